"""Waiting for the CPU pool's cores is its own part of a step (``env_queue``), not env.reset, and a
run says how much of its CPU pool it held: a buyer sizes the pool, or the image cache, from these."""

from __future__ import annotations

from rich.console import Console

from rollart.report import step_table, summary_table
from tests.conftest import run_sim, small_plan


def _result(cores: int):
    out = run_sim(small_plan(["algorithm.batch_size=64", "algorithm.steps=2", f"cluster.cpu_pools.env.cores={cores}"]),
                  "rollart")
    assert out.error is None
    return out.to_result()


def _text(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True)
    console.print(renderable)
    return console.export_text()


def test_a_small_pool_shows_as_queueing_for_cores_not_as_env_reset() -> None:
    small, large = _result(16), _result(1024)
    queued = sum(s.breakdown_s["env_queue"] for s in small.steps)
    assert queued > 0 and all(s.breakdown_s["env_queue"] == 0 for s in large.steps)
    # the resets themselves take what they take: the queue is not folded into them
    assert sum(s.breakdown_s["env_reset"] for s in small.steps) < queued
    cs, cl = small.summary["env_cores"]["env"], large.summary["env_cores"]["env"]
    assert cs["cores"] == 16 and cs["peak_held_share"] == 1.0 and cs["mean_wait_s"] > 0
    assert cl["cores"] == 1024 and 0 < cl["peak_held_share"] < 0.5 and cl["mean_wait_s"] == 0
    for s in small.steps:  # the breakdown still adds up to the step
        assert abs(sum(s.breakdown_s.values()) - s.time_s) < 1e-6


def test_the_tables_name_the_wait_and_the_idle_pool() -> None:
    small, large = _result(16), _result(1024)
    assert " cpu " in _text(step_table(small)) and " cpu " not in _text(step_table(large))
    assert "envs waited" in _text(summary_table(small), 300)
    assert "billed for all 1,024 (cluster.cpu_pools.env.cores)" in _text(summary_table(large), 300)


def test_every_breakdown_part_has_a_colour_and_a_name_wherever_parts_are_shown() -> None:
    # a new part (env_queue) broke rollart validate's plot once: every table and plot must know every part
    from rollart.core.stats import BREAKDOWN_KEYS
    from rollart.planner.report import NAMES
    from rollart.report import SHORT
    from rollart.validate.plots import COLORS

    for shown in (COLORS, NAMES, SHORT):
        assert set(BREAKDOWN_KEYS) <= set(shown)


def test_the_pool_reports_what_its_envs_hold_on_average_and_compute_in() -> None:
    """An env reserves its cores for its whole episode, LLM turns included: the core-seconds held are
    integrated over the run and split from those spent in env calls (resets, steps, rule rewards), so a
    buyer sees how far the reservation exceeds the computing (helper-88: 8 cores slowed envs needing 1.6
    CPU-s a step 4.6×, and nothing said why). Slower env calls compute a larger share of what is held."""
    only = ["algorithm.steps=3", "tasks.GEM-Math.share=1e-6", "tasks.CodeExec.share=1e-6"]  # FrozenLake alone
    fast = run_sim(small_plan([*only, "tasks.FrozenLake.env.step=0.05"]), "rollart")
    slow = run_sim(small_plan([*only, "tasks.FrozenLake.env.step=1.0"]), "rollart")
    c_fast, c_slow = (o.to_result().summary["env_cores"]["env"] for o in (fast, slow))
    for c in (c_fast, c_slow):
        assert 0 < c["mean_held_share"] <= c["peak_held_share"] and 0 < c["computing_share_of_held"] < 1
    assert c_slow["computing_share_of_held"] > 2 * c_fast["computing_share_of_held"]
    # the integral by hand: every env holds its cores from its first reset to its close
    b = fast.backend
    held, busy = b.cpu_held["env"], b.cpu_busy_s["env"]
    assert held[0] >= 0 and busy > 0 and held[1] > busy
