"""``step_overhead_ms`` on a generation group or the reward placement: the engine's fixed cost a step, for the
kernel profile's assumed 3 ms (vLLM 0.8). A probe (helper-87) found it the largest lever on small-batch
hardware comparisons, with no way to state another engine's (SGLang's ~1.5 ms)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart.calibration import generation_cost
from rollart.calibration.engine_fit import fit_engine_csv
from rollart.calibration.profiles import save_profile
from rollart.plan import PlanError
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, ModelSpec
from tests.conftest import run_sim, small_plan
from tests.test_calibration import _engine_csv

ASSUMED_S = 0.003  # every shipped kernel profile's iteration_overhead_s


@pytest.mark.parametrize("gpu", ["H800", "H20", "B200", "A100"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_a_stated_step_overhead_replaces_the_assumed_one_in_every_step(gpu: str, dtype: str) -> None:
    """Every step (a decode iteration at any batch, a prefill, a mixed step) moves by exactly the difference,
    floored presets included (a B200 is floored by the H20 and others, each priced with the same overhead)."""
    m = ModelSpec.model_validate({"preset": "Qwen3-8B", "weight_dtype": dtype})
    sheet = GpuType(**GPU_PRESETS[gpu])
    base, fast = generation_cost(m, gpu, sheet, 1), generation_cost(m, gpu, sheet, 1, step_overhead_s=0.0015)
    d = ASSUMED_S - 0.0015
    for b in (1, 16, 256):
        assert base.decode_line(b).total(b * 2048, b, 1) - fast.decode_line(b).total(b * 2048, b, 1) == \
            pytest.approx(d)
    assert base.prefill_time(4096, 4096 ** 2 / 2, 1) - fast.prefill_time(4096, 4096 ** 2 / 2, 1) == pytest.approx(d)
    assert base.mixed_step_time(512, 512 ** 2 / 2, 8, 8 * 2048, 1) - \
        fast.mixed_step_time(512, 512 ** 2 / 2, 8, 8 * 2048, 1) == pytest.approx(d)
    assert "engine step overhead 1.5 ms" in fast.source


def test_a_decode_bound_run_speeds_up_with_a_lighter_engine() -> None:
    """The default scenario with both pools' engines at 1 ms a step decodes faster than at the assumed 3 ms."""
    plan = ["algorithm.steps=3"]
    light = [*plan, "placement.generation.0.step_overhead_ms=1", "placement.generation.1.step_overhead_ms=1"]
    base, fast = (run_sim(small_plan(o), "sync").to_result().summary for o in (plan, light))
    assert fast["step_time_s_mean"] < base["step_time_s_mean"]


def test_an_engine_profile_refuses_a_stated_step_overhead(tmp_path: Path) -> None:
    """An engine profile measured its engine end to end, its own overhead included: stating another is a plan
    error naming the field, not a silent double count."""
    _engine_csv(tmp_path / "p.csv")
    save_profile(fit_engine_csv(tmp_path / "p.csv", gpu="cpu", model="Qwen3-8B"), tmp_path / "e.yaml")
    plan = small_plan([f"cluster.gpu_pools.h20.profile={tmp_path / 'e.yaml'}",
                       "placement.generation.1.step_overhead_ms=1.5"])
    with pytest.raises(PlanError, match=r"placement\.generation\.1\.step_overhead_ms: .*is an engine profile"):
        run_sim(plan, "sync")
    with pytest.raises(PlanError, match=r"placement\.generation\.0\.step_overhead_ms"):
        small_plan(["placement.generation.0.step_overhead_ms=-1"])
