"""Memory and context-window physics of a generation worker: what a plan can ask an engine to hold."""

from __future__ import annotations

import numpy as np
import pytest

from rollart.plan import PlanError, load_plan
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, ModelSpec, overlong_prompt_share
from rollart.scenarios_catalog import default_scenario
from rollart.sim.costs.env import EnvModel
from rollart.sim.costs.gpu import RooflineEfficiency, kv_capacity

from tests.conftest import run_sim, small_plan

WINDOW = 16_384
# (25000 − 16384) / 24000 = 36 % of the draws of U(1000, 25000) fill a 16K window
OVERLONG = ["tasks.GEM-Math.max_context_tokens=16384", "tasks.GEM-Math.prompt_tokens={kind: uniform, low: 1000, "
            "high: 25000}"]


def test_a_first_prompt_is_never_longer_than_the_window() -> None:
    """RL harnesses drop prompts that leave no room in the window (verl's filter_overlong_prompts) and an
    engine refuses them (vLLM: longer than max_model_len): the simulator draws such a prompt again, so no
    request ever exceeds the task's window, while the draws that fit keep their distribution."""
    plan = small_plan(OVERLONG)
    task = plan.task("GEM-Math")
    env = EnvModel(plan.algorithm.seed)
    prompts = [env.reset(task, i)[1].obs_tokens for i in range(2000)]
    assert max(prompts) < WINDOW
    # the kept draws are U(1000, 16384): mean ≈ 8,700, not the cut's pile-up at the window
    assert np.mean(prompts) == pytest.approx((1000 + WINDOW) / 2, rel=0.03)
    assert sum(p >= WINDOW - 10 for p in prompts) < 5


def test_no_request_of_a_run_exceeds_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollart.sim import engine

    longest = [0]
    add = engine.GenerationEngine.add

    def watched(self, traj_id, context, tokens, *args, **kwargs):  # noqa: ANN001, ANN202
        longest[0] = max(longest[0], context + tokens)
        return add(self, traj_id, context, tokens, *args, **kwargs)

    monkeypatch.setattr(engine.GenerationEngine, "add", watched)
    run_sim(small_plan([*OVERLONG, "algorithm.steps=1"]))
    assert 0 < longest[0] <= WINDOW


def test_prompts_that_mostly_overfill_the_window_are_refused_naming_the_field() -> None:
    with pytest.raises(PlanError) as info:
        # mean 12,400 tokens (fits the window), but 60 % of the prompts fill it
        load_plan(default_scenario(), ["tasks.GEM-Math.max_context_tokens=16384",
                                       "tasks.GEM-Math.prompt_tokens={kind: mixture, components: [{weight: 0.6, dist: "
                                       "{kind: constant, value: 20000}}, {weight: 0.4, dist: {kind: constant, value: "
                                       "1000}}]}"])
    line, = (p for p in info.value.problems if p.startswith("tasks.GEM-Math.prompt_tokens:"))
    assert "max_context_tokens (16384)" in line and "%" in line
    assert overlong_prompt_share(small_plan(OVERLONG).task("GEM-Math")) == pytest.approx(0.36, abs=0.04)


@pytest.mark.parametrize("gpu, visible_mib", [("H800", 81_089), ("H100", 81_089), ("H20", 97_285),
                                              ("H200", 143_156), ("A100", 80 * 40_536 / 40)])
