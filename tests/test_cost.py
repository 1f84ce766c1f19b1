"""Cost: the price table (defaults, overrides, unknown GPU types) and the cost figures every
simulate result carries."""

from __future__ import annotations

import pytest
from rich.console import Console

from rollart.plan import PlanError, load_plan
from rollart.plan.schema import DEFAULT_GPU_USD_PER_HOUR, Prices
from rollart.report import summary_table
from rollart.scenarios_catalog import default_scenario
from rollart.sim.costs.price import (cpu_cores, gpus_placed, gpus_placed_by_type, hourly_fixed_usd, require_prices,
                                     run_cost)
from tests.conftest import run_sim, small_plan

CUSTOM = ["cluster.custom_gpus.X9={tflops_bf16: 500, hbm_tbps: 3, memory_gb: 80}", "cluster.gpu_pools.h20.gpu=X9"]


def _text(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_default_prices_cover_every_preset_and_overrides_merge():
    from rollart.plan.presets import GPU_PRESETS

    assert set(Prices().gpu_usd_per_hour) == set(GPU_PRESETS)
    plan = small_plan(["prices.gpu_usd_per_hour.h20=1.75", "prices.cpu_core_usd_per_hour=0.01"])
    # a partial table merges over the defaults; preset names are case-insensitive
    assert plan.prices.gpu_usd_per_hour["H20"] == 1.75
    assert plan.prices.gpu_usd_per_hour["H800"] == DEFAULT_GPU_USD_PER_HOUR["H800"]
    assert plan.prices.gpu_price("h800") == DEFAULT_GPU_USD_PER_HOUR["H800"]
    assert plan.prices.cpu_core_usd_per_hour == 0.01


def test_price_fields_are_validated():
    with pytest.raises(PlanError) as err:
        small_plan(["prices.gpu_usd_per_hour.H20=-1"])
    assert any(p.startswith("prices.gpu_usd_per_hour.H20:") for p in err.value.problems)
    with pytest.raises(PlanError) as err:
        small_plan(["prices.per_token=1"])
    assert any(p.startswith("prices.per_token: unknown field") for p in err.value.problems)


def test_hourly_cost_counts_placed_gpus_and_env_cores():
    plan = small_plan()  # trainer 4 H800, generation 2×tp2 H800 + 8×tp1 H20, 256 env cores
    assert gpus_placed(plan) == {"h800": 8, "h20": 8}
    assert gpus_placed_by_type(plan) == {"H800": 8, "H20": 8}
    expected = 8 * 2.50 + 8 * 1.20 + 256 * 0.04
    assert hourly_fixed_usd(plan) == pytest.approx(expected)
    # GPUs the placement leaves idle in a pool are not charged
    bigger = small_plan(["cluster.gpu_pools.h20.count=32"])
    assert hourly_fixed_usd(bigger) == pytest.approx(expected)
    # dedicated reward GPUs are
    judged = small_plan(["placement.reward={where: dedicated, pool: h20, gpus: 4}",
                         "cluster.gpu_pools.h20.count=12"])
    assert hourly_fixed_usd(judged) == pytest.approx(expected + 4 * 1.20)


def test_run_cost_arithmetic():
    plan = small_plan()
    cost = run_cost(plan, wall_s=1800.0, steps=3, trajectories=48, serverless_gpu_s=1000.0)
    fixed = hourly_fixed_usd(plan)
    assert cost.gpu_usd + cost.cpu_usd == pytest.approx(fixed * 0.5)
    assert cost.serverless_usd == pytest.approx(1000 * 0.0011)
    assert cost.total_usd == pytest.approx(fixed * 0.5 + 1.1)
    assert cost.per_step_usd == pytest.approx(cost.total_usd / 3)
    assert cost.per_1k_trajectories_usd == pytest.approx(cost.total_usd / 48 * 1000)
    assert cost.usd_per_hour == pytest.approx(cost.total_usd / 0.5)
    nothing = run_cost(plan, wall_s=0.0, steps=0, trajectories=0, serverless_gpu_s=0.0)
    assert nothing.per_step_usd == 0 and nothing.per_1k_trajectories_usd == 0 and nothing.usd_per_hour == fixed


def test_every_simulate_result_carries_its_cost(plan):
    result = run_sim(plan).to_result()
    sm = result.summary
    steps, trajs = len(result.steps), sum(s.trajectories for s in result.steps)
    wall = result.steps[-1].end_s
    expected = run_cost(plan, wall, steps, trajs, sm["serverless_gpu_seconds"])
    assert sm["cost_per_step_usd"] == pytest.approx(expected.per_step_usd)
    assert sm["cost_per_1k_trajectories_usd"] == pytest.approx(expected.per_1k_trajectories_usd)
    assert sm["cost_usd_per_hour"] == pytest.approx(expected.usd_per_hour)
    # serverless reward is billed on top of the fixed hourly rate
    assert sm["serverless_gpu_seconds"] > 0
    assert sm["cost_usd_per_hour"] > hourly_fixed_usd(plan)
    assert sm["cost_per_step_usd"] * steps == pytest.approx(sm["cost_usd_per_hour"] * wall / 3600)
    line = [ln for ln in _text(summary_table(result)).splitlines() if ln.startswith("cost ") and "/step" in ln]
    assert len(line) == 1 and "per 1k trajectories" in line[0] and "/h" in line[0]


def test_cheaper_gpus_cheaper_run(plan):
    base = run_sim(plan).to_result().summary
    cheap = run_sim(small_plan(["prices.gpu_usd_per_hour.H20=0.5"])).to_result().summary
    assert cheap["trajectories_per_s"] == base["trajectories_per_s"]  # prices do not change the simulation
    assert cheap["cost_per_1k_trajectories_usd"] < base["cost_per_1k_trajectories_usd"]


def test_custom_gpu_without_price_errors_only_when_cost_is_requested():
    plan = small_plan(CUSTOM)
    # simulating still works; the summary just has no cost, and the report says why
    result = run_sim(plan).to_result()
    assert result.summary["cost_usd_per_hour"] is None
    assert result.summary["cost_per_step_usd"] is None
    assert "set prices.gpu_usd_per_hour" in _text(summary_table(result))
    # asking for a cost is a plan error naming the field to set
    with pytest.raises(PlanError) as err:
        require_prices(plan)
    assert err.value.problems == ["prices.gpu_usd_per_hour.X9: no price for GPU type 'X9' (pool 'h20'); "
                                  "add one, e.g. --set prices.gpu_usd_per_hour.X9=2.0"]
    priced = small_plan([*CUSTOM, "prices.gpu_usd_per_hour.X9=3"])
    assert hourly_fixed_usd(priced) == pytest.approx(8 * 2.5 + 8 * 3 + cpu_cores(priced) * 0.04)


def test_prices_in_a_scenario_file(tmp_path):
    path = tmp_path / "priced.yaml"
    path.write_text(f"extends: {default_scenario()}\nprices:\n  gpu_usd_per_hour: {{H800: 4.0}}\n"
                    "  serverless_usd_per_gpu_second: 0.002\n")
    plan = load_plan(path)
    assert plan.prices.gpu_usd_per_hour["H800"] == 4.0 and plan.prices.gpu_usd_per_hour["H20"] == 1.2
    assert plan.prices.serverless_usd_per_gpu_second == 0.002


def test_colocated_trainer_and_engines_are_billed_for_their_gpus_once():
    """Colocated training time-shares the engines' GPUs: the pool gives max(trainer, engines) GPUs,
    as validation counts them, not their sum (a review found 16 colocated H800 billed as 32)."""
    from rollart.scenarios_catalog import resolve

    plan = load_plan(resolve("paper/experiments/swe-step-breakdown"))  # 32 H800: trainer 32, 32 workers tp 1
    assert plan.placement.colocated and gpus_placed(plan) == {"h800": 32}
    apart = load_plan(resolve("paper/experiments/swe-step-breakdown"),
                      ["placement.colocated=false", "cluster.gpu_pools.h800.count=64"])
    assert gpus_placed(apart) == {"h800": 64}
    gpu = plan.prices.gpu_price("H800")
    assert hourly_fixed_usd(apart) - hourly_fixed_usd(plan) == pytest.approx(32 * gpu)


def test_serverless_gpu_seconds_are_priced_by_the_platforms_gpu_type():
    """A serverless GPU-second costs the GPU type's hourly price × the serverless premium, so a
    cheaper serverless GPU costs less (one flat H100 rate made an A100 or H20 platform, slower and
    billing more seconds, the dearer one); the default H800 rate stays $0.0011."""
    prices = Prices()
    assert prices.serverless_gpu_second_price("H800") == 0.0011  # exactly: 2.50 × 1.584 / 3600
    assert prices.serverless_gpu_second_price("H100") == 0.0011
    rate = {gpu: prices.serverless_gpu_second_price(gpu) for gpu in ("H800", "H200", "A100", "H20")}
    assert rate["H20"] < rate["A100"] < rate["H800"] < rate["H200"]
    # the per-type rate reaches the bill
    for gpu in ("H800", "H20"):
        plan = small_plan([f"cluster.serverless.gpu={gpu}"])
        cost = run_cost(plan, 3600.0, 1, 1, 1000.0)
        assert cost.serverless_usd == pytest.approx(1000.0 * rate[gpu])
    # an explicit flat rate still overrides the premium, whatever the GPU type
    flat = small_plan(["cluster.serverless.gpu=H20", "prices.serverless_usd_per_gpu_second=0.002"])
    assert run_cost(flat, 3600.0, 1, 1, 1000.0).serverless_usd == pytest.approx(2.0)


def test_a_serverless_gpu_type_without_a_price_is_named_when_a_cost_is_asked_for():
    plan = small_plan(["cluster.custom_gpus.X9={tflops_bf16: 500, hbm_tbps: 3, memory_gb: 80}",
                       "cluster.serverless.gpu=X9"])
    with pytest.raises(PlanError) as err:
        require_prices(plan)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith("prices.gpu_usd_per_hour.X9:")
    assert "cluster.serverless.gpu" in err.value.problems[0]
