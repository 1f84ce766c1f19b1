"""When the engines' KV cannot hold the conversations the env managers keep in flight, the summary names the
env_managers that fit: a setting, not more GPUs (helper-95: the 32B plan at batch 1,024 read 0.56
trajectories/s at its default 1,280 env managers and 1.31 at 640)."""

from __future__ import annotations

from rich.console import Console

from rollart.plan import load_plan
from rollart.report import summary_table
from rollart.scenarios_catalog import default_scenario
from tests.conftest import run_sim

SMALL_KV = ["algorithm.batch_size=128", "algorithm.steps=3",
            "placement.generation=[{pool: h800, workers: 2, tp: 2, gpu_memory_utilization: 0.27}, "
            "{pool: h20, workers: 8, tp: 1, gpu_memory_utilization: 0.27}]"]


def test_a_run_whose_kv_overflows_names_the_env_managers_that_fit() -> None:
    result = run_sim(load_plan(default_scenario(), SMALL_KV)).to_result()
    sm = result.summary
    assert sm["kv_preemptions"] > 0
    held, flight, fit, rounds = (sm[k] for k in ("kv_conversations_held", "env_managers_in_flight",
                                                  "env_managers_fit", "env_manager_rounds"))
    groups, members = sm["groups_per_batch"], 10  # 16 groups of 8, redundancy 0.25: 10 members each
    assert (groups, flight) == (16, 160) and held < flight
    # whole env groups, each rolling out a whole number of a batch's groups, as few rounds as fit
    assert fit == -(-groups // rounds) * members <= held
    assert rounds == 1 or -(-groups // (rounds - 1)) * members > held
    console = Console(width=400, record=True)
    console.print(summary_table(result))
    assert f"algorithm.env_managers={fit}" in console.export_text()


def test_a_run_that_fits_its_kv_says_nothing() -> None:
    sm = run_sim(load_plan(default_scenario(), ["algorithm.batch_size=16", "algorithm.steps=3"])).to_result().summary
    assert sm["kv_preemptions"] == 0 and "env_managers_fit" not in sm
