"""Host contention: virtual devices that share one host's CPU cores.

On a GPU cluster every engine and trainer has its own device. In a CPU run (``rollart run`` with
``runtime.pools`` of CPU "virtual devices", and ``rollart validate``) they are threads of one
host: when more of them compute at once than the host runs in parallel, each goes slower. With
``k`` busy compute actors (engines with work, the trainer while it trains) on a host that runs
``P`` of them in parallel (measured by ``rollart validate``)::

    slowdown(k) = max(1, k / P) / max(1, k_ref / P)

relative to the ``k_ref`` actors that were busy while the actor's own profile was measured
(engines are profiled side by side, the trainer alone). The run's driver and env workers are
load too: each effect of the core costs them ``effect_cpu_s`` of CPU (measured), so at an
effect rate ``r`` (a moving average over ``tau_s``) they add ``L = effect_cpu_s · r`` cores::

    slowdown = max(1, (k + L) / P) / max(1, k_ref / P)

An engine re-plans when its slowdown changes by more than ``REPLAN_STEP`` (its iteration in
progress finishes at the old speed); a training step takes the slowdown of its start.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

from rollart.sim.costs.gpu import DecodeLine, EnvelopeLine

if TYPE_CHECKING:  # pragma: no cover
    from rollart.sim.engine import GenerationEngine


class ScaledGeneration:
    """A generation cost model whose step times are multiplied by ``factor``."""

    def __init__(self, cost: Any):
        self.inner = cost
        self._factor = 1.0
        self._lines: dict[int, DecodeLine | EnvelopeLine] = {}  # per batch, at the current factor

    def __getattr__(self, name: str) -> Any:  # kv_capacity_tokens, source, request_overhead_s…
        return getattr(self.inner, name)

    @property
    def factor(self) -> float:
        return self._factor

    @factor.setter
    def factor(self, value: float) -> None:
        # the driver's load makes the factor continuous: keep only the current factor's lines
        if value != self._factor:
            self._factor = value
            self._lines.clear()

    def decode_line(self, batch: int) -> DecodeLine | EnvelopeLine:
        line = self._lines.get(batch)
        if line is None:
            line = self._lines[batch] = self.inner.decode_line(batch).scaled(self._factor)
        return line

    def prefill_time(self, new_tokens: int, attention_pairs: float, sequences: int = 0) -> float:
        return self.inner.prefill_time(new_tokens, attention_pairs, sequences) * self.factor

    def mixed_step_time(self, new_tokens: int, attention_pairs: float, decode_batch: int,
                        decode_context: float, sequences: int = 0) -> float:
        return self.inner.mixed_step_time(new_tokens, attention_pairs, decode_batch, decode_context,
                                          sequences) * self.factor


def slowdown(k: float, parallelism: float) -> float:
    """``max(1, k / P)``: how much slower each of ``k`` busy actors runs on a host that runs
    ``P`` of them at full speed."""
    return max(1.0, k / max(1.0, parallelism))


REPLAN_STEP = 0.02  # re-plan engines when the background load moves their slowdown by 2 %


class HostContention:
    def __init__(self, parallelism: float, engine_ref: int, trainer_ref: int = 1, effect_cpu_s: float = 0.0,
                 tau_s: float = 0.1, clock: Callable[[], float] = lambda: 0.0):
        self.parallelism = max(1.0, float(parallelism))
        self.engine_ref, self.trainer_ref = engine_ref, trainer_ref
        self.engines: list["GenerationEngine"] = []
        # the trainer's jobs on this host (a training step, a weight transfer): each one counts as a
        # busy actor, and in the simulator they may overlap (a publish still running when the next
        # step starts)
        self.trainer_jobs = 0
        self.effect_cpu_s, self.tau_s, self.clock = float(effect_cpu_s), float(tau_s), clock
        self._rate, self._rate_at = 0.0, 0.0  # effects per second, as of time _rate_at
        self._applied = 1.0                    # the engine slowdown the engines last planned with

    def _load(self, k: float) -> float:
        return slowdown(k, self.parallelism)

    def _rate_now(self) -> float:
        return self._rate * math.exp(-(self.clock() - self._rate_at) / self.tau_s)

    def background_cores(self) -> float:
        """Cores the driver and env workers use at the current effect rate."""
        return self.effect_cpu_s * self._rate_now() if self.effect_cpu_s > 0 else 0.0

    def _busy(self) -> int:
        return sum(1 for e in self.engines if e.busy) + self.trainer_jobs

    def engine_factor(self) -> float:
        return self._load(self._busy() + self.background_cores()) / self._load(self.engine_ref)

    def trainer_factor(self) -> float:
        """The slowdown a training step starting now runs at (the trainer counted as busy)."""
        k = self._busy() + 1 + self.background_cores()
        return self._load(k) / self._load(self.trainer_ref)

    def note_effect(self) -> None:
        """The core issued an effect: update the rate, and re-plan the engines when the slowdown
        it implies moved by more than ``REPLAN_STEP``."""
        if self.effect_cpu_s <= 0:
            return
        self._rate, self._rate_at = self._rate_now() + 1.0 / self.tau_s, self.clock()
        if abs(self.engine_factor() / self._applied - 1.0) > REPLAN_STEP:
            self.changed()

    def changed(self, source: "GenerationEngine | None" = None) -> None:
        """Someone became busy or idle: every engine takes the new slowdown; ``source`` (about
        to plan with it) only has its factor set."""
        f = self._applied = self.engine_factor()
        for e in self.engines:
            if e is source:
                e.cost.factor = f
            else:
                e.set_slowdown(f)

    def trainer_job(self, started: bool) -> None:
        """A training step or a weight transfer started (``True``) or ended on this host."""
        self.trainer_jobs += 1 if started else -1
        self.changed()
