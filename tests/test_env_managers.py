"""Env managers (``algorithm.env_managers``): the continuous modes roll out on a fixed set of them,
as ROLL (num_env_groups × group_size = rollout_batch_size) and AReaL (max_concurrent_rollouts, by
default the train batch size) do; α bounds how stale a rollout may get, not how many run."""

from __future__ import annotations

import pytest

from rollart.core import mode_config
from rollart.plan import PlanError
from tests.conftest import run_sim, small_plan

BASE = ["algorithm.steps=6", "algorithm.batch_size=32", "tasks.CodeExec.env.step.sigma=2"]


def test_default_is_one_batch_of_members_with_redundancy() -> None:
    plan = small_plan([*BASE, "algorithm.redundancy=0.25"])
    out = run_sim(plan, "rollart")
    s = out.backend.ctl.scheduler
    assert s.members_per_group == 10 and s.env_managers == plan.groups_per_batch * 10
    areal = run_sim(plan, "areal").backend.ctl.scheduler
    assert areal.env_managers == plan.algorithm.batch_size  # no redundancy: AReaL's default


@pytest.mark.parametrize("mode", ["rollart", "areal"])
def test_alpha_bounds_staleness_not_concurrency(mode: str) -> None:
    """Before, admission alone bounded concurrency at (1 + α) batches: a larger α put more
    trajectories on the engines at once (at α = 4 on the 32B paper plan: KV overflow, prefix cache
    thrashing, steps 3× slower). Now every α rolls out on the same env managers."""
    highs = {}
    for alpha in (1, 4):
        plan = small_plan([*BASE, f"algorithm.alpha={alpha}"])
        out = run_sim(plan, mode, watch_running=True)
        assert out.error is None
        highs[alpha] = out.running_high_water
        sched = out.backend.ctl.scheduler
        assert highs[alpha] <= sched.env_managers == plan.groups_per_batch * sched.members_per_group
    assert highs[4] <= highs[1] + sched.members_per_group  # the same managers (one group of slack: the sampling)


def test_fewer_env_managers_roll_out_less_at_once_and_take_longer() -> None:
    plan = small_plan(BASE)
    one_group = small_plan([*BASE, "algorithm.env_managers=10"])  # one group of 8 + 25 % redundancy
    full = run_sim(plan, "rollart", watch_running=True)
    narrow = run_sim(one_group, "rollart", watch_running=True)
    assert narrow.running_high_water <= 10 < full.running_high_water
    t = lambda o: o.to_result().summary["step_time_s_mean"]  # noqa: E731
    assert t(narrow) > t(full)


def test_batch_level_modes_launch_their_batch_whatever_the_setting() -> None:
    """Sync, Sync+ and One-off launch one whole batch at a time: the batch is their env managers."""
    plan = small_plan([*BASE, "algorithm.env_managers=10"])
    for mode in ("sync", "sync+", "one-off"):
        out = run_sim(plan, mode, watch_running=True)
        assert out.error is None and mode_config(plan, mode).batch_level_launch
        assert out.running_high_water >= plan.algorithm.batch_size


def test_too_few_to_roll_out_one_group_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match=r"algorithm\.env_managers: 9 cannot roll out one group \(10 members"):
        small_plan(["algorithm.redundancy=0.25", "algorithm.env_managers=9"])


def test_a_baseline_says_which_rollart_settings_it_does_not_use() -> None:
    plan = small_plan([*BASE, "algorithm.redundancy=0.25"])
    for mode in ("sync", "sync+", "one-off", "areal"):
        notes = run_sim(plan, mode).to_result().summary["unused_settings"]
        assert any(n.startswith("algorithm.redundancy=0.25:") for n in notes), (mode, notes)
        assert any(n.startswith("placement.hw_affinity:") for n in notes), (mode, notes)
    assert run_sim(plan, "rollart").to_result().summary["unused_settings"] == []
    # α: Sync and Sync+ run in lockstep, One-off one batch ahead, whatever the plan's algorithm.alpha
    plan = small_plan([*BASE, "algorithm.alpha=3"])
    for mode, alpha in (("sync", 0), ("sync+", 0), ("one-off", 1)):
        notes = run_sim(plan, mode).to_result().summary["unused_settings"]
        assert any(n.startswith(f"algorithm.alpha=3: mode {mode} runs with α = {alpha}") for n in notes), (mode, notes)
    for mode in ("areal", "rollart"):
        notes = run_sim(plan, mode).to_result().summary["unused_settings"]
        assert not any(n.startswith("algorithm.alpha") for n in notes), (mode, notes)


@pytest.mark.parametrize("batches", [1.25, 3])
def test_areal_admission_stays_its_global_window_with_more_env_groups_than_a_batch(batches: float) -> None:
    """AReaL caps submissions at (α + version + 1) × batch, its only staleness bound (it evicts
    nothing). With more env groups than a batch has groups, each env group's own quota (ROLL's, one
    group a step) admitted env groups ÷ batch groups batches a version: the backlog grew every step and
    so did staleness (default scenario, 256 env managers: 4.15 versions mean after 10 steps against
    0.90 at 64, and 2.4× the throughput, trained on ever older rollouts)."""
    plan = small_plan([*BASE, "algorithm.steps=8", "algorithm.alpha=1"])
    out = run_sim(small_plan([*BASE, "algorithm.steps=8", "algorithm.alpha=1",
                              f"algorithm.env_managers={int(batches * plan.algorithm.batch_size)}"]), "areal")
    assert out.error is None
    ctl = out.backend.ctl
    assert ctl.scheduler.env_groups > plan.groups_per_batch
    assert ctl.buffer.pending_high_water <= 2 * plan.groups_per_batch  # (1 + α) batches
    late = [s.mean_staleness for s in ctl.stats.steps[2:]]
    assert max(late) <= 1.5, late  # α = 1: a straggler may be trained a little late, not ever later


def test_a_task_mix_shortfall_names_env_groups_beyond_a_batch_in_rollart_only() -> None:
    """ROLLART keeps ROLL's per-queue quotas (the surplus episodes expire), so with more env groups than
    a batch's groups a slow task loses its share: the warning names the setting and the count that fixes it."""
    from rollart.report import _surplus_env_groups

    plan = small_plan([*BASE, "algorithm.redundancy=0.25"])
    wide = small_plan([*BASE, "algorithm.redundancy=0.25", f"algorithm.env_managers={plan.groups_per_batch * 10 + 20}"])
    note = _surplus_env_groups(wide, mode_config(wide, "rollart"))
    assert f"algorithm.env_managers={plan.groups_per_batch * 10 + 20} forms {plan.groups_per_batch + 2} env groups" in note
    assert f"{plan.groups_per_batch * 10} (one batch's members)" in note
    assert _surplus_env_groups(plan, mode_config(plan, "rollart")) == ""
    assert _surplus_env_groups(wide, mode_config(wide, "areal")) == ""  # one global window there
    assert _surplus_env_groups(wide, mode_config(wide, "sync")) == ""   # batch-level launch
