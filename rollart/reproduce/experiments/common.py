"""What every experiment shares: the paper's base scenarios, the modes, the steady-state note and
the notes on which side bounds a step."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Iterable

from rollart.core.modes import mode_config
from rollart.plan.schema import Plan, env_managers_of
from rollart.reproduce.figures import (TRAINER_BOUND, breakdown_mean, failed, fp, mean, ratio, steady, throughput,
                                      train_share)
from rollart.reproduce.model import Outcome, Variant

B8, B14, B32 = "paper/qwen3-8b-128gpu", "paper/qwen3-14b-128gpu", "paper/qwen3-32b-128gpu"
BASES = {"Qwen3-8B": B8, "Qwen3-14B": B14, "Qwen3-32B": B32}
EXP = "paper/experiments/"
MODES = ("sync", "sync+", "one-off", "areal", "rollart")
MODE_LABEL = {"sync": "Sync", "sync+": "Sync+", "one-off": "One-off", "areal": "AReaL-style", "rollart": "ROLLART"}

STEADY_NOTE = ("Steady state = the steps after the first, which rolls out a whole batch cold with nothing to "
               "overlap: the rule of `rollart simulate`'s steady-state line, `compare`, `sweep` and `plan` "
               "(`core/stats.steady_window`).")
TIME_TO_SCORE_CAVEAT = ("The paper's 32B figures (2.05× Sync+, 1.35× One-off, 1.31× AReaL) are *time to reach a "
                        "score of 0.85*, not throughput: they also depend on how many steps each method needs, "
                        "which staleness changes. The simulator models time, not learning, so it can only give "
                        "throughput ratios; they are shown beside the paper's time-to-score ratios for orientation, "
                        "not as the same quantity.")


def _find(outs: list[Outcome], **params: Any) -> Outcome | None:
    for o in outs:
        if all(o.variant.params.get(k) == v for k, v in params.items()):
            return o
    return None


# Experiments whose variants differ by a few %, as much as one seed's draws (env latencies, response
# lengths, failures) move a run, run each variant at these seeds and read the means (core.ties.paired_margin).
SEEDS = (0, 1, 2)


def seeded(variant: Variant) -> tuple[Variant, ...]:
    """``variant`` at each of :data:`SEEDS` (``params["seed"]``; the scenario's own seed is 0)."""
    return tuple(replace(variant, label=variant.label + (f" (seed {s})" if s else ""),
                         overrides=variant.overrides + ((f"algorithm.seed={s}",) if s else ()),
                         params={**variant.params, "seed": s}) for s in SEEDS)


def _seed_runs(outs: list[Outcome], **params: Any) -> dict[int, Outcome]:
    """The runs of one seeded variant, by seed."""
    return {s: o for s in SEEDS if (o := _find(outs, **params, seed=s)) is not None}


def finite_mean(xs: Iterable[float]) -> float:
    """Over the seeds that gave the figure (a failed run gives NaN); NaN when none did."""
    return mean(x for x in xs if math.isfinite(x))


def seed_figures(outs: list[Outcome], figure: Callable[[Outcome], float], **params: Any) -> dict[int, float]:
    """``figure`` by seed of a seeded variant; {SEEDS[0]: its one run's} for a variant run once."""
    runs = _seed_runs(outs, **params)
    if runs:
        return {s: figure(o) for s, o in runs.items()}
    o = _find(outs, **params)
    return {SEEDS[0]: figure(o)} if o is not None else {}


def seed_throughputs(outs: list[Outcome], **params: Any) -> dict[int, float]:
    """Throughput by seed (:func:`seed_figures` of :func:`~rollart.reproduce.figures.throughput`)."""
    return seed_figures(outs, throughput, **params)


def mean_throughput(outs: list[Outcome], **params: Any) -> float:
    """A variant's throughput, the mean over its seeds (:func:`seed_throughputs`)."""
    return finite_mean(seed_throughputs(outs, **params).values())


def _failures(outs: list[Outcome]) -> list[str]:
    return [f"`{o.variant.label}`: {failed(o)}" for o in outs if failed(o)]


# ---- which side bounds the step: when the trainer does, more rollout hardware cannot help

BOUND_RULE = f"trainer-bound: the train step is at least {fp(TRAINER_BOUND)} of the step's critical path"


def _bound_note(parts: list[str]) -> list[str]:
    """The note that says, per run or pair, which side bounds the step (none without parts)."""
    return [f"Which side bounds the step ({BOUND_RULE}): " + "; ".join(parts) + "."] if parts else []


def _side(o: Outcome | None) -> str:
    """'trainer-bound (93 %)', 'rollout-bound (40 %)', or 'unknown' for a run without steps."""
    s = train_share(o) if o is not None else math.nan
    if not math.isfinite(s):
        return "unknown (no steps)"
    return f"{'trainer' if s >= TRAINER_BOUND else 'rollout'}-bound ({fp(s)})"


def _train_s(o: Outcome) -> float:
    return breakdown_mean(steady(o), "train")


def _tokens_per_traj(o: Outcome) -> float:
    """Trained tokens per trajectory over the steady steps: on one trainer, what makes train steps differ."""
    recs = steady(o)
    return ratio(sum(r.tokens for r in recs), sum(r.trajectories for r in recs))


def _same_trainer(outs: list[Outcome]) -> str:
    """'; both train on the same 64 H800' when every run's plan has the same trainer, else '' (a
    run without a plan, or different trainers: then the claim cannot be read from the runs)."""
    if any(o.plan is None for o in outs):
        return ""
    ts = {(o.plan.placement.trainer.gpus, o.plan.placement.trainer.pool) for o in outs}
    if len(ts) != 1:
        return ""
    (gpus, pool), = ts
    return f"; {'both' if len(outs) == 2 else 'all'} train on the same {gpus} {pool.upper()}"


def env_managers(plan: Plan, mode: str | None) -> int:
    """The env managers ``mode`` rolls out with on ``plan`` (the scheduler's count)."""
    a = plan.algorithm
    return env_managers_of(a.env_managers, plan.groups_per_batch, a.group_size, mode_config(plan, mode).redundancy)


def conversations_per_worker(o: Outcome | None) -> float:
    """Trajectories in flight per rollout worker at most: the plan's env managers over its workers
    (every worker of a colocated plan serves conversations end to end)."""
    if o is None or o.plan is None:
        return math.nan
    return ratio(env_managers(o.plan, o.variant.mode), sum(g.workers for g in o.plan.placement.generation))
