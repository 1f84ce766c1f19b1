"""A continuous-batching generation engine on the SimPy clock, without per-token events.

Between two events (an arrival, a completion, an ABORT, a weight update) the running batch is
fixed, so the engine computes in closed form how long it takes until the next request
finishes and sleeps that long; an ADD or ABORT wakes it, it completes the iteration in
progress (commands apply between engine steps, as in a real engine) and recomputes.

Model:
* admission is bounded by ``max_num_seqs`` and by KV capacity (a request reserves its final
  footprint, context + response, so no preemption is needed);
* a new request's prefill runs in one mixed iteration with a decode step of the running batch;
* the prefix cache keeps each trajectory's conversation after its turn (LRU in free KV), so
  the next turn only prefills the new observation — a weight update invalidates it;
* a weight update pauses the engine for the swap, then recomputes the KV of every running
  request under the new weights (step ⑤ of the protocol).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from typing import Any, Callable, Generator

import simpy

from rollart.sim.costs.gpu import GenerationCost


class Request:
    __slots__ = ("traj_id", "context", "new_tokens", "decode_tokens", "done", "admit_iter", "finish_iter",
                 "kv_final", "aborted", "running")

    def __init__(self, traj_id: int, context: int, decode_tokens: int, done: simpy.Event, prefilled: bool):
        self.traj_id = traj_id
        self.context = context          # tokens the model sees before generating
        self.new_tokens = 0 if prefilled else context
        self.decode_tokens = decode_tokens
        self.done = done
        self.admit_iter = 0
        self.finish_iter = 0
        self.kv_final = context + decode_tokens
        self.aborted = False
        self.running = False


class GenerationEngine:
    def __init__(self, env: simpy.Environment, worker_id: int, pool: str, cost: GenerationCost,
                 max_num_seqs: int, prefix_cache: bool,
                 span: Callable[[str, float, float], None] | None = None):
        self.env = env
        self.id = worker_id
        self.pool = pool
        self.cost = cost
        self.capacity = cost.kv_capacity_tokens
        self.max_num_seqs = max_num_seqs
        self.prefix_cache = prefix_cache
        self._span = span
        self.waiting: deque[Request] = deque()
        self.running: set[Request] = set()
        self._heap: list[tuple[int, int, Request]] = []
        self._seq = 0
        self.it = 0                 # decode iterations done
        self.ctx_sum = 0            # total context of the running batch
        self.reserved = 0           # Σ final footprint of running requests
        self.cache: OrderedDict[int, int] = OrderedDict()
        self.cache_tokens = 0
        self.cache_hits_tokens = 0
        self.prefill_tokens = 0
        self.busy_s = 0.0
        self._aborts: list[Request] = []
        self._updates: list[tuple[float, simpy.Event]] = []
        self._wake = env.event()
        self.process = env.process(self._loop())

    # ---- commands (applied between engine steps) ------------------------------------

    def add(self, traj_id: int, context: int, decode_tokens: int, prefilled: bool = False) -> Request:
        req = Request(traj_id, context, max(1, decode_tokens), self.env.event(), prefilled)
        self.waiting.append(req)
        self._poke()
        return req

    def abort(self, req: Request) -> None:
        if req.aborted or req.done.triggered:
            return
        req.aborted = True
        if req.running:
            self._aborts.append(req)
            self._poke()
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass

    def update_weights(self, swap_s: float) -> simpy.Event:
        ev = self.env.event()
        self._updates.append((swap_s, ev))
        self._poke()
        return ev

    def forget(self, traj_id: int) -> None:
        self.cache_tokens -= self.cache.pop(traj_id, 0)

    def _poke(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    # ---- the engine loop --------------------------------------------------------------------

    def _loop(self) -> Generator[Any, Any, None]:
        while True:
            if self._updates:
                yield from self._apply_updates()
                continue
            self._apply_aborts()
            admitted = self._admit()
            if admitted:
                yield from self._prefill_iteration(admitted)
            elif self.running:
                yield from self._decode_until_event()
            else:
                self._wake = self.env.event()
                yield self._wake

    def _busy(self, name: str, t0: float, t1: float) -> None:
        self.busy_s += t1 - t0
        if self._span is not None and t1 > t0:
            self._span(name, t0, t1)

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        reserved = self.reserved
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            req = self.waiting[0]
            if reserved + req.kv_final > self.capacity and (self.running or admitted):
                break  # wait for KV to free up
            self.waiting.popleft()
            reserved += req.kv_final
            admitted.append(req)
        return admitted

    def _prefill_iteration(self, admitted: list[Request]) -> Generator[Any, Any, None]:
        new_tokens, pairs = 0, 0.0
        for req in admitted:
            if self.prefix_cache and req.new_tokens:
                cached = self.cache.pop(req.traj_id, 0)
                self.cache_tokens -= cached
                hit = min(cached, req.context)
                self.cache_hits_tokens += hit
                req.new_tokens = req.context - hit
            pairs += req.new_tokens * (req.context - req.new_tokens + req.new_tokens / 2)
            new_tokens += req.new_tokens
        # One mixed iteration: the new prompts' prefill plus a decode step for the running
        # batch and for requests whose KV arrived from a prefill worker (PD disaggregation).
        transferred = [r for r in admitted if r.new_tokens == 0]
        decoders = len(self.running) + len(transferred)
        dt = self.cost.prefill_time(new_tokens, pairs)
        if decoders:
            x0 = self.ctx_sum + sum(r.context for r in transferred)
            dt += self.cost.decode_line(decoders).total(x0, decoders, 1)
        t0 = self.env.now
        yield self.env.timeout(dt)
        self._busy(f"prefill {len(admitted)} req / {new_tokens} tok", t0, self.env.now)
        self.prefill_tokens += new_tokens
        self._advance(1)
        for req in admitted:
            # The prefill produced the first token; the request joins the decode batch.
            req.running = True
            req.admit_iter = self.it
            req.finish_iter = self.it + req.decode_tokens - 1
            self.running.add(req)
            self.ctx_sum += req.context + 1
            self.reserved += req.kv_final
            self._seq += 1
            heapq.heappush(self._heap, (req.finish_iter, self._seq, req))
            if req.aborted:
                self._aborts.append(req)
        self._complete_finished()

    def _decode_until_event(self) -> Generator[Any, Any, None]:
        batch = len(self.running)
        k_next = max(1, self._next_finish() - self.it)
        line = self.cost.decode_line(batch)
        x0 = self.ctx_sum
        total = line.total(x0, batch, k_next)
        self._wake = self.env.event()
        t0 = self.env.now
        yield self.env.timeout(total) | self._wake
        elapsed = self.env.now - t0
        k = k_next if elapsed >= total else line.iterations_within(x0, batch, k_next, elapsed)
        boundary = line.total(x0, batch, k)
        if boundary > elapsed:
            yield self.env.timeout(boundary - elapsed)  # finish the iteration in progress
        self._busy(f"decode ×{k} (batch {batch})", t0, self.env.now)
        self._advance(k)
        self._complete_finished()

    def _next_finish(self) -> int:
        while self._heap and not self._heap[0][2].running:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else self.it + 1

    def _advance(self, iterations: int) -> None:
        self.it += iterations
        self.ctx_sum += iterations * len(self.running)

    def _remove(self, req: Request) -> int:
        """Take a running request out of the batch; returns its current context."""
        ctx = req.context + 1 + (self.it - req.admit_iter)
        req.running = False
        self.running.discard(req)
        self.ctx_sum -= ctx
        self.reserved -= req.kv_final
        return ctx

    def _complete_finished(self) -> None:
        while self._heap and self._heap[0][0] <= self.it:
            _, _, req = heapq.heappop(self._heap)
            if not req.running:
                continue
            ctx = self._remove(req)
            if self.prefix_cache:
                self._cache_put(req.traj_id, ctx)
            if not req.aborted:
                req.done.succeed(req.decode_tokens)

    def _apply_aborts(self) -> None:
        for req in self._aborts:
            if req.running:
                self._remove(req)
        self._aborts.clear()

    def _cache_put(self, traj_id: int, tokens: int) -> None:
        self.cache_tokens += tokens - self.cache.pop(traj_id, 0)
        self.cache[traj_id] = tokens
        free = max(0, self.capacity - self.reserved)
        while self.cache_tokens > free and self.cache:
            _, evicted = self.cache.popitem(last=False)
            self.cache_tokens -= evicted

    def _apply_updates(self) -> Generator[Any, Any, None]:
        updates, self._updates = self._updates, []
        self._apply_aborts()
        swap = max(s for s, _ in updates)
        t0 = self.env.now
        if swap > 0:
            yield self.env.timeout(swap)
            self._busy("weight swap", t0, self.env.now)
        # KV computed under the old weights is invalid: drop the prefix cache and recompute
        # the running requests' contexts (one batched prefill).
        self.cache.clear()
        self.cache_tokens = 0
        if self.running:
            ctxs = [req.context + 1 + (self.it - req.admit_iter) for req in self.running]
            t1 = self.env.now
            yield self.env.timeout(self.cost.prefill_time(sum(ctxs), sum(c * c / 2 for c in ctxs)))
            self._busy(f"KV recompute {len(ctxs)} req", t1, self.env.now)
        for _, ev in updates:
            ev.succeed()
