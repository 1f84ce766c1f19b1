"""Reward placement: rule checks in-process, an LLM judge on dedicated GPUs (queued on
continuous-batching engines) or on an autoscaling serverless platform."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator

import simpy

from rollart.plan.schema import ModelSpec, Serverless
from rollart.sim.costs.gpu import GenerationCost
from rollart.sim.engine import GenerationEngine

JUDGE_MAX_INPUT_TOKENS = 32768  # a judge's window when its model names none (every preset's native 32K)


def judge_window(model: ModelSpec) -> int:
    """The reward model's context window: its ``max_context_tokens``, else 32K."""
    return model.max_context_tokens or JUDGE_MAX_INPUT_TOKENS


def judge_input_tokens(context_tokens: int, window: int = JUDGE_MAX_INPUT_TOKENS, output_tokens: int = 0) -> int:
    """An LLM judge's prompt: the ``context_tokens`` it reads (by default the whole trajectory: prompt, every
    turn, the answer; a task's ``judge_input_tokens`` where set, ``TaskSpec.judge_reads``), cut only where the
    judge's own context ``window`` must still hold the ``output_tokens`` of its verdict (an engine refuses a
    prompt plus max_tokens past max_model_len)."""
    return max(1, min(context_tokens, window - output_tokens))


class _Platform:
    """What every serverless platform keeps: its spec and judge, a bound of ``slots`` calls at once,
    its counters, and two figures of which ``spec.billing`` says which one is the bill."""

    def __init__(self, env: simpy.Environment, spec: Serverless, judge: GenerationCost, output_tokens: int,
                 slots: int):
        self.env = env
        self.spec = spec
        self.judge = judge
        self.output_tokens = output_tokens  # the verdict each call writes (placement.reward.output_tokens)
        self.slots = simpy.Resource(env, capacity=slots)
        self.cold_starts = 0
        self.calls = 0
        self.busy_s = 0.0
        self.request_s = 0.0    # per request: call time + cold starts
        self.reserved_s = 0.0   # instance lifetimes: cold start until scale-down (idle tails included)

    def gpu_seconds(self, instance_s: float) -> float:
        """GPU-seconds of ``instance_s`` instance-seconds: an instance spans ``spec.tp`` GPUs."""
        return instance_s * self.spec.tp

    @property
    def billed_s(self) -> float:
        """GPU-seconds billed, as ``spec.billing`` counts them."""
        return self.gpu_seconds(self.reserved_s if self.spec.billing == "instance_time" else self.request_s)


class ServerlessPlatform(_Platform):
    """Instances start cold (``cold_start_s``), serve one call at a time, stay warm until idle
    for ``scale_down_idle_s`` and scale to zero; at most ``max_concurrency`` exist. Each call
    pays ``per_call_overhead_s`` plus the judge's single-request time on the platform GPU.

    Two figures are kept, and ``spec.billing`` says which one the bill is: ``request_s``, each
    call's time on an instance plus the cold starts it caused (pay per request: a warm instance's
    idle time is the platform's), and ``reserved_s``, every instance's life from its cold start
    until it scales down, idle tail included (platforms that bill container time)."""

    def __init__(self, env: simpy.Environment, spec: Serverless, judge: GenerationCost, output_tokens: int):
        super().__init__(env, spec, judge, output_tokens, spec.max_concurrency)
        # idle-since times of warm instances; a time ahead of now: one still cold-starting (its call
        # was aborted), free once ready
        self._idle: list[float] = []

    def call_time(self, input_tokens: int) -> float:
        prefill = self.judge.prefill_time(input_tokens, input_tokens * input_tokens / 2)
        # the prefill writes the verdict's first token, as on an engine: one decode step fewer
        decode = self.judge.decode_line(1).total(input_tokens, 1, self.output_tokens - 1)
        return self.spec.per_call_overhead_s + prefill + decode

    def _take_warm(self) -> float | None:
        """An instance for a call: when it is ready (now, or ahead for one still cold-starting);
        None when none is up."""
        now = self.env.now
        # Instances idle longer than the scale-down delay are gone; bill their idle tail.
        alive = []
        for t in self._idle:
            if now - t <= self.spec.scale_down_idle_s:
                alive.append(t)
            else:
                self.reserved_s += self.spec.scale_down_idle_s
        self._idle = alive
        if not alive:
            return None
        ready = [t for t in alive if t <= now]
        t = max(ready) if ready else min(alive)  # most recently used (warmest), else the first to boot
        self._idle.remove(t)
        self.reserved_s += max(0.0, now - t)
        return t

    def call(self, input_tokens: int) -> Generator[Any, Any, None]:
        with self.slots.request() as slot:
            yield slot
            self.calls += 1
            start, t0 = self.env.now, None
            ready = self._take_warm()
            cold = ready is None
            if ready is None:
                self.cold_starts += 1
                ready = start + self.spec.cold_start_s
            try:
                if cold:
                    yield self.env.timeout(self.spec.cold_start_s)
                elif ready > start:  # still cold-starting for a call that was aborted
                    yield self.env.timeout(ready - start)
                t0 = self.env.now
                yield self.env.timeout(self.call_time(input_tokens))
            finally:
                # Also when the caller is aborted: a cold start runs to its end and is billed whole
                # to the call that caused it; a later call on that instance is billed from when it
                # is ready, and the instance is free from then (or from when the call left).
                end = max(self.env.now, ready)
                billed = end - (start if cold else max(start, ready))
                self.request_s += billed
                self.reserved_s += billed
                if t0 is not None:
                    self.busy_s += self.env.now - t0
                self._idle.append(end)

    def close(self) -> None:
        """Bill the idle tails of instances still warm when the run ends."""
        for t in self._idle:
            self.reserved_s += max(0.0, min(self.spec.scale_down_idle_s, self.env.now - t))
        self._idle = []


