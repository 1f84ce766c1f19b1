"""Figures computed from a variant's step records (shared by the analyses and the plots)."""

from __future__ import annotations

import math
from typing import Callable, Iterable

from rollart.core import stats
from rollart.core.stats import TRAINER_BOUND, StepRecord
from rollart.reproduce.model import Outcome

NA = "—"


def steady(o: Outcome) -> list[StepRecord]:
    """The steady-state steps: those the run's own summary reads (its ``steady.from_step``: past the
    cold first step, or past 1 + α in a run bound by the weight transfer, :func:`rollart.core.stats.
    warmup_steps`); past the first step for a run without one."""
    first = (o.summary.get("steady") or {}).get("from_step")
    if first is None:
        return stats.steady_window(o.records)[0]
    return [r for r in o.records if r.step >= first]


def busy_share(o: Outcome) -> float | None:
    """The dedicated judges' busy share over the steps the step time is read over (the steady window);
    a result without that figure (written before it existed): over the whole run."""
    steady = o.summary.get("reward_gpu_busy_steady_fraction")
    return steady if steady is not None else o.summary.get("reward_gpu_busy_fraction")


def mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan


def step_s(o: Outcome, recs: list[StepRecord] | None = None) -> float:
    recs = steady(o) if recs is None else recs
    return mean(r.time_s for r in recs)


def _steady_rate(o: Outcome, count: Callable[[StepRecord], float]) -> float:
    """``count`` summed over the steady-state steps (all steps when only one) per second of their span."""
    recs = steady(o)
    if not recs:
        return math.nan
    span = recs[-1].end_s - recs[0].start_s
    return sum(count(r) for r in recs) / span if span > 0 else math.nan


def throughput(o: Outcome) -> float:
    """Trajectories per second over the steady-state steps (all steps when only one)."""
    return _steady_rate(o, lambda r: r.trajectories)


def token_throughput(o: Outcome) -> float:
    """Trained tokens per second over the same steps as :func:`throughput`: redundant rollout trains the
    shorter trajectories of each step, so a mode's lead in trajectories can exceed its lead in work."""
    return _steady_rate(o, lambda r: r.tokens)


def rollout_s(r: StepRecord) -> float:
    """A step's time minus what the trainer did itself (train step, exposed weight sync)."""
    return r.time_s - r.breakdown_s.get("train", 0.0) - r.breakdown_s.get("weight_sync", 0.0)


def share(r: StepRecord, *keys: str) -> float:
    return sum(r.breakdown_s.get(k, 0.0) for k in keys) / r.time_s if r.time_s > 0 else math.nan


def breakdown_mean(recs: list[StepRecord], key: str) -> float:
    return mean(r.breakdown_s.get(key, 0.0) for r in recs)



def train_share(o: Outcome) -> float:
    """Mean share of the steady steps' time that is the train step (NaN without records)."""
    return mean(share(r, "train") for r in steady(o))


def wait_share(o: Outcome | None) -> float:
    """Mean share of the steady steps' time the trainer spends waiting in ``get_batch``: the step
    minus its own train step and exposed weight sync (:func:`rollout_s`). With a disaggregated
    trainer this is the share of the step its GPUs sit idle (NaN without records)."""
    if o is None:
        return math.nan
    return mean(rollout_s(r) / r.time_s for r in steady(o) if r.time_s > 0)


def response_tail(o: Outcome | None) -> float:
    """Mean over the steady steps of the trained batch's longest response ÷ its mean response (a
    trajectory's generated tokens, every turn): how long the tail the trainer waits for is (NaN
    without records, or from records that carry no response lengths)."""
    if o is None:
        return math.nan
    tails = [r.response_tokens_max / r.response_tokens_mean for r in steady(o) if r.response_tokens_mean > 0]
    return mean(tails) if tails else math.nan


def trainer_bound(o: Outcome | None) -> bool:
    return o is not None and train_share(o) >= TRAINER_BOUND  # NaN compares False


def ratio(a: float, b: float) -> float:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return math.nan
    return a / b


# ---- formatting -----------------------------------------------------------------------


def fs(x: float | None, digits: int = 1) -> str:
    """Seconds (or any plain number)."""
    if x is None or not math.isfinite(x):
        return NA
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def fx(x: float | None, digits: int = 2) -> str:
    """A ratio, e.g. 1.23×."""
    if x is None or not math.isfinite(x):
        return NA
    return f"{x:.{digits}f}×"


def fp(x: float | None, digits: int = 0) -> str:
    """A fraction as a percentage."""
    if x is None or not math.isfinite(x):
        return NA
    return f"{100 * x:.{digits}f} %"


def fr(x: float | None) -> str:
    """A rate in trajectories per second."""
    if x is None or not math.isfinite(x):
        return NA
    return f"{x:.3f}"


def busy(o: Outcome) -> str:
    b = o.summary.get("gpu_busy_fraction") or {}
    return " · ".join(f"{pool} {x:.0%}" for pool, x in b.items()) or NA


def failed(o: Outcome) -> str:
    """A short marker for a variant whose run failed or stopped early."""
    if o.result is None:
        return f"failed: {o.error}"
    if o.error:
        return f"stopped early ({len(o.records)}/{o.steps} steps): {o.error}"
    return ""
