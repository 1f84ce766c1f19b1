"""A task whose env keeps failing must not drop out of training silently: the result carries each
task's planned and trained share, a warning per task that fell short (table and JSON), and a run in
which a task owed ≥ 10 % of each batch trains none of it for 3 steps while its env fails stops."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rollart.core.stats import RunStats, StepRecord
from rollart.plan import Plan
from rollart.report import RunResult, task_share_summary
from tests.conftest import run_sim, small_plan
from tests.test_cli import rollart

FAIL_ALL = "tasks.FrozenLake.env.failure_prob=1"


def _result(overrides: list[str], mode: str = "rollart") -> RunResult:
    return run_sim(small_plan(overrides), mode).to_result()


@pytest.mark.parametrize("mode", ["rollart", "sync"])
def test_a_task_whose_env_always_fails_is_warned_about(mode: str) -> None:
    result = _result([FAIL_ALL], mode)
    sm = result.summary
    assert sm["task_shares"]["FrozenLake"] == {"planned": pytest.approx(0.4), "trained": 0.0}
    assert len(sm["warnings"]) == 1
    warning = sm["warnings"][0]
    assert warning.startswith("FrozenLake: 0% trained of 40% planned: its env failed ")
    failed = int(warning.split("its env failed ")[1].split()[0].replace(",", ""))
    assert 0 < failed <= sm["env_failures"]  # FrozenLake's own (others' envs may fail too)
    assert "tasks.FrozenLake.env.failure_prob=1" in warning and "remove the task" in warning


def test_no_warning_when_every_env_works() -> None:
    sm = _result([]).summary
    assert sm["warnings"] == []
    assert set(sm["task_shares"]) == {"FrozenLake", "GEM-Math", "CodeExec"}


@pytest.mark.parametrize("overrides", [[], [FAIL_ALL]])
def test_shares_sum_to_one(overrides: list[str]) -> None:
    shares = _result(overrides).summary["task_shares"]
    assert sum(s["planned"] for s in shares.values()) == pytest.approx(1.0)
    assert sum(s["trained"] for s in shares.values()) == pytest.approx(1.0)


def test_trained_shares_match_the_steps() -> None:
    result = _result([FAIL_ALL])
    per_task: dict[str, int] = {}
    for s in result.steps:
        assert sum(s.task_trajectories.values()) == s.trajectories
        for task, n in s.task_trajectories.items():
            per_task[task] = per_task.get(task, 0) + n
    total = sum(per_task.values())
    for task, share in result.summary["task_shares"].items():
        assert share["trained"] == pytest.approx(per_task.get(task, 0) / total)


def test_json_carries_shares_and_warnings(tmp_path) -> None:
    result = _result([FAIL_ALL])
    result.write_json(tmp_path / "r.json")
    written = json.loads((tmp_path / "r.json").read_text())
    sm = written["summary"]
    # each step says what it trained of each task, and the steps add up to the run's trained shares
    for rec, s in zip(written["steps"], result.steps):
        assert rec["task_trajectories"] == dict(s.task_trajectories)
        assert sum(rec["task_trajectories"].values()) == rec["trajectories"]
    assert set(sm["task_shares"]["CodeExec"]) == {"planned", "trained"}
    assert isinstance(sm["warnings"], list) and "FrozenLake" in sm["warnings"][0]


def _plan(shares: dict[str, float]) -> SimpleNamespace:
    env = SimpleNamespace(failure_prob=0.0, timeout_s=30.0, image_gb=0.0)  # a task that pulls no image
    return SimpleNamespace(tasks=[SimpleNamespace(name=n, share=s, env=env) for n, s in shares.items()],
                           algorithm=SimpleNamespace(group_size=8))


def _steps(*batches: dict[str, int]) -> list[StepRecord]:
    return [StepRecord(step=i, start_s=i, end_s=i + 1, breakdown_s={}, trajectories=sum(b.values()), tokens=0,
                       mean_staleness=0.0, task_trajectories=b) for i, b in enumerate(batches)]


def test_a_shortfall_of_less_than_one_group_is_rounding() -> None:
    # one batch of two groups cannot hold three tasks' shares: CodeExec's 20 % is less than a group
    out = task_share_summary(_plan({"A": 0.4, "B": 0.4, "C": 0.2}), _steps({"A": 8, "B": 8}), RunStats())
    assert out["warnings"] == []
    assert out["task_shares"]["C"] == {"planned": pytest.approx(0.2), "trained": 0.0}


def test_a_slow_task_without_failures_is_named_with_timeouts_when_known() -> None:
    plan = _plan({"A": 0.5, "B": 0.5})
    steps = _steps(*[{"A": 48, "B": 16}] * 4)  # B: 25 % of 50 %
    out = task_share_summary(plan, steps, RunStats())
    assert len(out["warnings"]) == 1 and out["warnings"][0].startswith("B: 25% trained of 50% planned: no env failures")
    stats = RunStats(env_failures_by_task={"B": 12}, env_timeouts_by_task={"B": 30})
    warning = task_share_summary(plan, steps, stats)["warnings"][0]
    assert "its env failed 12 trajectories" in warning
    assert "30 of its env calls timed out (tasks.B.env.timeout_s=30)" in warning


def test_no_steps_no_warning() -> None:
    out = task_share_summary(_plan({"A": 1.0}), [], RunStats())
    assert out == {"task_shares": {"A": {"planned": 1.0, "trained": 0.0}}, "warnings": []}


def test_a_starved_task_stops_the_run_keeping_its_steps() -> None:
    # batch 64: FrozenLake's 40 % is 3.2 groups a batch; it trains none for 3 steps, its env failing
    plan: Plan = small_plan(["algorithm.batch_size=64", "algorithm.steps=6", FAIL_ALL])
    result = run_sim(plan, "rollart").to_result()
    assert result.error is not None
    assert result.error.startswith("tasks.FrozenLake: no trajectory trained in steps 0–2")
    assert "tasks.FrozenLake.env.failure_prob=1" in result.error
    assert len(result.steps) == 3
    assert result.summary["warnings"] and result.summary["steps_done"] == 3


def test_a_task_starved_by_timeouts_names_the_timeout_first() -> None:
    """Every env call outlasting its timeout, not the failure rate, is what stopped the run: the message says
    how many calls timed out and names timeout_s before failure_prob (helper-74: it named failure_prob=0.01 first)."""
    plan: Plan = small_plan(["algorithm.batch_size=64", "algorithm.steps=6", "tasks.FrozenLake.env.timeout_s=0.01",
                             "tasks.FrozenLake.env.failure_prob=0.01"])
    result = run_sim(plan, "rollart").to_result()
    assert result.error is not None and result.error.startswith("tasks.FrozenLake: no trajectory trained")
    causes = result.error[result.error.index("none completed"):]
    assert "env calls timed out at tasks.FrozenLake.env.timeout_s=0.01; also tasks.FrozenLake.env.failure_prob=0.01" \
        in causes


def test_a_task_that_fails_often_but_completes_groups_runs_on() -> None:
    plan = small_plan(["algorithm.batch_size=64", "algorithm.steps=4", "tasks.FrozenLake.env.failure_prob=0.05"])
    result = run_sim(plan, "rollart").to_result()
    assert result.error is None and len(result.steps) == 4
    assert result.summary["warnings"] == []


def test_cli_prints_the_warning_and_stops(tmp_path) -> None:
    proc = rollart("simulate", "--quiet", "--mode", "rollart", "--steps", "2", "--set", "algorithm.batch_size=16",
                   "--set", FAIL_ALL, "--json", "r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("warning"))
    assert "task mix: FrozenLake: 0% trained of 40% planned" in line
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["warnings"]
    # a batch FrozenLake owes groups to: the run stops after 3 steps (exit 1, as other stops), steps kept
    proc = rollart("simulate", "--quiet", "--mode", "rollart", "--steps", "6", "--set", FAIL_ALL, "--json", "s.json",
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "stopped early: tasks.FrozenLake: no trajectory trained" in " ".join(proc.stdout.split())
    data = json.loads((tmp_path / "s.json").read_text())
    assert len(data["steps"]) == 3 and data["error"].startswith("tasks.FrozenLake")
