"""A plan that writes no ``cluster.cpu_pools`` gets the schema's default pool (4,096 cores) it never asked
for: a run bills that implicit pool by the most cores its envs held at once, and says so; a pool the
plan wrote is billed whole (a review found the default pool's every core billed: $37/h → $196/h)."""

from __future__ import annotations

import pytest

from rollart.plan import plan_from_dict
from rollart.plan.loader import read_yaml
from rollart.scenarios_catalog import resolve
from rollart.sim.costs.price import cpu_cores, cpu_cores_billed, hourly_fixed_usd, implicit_cpu_pool, run_cost
from tests.conftest import run_sim

BASE = ["algorithm.batch_size=16", "algorithm.steps=2"]


def _plans():
    raw = read_yaml(resolve("default"))
    wrote = plan_from_dict(raw, BASE)
    raw["cluster"].pop("cpu_pools")
    implicit = plan_from_dict(raw, BASE)
    return wrote, implicit


def test_the_implicit_default_pool_is_billed_by_the_peak_cores_held_and_an_explicit_one_whole() -> None:
    wrote, implicit = _plans()
    assert implicit_cpu_pool(implicit) and not implicit_cpu_pool(wrote)
    assert cpu_cores(implicit) == 4096  # the schema default, still what a run may use
    held = {"env": 37.5}
    assert cpu_cores_billed(implicit, held) == 38  # whole cores
    assert cpu_cores_billed(wrote, held) == cpu_cores(wrote) == 256
    assert cpu_cores_billed(implicit) == 4096  # no run to read a peak from: the whole pool (upper bound)
    price = implicit.prices.cpu_core_usd_per_hour
    a = run_cost(implicit, 3600.0, 1, 16, 0.0, cpu_held=held)
    b = run_cost(implicit, 3600.0, 1, 16, 0.0)
    assert a.cpu_billed_at_peak and not b.cpu_billed_at_peak
    assert b.usd_per_hour - a.usd_per_hour == pytest.approx((4096 - 38) * price)
    # a pool the plan wrote is bought whole, peak or not
    w = run_cost(wrote, 3600.0, 1, 16, 0.0, cpu_held=held)
    assert not w.cpu_billed_at_peak and w.cpu_usd == pytest.approx(256 * price)
    assert hourly_fixed_usd(implicit) - hourly_fixed_usd(wrote) == pytest.approx((4096 - 256) * price)


def test_a_run_without_cpu_pools_bills_what_its_envs_held_and_says_so() -> None:
    wrote, implicit = _plans()
    sm = run_sim(implicit, "sync").to_result().summary
    peak = sm["env_cores"]["env"]["peak_held_share"] * 4096
    assert sm["cpu_cores_billed_at_peak"] == pytest.approx(peak) and 0 < peak < 4096
    explicit = run_sim(wrote, "sync").to_result().summary
    assert "cpu_cores_billed_at_peak" not in explicit
    # same run, same GPUs: the hourly cost differs by the cores billed, 256 written vs the peak held
    price = wrote.prices.cpu_core_usd_per_hour
    assert explicit["cost_usd_per_hour"] - sm["cost_usd_per_hour"] == pytest.approx((256 - peak) * price, rel=1e-6)


def test_gpus_a_pool_holds_beyond_the_placement_are_said_unbilled() -> None:
    """The cost counts placed GPUs: a pool of 16 that the placement fills with 8 prices 8, and the run says so
    rather than let a buyer read the price of 16 (helper-93)."""
    from rollart.core import mode_config
    from rollart.plan import load_plan
    from rollart.scenarios_catalog import default_scenario
    from rollart.sim.backend import SimBackend
    from rollart.sim.costs.price import unplaced_gpu_notes

    assert unplaced_gpu_notes(load_plan(default_scenario())) == []
    notes = unplaced_gpu_notes(load_plan(default_scenario(), ["cluster.gpu_pools.h20.count=16"]))
    assert notes == ["cluster.gpu_pools.h20.count=16: the placement uses 8; the other 8 are neither used nor billed "
                     "(the cost counts placed GPUs)"]

    # dedicated judges the run sends nowhere are named once, by unused_settings, not again here
    judged = load_plan(default_scenario(), ["placement.reward.gpus=2", "placement.reward.pool=h20",
                                            "cluster.gpu_pools.h20.count=10"])
    assert unplaced_gpu_notes(judged) == []
    notes = SimBackend(judged, mode_config(judged), 0).run().to_result().summary["unused_settings"]
    assert sum("h20" in n for n in notes) == 1
