"""Bounded memory: a long simulation keeps state proportional to what is in flight, not to
its history (consumed and aborted trajectories become counters and per-step records)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from benchmarks.sim_speed import heap_slope
from rollart.core import mode_config
from rollart.sim import SimBackend
from tests.conftest import small_plan

STEPS = 30


def _heap_after_each_step(mode: str, keep_history: bool) -> tuple[list[int], SimBackend]:
    plan = small_plan([f"algorithm.steps={STEPS}", "algorithm.redundancy=0.5",
                       "tasks.CodeExec.env.failure_prob=0.05"])
    heap: list[int] = []

    def on_step(_rec: object) -> None:
        gc.collect()  # trajectory ↔ group cycles are freed by the collector
        heap.append(tracemalloc.get_traced_memory()[0])

    gc.collect()
    tracemalloc.start()
    try:
        backend = SimBackend(plan, mode_config(plan, mode), 0, on_step=on_step, keep_history=keep_history)
        out = backend.run()
    finally:
        tracemalloc.stop()
    assert out.error is None and len(heap) == STEPS
    return heap, backend


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["rollart", "sync"])
def test_memory_is_flat_over_many_steps(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The cost model's token-count memo is bounded by its cap, not by what is in flight: a small cap
    # fills it in the first steps, so a slope left after them is history (the cap has its own test,
    # tests/test_calibration.py::test_token_memo_stays_bounded).
    import rollart.calibration.cost as cost

    monkeypatch.setattr(cost, "_TOKEN_MEMO", 64)
    heap, backend = _heap_after_each_step(mode, keep_history=False)
    # After the pipeline fills, the heap grows only by the per-step record (~1-2 kB: StepRecord and
    # its breakdown dict); the full history grows by every trajectory's record and spans.
    slope = heap_slope(heap[STEPS // 4:])
    assert slope < 2_500, f"{slope:,.0f} bytes per step"
    history, kept = _heap_after_each_step(mode, keep_history=True)
    assert heap_slope(history[STEPS // 4:]) > 3 * max(slope, 1_000)  # the check can fail: history does grow
    # the counts are the same either way
    assert backend.ctl.outcome_counts() == kept.ctl.outcome_counts()
    assert [s.end_s for s in backend.ctl.stats.steps] == [s.end_s for s in kept.ctl.stats.steps]


def test_the_speed_benchmark_refuses_too_few_steps_for_a_memory_slope(capsys) -> None:
    """Two marks give no slope: the benchmark says so in one line (exit 2) instead of a KeyError."""
    from benchmarks.sim_speed import main

    with pytest.raises(SystemExit) as exc:
        main(["--steps", "1", "--mem-steps", "2"])
    assert exc.value.code == 2 and "--mem-steps: 2 is too few" in capsys.readouterr().err
