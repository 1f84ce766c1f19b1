"""What a run measures, independent of the backend that ran it."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

BREAKDOWN_KEYS = ("generation", "env_queue", "env_reset", "env_step", "reward", "train", "weight_sync", "idle")


@dataclass
class StepRecord:
    step: int
    start_s: float
    end_s: float
    breakdown_s: dict[str, float]
    trajectories: int
    tokens: int            # tokens in the trained batch (context incl. responses)
    mean_staleness: float  # mean (n − start version) over the batch
    mean_reward: float | None = None
    env_timeouts: int = 0  # env calls (reset or step, retries included) that timed out during the step
    # the trained batch's responses (a trajectory's generated tokens, every turn): the longest and the
    # mean, so a run shows how long its tail is (the paper's production: the longest ~9x the mean);
    # under --scale-approx, of the batch's simulated subset
    response_tokens_max: int = 0
    response_tokens_mean: float = 0.0
    # the trained batch's trajectories per task (under --scale-approx, of the simulated subset)
    task_trajectories: dict[str, int] = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class RunStats:
    generated_tokens: int = 0    # tokens of the turns that returned (what tokens_per_s counts)
    # the decoded tokens of turns cut short by an abort (redundant or stale): the backend reports them
    # with the abort (Aborted.partial_tokens); aborted turns whose backend could not tell are counted
    # in wasted_unreported (then the run's wasted_tokens is unknown, not 0)
    wasted_tokens: int = 0
    wasted_unreported: int = 0
    env_errors: int = 0          # individual env call errors/timeouts (retried or not)
    env_timeouts: int = 0        # the env call errors that were timeouts
    env_failures: int = 0        # trajectories lost to env failures after retries
    consecutive_failures: int = 0
    # per task: trajectories lost to env failures, env calls timed out, GRPO groups completed and
    # abandoned (refills exhausted); the report names a task whose trained share fell short by them
    env_failures_by_task: Counter[str] = field(default_factory=Counter)
    env_timeouts_by_task: Counter[str] = field(default_factory=Counter)
    groups_completed_by_task: Counter[str] = field(default_factory=Counter)
    groups_abandoned_by_task: Counter[str] = field(default_factory=Counter)
    steps: list[StepRecord] = field(default_factory=list)


# A steady-state figure needs at least this many steps past the warm-up: one step's time is half of
# an alternating pair (a step that trains on an early-finished batch, then one that waits).
STEADY_MIN_STEPS = 2
# The warm-up every steady-state figure leaves out (a run's summary, compare, sweep, plan and
# reproduce alike): the first step, which rolls out a whole batch cold with nothing to overlap (at
# 128 GPUs 2-3x a steady step of an asynchronous mode). Measured (benchmarks/planner_horizon.py):
# past it 4 steps of a paper plan come within a few % of the long run, where the whole run's rate is
# up to 30 % low. Leaving out the 1 + α pipeline-fill steps as well (the batches admitted at version
# 0) erred more, not less: on reproduce's throughput plans, 10 steps against the last 12 of 24, a
# ROLLART ÷ AReaL-style or ÷ Sync ratio was off by 5.6 % on average against 4.5 % (--only modes).
START_UP_STEPS = 1
# pairs of steady steps (eight steps) the rate's standard error needs (:func:`rate_standard_error`): from two
# it scatters 0.08-4x the seed-to-seed spread (default scenario, 16 seeds)
SE_MIN_PAIRS = 4
# From this share of an overlapping run's step spent training (on the critical path) on, the trainer sets the
# pace and faster rollout cannot shorten the step much; below it the trainer waits for batches, so the rollout
# does (reproduce's bound notes, plan's bottleneck line).
TRAINER_BOUND = 0.8
# A run whose steps after the first 1 + α wait on the weights this share of their time or more is bound
# by the weight transfer (a slow cross-cluster link): there steps 1..α run ahead on the version the
# engines already hold (the window lets them lag α versions) and only then does each step wait for its
# weights, so those α steps are warm-up too. At 1 Gbps the default scenario reads 85, 45, then ~220 s
# steps, 60 % of them waiting; the paper plans at 200 Gbps wait at most 5 % of a step.
WEIGHT_BOUND_SHARE = 0.2


def warmup_steps(steps: list[StepRecord], alpha: int) -> int:
    """The steps a steady-state figure leaves out: :data:`START_UP_STEPS`, or 1 + α when the run is
    bound by the weight transfer (its later steps wait on the weights :data:`WEIGHT_BOUND_SHARE` of
    their time or more)."""
    later = steps[1 + alpha:] if alpha > 0 else []
    span = sum(s.time_s for s in later)
    waiting = sum(s.breakdown_s.get("weight_sync", 0.0) for s in later)
    return 1 + alpha if span > 0 and waiting >= WEIGHT_BOUND_SHARE * span else START_UP_STEPS


def steady_window(steps: list[StepRecord], warmup: int = START_UP_STEPS) -> tuple[list[StepRecord], bool]:
    """The steady-state steps and whether the run reached them: those after the first ``warmup``
    when at least :data:`STEADY_MIN_STEPS` remain (True); else, as the best a short run has, those
    after the first step when at least two, else all (False)."""
    if len(steps) - warmup >= STEADY_MIN_STEPS:
        return steps[warmup:], True
    return (steps[1:] if len(steps) >= 2 else steps), False


def rate_standard_error(window: list[StepRecord]) -> float | None:
    """Standard error of the rate R = Σ nᵢ / Σ tᵢ over a run's steps, by batch means over pairs of consecutive
    steps (an odd last step joins the last pair): the ratio estimator's √(k/(k−1) · Σ (n_b − R·t_b)²) / Σ t_b
    over k batches b of n_b trajectories in t_b seconds. Pairs, because an asynchronous run's steps alternate
    (a step that trains on an early-finished batch, then one that waits): single steps swing far more than
    their sum. Measured on the default scenario over 12 seeds it is 0.83-1.86x the seed-to-seed spread of the
    rate at 9 steps and 1.1-2.2x at 20 (mean 1.3x, 1.6x): an upper estimate more often than not; from fewer
    batches it scatters (two pairs: 0.08-4x over 16 seeds), so it needs :data:`SE_MIN_PAIRS`. None below that."""
    batches = [(a.trajectories + b.trajectories, b.end_s - a.start_s) for a, b in zip(window[::2], window[1::2])]
    if len(window) % 2 and batches:  # the odd last step: into the last batch, not dropped
        n, t = batches[-1]
        batches[-1] = (n + window[-1].trajectories, t + window[-1].time_s)
    total = sum(t for _, t in batches)
    if len(batches) < SE_MIN_PAIRS or total <= 0:
        return None
    k, rate = len(batches), sum(n for n, _ in batches) / total
    dev2 = sum((n - rate * t) ** 2 for n, t in batches)
    return math.sqrt(k / (k - 1) * dev2) / total


def steady_state(steps: list[StepRecord], warmup: int = START_UP_STEPS) -> dict[str, Any]:
    """Rates over the steady-state steps (:func:`steady_window`): trajectories and trained tokens per
    second over their span, their mean step time and breakdown, their trajectories' mean staleness, the first
    of them and how many;
    ``settled`` False when the run was too short to pass the warm-up, and ``steps_needed`` the run
    length that would."""
    window, settled = steady_window(steps, warmup)
    span = window[-1].end_s - window[0].start_s if window else 0.0
    trajectories = sum(s.trajectories for s in window)
    rate = trajectories / span if span > 0 else 0.0
    return {
        "settled": settled,
        "from_step": window[0].step if window else 0,
        "steps": len(window),
        "steps_needed": warmup + STEADY_MIN_STEPS,
        "trajectories_per_s": rate,
        "trajectories_per_s_se": rate_standard_error(window),
        "trained_tokens_per_s": sum(s.tokens for s in window) / span if span > 0 else 0.0,
        "step_time_s_mean": sum(s.time_s for s in window) / len(window) if window else 0.0,
        "breakdown_s_mean": {k: sum(s.breakdown_s.get(k, 0.0) for s in window) / len(window) if window else 0.0
                             for k in BREAKDOWN_KEYS},
        # how stale the trajectories these rates count were: the cold first step trains fresh ones only, so
        # the whole run's mean understates a wide window's steady lag (α 2: 1.25 over 4 steps, 2.0 a step)
        "mean_staleness": sum(s.mean_staleness * s.trajectories for s in window) / trajectories
        if trajectories else 0.0,
    }


def critical_path_breakdown(segments: list[tuple[float, float, str]], start: float, end: float) -> dict[str, float]:
    """Attribute the interval [start, end] to the categories of the given (non-overlapping)
    segments; whatever they do not cover is 'idle'."""
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    covered = 0.0
    for s, e, cat in segments:
        lo, hi = max(s, start), min(e, end)
        if hi > lo:
            out[cat] = out.get(cat, 0.0) + (hi - lo)
            covered += hi - lo
    out["idle"] += max(0.0, (end - start) - covered)
    return out


def awaited_on_path(segments: list[tuple[float, float, str]], start: float, end: float,
                    awaited: list[list[float | None]], now: float) -> float:
    """Seconds of [start, end] that the segments leave uncovered (the critical path's idle) and that
    fall inside an ``awaited`` span ([t0, t1], t1 None: still open at ``now``)."""
    spans = sorted((max(a, start), min(now if b is None else b, end)) for a, b in awaited)
    spans = [(a, b) for a, b in spans if b > a]
    if not spans:
        return 0.0
    covered = sorted((max(s, start), min(e, end)) for s, e, _ in segments if e > start and s < end)
    total = 0.0
    for a, b in spans:
        t = a
        for s, e in covered:
            if e <= t:
                continue
            if s >= b:
                break
            if s > t:
                total += s - t
            t = max(t, e)
            if t >= b:
                break
        if t < b:
            total += b - t
    return total

