"""What a run costs: placed GPUs and env CPU cores for the run's wall time, plus billed
serverless GPU-seconds, priced with the plan's ``prices`` table.

* GPUs are counted as *placed*: the trainer's GPUs, generation workers × tp and dedicated
  reward GPUs (``placement.reward.gpus``), each at its pool's GPU-type price. GPUs of a pool
  that the placement leaves unused are not charged (a planner's plan buys only what it places).
  Reward GPUs are placed only when the run's mode sends the LLM judge to them
  (:func:`dedicated_reward_used`): a mode that scores on the serverless platform leaves them
  out, so they are neither billed nor counted (pass the run's ``mode``; without one, a plan-only
  check counts them, the most the plan can place).
* CPU cores: every core of the plan's CPU pools, for the whole run (env pools are provisioned,
  not billed per call). A plan that writes no ``cluster.cpu_pools`` gets the schema's default pool
  (``CpuPool(cores=4096)``), which it never asked for: a run bills that implicit pool by the most
  cores its envs held at once (``run_cost(cpu_held=...)``), and the report says so; a pool the plan
  wrote is billed whole. A check before simulating (``hourly_fixed_usd``) knows no peak and counts
  the whole default pool, an upper bound.
* Serverless reward: the GPU-seconds the platform billed, at its GPU type's hourly price × the
  serverless premium (``Prices.serverless_gpu_second_price``).

``cost_usd_per_hour`` is the run's total cost over its wall time, so it includes the serverless
spend averaged over the run; ``hourly_fixed_usd`` (GPUs + CPUs only) is what a budget in
US$/hour can be checked against before simulating.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from rollart.core.modes import ModeConfig, dedicated_reward_used
from rollart.plan.loader import PlanError
from rollart.plan.schema import Plan


def gpus_placed(plan: Plan, mode: ModeConfig | None = None) -> dict[str, int]:
    """GPUs each pool gives the placement (trainer + generation workers × tp + reward; colocated
    trainer and engines share theirs): ``Placement.gpus_by_pool``, less the reward GPUs when the
    run's ``mode`` scores on the serverless platform (:func:`dedicated_reward_used`)."""
    used = plan.placement.gpus_by_pool()
    r = plan.placement.reward
    if r.gpus and r.pool is not None and not dedicated_reward_used(plan, mode):
        used[r.pool] -= r.gpus
        if used[r.pool] <= 0:  # a pool that held only the judges is not placed at all
            del used[r.pool]
    return used


def unplaced_gpu_notes(plan: Plan) -> list[str]:
    """One line per pool whose ``count`` is more GPUs than the placement gives a role there: the cost counts
    placed GPUs only, so a buyer pricing a pool of 16 that the placement fills with 8 reads the price of 8
    (helper-93). Dedicated judges the run does not use count as placed here: ``unused_settings`` names them."""
    placed = plan.placement.gpus_by_pool()
    notes = []
    for name, spec in plan.cluster.gpu_pools.items():
        spare = spec.count - placed.get(name, 0)
        if spare > 0:
            notes.append(f"cluster.gpu_pools.{name}.count={spec.count}: the placement uses {placed.get(name, 0)}; "
                         f"the other {spare} {'is' if spare == 1 else 'are'} neither used nor billed (the cost "
                         "counts placed GPUs)")
    return notes