def test_the_kv_cache_is_sized_on_the_memory_the_driver_reports(gpu: str, visible_mib: int) -> None:
    """vLLM's gpu_memory_utilization multiplies the total CUDA reports (torch's total_memory), ~1 % under
    a Hopper's 80/96/141 GiB; so 0.9 of an H800 holds 0.9 × 0.81 GiB less KV than 0.9 of 80 GiB would.
    The expected totals are the public printouts themselves (A100: its 40 GB part's share on 80 GiB)."""
    sheet = GpuType(**GPU_PRESETS[gpu])
    assert sheet.usable_memory_gib == pytest.approx(visible_mib / 1024, abs=1e-3)
    assert 0.985 < sheet.usable_memory_gib / sheet.memory_gb < 0.995  # the driver's ~1 %, on every preset
    assert sheet.usable_memory_gib <= sheet.memory_gb
    m, eff = ModelSpec.model_validate("Qwen3-8B"), RooflineEfficiency()
    nominal = sheet.model_copy(update={"memory_visible_gib": None})
    lost_gib = (kv_capacity(m, nominal, 1, eff) - kv_capacity(m, sheet, 1, eff)) * m.kv_bytes_per_token / 2**30
    assert lost_gib == pytest.approx(eff.memory_utilization * (sheet.memory_gb - visible_mib / 1024), abs=1e-3)


def test_visible_memory_above_the_gpus_memory_is_refused() -> None:
    with pytest.raises(PlanError) as info:
        load_plan(default_scenario(), ["cluster.custom_gpus.X={tflops_bf16: 500, hbm_tbps: 3, memory_gb: 80, "
                                       "memory_visible_gib: 81}"])
    assert any(p.startswith("cluster.custom_gpus.X") and "memory_visible_gib 81 exceeds memory_gb 80" in p
               for p in info.value.problems)


def test_a_worker_that_cannot_hold_a_context_names_its_served_weights_and_the_fp8_fix() -> None:
    """Qwen3-32B in BF16 on one H800 leaves ~25K tokens of KV for a 32K window: the message gives the
    65.5 GB of BF16 weights held and offers an FP8 KV cache only when that would hold the context."""
    base = ["cluster.gpu_pools.h800.count=36", "placement.trainer.gpus=32", "placement.trainer.tp=8",
            "tasks.FrozenLake.max_context_tokens=32768"]
    with pytest.raises(PlanError) as info:
        run_sim(small_plan([*base, "model=Qwen3-32B", "cluster.gpu_pools.h20.gpu=H800"]))
    line, = info.value.problems
    assert line.startswith("placement.generation.1.tp: Qwen3-32B (65.5 GB of bf16 weights held)")
    assert line.endswith("or serve it in FP8 (model.kv_dtype: fp8)")
    fp8 = "model={preset: Qwen3-32B, weight_dtype: fp8}"
    small = "cluster.custom_gpus.H800x40={tflops_bf16: 989, tflops_fp8: 1978, hbm_tbps: 3.35, memory_gb: 40}"
    with pytest.raises(PlanError) as info:
        run_sim(small_plan([*base, fp8, small, "cluster.gpu_pools.h20.gpu=H800x40"]))
    line, = info.value.problems
    assert "(34.3 GB of fp8 weights held)" in line and "FP8 (" not in line  # an FP8 cache would not hold it


def test_a_window_past_the_models_native_one_is_said_not_refused() -> None:
    """Qwen3 is trained for 32,768 tokens; 64K or 128K needs YaRN rope scaling (the model card). A task
    window past it still runs and is priced as it is, but the summary says so (helper-91 found 128K accepted
    silently); a model the plan describes (no preset) has no card to read."""
    long = ["tasks.GEM-Math.max_context_tokens=65536", "placement.trainer.cp=2", "algorithm.batch_size=16",
            "algorithm.steps=1"]
    notes = load_plan(default_scenario(), long).context_notes()
    assert len(notes) == 1 and "tasks.GEM-Math.max_context_tokens=65,536" in notes[0] and "YaRN, factor 2" in notes[0]
    assert load_plan(default_scenario()).context_notes() == []
    described = load_plan(default_scenario(), [*long, "model={name: mine, layers: 36, hidden: 4096, heads: 32, "
                                                       "kv_heads: 8, head_dim: 128, intermediate: 12288, vocab: 151936}"])
    assert described.context_notes() == []
    summary = run_sim(load_plan(default_scenario(), long)).to_result().summary
    assert summary["context_notes"] == notes
    assert "context_notes" not in run_sim(small_plan()).to_result().summary
