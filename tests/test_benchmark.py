"""Benchmark: wall time per simulated paper-scale step (Qwen3-32B, 128 GPUs, batch 512).

Run with ``pytest tests/test_benchmark.py --benchmark-enable``; in the normal suite it runs
once as a smoke test (benchmarks are disabled in pytest's addopts)."""

from __future__ import annotations

import time

import pytest

from rollart.core import mode_config
from rollart.plan import load_plan
from rollart.scenarios_catalog import resolve
from rollart.sim import SimBackend

STEPS = 3


@pytest.mark.slow
def test_paper_scale_step(benchmark) -> None:
    plan = load_plan(resolve("paper/qwen3-32b-128gpu"), [f"algorithm.steps={STEPS}"])
    stats: dict[str, float] = {}

    def run() -> None:
        backend = SimBackend(plan, mode_config(plan), seed=0)
        t0 = time.perf_counter()
        outcome = backend.run()
        wall = time.perf_counter() - t0
        assert outcome.error is None and len(backend.ctl.stats.steps) == STEPS
        stats.update(wall_per_step_s=wall / STEPS, effects_per_s=backend.effects_handled / wall)

    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info.update(stats)
    print(f"\nwall per simulated step: {stats['wall_per_step_s']:.2f} s; {stats['effects_per_s']:,.0f} effects/s")