def gpus_placed_by_type(plan: Plan, mode: ModeConfig | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for pool, n in gpus_placed(plan, mode).items():
        gpu = plan.cluster.gpu_pools[pool].gpu
        out[gpu] = out.get(gpu, 0) + n
    return out


def cpu_cores(plan: Plan) -> int:
    return sum(p.cores for p in plan.cluster.cpu_pools.values())


def implicit_cpu_pool(plan: Plan) -> bool:
    """Whether the plan's CPU pools are the schema's default: the plan wrote no ``cluster.cpu_pools``."""
    return "cpu_pools" not in plan.cluster.model_fields_set


def cpu_cores_billed(plan: Plan, cpu_held: Mapping[str, float] | None = None) -> float:
    """CPU cores a run pays for: every core of the plan's pools; for the implicit default pool
    (:func:`implicit_cpu_pool`) with the run's ``cpu_held`` (per pool, the most cores its envs held at
    once) known, those cores, whole."""
    if cpu_held is None or not implicit_cpu_pool(plan):
        return float(cpu_cores(plan))
    return float(sum(math.ceil(cpu_held.get(pool, 0.0) - 1e-9) for pool in plan.cluster.cpu_pools))


def missing_prices(plan: Plan, mode: ModeConfig | None = None) -> list[str]:
    """One ``prices.gpu_usd_per_hour.<type>: ...`` line per placed GPU type without a price."""
    out = []
    for pool, n in gpus_placed(plan, mode).items():
        gpu = plan.cluster.gpu_pools[pool].gpu
        if n and plan.prices.gpu_price(gpu) is None:
            out.append(f"prices.gpu_usd_per_hour.{gpu}: no price for GPU type '{gpu}' (pool '{pool}'); "
                       f"add one, e.g. --set prices.gpu_usd_per_hour.{gpu}=2.0")
    s = plan.cluster.serverless
    scored_there = mode is None or mode.serverless_reward  # a run on dedicated judges bills no GPU-second
    if s is not None and scored_there and plan.llm_judged_tasks and serverless_price(plan) is None:
        out.append(f"prices.gpu_usd_per_hour.{s.gpu}: no price for GPU type '{s.gpu}' (cluster.serverless.gpu), "
                   "which serverless GPU-seconds are priced from; add one, or set prices.serverless_usd_per_gpu_second")
    return out


def serverless_price(plan: Plan) -> float | None:
    """US$ per billed GPU-second of the plan's serverless platform; None without one, or without a
    price for its GPU type."""
    s = plan.cluster.serverless
    return None if s is None else plan.prices.serverless_gpu_second_price(s.gpu)


def require_prices(plan: Plan, mode: ModeConfig | None = None) -> None:
    """Raise a :class:`PlanError` when a cost is asked for but a placed GPU type has no price."""
    problems = missing_prices(plan, mode)
    if problems:
        raise PlanError(problems)


def hourly_fixed_usd(plan: Plan, mode: ModeConfig | None = None) -> float:
    """US$/hour of the placed GPUs and the env CPU cores (no serverless: that depends on the run).
    Without ``mode`` (a budget check before simulating) dedicated reward GPUs count whenever the
    plan sets them: an upper bound for a mode that scores on the serverless platform."""
    require_prices(plan, mode)
    gpu = sum(n * (plan.prices.gpu_price(t) or 0.0) for t, n in gpus_placed_by_type(plan, mode).items())
    return gpu + cpu_cores(plan) * plan.prices.cpu_core_usd_per_hour


@dataclass(frozen=True)
class RunCost:
    total_usd: float
    per_step_usd: float
    per_1k_trajectories_usd: float
    usd_per_hour: float
    gpu_usd: float
    cpu_usd: float
    serverless_usd: float
    cpu_cores_billed: float = 0.0  # the CPU cores billed for the run's wall time
    cpu_billed_at_peak: bool = False  # the implicit default pool, billed by the most cores held at once


def run_cost(plan: Plan, wall_s: float, steps: int, trajectories: int, serverless_gpu_s: float,
             mode: ModeConfig | None = None, cpu_held: Mapping[str, float] | None = None) -> RunCost:
    """Cost of a run in ``mode`` that took ``wall_s`` seconds for ``steps`` steps and ``trajectories``
    trained trajectories. Per-step / per-1k figures are 0 when nothing finished. ``mode`` None: the
    plan's own ``algorithm.mode`` (this is a run, so its reward GPUs are billed only if it uses them).
    ``cpu_held``: per CPU pool, the most cores the run's envs held at once; a plan that wrote no
    ``cluster.cpu_pools`` pays for those instead of the default pool's every core."""
    if mode is None:
        from rollart.core.modes import mode_config

        mode = mode_config(plan)
    require_prices(plan, mode)
    hours = max(wall_s, 0.0) / 3600.0
    gpu = sum(n * (plan.prices.gpu_price(t) or 0.0) for t, n in gpus_placed_by_type(plan, mode).items()) * hours
    billed = cpu_cores_billed(plan, cpu_held)
    cpu = billed * plan.prices.cpu_core_usd_per_hour * hours
    serverless = serverless_gpu_s * (serverless_price(plan) or 0.0)  # no price only where nothing is billed
    total = gpu + cpu + serverless
    return RunCost(
        total_usd=total,
        per_step_usd=total / steps if steps else 0.0,
        per_1k_trajectories_usd=1000.0 * total / trajectories if trajectories else 0.0,
        usd_per_hour=total / hours if hours > 0 else hourly_fixed_usd(plan, mode),
        gpu_usd=gpu, cpu_usd=cpu, serverless_usd=serverless,
        cpu_cores_billed=billed, cpu_billed_at_peak=cpu_held is not None and implicit_cpu_pool(plan),
    )


__all__ = ["RunCost", "cpu_cores", "cpu_cores_billed", "dedicated_reward_used", "implicit_cpu_pool", "gpus_placed", "gpus_placed_by_type", "hourly_fixed_usd",
           "missing_prices", "require_prices", "run_cost", "serverless_price", "unplaced_gpu_notes"]
