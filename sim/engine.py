"""A continuous-batching generation engine on the SimPy clock, without per-token events.

Between two events (an arrival, a completion, an ABORT, a weight update) the running batch is
fixed, so the engine computes in closed form when the next request finishes and schedules
one timer for it. A command settles the plan in progress at the current iteration boundary
(commands apply between engine steps, as in a real engine) and plans again; a request that
arrives at a busy engine leaves the plan alone and sets one wake-up at the end of the iteration
in progress, where it joins with every request that arrived before it. The engine is
a state machine driven by timer callbacks rather than a SimPy process: a command costs no
event of its own, and a superseded timer is ignored when it fires.

Model:
* KV is held on demand, as vLLM and SGLang do: a request admitted holds its context + 1 tokens and
  grows by one a decode iteration. Admission is bounded by ``max_num_seqs`` and by the KV capacity
  (the current footprint, after the admitting iteration's decode step, plus the new prompt must fit;
  one request is always admitted when none runs). A plan of decode iterations stops at the last
  iteration whose KV fits; there, if the next would overflow, the most recently admitted running
  requests are preempted (vLLM's RECOMPUTE): their KV is freed (kept as evictable prefix cache) and
  they wait at the front of the queue with their context grown by the tokens generated so far, to be
  prefilled again and to decode the rest. A lone request larger than the cache runs on alone;
* the prefix cache is the KV the batch does not hold; eviction takes the least recently used
  conversation's blocks tail first (vLLM's order), so a partly evicted one keeps its prefix;
* a new request's prefill runs in one mixed iteration with a decode step of the running batch;
* measured CPU profiles have ``call_step_s``: the worker's event loop handles generate calls in
  the engine's process and takes the GIL from the engine for about a switch interval, for one
  call or several. The first iteration after a call arrived at a busy engine, or a result (or an
  abort) went back, pays it once; calls during the iteration that pays it share it;
* the prefix cache keeps each trajectory's conversation after its turn (LRU in free KV), so
  the next turn only prefills the new observation — a weight update invalidates it;
* a weight update pauses the engine for the swap, then recomputes the KV of every running
  request under the new weights (step ⑤ of the protocol).
"""

from __future__ import annotations

import heapq
import math
from heapq import heappop, heappush
from collections import OrderedDict, deque
from operator import attrgetter
from typing import Any, Callable

import simpy
from simpy.events import NORMAL

from rollart.sim.costs.gpu import GenerationCost


class _Timer:
    """A bare SimPy timeout: the engine's one pending wake-up. SimPy's ``Timeout`` plus a
    closure per plan cost more than the plan; a superseded timer has its callback list
    emptied, so when it fires it is just popped from the queue (no call into the engine)."""

    __slots__ = ("callbacks",)
    _ok = True      # class attributes: what SimPy's step reads of a fired event
    _value = None

    def __init__(self, env: simpy.Environment, delay: float, callback: Callable[[Any], None]):
        self.callbacks: list[Callable[[Any], None]] = [callback]
        # Environment.schedule(self, NORMAL, delay), inlined (the same queue entry)
        heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), self))  # type: ignore[attr-defined]


class Request:
    __slots__ = ("traj_id", "context", "new_tokens", "decode_tokens", "tokens", "done", "admit_iter",
                 "finish_iter", "seq", "aborted", "running", "remote", "preempted", "wasted")

    def __init__(self, traj_id: int, context: int, decode_tokens: int, done: simpy.Event, prefilled: bool,
                 remote: int = 0):
        self.traj_id = traj_id
        self.context = context          # tokens the model sees before generating
        self.new_tokens = 0 if prefilled else context
        self.remote = remote            # prefix tokens a KV connector loads from another worker (PD)
        self.decode_tokens = decode_tokens  # still to generate from this admission (less after a preemption)
        self.tokens = decode_tokens         # asked for: what ``done`` succeeds with
        self.done = done
        self.admit_iter = 0
        self.finish_iter = 0
        self.seq = 0                        # its completion-heap entry while running (0: none)
        self.aborted = False
        self.running = False
        self.preempted = False              # it ran, was preempted, and waits to be prefilled again
        self.wasted = 0                     # aborted: the tokens it had decoded (thrown away)

    def decoded_before(self) -> int:
        """Tokens decoded in earlier admissions (before a preemption cut the asked-for count)."""
        return self.tokens - self.decode_tokens


