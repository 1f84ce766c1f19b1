"""Dedicated reward GPUs are placed, billed and counted only when the run's reward goes to them: the
mode's ``serverless_reward`` off and ``placement.reward.gpus`` > 0. A run that scores on the serverless
platform (by its mode or by the plan's ``placement.reward.where``) neither pays for them nor hides them:
``unused_settings`` names them."""

from __future__ import annotations

import pytest

from rollart.core.modes import dedicated_reward_used, mode_config, unused_settings
from rollart.plan import load_plan
from rollart.planner import Budget, Space
from rollart.planner.space import SERVERLESS
from rollart.scenarios_catalog import resolve_existing
from rollart.sim.costs.price import gpus_placed, hourly_fixed_usd, missing_prices, run_cost
from rollart.sweep.runner import evaluate_point
from tests.conftest import run_sim, small_plan

MODES = ("sync", "sync+", "one-off", "areal", "rollart")
# the default scenario (8 H800: trainer 4 + generation 4) with 4 more H800 set aside for a judge that the
# plan itself sends to the serverless platform
IDLE_JUDGES = ["placement.reward.where=serverless", "placement.reward.pool=h800", "placement.reward.gpus=4",
               "cluster.gpu_pools.h800.count=12"]
H800 = 2.50


def _reward_placement(extra: list[str] = ()):  # 4 dedicated H800 judges beside 28 H800
    return load_plan(resolve_existing("paper/experiments/reward-placement"), ["algorithm.steps=2", *extra])


@pytest.mark.parametrize("overrides", [IDLE_JUDGES, ["placement.reward={where: dedicated, pool: h800, gpus: 4}",
                                                     "cluster.gpu_pools.h800.count=12"], []])
@pytest.mark.parametrize("mode", MODES)
def test_reward_gpus_are_placed_exactly_when_the_mode_sends_reward_to_them(overrides, mode):
    plan = small_plan(overrides)
    cfg = mode_config(plan, mode)
    r = plan.placement.reward
    used = r.gpus > 0 and not cfg.serverless_reward  # the rule
    assert dedicated_reward_used(plan, cfg) is used
    without = plan.placement.gpus_by_pool()["h800"] - r.gpus
    assert gpus_placed(plan, cfg)["h800"] == without + (r.gpus if used else 0)
    assert hourly_fixed_usd(plan, cfg) == pytest.approx(hourly_fixed_usd(small_plan(), cfg) + (4 * H800 if used else 0))
    # a mode that scores on the serverless platform says what it leaves out; one that uses them says nothing
    notes = [n for n in unused_settings(plan, cfg) if n.startswith("placement.reward.gpus")]
    assert len(notes) == (r.gpus > 0 and not used)
    if notes:
        who = f"mode {mode}" if r.where == "dedicated" else "placement.reward.where=serverless"
        assert notes[0].startswith(f"placement.reward.gpus=4: {who} sends") and "not placed or billed" in notes[0]
    # a plan that asks for a serverless judge but keeps GPUs a baseline judges on is told so: before, Sync and
    # AReaL-style judged on them and billed them without a word
    where = [n for n in unused_settings(plan, cfg) if n.startswith("placement.reward.where")]
    assert len(where) == (used and r.where == "serverless")
    if where:
        assert f"mode {mode} judges on the plan's dedicated GPUs" in where[0] and "gpus=0" in where[0]


def test_a_plan_only_check_counts_them_and_a_run_without_a_mode_is_the_plans_own():
    plan = small_plan(IDLE_JUDGES)  # algorithm.mode rollart: reward where the plan says, serverless
    # no mode (validation, a budget check before simulating): the most the plan can place
    assert gpus_placed(plan) == {"h800": 12, "h20": 8}
    assert hourly_fixed_usd(plan) == pytest.approx(hourly_fixed_usd(small_plan()) + 4 * H800)
    # run_cost is a run's: without a mode, the plan's own
    own = run_cost(plan, 3600.0, 3, 100, 0.0)
    assert own.usd_per_hour == pytest.approx(hourly_fixed_usd(small_plan()))
    assert own == run_cost(plan, 3600.0, 3, 100, 0.0, mode_config(plan))
    assert run_cost(plan, 3600.0, 3, 100, 0.0, mode_config(plan, "sync")).usd_per_hour == \
        pytest.approx(own.usd_per_hour + 4 * H800)  # sync runs the judge on them


def test_an_unpriced_gpu_type_held_only_by_unused_judges_does_not_block_the_cost():
    custom = ["cluster.custom_gpus.X9={tflops_bf16: 500, hbm_tbps: 3, memory_gb: 80}",
              "cluster.gpu_pools.judge={gpu: X9, count: 4}", "placement.reward.where=serverless",
              "placement.reward.pool=judge", "placement.reward.gpus=4"]
    plan = small_plan(custom)
    assert missing_prices(plan) and not missing_prices(plan, mode_config(plan))
    assert "judge" not in gpus_placed(plan, mode_config(plan))
    assert run_sim(plan).to_result().summary["cost_usd_per_hour"] is not None


