"""When the engines' KV cannot hold the conversations the env managers keep in flight, the summary says how many
it holds and which env_managers to try: a setting, not more GPUs (helper-95: the 32B plan at batch 1,024 read
0.56 trajectories/s at its default 1,280 env managers and 1.31 at 640). Only where the thrash is material
(helper-96: a run 6 preemptions over the line read 11 % slower at the suggestion)."""

from __future__ import annotations

import pytest
from rich.console import Console

from rollart.plan import load_plan
from rollart.report import summary_table
from rollart.scenarios_catalog import default_scenario, resolve
from rollart.sim.backend import KV_THRASH_SHARE
from tests.conftest import run_sim


def _small_kv(batch: int, steps: int = 4) -> list[str]:
    return [f"algorithm.batch_size={batch}", f"algorithm.steps={steps}",
            "placement.generation=[{pool: h800, workers: 2, tp: 2, gpu_memory_utilization: 0.27}, "
            "{pool: h20, workers: 8, tp: 1, gpu_memory_utilization: 0.27}]"]


def test_a_run_whose_kv_thrashes_names_the_env_managers_to_try() -> None:
    result = run_sim(load_plan(default_scenario(), _small_kv(256))).to_result()
    sm = result.summary
    trained = sum(s.trajectories for s in result.steps)
    assert sm["kv_preemptions"] >= KV_THRASH_SHARE * trained
    held, flight, fit, rounds = (sm[k] for k in ("kv_conversations_held", "env_managers_in_flight",
                                                  "env_managers_fit", "env_manager_rounds"))
    groups, members = sm["groups_per_batch"], 10  # 32 groups of 8, redundancy 0.25: 10 members each
    assert (groups, flight) == (32, 320) and held < flight
    # whole env groups, each rolling out a whole number of a batch's groups, in as few rounds as fit
    assert fit == -(-groups // rounds) * members <= held
    assert rounds == 1 or -(-groups // (rounds - 1)) * members > held
    console = Console(width=400, record=True)
    console.print(summary_table(result))
    assert f"try algorithm.env_managers={fit}" in console.export_text()


def test_a_few_preemptions_suggest_nothing() -> None:
    """6 preemptions over 768 trajectories: the cure (half the env managers) cost 11 % (helper-96)."""
    result = run_sim(load_plan(default_scenario(), _small_kv(128, 6))).to_result()
    sm = result.summary
    assert 0 < sm["kv_preemptions"] < KV_THRASH_SHARE * sum(s.trajectories for s in result.steps)
    assert "env_managers_fit" not in sm
    assert "env_managers_fit" not in run_sim(load_plan(default_scenario(), ["algorithm.batch_size=16",
                                                                             "algorithm.steps=3"])).to_result().summary


@pytest.mark.slow
def test_the_suggested_env_managers_end_the_thrash_on_the_32b_plan() -> None:
    """The case that asked for it, end to end: the suggestion removes the preemptions and more than doubles the
    rate (0.56 → 1.31 trajectories/s at 5 steps)."""
    from rollart.report import plan_rates

    base = ["algorithm.batch_size=1024", "algorithm.steps=4"]
    thrash = run_sim(load_plan(resolve("paper/qwen3-32b-128gpu"), base)).to_result().summary
    fit = thrash["env_managers_fit"]
    cured = run_sim(load_plan(resolve("paper/qwen3-32b-128gpu"), [*base, f"algorithm.env_managers={fit}"])).to_result().summary
    assert cured["kv_preemptions"] < thrash["kv_preemptions"] / 10
    assert plan_rates(cured)[0] > 1.5 * plan_rates(thrash)[0]