class GenerationEngine:
    def __init__(self, env: simpy.Environment, worker_id: int, pool: str, cost: GenerationCost,
                 max_num_seqs: int, prefix_cache: bool,
                 span: Callable[[str, float, float], None] | None = None):
        self.env = env
        self.id = worker_id
        self.pool = pool
        self.cost = cost
        self.request_overhead_s = float(getattr(cost, "request_overhead_s", 0.0))  # outside the engine's steps
        self.call_step_s = float(getattr(cost, "call_step_s", 0.0))  # inside them: calls handled in-process
        self._calls_handled = False  # calls arrived or returned since the last iteration began
        self._charged_until = 0.0    # end of the iteration that last paid call_step_s
        self.padded_kv = getattr(cost, "kv_layout", "paged") == "padded"  # decode reads rows × longest row
        self.capacity = cost.kv_capacity_tokens
        self.max_num_seqs = max_num_seqs
        self.prefix_cache = prefix_cache
        self._span = span
        self.waiting: deque[Request] = deque()
        self.running: set[Request] = set()
        self._heap: list[tuple[int, int, Request]] = []
        self._seq = 0
        self.it = 0                 # decode iterations done
        self.decode_rows = 0        # sequences those iterations decoded a token for (Σ batch over iterations)
        self.ctx_sum = 0            # total context of the running batch: the KV it holds
        self.preemptions = 0        # running requests preempted (KV freed, recomputed later)
        self.resumed_hit_tokens = 0  # of cache_hits_tokens, a preempted request's own KV found again
        self.cache: OrderedDict[int, int] = OrderedDict()
        self.cache_tokens = 0
        self.cache_hits_tokens = 0
        self.prefill_tokens = 0
        self.busy_s = 0.0
        self._aborts: list[Request] = []
        # abort accounting: requests aborted after decoding something, the tokens they had decoded
        # and the tokens prefilled for their last admission (GPU time is charged as it ran, in busy_s)
        self.aborted_requests = 0
        self.aborted_decoded_tokens = 0
        self.aborted_prefill_tokens = 0
        self._updates: list[tuple[float, simpy.Event]] = []
        self._carry = 0.0           # seconds of an interrupted iteration still to run
        self._plan: tuple[float, float, float, int, Any, int, float] | None = None
        self._timer: _Timer | None = None  # the live timer; older ones were emptied
        self._updating = False      # a weight swap + KV recompute is running (not interruptible)
        self._replan_pending = False
        self._update_started = 0.0
        self.contention: Any = None  # a HostContention when engines share a host's cores
        self.busy = False
        self._on_timer_cb = self._on_timer  # one bound method for every timer
        # A request that arrives at a busy engine joins at the end of the iteration in progress: the plan
        # stays, and one wake-up at that boundary (its time, iterations done by then, its timer) admits
        # every request that arrived before it (_arrive).
        self._boundary: tuple[float, int, _Timer] | None = None
        self._on_boundary_cb = self._on_boundary

    # ---- commands (applied between engine steps) ------------------------------------

    def add(self, traj_id: int, context: int, decode_tokens: int, prefilled: bool = False, remote: int = 0) -> Request:
        req = Request(traj_id, context, max(1, decode_tokens), self.env.event(), prefilled, remote)
        self.waiting.append(req)
        if self._plan is not None:  # _note_calls, inlined for the busy engine
            if self.call_step_s and self.env._now >= self._charged_until:
                self._calls_handled = True
            if self._boundary is None and not (self._updating or self._replan_pending):
                self._arrive()
            return req
        if self._updating:  # an idle engine loses nothing to the call
            self._note_calls()
        self._command()
        return req

    def abort(self, req: Request) -> int:
        """ABORT a request; returns the tokens it had decoded (its partial response, thrown away):
        those of the admission in progress up to now and of earlier ones (a preempted request).
        A request whose result was ready but not yet taken gives all of its tokens."""
        if req.aborted:
            return 0
        if req.done.triggered:  # it finished this instant; the caller never takes the result
            req.aborted = True
            self._count_abort(req, req.tokens)
            return req.tokens
        req.aborted = True
        self._note_calls()  # the call returns (as aborted) through the worker's event loop
        if req.running:
            self._aborts.append(req)
            self._command()  # applies it now unless a weight swap runs (then when that ends)
            if req.running:  # not applied yet: what it decoded until now
                return self._decoded_so_far(req)
            return req.wasted
        try:
            self.waiting.remove(req)
        except ValueError:
            pass
        if req.decoded_before():  # preempted earlier: what it decoded before
            self._count_abort(req, req.decoded_before())
        return req.wasted

    def update_weights(self, swap_s: float) -> simpy.Event:
        """Swap new weights in (``swap_s`` seconds) once the iteration in progress ends, then recompute the
        running requests' KV under them. The event fires when the weights are in, before the recompute:
        the sender moves on (the paper's ④ resume comes before ⑤ recompute; SGLang's and vLLM's weight
        update calls return once loaded) while the engine, busy recomputing, admits nothing new."""
        ev = self.env.event()
        self._updates.append((swap_s, ev))
        self._command()
        return ev

    def busy_until(self, t: float) -> float:
        """Busy seconds up to ``t``, counting the part of the plan in progress already run."""
        busy = self.busy_s
        if self._plan is not None:
            busy += max(0.0, min(t, self.env.now) - self._plan[0])
        elif self._updating:
            busy += max(0.0, min(t, self.env.now) - self._update_started)
        return busy

    def iterations_until(self, t: float) -> int:
        """Engine steps finished by ``t`` (at most now): those settled and the plan in progress's
        decode iterations done by then (its mixed prefill step is counted when it is planned)."""
        plan = self._plan
        if plan is None:
            return self.it
        t0, lead, x0, batch, line, k_next, _total = plan
        elapsed = min(t, self.env.now) - t0 - lead
        if line is None or k_next <= 0 or elapsed <= 0:
            return self.it
        k = line.iterations_within(x0, batch, k_next, elapsed)  # the one in progress included ...
        return self.it + (k - 1 if k and line.total(x0, batch, k) > elapsed else k)  # ... unless done

    def forget(self, traj_id: int) -> None:
        self.cache_tokens -= self.cache.pop(traj_id, 0)

    # ---- planning ---------------------------------------------------------------------------

    def _command(self) -> None:
        """Re-plan for a command. An idle engine waits until all commands of this instant are
        in, so requests that arrive together share one prefill iteration (e.g. a whole batch
        after a lockstep barrier); a busy one re-plans at once — new requests are admitted at
        the end of the iteration in progress anyway, together with any that arrive before it."""
        if self._updating or self._replan_pending:
            return  # an update picks commands up when it finishes
        if self._plan is not None:
            self._settle()
            self._next()
            return
        self._replan_pending = True
        self.env.timeout(0).callbacks.append(self._replan)

    def _replan(self, _: object) -> None:
        self._replan_pending = False
        if self._updating:
            return
        self._settle()
        self._next()

    def _schedule(self, delay: float, callback: Callable[[Any], None]) -> None:
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        self._cancel_timer()
        self._timer = _Timer(self.env, delay, callback)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.callbacks.clear()  # stale: popped when due, calls nothing
            self._timer = None

    def _next(self) -> None:
        """Decide what the engine does from now on and schedule its timer."""
        if self._updates:
            if self._carry > 0:  # finish the iteration in progress (and its completions) first
                self._begin(self._carry, 0)
                self._carry = 0.0
            else:
                self._start_updates()
            return
        if self._aborts:
            self._apply_aborts()
        if self._carry > 0 and (self.waiting or (self._heap and self._next_finish() <= self.it)):
            # Finish the iteration in progress first: requests it completes return at its end,
            # and requests that arrive before its end are admitted together at that boundary.
            self._begin(self._carry, 0)
            self._carry = 0.0
            return
        running = self.running  # (none of them finishes at the boundary: those are completed)
        if self.ctx_sum + len(running) > self.capacity and len(running) > 1:
            self._preempt()  # the next decode iteration would overflow the KV
        lead, self._carry = self._carry, 0.0
        admitted = self._admit() if self.waiting else ()
        charge = self._calls_handled and bool(admitted or self.running)
        self._calls_handled = False
        if charge:
            lead += self.call_step_s * getattr(self.cost, "factor", 1.0)
        if admitted:
            lead += self._start_prefill(admitted)
        if charge:
            self._charged_until = self.env.now + lead
        if running:
            k_next = self._next_finish() - self.it
            batch = len(running)
            if batch > 1 and self.ctx_sum + k_next * batch > self.capacity:
                k_next = (self.capacity - self.ctx_sum) // batch  # stop where the KV is full (_preempt)
            self._begin(lead, max(0, k_next))
        elif lead > 0:
            self._begin(lead, 0)
        else:
            self._plan = None
            self._set_busy(False)

    def _note_calls(self) -> None:
        """A call arrived or returned: the next iteration pays ``call_step_s``, unless the one in
        progress already pays it (the event loop handles them together)."""
        if self.call_step_s and self.env.now >= self._charged_until:
            self._calls_handled = True

    def _set_busy(self, busy: bool) -> None:
        if busy != self.busy:
            self.busy = busy
            if self.contention is not None:
                self.contention.changed(self if busy else None)

    def set_slowdown(self, factor: float) -> None:
        """Host contention changed: re-plan at the new speed (the iteration in progress
        finishes at the old one)."""
        if factor == self.cost.factor:
            return
        if self._plan is not None and not self._updating:
            self._settle()
            self.cost.factor = factor
            self._next()
        else:
            self.cost.factor = factor

    def _begin(self, lead: float, k_next: int) -> None:
        """Run ``lead`` seconds of prefill work, then ``k_next`` decode iterations."""
        if not self.busy:
            self._set_busy(True)  # first, so a contention change applies to this plan too
        batch = len(self.running)
        x0 = self.ctx_sum if not self.padded_kv else self._decode_context()
        if batch:
            line = self.cost.decode_line(batch)
            total = lead + (line.total(x0, batch, k_next) if k_next > 0 else 0.0)
        else:
            line, total = None, lead + 0.0
        env = self.env
        self._plan = (env._now, lead, x0, batch, line, k_next, total)
        # _schedule(total, self._on_timer), inlined: this runs at every command and completion
        if total < 0:
            raise ValueError(f"negative delay {total}")
        if self._timer is not None:
            self._timer.callbacks.clear()  # stale: popped when due, calls nothing
        self._timer = _Timer(env, total, self._on_timer_cb)

    def _arrive(self) -> None:
        """A request arrived at the busy engine: it is admitted at the end of the iteration in progress
        (with any that arrive before then). Where that end is the plan's own end, the plan's timer
        already wakes the engine there; else one wake-up is set at it. The plan is not touched, so
        nothing is re-planned per arrival (what :meth:`_command` would do: settle, then plan the rest
        of the iteration alone)."""
        t0, lead, x0, batch, line, k_next, total = self._plan  # type: ignore[misc]
        now = self.env._now
        elapsed = now - t0
        eps = max(1e-12, 8 * math.ulp(now))
        if elapsed >= total - eps:  # the plan ends now: its timer is due at this instant
            return
        k, carry = self._in_progress(lead, x0, batch, line, k_next, elapsed)
        if k >= k_next:  # the iteration in progress is the plan's last: its timer is the boundary
            return
        if carry < eps:  # exactly at a boundary: admit now
            self._settle()
            self._next()
            return
        self._boundary = (now + carry, k, _Timer(self.env, carry, self._on_boundary_cb))

    @staticmethod
    def _in_progress(lead: float, x0: float, batch: int, line: Any, k_next: int, elapsed: float) -> tuple[int, float]:
        """``elapsed`` seconds into a plan (``lead`` of prefill work, then ``k_next`` decode iterations)
        that has not ended: its decode iterations done once the one in progress ends, and the seconds
        left of that one."""
        if elapsed < lead:
            return 0, lead - elapsed
        k = line.iterations_within(x0, batch, k_next, elapsed - lead)
        return k, lead + line.total(x0, batch, k) - elapsed

    def _on_boundary(self, _: object) -> None:
        """The iteration in progress when a request arrived has ended: account the plan up to it
        (exactly its iterations, nothing carried) and plan again, admitting what waits."""
        k = self._boundary[1]  # type: ignore[index]
        self._boundary = None
        self._settle(k)
        self._next()

    def _on_timer(self, _: object) -> None:
        self._timer = None
        if self._plan is None:
            return
        self._settle()
        self._next()

    def _settle(self, at_boundary: int | None = None) -> None:
        """Account for the plan in progress up to now, stopping at an iteration boundary
        (``at_boundary``: now is the end of the plan's iteration of that number, nothing carried)."""
        if self._plan is None:
            return
        if self._boundary is not None:  # a command before the arrivals' boundary: it is planned anew
            t_b, k_b, timer = self._boundary
            self._boundary = None
            timer.callbacks.clear()
            if self.env._now >= t_b - max(1e-12, 8 * math.ulp(t_b)):  # at the boundary itself
                at_boundary = k_b
        t0, lead, x0, batch, line, k_next, total = self._plan
        self._plan = None
        if self._timer is not None:  # _cancel_timer, inlined: the pending timer is now stale
            self._timer.callbacks.clear()
            self._timer = None
        now = self.env._now
        elapsed = now - t0
        # Remainders below the clock's resolution at this time can never elapse: treat them as
        # done, or the engine would re-schedule them forever without time advancing.
        eps = max(1e-12, 8 * math.ulp(now))
        if at_boundary is not None:
            k = at_boundary
        elif elapsed >= total - eps:
            k = k_next
        else:
            k, carry = self._in_progress(lead, x0, batch, line, k_next, elapsed)
            self._carry = max(0.0, carry)
        if self._carry < eps:
            self._carry = 0.0
        self.busy_s += now - t0  # only elapsed time counts as busy (see _busy)
        if self._span is not None and now > t0:
            self._span(f"step: prefill {lead * 1e3:.0f} ms, decode ×{k} (batch {batch})", t0, now)
        if k:  # _advance, inlined: this runs at every command and completion
            self.it += k
            rows = k * len(self.running)
            self.decode_rows += rows
            self.ctx_sum += rows
            if self.cache_tokens > self.capacity - self.ctx_sum:  # the batch grew into the cache
                self._trim_cache()
        if self._carry == 0 and self._heap and self._heap[0][0] <= self.it:  # something to complete
            self._complete_finished()

    def _busy(self, t0: float, t1: float, name: str, *args: object) -> None:
        # Only elapsed time counts as busy; a carried remainder is counted when it runs.
        self.busy_s += t1 - t0
        if self._span is not None and t1 > t0:  # format only when tracing
            self._span(name.format(*args), t0, t1)

    def _admit(self) -> list[Request]:
        """FIFO while the KV after the admitting iteration fits: the running batch's context grown by
        its decode step, plus each new request's context and first token. The prefix cache is free
        KV (evictable), so it does not count."""
        admitted: list[Request] = []
        waiting, capacity, limit = self.waiting, self.capacity, self.max_num_seqs - len(self.running)
        used = self.ctx_sum + len(self.running)
        while waiting and len(admitted) < limit:
            req = waiting[0]
            used += req.context + 1
            if used > capacity and (self.running or admitted):
                break  # wait for KV to free up
            waiting.popleft()
            admitted.append(req)
        return admitted

    def _preempt(self) -> None:
        """The next decode iteration would overflow the KV: preempt the most recently admitted
        running requests until it fits (or one is left), as vLLM does (RECOMPUTE). A victim's KV
        goes to the prefix cache (evictable) and it waits at the front of the queue, its context
        grown by the tokens it generated, to be prefilled again and decode the rest."""
        running, capacity = self.running, self.capacity
        victims = sorted(running, key=attrgetter("seq"), reverse=True)  # the latest admitted first
        preempted: list[Request] = []
        for req in victims:
            if self.ctx_sum + len(running) <= capacity or len(running) <= 1:
                break
            ctx = self._remove(req)
            self.preemptions += 1
            if req.aborted:  # aborted this instant, not yet applied: account for it here
                self._count_abort(req, req.decoded_before() + ctx - req.context, req.new_tokens)
                continue
            req.decode_tokens -= ctx - req.context  # ≥ 1: it would have completed otherwise
            req.context = req.new_tokens = ctx
            req.preempted = True
            preempted.append(req)
            if self.prefix_cache:  # its KV stays cached until evicted: a quick resume hits
                self._cache_put(req.traj_id, ctx, trim=False)  # trimmed once, with every victim's KV freed
        self.waiting.extendleft(preempted)  # the earliest admitted first, as they ran
        self._trim_cache()

    def _start_prefill(self, admitted: list[Request]) -> float:
        """Put ``admitted`` into the batch through one mixed iteration (their prefill plus a
        decode step of the running batch); returns the iteration's duration. The batch state
        is updated now; completions wait until the iteration has elapsed."""
        new_tokens, pairs, prompts = 0, 0.0, 0
        cache = self.cache if self.prefix_cache else None
        transferred = []
        for req in admitted:
            if cache is not None:
                # the cached prefix becomes part of the running request's KV (held from now on);
                # a PD decode request (KV from a prefill worker) must drop it too, or it counts twice
                cached = cache.pop(req.traj_id, 0)
                self.cache_tokens -= cached
                if req.new_tokens:  # a prefix loaded by the KV connector counts as found (PD prefill)
                    hit = min(max(cached, req.remote), req.context)
                    self.cache_hits_tokens += hit
                    if req.preempted:
                        self.resumed_hit_tokens += hit
                    req.new_tokens = req.context - hit
            n = req.new_tokens
            if n:
                pairs += n * (req.context - n + n / 2)
                new_tokens += n
                prompts += 1
            else:  # its KV arrived from a prefill worker (PD disaggregation): it only decodes
                transferred.append(req)  # (its term of the sums is 0: adding it changes nothing)
        running = self.running
        decoders = len(running) + len(transferred)
        dt = self.cost.mixed_step_time(new_tokens, pairs, decoders,
                                       self._decode_context(transferred) if decoders else 0.0, prompts)
        self.prefill_tokens += new_tokens
        self.decode_rows += decoders
        # _advance(1), inlined
        it = self.it = self.it + 1
        self.ctx_sum += len(running)
        heap, seq, ctx_sum = self._heap, self._seq, self.ctx_sum
        for req in admitted:
            # The prefill produces the first token; the request joins the decode batch.
            req.running = True
            req.admit_iter = it
            req.finish_iter = it + req.decode_tokens - 1
            running.add(req)
            ctx_sum += req.context + 1
            seq += 1
            req.seq = seq
            heappush(heap, (req.finish_iter, seq, req))
            if req.aborted:
                self._aborts.append(req)
        self._seq, self.ctx_sum = seq, ctx_sum
        self._trim_cache()
        return dt

    def _next_finish(self) -> int:
        heap = self._heap
        while heap and heap[0][2].seq != heap[0][1]:  # left the batch (or preempted and back)
            heapq.heappop(heap)
        return self._heap[0][0] if self._heap else self.it + 1

    def _decode_context(self, joining: list[Request] = ()) -> float:
        """The context a decode iteration reads: Σ of the rows' contexts (paged KV), or rows ×
        the longest (KV padded to one length). Either grows by the batch size per iteration."""
        if not self.padded_kv:
            return self.ctx_sum + sum(r.context for r in joining) if joining else self.ctx_sum
        rows = len(self.running) + len(joining)
        longest = max([req.context + 1 + (self.it - req.admit_iter) for req in self.running]
                      + [r.context for r in joining], default=0)
        return float(rows * longest)

    def _advance(self, iterations: int) -> None:
        self.it += iterations
        self.ctx_sum += iterations * len(self.running)

    def _remove(self, req: Request) -> int:
        """Take a running request out of the batch; returns its current context."""
        ctx = req.context + 1 + (self.it - req.admit_iter)
        req.running = False
        req.seq = 0
        self.running.discard(req)
        self.ctx_sum -= ctx
        return ctx

    def _complete_finished(self) -> None:
        heap, it, running, cache = self._heap, self.it, self.running, self.cache
        while heap and heap[0][0] <= it:
            _, seq, req = heappop(heap)
            if req.seq != seq:  # left the batch (or preempted and back: its live entry is later)
                continue
            # _remove, inlined
            ctx = req.context + 1 + (it - req.admit_iter)
            req.running = False
            req.seq = 0
            running.discard(req)
            self.ctx_sum -= ctx
            if not req.aborted:
                if self.prefix_cache:  # _cache_put, inlined
                    self.cache_tokens += ctx - cache.pop(req.traj_id, 0)
                    cache[req.traj_id] = ctx
                    self._trim_cache()
                req.done.succeed(req.tokens)
                # _note_calls, inlined: its result goes back through the worker's event loop
                if self.call_step_s and self.env._now >= self._charged_until:
                    self._calls_handled = True
            else:  # aborted as it decoded its last token: every token was decoded, and is thrown away
                self._count_abort(req, req.tokens, req.new_tokens)

    def _decoded_so_far(self, req: Request) -> int:
        """Tokens a running request has decoded, this admission's up to the current iteration included."""
        return req.decoded_before() + self.it - req.admit_iter + 1

    def _count_abort(self, req: Request, decoded: int, prefilled: int = 0) -> None:
        """Account an abort: ``decoded`` tokens thrown away (the request's ``wasted``), and the tokens
        ``prefilled`` for its last admission."""
        req.wasted = decoded
        self.aborted_requests += 1
        self.aborted_decoded_tokens += decoded
        self.aborted_prefill_tokens += prefilled

    def _apply_aborts(self) -> None:
        for req in self._aborts:
            if req.running:
                self._count_abort(req, self._decoded_so_far(req), req.new_tokens)
                self._remove(req)
        self._aborts.clear()

    def _cache_put(self, traj_id: int, tokens: int, trim: bool = True) -> None:
        self.cache_tokens += tokens - self.cache.pop(traj_id, 0)
        self.cache[traj_id] = tokens
        if trim:
            self._trim_cache()

    def _trim_cache(self) -> None:
        """The prefix cache lives in KV memory the running requests do not hold. Eviction takes the
        least recently used conversation's blocks tail first, as vLLM frees a finished request's
        blocks (its prefix, what a next turn or a resumed request reads first, goes last)."""
        free = max(0, self.capacity - self.ctx_sum)
        cache = self.cache
        while self.cache_tokens > free and cache:
            excess = self.cache_tokens - free
            oldest = next(iter(cache))
            if cache[oldest] > excess:  # its tail alone makes the room
                cache[oldest] -= excess
                self.cache_tokens -= excess
                break
            self.cache_tokens -= cache.pop(oldest)

    # ---- weight update (steps ③ and ⑤) --------------------------------------------------

    def _start_updates(self) -> None:
        """Finish the interrupted iteration, swap the weights in (the updates' events fire), then
        recompute the KV of the running requests under the new weights (one batched prefill). Not
        interruptible: requests routed here meanwhile wait for the recompute."""
        self._apply_aborts()
        updates, self._updates = self._updates, []
        swap = max(s for s, _ in updates)
        # KV computed under the old weights is invalid: drop the prefix cache too.
        self.cache.clear()
        self.cache_tokens = 0
        recompute = 0.0
        if self.running:
            ctxs = [req.context + 1 + (self.it - req.admit_iter) for req in self.running]
            recompute = self.cost.prefill_time(sum(ctxs), sum(c * c / 2 for c in ctxs))
        self._updating = True
        t0 = self._update_started = self.env.now
        self._plan = None
        self._set_busy(True)

        def loaded(_: object) -> None:
            for _, ev in updates:
                ev.succeed()

        def done(_: object) -> None:
            self._timer = None
            self._updating = False
            self._busy(t0, self.env.now, "weight swap {:.2f} s + KV recompute {:.2f} s", swap, recompute)
            self._next()

        self.env.timeout(swap).callbacks.append(loaded)
        self._schedule(swap + recompute, done)