def test_a_run_with_unused_judges_costs_what_the_run_without_them_costs():
    idle = run_sim(small_plan(IDLE_JUDGES)).to_result().summary
    bare = run_sim(small_plan()).to_result().summary
    assert idle["trajectories_per_s"] == bare["trajectories_per_s"]  # the same run ...
    for key in ("cost_usd_per_hour", "cost_per_step_usd", "cost_per_1k_trajectories_usd"):
        assert idle[key] == pytest.approx(bare[key])  # ... at the same price
    steady = "cost_per_1k_trajectories_usd"
    assert idle["steady"][steady] == pytest.approx(bare["steady"][steady])
    # GPU busy: the reward GPUs are neither busy nor idle figures of this run
    assert idle["gpu_busy_fraction"] == bare["gpu_busy_fraction"] and idle["reward_gpu_busy_fraction"] is None
    assert any(n.startswith("placement.reward.gpus=4: placement.reward.where=serverless")
               for n in idle["unused_settings"])


def test_sync_plus_does_not_bill_the_dedicated_judges_that_sync_uses():
    plan = _reward_placement(["algorithm.batch_size=32"])
    sync, plus = mode_config(plan, "sync"), mode_config(plan, "sync+")
    assert not sync.serverless_reward and plus.serverless_reward
    assert gpus_placed(plan, sync)["h800"] == 32 and gpus_placed(plan, plus)["h800"] == 28
    assert hourly_fixed_usd(plan, sync) - hourly_fixed_usd(plan, plus) == pytest.approx(4 * H800)
    out = run_sim(plan, "sync+").to_result()
    sm = out.summary
    steps = out.steps
    expected = run_cost(plan, steps[-1].end_s, len(steps), sum(s.trajectories for s in steps),
                        sm["serverless_gpu_seconds"], plus)
    assert sm["cost_usd_per_hour"] == pytest.approx(expected.usd_per_hour)
    assert expected.gpu_usd == pytest.approx(28 * H800 * steps[-1].end_s / 3600)
    assert "placement.reward.gpus=4: mode sync+ sends LLM-judge calls to the serverless platform; the 4 h800 " \
           "GPUs are not placed or billed" in sm["unused_settings"]
    assert sm["reward_gpu_busy_fraction"] is None


def test_a_sweep_point_records_only_the_gpus_its_run_places():
    from rollart.plan import read_yaml
    from rollart.scenarios_catalog import default_scenario

    data = read_yaml(default_scenario())
    tiny = ["algorithm.batch_size=16", "algorithm.steps=1", *IDLE_JUDGES]
    own, sync = evaluate_point(data, tiny), evaluate_point(data, tiny, mode="sync")
    assert own["error"] is None and sync["error"] is None
    assert own["placed_gpus"] == {"h800": 8, "h20": 8} and sync["placed_gpus"] == {"h800": 12, "h20": 8}


def test_the_planner_offers_no_idle_judges_and_reads_the_scenarios_reward_as_its_mode_runs_it():
    plan = small_plan(IDLE_JUDGES)
    space = Space.from_plan(plan, Budget(gpus=24), step=4, tps=[1, 2], alphas=[1], redundancies=[0.0])
    assert any(r[0] == "dedicated" for r in space.rewards)
    assert space.baseline is not None and space.baseline.reward == SERVERLESS  # rollart: where=serverless
    synced = small_plan([*IDLE_JUDGES, "algorithm.mode=sync"])
    base = Space.from_plan(synced, Budget(gpus=24), step=4, tps=[1, 2], alphas=[0], redundancies=[0.0]).baseline
    assert base is not None and base.reward == ("dedicated", "h800", 4)  # sync scores on them
    # sync+ scores on the serverless platform whatever the placement: a dedicated judge would idle
    plus = small_plan([*IDLE_JUDGES, "algorithm.mode=sync+"])
    space = Space.from_plan(plus, Budget(gpus=24), step=4, tps=[1, 2], alphas=[0], redundancies=[0.0])
    assert space.rewards == [SERVERLESS]
    assert all(c.reward == SERVERLESS for c in space.enumerate())


@pytest.mark.parametrize("mode", MODES)
def test_judges_no_task_calls_are_not_placed_whatever_the_mode(mode):
    """Every task scored by rules: the judge engines are never built, so a run neither places nor bills
    them, and says why."""
    rules = ["placement.reward={where: dedicated, pool: h800, gpus: 4}", "cluster.gpu_pools.h800.count=12",
             *(f"tasks.{t}.reward=rule" for t in ("FrozenLake", "GEM-Math", "CodeExec"))]
    plan = small_plan(rules)
    cfg = mode_config(plan, mode)
    assert not dedicated_reward_used(plan, cfg) and dedicated_reward_used(plan)  # a plan-only check counts them
    assert gpus_placed(plan, cfg)["h800"] == plan.placement.gpus_by_pool()["h800"] - 4
    note, = (n for n in unused_settings(plan, cfg) if n.startswith("placement.reward.gpus"))
    assert "no task is judged by the LLM" in note
