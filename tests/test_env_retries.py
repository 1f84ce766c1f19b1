"""An env call's retry policy: env.reset waits ``retry_backoff_s`` before retrying, env.step
``step_retry_backoff_s`` when set (re-running a command in a live sandbox is not starting a new
one: ROLL's sandbox manager retries a start 120 s × attempt apart and a session command 2 s × attempt)."""

from __future__ import annotations

import numpy as np
import pytest

from rollart.plan import PlanError
from tests.conftest import run_sim, small_plan

FAULTY = ["algorithm.steps=3", "tasks.CodeExec.env.failure_prob=0.05", "tasks.CodeExec.env.max_retries=2"]


def _run(overrides: list[str]):
    out = run_sim(small_plan([*FAULTY, *overrides]), "sync")
    assert out.error is None
    return out.to_result().summary["step_time_s_mean"], out.backend.ctl.stats.env_errors


def test_a_failed_step_waits_the_step_backoff_and_a_failed_reset_the_reset_backoff() -> None:
    base, errors = _run(["tasks.CodeExec.env.retry_backoff_s=0"])
    assert errors >= 3  # calls did fail and were retried
    slow_steps, e1 = _run(["tasks.CodeExec.env.retry_backoff_s=0", "tasks.CodeExec.env.step_retry_backoff_s=60"])
    slow_resets, e2 = _run(["tasks.CodeExec.env.retry_backoff_s=60", "tasks.CodeExec.env.step_retry_backoff_s=0"])
    both, e3 = _run(["tasks.CodeExec.env.retry_backoff_s=60"])  # no step setting: env.step takes reset's
    assert errors == e1 == e2 == e3  # failures draw from their own stream: the same calls fail in every run
    assert slow_steps > base and slow_resets > base
    assert both > max(slow_steps, slow_resets)  # the lockstep batch paid both kinds of wait


def test_the_step_backoff_is_optional_and_validated() -> None:
    assert small_plan().task("CodeExec").env.step_retry_backoff_s is None
    with pytest.raises(PlanError) as err:
        small_plan(["tasks.CodeExec.env.step_retry_backoff_s=-1"])
    assert any("step_retry_backoff_s" in p for p in err.value.problems), err.value.problems


def test_a_rule_reward_takes_its_tasks_time_and_holds_the_envs_cores() -> None:
    # running a repository's tests is a rule reward too: tens of seconds, in the env, on its cores
    base = ["algorithm.steps=2", "cluster.cpu_pools.env.cores=1024"]
    quick = run_sim(small_plan(base), "sync+").to_result()
    slow_plan = small_plan([*base, "tasks.CodeExec.rule_reward_s={kind: lognormal, median: 30, sigma: 0.3}"])
    slow = run_sim(slow_plan, "sync+")
    assert slow.error is None
    r = slow.to_result()
    assert r.summary["step_time_s_mean"] > quick.summary["step_time_s_mean"] + 10
    # where a CodeExec trajectory completes the batch, its ~30 s reward is on the critical path
    assert max(s.breakdown_s["reward"] for s in r.steps) > 20
    # a constant (the 5 ms default) draws nothing; a distribution draws from its own stream (seed, id, 2)
    from rollart.sim.costs.env import EnvModel

    model = EnvModel(3)
    assert model.rule_reward_s(small_plan().task("CodeExec"), 7) == 0.005 and model._state == {}
    task = slow_plan.task("CodeExec")
    assert model.rule_reward_s(task, 7) == task.rule_reward_s.sample(np.random.default_rng([3, 7, 2]))
    assert model._state == {}  # the trajectory's own streams untouched


def test_a_rule_reward_time_on_a_judged_task_is_refused() -> None:
    with pytest.raises(PlanError) as err:
        small_plan(["tasks.GEM-Math.rule_reward_s=3"])  # GEM-Math is scored by the LLM judge
    assert any(p.startswith("tasks.GEM-Math") and "rule_reward_s" in p for p in err.value.problems)


def test_a_refill_continues_its_failed_predecessors_critical_path() -> None:
    """A failed member's refill starts when the failure is known; the step's critical path runs through the
    failed attempt and then its refill, so that time reads as the generation and env calls it was, not as idle
    (helper-95: Sync at 20 % env failures read 433 s of a 531 s step idle while engines and envs were busy)."""
    from rollart.core import mode_config
    from rollart.plan import load_plan
    from rollart.scenarios_catalog import default_scenario
    from rollart.sim import simulate_plan

    plan = load_plan(default_scenario(), ["algorithm.batch_size=32", "algorithm.steps=4", "algorithm.mode=sync",
                                          *(f"tasks.{t}.env.failure_prob=0.2" for t in ("FrozenLake", "GEM-Math",
                                                                                      "CodeExec"))])
    result = simulate_plan(plan, mode_config(plan), 0).to_result()
    assert result.summary["env_failures"] > 10
    for step in result.steps:
        assert step.breakdown_s["idle"] <= 0.05 * step.time_s, step
