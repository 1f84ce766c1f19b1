"""`rollart run` end to end on a local Ray: it learns, it survives failures, it resumes,
and the accounting invariant of the simulator holds for real trajectories."""

from __future__ import annotations

import gc
import json
import os
from collections import Counter
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from rollart.core import mode_config  # noqa: E402
from rollart.plan import load_plan  # noqa: E402
from rollart.runtime.backend import RuntimeBackend  # noqa: E402
from rollart.runtime.cluster import init_local_ray, resource_name  # noqa: E402

pytestmark = pytest.mark.slow
DIGITS = Path(__file__).parents[1] / "scenarios" / "local" / "digits.yaml"


@pytest.fixture(scope="module")
def local_ray():
    init_local_ray(2, {resource_name("pool_a"): 4, resource_name("pool_b"): 4})
    yield
    ray.shutdown()


def _run(overrides, mode=None, **kwargs):
    plan = load_plan(DIGITS, overrides)
    backend = RuntimeBackend(plan, mode_config(plan, mode), plan.algorithm.seed, **kwargs)
    return plan, backend, backend.run()


def _check_accounting(plan, ctl) -> None:
    counts = ctl.outcome_counts()
    assert sum(counts.values()) == len(ctl.trajectories)
    ids = [i for b in ctl.batches for i in b]
    assert len(ids) == len(set(ids)) == counts["used"]
    for n, batch in enumerate(ctl.batches, start=ctl.start_version):
        assert set(Counter(ctl.trajectories[i].group.id for i in batch).values()) == {plan.algorithm.group_size}
        assert all(ctl.trajectories[i].start_version >= n - ctl.mode.alpha for i in batch)


def test_it_learns(local_ray) -> None:
    plan, backend, out = _run(["algorithm.steps=40", "runtime.weight_store=ray"])
    assert out.error is None
    rewards = [s.mean_reward for s in backend.ctl.stats.steps]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    # random init writes ~10 % digits; 40 GRPO steps reach ~50 % (seed noise is a few points)
    assert last > first + 0.1, rewards
    _check_accounting(plan, backend.ctl)


def test_env_failures_are_counted_not_fatal(local_ray) -> None:
    plan, backend, out = _run(["algorithm.steps=4", "tasks.Digits.env.failure_prob=0.2", "runtime.weight_store=ray"])
    assert out.error is None
    result = out.to_result()
    assert result.summary["env_failures"] > 0 or result.summary["env_call_errors"] > 0
    _check_accounting(plan, backend.ctl)
    # setup froze the driver's heap; close() must unfreeze it, or this run's actor handles (in
    # reference cycles) are never collected and the next run finds the pools still taken
    assert gc.get_freeze_count() == 0


def test_a_dead_reward_endpoint_stops_the_run_instead_of_training_on_zeros(local_ray) -> None:
    plan, backend, out = _run(["algorithm.steps=4", "tasks.Digits.reward=llm_judge", "runtime.weight_store=ray",
                               "runtime.reward_url=http://127.0.0.1:9/reward", "runtime.reward_timeout_s=0.5",
                               "runtime.reward_retries=1"])
    assert out.error is not None and "runtime.max_reward_failure_rate" in out.error, out.error
    assert "unreachable" in out.error and "\n" not in out.error
    result = out.to_result()
    # stopped once more than 20 % of a batch (16) failed; calls still in flight were cancelled
    assert result.summary["reward_failures"] > 0.2 * plan.algorithm.batch_size
    assert backend.counters.train_metrics == [] and result.steps == []  # nothing trained on missing rewards
    # a failed reward fails its trajectory: none was scored
    assert all(t.reward is None for t in backend.ctl.trajectories)


def test_a_killed_env_worker_is_restarted_and_its_trajectories_refilled(local_ray, capfd) -> None:
    holder = {}

    def kill_at_step_one(rec) -> None:  # kill -9 of the worker's process, as a crash or a user would
        if rec.step == 1:
            os.kill(ray.get(holder["b"].env_workers[0].pid.remote()), 9)

    plan = load_plan(DIGITS, ["algorithm.steps=5", "runtime.weight_store=ray", "algorithm.alpha=2"])
    backend = holder["b"] = RuntimeBackend(plan, mode_config(plan), 0, on_step=kill_at_step_one)
    out = backend.run()
    assert out.error is None and len(backend.ctl.stats.steps) == 5
    _check_accounting(plan, backend.ctl)
    summary = out.to_result().summary
    lost = summary["env_worker_deaths"] + summary["env_failures"]
    print("env calls lost to the killed worker:", summary["env_worker_deaths"], "failed trajectories:",
          summary["env_failures"])
    assert lost > 0  # in-flight trajectories failed (and were refilled: every step still filled its batch)
    assert ray.get(backend.env_workers[0].ping.remote(), timeout=60)
    assert "OOM" not in capfd.readouterr().err  # a deliberate kill is not reported as out of memory


def test_a_killed_inference_worker_is_restarted_and_its_requests_reissued(local_ray) -> None:
    holder = {}

    def kill_at_step_one(rec) -> None:
        if rec.step == 1:
            ray.kill(holder["b"].workers[1], no_restart=False)

    plan = load_plan(DIGITS, ["algorithm.steps=6", "runtime.weight_store=ray", "algorithm.alpha=2"])
    backend = holder["b"] = RuntimeBackend(plan, mode_config(plan), 0, on_step=kill_at_step_one)
    out = backend.run()
    assert out.error is None and len(backend.ctl.stats.steps) == 6
    _check_accounting(plan, backend.ctl)
    # the killed worker came back (a fresh actor: its counters restarted) and served again
    restarted = out.worker_stats[1]
    assert restarted["uptime_seconds"] < out.worker_stats[0]["uptime_seconds"]
    assert restarted["requests_served"] > 0
    print("re-issued generate calls:", backend.counters.reissued)


def test_resume_continues_versions_and_keeps_the_alpha_window(local_ray, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    plan, first, out = _run(["algorithm.steps=4", "runtime.checkpoint_every=2", "runtime.weight_store=ray"],
                            checkpoint_dir=ckpt)
    assert out.error is None and any(ckpt.iterdir())
    plan, second, out = _run(["algorithm.steps=6", "runtime.weight_store=ray"], resume=ckpt)
    assert out.error is None
    assert [s.step for s in second.ctl.stats.steps] == [4, 5]
    assert second.ctl.start_version == 4 and second.ctl.version == 6
    _check_accounting(plan, second.ctl)


def test_cli_run_writes_the_same_contract_and_trace(tmp_path: Path) -> None:
    from tests.test_readme import readme_command, run_command

    command, spec = readme_command("rollart run scenarios/local/digits.yaml")  # as the README prints it, 3 steps
    out = run_command(command, spec, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "trajectories/s" in out.stdout and "Traceback" not in out.stdout + out.stderr
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["backend"] == "runtime" and len(data["steps"]) == 3
    assert {"step_time_s_mean", "trajectories_per_s", "tokens_per_s", "gpu_busy_fraction", "aborted_stale",
            "aborted_redundant", "env_failures", "decode_batch_mean"} <= set(data["summary"])
    # the torch engines say how many sequences each step decoded, as the simulator's engines do
    assert data["summary"]["decode_batch_mean"] and all(b > 0 for b in data["summary"]["decode_batch_mean"].values())
    names = {e["args"]["name"] for e in json.loads((tmp_path / "run.trace.json").read_text())["traceEvents"]
             if e.get("name") == "process_name"}
    assert "trainer" in names and any(n.startswith("generation/") for n in names)
    assert any(n.startswith("env managers/") for n in names)
