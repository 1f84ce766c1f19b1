"""Scale-out approximation: simulate 1/m of a very large cluster, account for the rest by symmetry.

Workers of a generation group are exchangeable under least-loaded routing, env managers of a
task are exchangeable, and the α window, redundancy and group sizes are per group, so a plan
with m times fewer workers in every generation group, m times fewer GRPO groups per batch, env
cores, serverless concurrency and reward GPUs sees the same per-worker load, the same step
time and 1/m of the throughput. What does not shrink is the trainer: its step (and the weight
transfer) is priced on the *full* plan with the simulated batch replicated m times. The result
scales the extensive figures (trajectories, tokens, counts, serverless GPU·s, cost) back by m
and says so in ``summary["scale_approx"]``.

Not for plans where the symmetry does not hold: colocated placement (the engines on the
trainer's GPUs), CPU-host contention (measured profiles), or counts m does not divide.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rollart.plan import Plan, PlanError

MIN_WORKERS = 4   # simulated workers per generation group, at least
MIN_GROUPS = 32   # simulated GRPO groups per batch, at least


def _divisible(plan: Plan, m: int) -> list[str]:
    pl, problems = plan.placement, []
    for i, g in enumerate(pl.generation):
        if g.workers % m:
            problems.append(f"placement.generation.{i}.workers ({g.workers}) is not a multiple of {m}")
    if plan.groups_per_batch % m:
        problems.append(f"algorithm.batch_size: {plan.groups_per_batch} groups per batch is not a multiple of {m}")
    if pl.trainer.gpus % m:
        problems.append(f"placement.trainer.gpus ({pl.trainer.gpus}) is not a multiple of {m}")
    if pl.reward.gpus and pl.reward.gpus % (m * pl.reward.tp):
        problems.append(f"placement.reward.gpus ({pl.reward.gpus}) is not a multiple of {m} × tp")
    return problems


def auto_factor(plan: Plan) -> int:
    """The largest m that keeps ≥ MIN_WORKERS workers per generation group and ≥ MIN_GROUPS groups
    per batch and divides every count (1: no approximation)."""
    gens = plan.placement.generation
    hi = min([g.workers // MIN_WORKERS for g in gens] + [plan.groups_per_batch // MIN_GROUPS])
    for m in range(max(1, hi), 1, -1):
        if not _divisible(plan, m):
            return m
    return 1


def shrink_plan(plan: Plan, m: int) -> Plan:
    """The 1/m plan that is simulated at full detail."""
    if getattr(plan.placement, "colocated", False):
        raise PlanError(["--scale-approx: colocated placement (engines on the trainer's GPUs) is not symmetric "
                         "under the approximation; simulate it in full"])
    problems = _divisible(plan, m)
    if problems:
        raise PlanError([f"--scale-approx {m}: {p}" for p in problems])
    d: dict[str, Any] = plan.model_dump(mode="python", by_alias=True, exclude_none=False)
    pools = d["cluster"]["gpu_pools"]
    for g in d["placement"]["generation"]:
        g["workers"] //= m
    for name, p in pools.items():
        p["count"] = max(1, -(-p["count"] // m))
    for p in d["cluster"]["cpu_pools"].values():
        p["cores"] = max(1, -(-p["cores"] // m))
    if d["cluster"].get("serverless"):
        s = d["cluster"]["serverless"]
        s["max_concurrency"] = max(1, -(-s["max_concurrency"] // m))
    d["placement"]["trainer"]["gpus"] //= m
    if d["placement"]["reward"].get("gpus"):
        d["placement"]["reward"]["gpus"] //= m
    d["algorithm"]["batch_size"] //= m
    try:
        return Plan.model_validate(d)
    except Exception as exc:  # pydantic's error: one line naming the first field
        raise PlanError([f"--scale-approx {m}: the 1/{m} plan is not valid ({str(exc).splitlines()[0]})"]) from None


_EXTENSIVE = ("aborted_stale", "aborted_redundant", "env_failures", "env_call_errors", "routed_fallback",
              "serverless_gpu_seconds", "serverless_cold_starts", "tokens_per_s")


def scale_result(result: Any, full_plan: Plan, m: int, simulated_plan: Plan) -> Any:
    """The simulated 1/m result as the full plan's: extensive figures × m, cost on the full plan."""
    from rollart.report import summary_from_steps
    from rollart.sim.costs.price import missing_prices, run_cost

    steps = [dataclasses.replace(s, trajectories=s.trajectories * m, tokens=s.tokens * m,
                                 env_timeouts=s.env_timeouts * m) for s in result.steps]
    summary = dict(result.summary)
    summary.update(summary_from_steps(steps))
    for key in _EXTENSIVE:
        if summary.get(key) is not None:
            summary[key] = summary[key] * m
    summary["trajectories"] = {k: v * m for k, v in summary["trajectories"].items()}
    if not missing_prices(full_plan) and steps:
        cost = run_cost(full_plan, steps[-1].end_s, len(steps), sum(s.trajectories for s in steps),
                        summary["serverless_gpu_seconds"])
        summary.update({"cost_per_step_usd": cost.per_step_usd,
                        "cost_per_1k_trajectories_usd": cost.per_1k_trajectories_usd,
                        "cost_usd_per_hour": cost.usd_per_hour})
    gens = simulated_plan.placement.generation
    summary["scale_approx"] = {
        "factor": m,
        "note": (f"scale-out approximation: simulated 1/{m} of the cluster in full detail "
                 f"({sum(g.workers for g in gens)} of {sum(g.workers for g in full_plan.placement.generation)} "
                 f"generation workers, batch {simulated_plan.algorithm.batch_size} of "
                 f"{full_plan.algorithm.batch_size}); the trainer and weight transfer priced on the full plan, "
                 f"counts and throughput × {m}"),
    }
    return dataclasses.replace(result, steps=steps, summary=summary, scenario=full_plan.name)
