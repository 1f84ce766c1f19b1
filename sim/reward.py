"""Reward placement: rule checks in-process, an LLM judge on dedicated GPUs (queued on
continuous-batching engines) or on an autoscaling serverless platform."""

from __future__ import annotations

from typing import Any, Generator

import simpy

from rollart.plan.schema import Serverless
from rollart.sim.costs.gpu import GenerationCost

RULE_REWARD_S = 0.005           # a regex / unit-test style check on the CPU
JUDGE_MAX_INPUT_TOKENS = 32768  # the judge reads the whole trajectory, up to its 32K context (Qwen2.5-7B)


def judge_input_tokens(context_tokens: int) -> int:
    """An LLM judge scores the whole trajectory (prompt, every turn, the answer), so its prompt is
    the trajectory's context, cut only at the judge's own context window."""
    return min(context_tokens, JUDGE_MAX_INPUT_TOKENS)


class ServerlessPlatform:
    """Instances start cold (``cold_start_s``), serve one call at a time, stay warm until idle
    for ``scale_down_idle_s`` and scale to zero; at most ``max_concurrency`` exist. Each call
    pays ``per_call_overhead_s`` plus the judge's single-request time on the platform GPU.
    Billing is per request: each call's time on an instance plus the cold starts it caused
    (the pay-per-use model of serverless GPU functions); a warm instance's idle time is the
    platform's, not the caller's. ``reserved_s`` keeps the instance-lifetime figure (cold
    start until scale-down) for comparison."""

    def __init__(self, env: simpy.Environment, spec: Serverless, judge: GenerationCost, output_tokens: int):
        self.env = env
        self.spec = spec
        self.judge = judge
        self.output_tokens = output_tokens  # the verdict each call writes (placement.reward.output_tokens)
        self.slots = simpy.Resource(env, capacity=spec.max_concurrency)
        self._idle: list[float] = []   # idle-since times of warm instances
        self.cold_starts = 0
        self.calls = 0
        self.busy_s = 0.0
        self.billed_s = 0.0     # per request: call time + cold starts
        self.reserved_s = 0.0   # instance lifetimes: cold start until scale-down (idle tails included)

    def call_time(self, input_tokens: int) -> float:
        prefill = self.judge.prefill_time(input_tokens, input_tokens * input_tokens / 2)
        decode = self.judge.decode_line(1).total(input_tokens, 1, self.output_tokens)
        return self.spec.per_call_overhead_s + prefill + decode

    def _take_warm(self) -> bool:
        now = self.env.now
        # Instances idle longer than the scale-down delay are gone; bill their idle tail.
        alive = []
        for t in self._idle:
            if now - t <= self.spec.scale_down_idle_s:
                alive.append(t)
            else:
                self.reserved_s += self.spec.scale_down_idle_s
        self._idle = alive
        if self._idle:
            t = self._idle.pop()  # most recently used: warmest
            self.reserved_s += now - t
            return True
        return False

    def call(self, input_tokens: int) -> Generator[Any, Any, None]:
        with self.slots.request() as slot:
            yield slot
            self.calls += 1
            start, t0 = self.env.now, None
            try:
                if not self._take_warm():
                    self.cold_starts += 1
                    yield self.env.timeout(self.spec.cold_start_s)
                t0 = self.env.now
                yield self.env.timeout(self.call_time(input_tokens))
            finally:
                # Also when the caller is aborted: the instance worked (and is billed) until now
                # and stays warm for the next call.
                self.billed_s += self.env.now - start
                self.reserved_s += self.env.now - start
                if t0 is not None:
                    self.busy_s += self.env.now - t0
                self._idle.append(self.env.now)

    def close(self) -> None:
        """Bill the idle tails of instances still warm when the run ends."""
        for t in self._idle:
            self.reserved_s += min(self.spec.scale_down_idle_s, self.env.now - t)
        self._idle = []