@dataclass(eq=False)
class _Instance:
    engine: GenerationEngine
    born: float                       # its cold start began
    ready: simpy.Event                # its cold start is over
    ready_at: float                   # when it is
    calls: int = 0                    # calls on it now (admitted, cold-starting or served)
    active_since: float | None = None  # start of the current stretch with calls being served
    idle_since: float | None = None    # the last call left (None while it has calls)


class BatchingServerlessPlatform(_Platform):
    """Serverless instances that each run one continuous-batching engine and serve up to
    ``instance_concurrency`` calls at once (an LLM server behind a serverless GPU function). A call
    goes to the least-loaded warm instance with a free slot, else to one still cold-starting, else
    starts a new one (at most ``max_concurrency // instance_concurrency`` exist); an instance idle for
    ``scale_down_idle_s`` scales down. The same two figures as :class:`ServerlessPlatform`:
    ``request_s`` (pay per request: each instance's time serving at least one call, counted once
    however many overlap, plus its cold start) and ``reserved_s`` (each instance's life, idle tail
    included); ``spec.billing`` picks the bill."""

    def __init__(self, env: simpy.Environment, spec: Serverless, judge: GenerationCost, output_tokens: int):
        self.per_instance = spec.instance_concurrency
        self.max_instances = max(1, spec.max_concurrency // self.per_instance)
        super().__init__(env, spec, judge, output_tokens, self.max_instances * self.per_instance)
        self.instances: list[_Instance] = []

    def _expire(self) -> None:
        """Instances idle past the scale-down delay are gone: bill their lives up to it."""
        now, delay = self.env.now, self.spec.scale_down_idle_s
        alive = []
        for inst in self.instances:
            if inst.idle_since is not None and now - inst.idle_since > delay:
                self.reserved_s += inst.idle_since + delay - inst.born
            else:
                alive.append(inst)
        self.instances = alive

    def _pick(self) -> _Instance:
        self._expire()
        free = [i for i in self.instances if i.calls < self.per_instance]
        warm = [i for i in free if i.ready_at <= self.env.now]  # (a Timeout is "triggered" from creation)
        if warm or free:
            return min(warm or free, key=lambda i: i.calls)
        self.cold_starts += 1
        self.request_s += self.spec.cold_start_s  # the cold start a call caused is billed to it
        engine = GenerationEngine(self.env, 20_000 + self.cold_starts, "serverless", self.judge,
                                  self.per_instance, False, None)
        inst = _Instance(engine, self.env.now, self.env.timeout(self.spec.cold_start_s),
                         self.env.now + self.spec.cold_start_s)
        self.instances.append(inst)
        return inst

    def call(self, input_tokens: int) -> Generator[Any, Any, None]:
        with self.slots.request() as slot:
            yield slot
            self.calls += 1
            inst = self._pick()
            inst.calls += 1
            inst.idle_since = None
            req = None
            try:
                yield inst.ready
                if inst.active_since is None:
                    inst.active_since = self.env.now
                yield self.env.timeout(self.spec.per_call_overhead_s)
                req = inst.engine.add(-1 - self.calls, input_tokens, self.output_tokens)
                yield req.done
            except simpy.Interrupt:
                if req is not None:
                    inst.engine.abort(req)
                raise
            finally:
                inst.calls -= 1
                if inst.calls == 0:
                    now = self.env.now
                    if inst.active_since is not None:
                        self.busy_s += now - inst.active_since
                        self.request_s += now - inst.active_since
                        inst.active_since = None
                    inst.idle_since = max(now, inst.ready_at)  # aborted while booting: idle once ready

    def close(self) -> None:
        """Bill the lives of the instances still up when the run ends (idle tails cut at the end)."""
        now, delay = self.env.now, self.spec.scale_down_idle_s
        for inst in self.instances:
            end = now if inst.idle_since is None else min(now, inst.idle_since + delay)
            self.reserved_s += end - inst.born
        self.instances = []
