"""Benchmark: CPU seconds per simulated paper-scale step (Qwen3-32B, 128 GPUs, batch 512), and the
simulator's events per CPU-s as a ratio to raw SimPy's, measured in the same run (the figure to
track on a shared machine). ``benchmarks/sim_speed.py`` prints the same figures plus memory per
step and the 3,072-GPU step.

Run with ``pytest tests/test_benchmark.py --benchmark-enable``; in the normal suite it runs
once as a smoke test (benchmarks are disabled in pytest's addopts)."""

from __future__ import annotations

import time

import pytest

from benchmarks.sim_speed import raw_simpy_events_per_cpu_s, requests_routed
from rollart.core import mode_config
from rollart.plan import load_plan
from rollart.scenarios_catalog import resolve
from rollart.sim import SimBackend

STEPS = 3


@pytest.mark.slow
def test_paper_scale_step(benchmark) -> None:
    plan = load_plan(resolve("paper/qwen3-32b-128gpu"), [f"algorithm.steps={STEPS}"])
    stats: dict[str, float] = {}
    floor = raw_simpy_events_per_cpu_s(events=200_000)

    def run() -> None:
        backend = SimBackend(plan, mode_config(plan), seed=0, keep_history=False)
        t0 = time.process_time()
        outcome = backend.run()
        cpu = time.process_time() - t0
        assert outcome.error is None and len(backend.ctl.stats.steps) == STEPS
        events = next(backend.env._eid)
        requests = requests_routed(backend)  # one per turn
        assert requests > 0
        stats.update(cpu_per_step_s=cpu / STEPS, effects_per_cpu_s=backend.effects_handled / cpu,
                     events_per_cpu_s=events / cpu, simpy_floor_events_per_cpu_s=floor,
                     floor_over_sim=floor / (events / cpu), cpu_us_per_request=1e6 * cpu / requests,
                     events_per_request=events / requests)

    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info.update(stats)
    print(f"\nCPU-s per simulated step: {stats['cpu_per_step_s']:.3f}; {stats['events_per_cpu_s']:,.0f} events/CPU-s "
          f"= raw SimPy ({floor:,.0f}) / {stats['floor_over_sim']:.1f}; per generation request "
          f"{stats['cpu_us_per_request']:.1f} CPU-µs and {stats['events_per_request']:.2f} events")
