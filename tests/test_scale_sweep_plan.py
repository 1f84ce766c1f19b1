"""`--scale-approx` in `rollart sweep` and `rollart plan`: every point of a very large plan is
simulated as `rollart simulate --scale-approx` simulates it (a review's 1,024-GPU `rollart plan`
ran 500 s and was killed: the planner always simulated the whole cluster)."""

from __future__ import annotations

import os
import subprocess

import pytest

from benchmarks.sim_speed import scaled_overrides
from rollart.core import mode_config
from rollart.plan import apply_overrides, load_plan, read_yaml
from rollart.scenarios_catalog import resolve
from rollart.sim import simulate_plan
from rollart.sim.scale import auto_factor
from rollart.sweep.runner import SerialPool, evaluate_point
from rollart.sweep.store import point_key
from tests.test_cli import ROLLART

PAPER = "paper/qwen3-32b-128gpu"


def test_a_point_is_simulated_as_simulate_scale_approx_simulates_it() -> None:
    overrides = [*scaled_overrides(8), "algorithm.steps=2"]  # 1,024 GPUs
    data = read_yaml(resolve(PAPER))
    plan = load_plan(resolve(PAPER), overrides)
    m = auto_factor(plan)
    assert m > 1
    rec = evaluate_point(data, overrides, mode="rollart", scale_approx=True)
    assert rec["error"] is None and rec["scale_factor"] == m and rec["summary"]["scale_approx"]
    direct = simulate_plan(plan, mode_config(plan, "rollart"), plan.algorithm.seed, scale_approx=m).to_result()
    assert rec["summary"]["trajectories_per_s"] == direct.summary["trajectories_per_s"]  # the same run
    # a batch-level mode is simulated in full (the approximation does not cover it): factor 1
    small = ["algorithm.steps=1", "algorithm.batch_size=64"]
    assert evaluate_point(data, small, mode="sync", scale_approx=True)["scale_factor"] == 1
    # the pools carry the flag to every job
    key, rec2 = next(SerialPool(scale_approx=True).imap_unordered([("k", data, overrides, None, "rollart")]))
    assert rec2["scale_factor"] == m and rec2["summary"] == rec["summary"]
    # results.csv says which points were approximated, and by what m
    from rollart.sweep.results import result_row

    assert result_row("k", {}, rec2)["scale_factor"] == m


def test_an_approximated_sweep_point_is_not_the_full_one() -> None:
    data = apply_overrides(read_yaml(resolve(PAPER)), [])
    assert point_key(data, ["a=1"], 0, "rollart") != point_key(data, ["a=1"], 0, "rollart", scale_approx=True)
    assert point_key(data, ["a=1"], 0, "rollart") == point_key(data, ["a=1"], 0, "rollart", scale_approx=False)


@pytest.mark.slow
def test_plan_searches_a_1024_gpu_cluster_under_the_approximation(tmp_path) -> None:
    """A minimal search of the 1,024-GPU cluster finishes (each candidate is a 1/m subset) and writes a
    plan whose reproduce line carries --scale-approx."""
    out = tmp_path / "plan.yaml"
    sets = [a for o in [*scaled_overrides(8), "algorithm.steps=2"] for a in ("--set", o)]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    proc = subprocess.run([ROLLART, "plan", PAPER, "--budget-gpus", "1024", "--candidates", "2",
                           "--finalists", "1", "--polish-rounds", "0", "--local-rounds", "0", "--tp", "2",
                           "--alphas", "1", "--redundancies", "0", "--fixed-affinity", "--workers", "1", "-q",
                           "--scale-approx", "--mode", "rollart", "--out", str(out), *sets],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--scale-approx" in out.read_text() and "--scale-approx reproduces" in proc.stdout
