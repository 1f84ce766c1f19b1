"""The composed GPU model against measured end-to-end serving (SGLang on H20, InferSim's README):
nothing is fitted to these figures, so they check the composition of the kernel fits."""

from __future__ import annotations

import numpy as np
import pytest

from rollart.calibration import datasets as D
from rollart.calibration import kernels as K
from rollart.calibration.profiles import load_profile, shipped_profile_path
from rollart.calibration.serving import HF_CONFIGS, model_from_hf_config, serving_checks
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import ModelSpec


def test_composed_profiles_predict_measured_serving_within_10_percent():
    """Prefill (compute-bound) and decode (64 sequences a GPU, bound by KV reads) of a dense FP8 model and of a
    BF16 MoE served with data-parallel attention and 4-way expert parallelism."""
    checks = serving_checks()
    assert {(c.model, c.phase) for c in checks} == {(m, p) for m in ("qwen3-8B", "qwen3-30B-A3B")
                                                    for p in ("prefill", "decode")}
    for c in checks:
        assert abs(c.error) < 0.10, (c.model, c.phase, c.measured_tgs, c.predicted_tgs)


def test_the_grouped_gemm_term_is_what_brings_the_moe_within_reach():
    """Priced as dense GEMMs of the experts' shapes, the MoE runs 10–16 % too fast end to end (decode
    10 %: the 64-row tile already charges an expert's few rows a whole tile; prefill 16 %); the measured
    grouped-GEMM term (one launch over many small expert weights: lower tile efficiency at few rows per
    expert) closes most of it. The dense model is unaffected."""
    h20 = load_profile(shipped_profile_path("H20"))
    without = serving_checks(profiles={"H20": h20.model_copy(update={"gemm_grouped_fp8": None})})
    with_term = serving_checks()
    for a, b in zip(without, with_term):
        if a.model == "qwen3-8B":
            assert a.predicted_tgs == b.predicted_tgs
        else:
            assert a.error > 0.08 and b.error < a.error - 0.03, (a.phase, a.error, b.error)


@pytest.mark.parametrize("preset,config", [("Qwen3-8B", "qwen3-8B_config.json"),
                                           ("Qwen3-30B-A3B", "qwen3-30B-A3B_config.json")])
def test_model_presets_are_the_published_configs(preset, config):
    spec = ModelSpec.model_validate(preset)
    shipped = model_from_hf_config(HF_CONFIGS / config)
    assert spec.model_dump(exclude={"name"}) == shipped.model_dump(exclude={"name"})


@pytest.mark.parametrize("gpu", ["h20", "h800"])
def test_grouped_fit_predicts_measured_grouped_gemms_better_than_the_dense_fit(gpu):
    """Why the term exists: on DeepGEMM's own grouped timings, the dense FP8 fit (what the MoE layer
    was priced with) misses by more than the grouped fit does; the grouped fit holds its held-out rows
    within the profile's reported error."""
    profile = load_profile(shipped_profile_path(gpu))
    X, y, _ = D.infersim_grouped_gemm(gpu)
    peak, bw = 2 * GPU_PRESETS[profile.gpu]["tflops_bf16"] * 1e12, GPU_PRESETS[profile.gpu]["hbm_tbps"] * 1e12
    grouped = K.mape(K.grouped_gemm_time(X, profile.gemm_grouped_fp8.params, peak, bw), y)
    dense = K.mape(K.grouped_gemm_time(X, profile.gemm_fp8.params, peak, bw), y)
    assert grouped < dense - 0.03
    assert profile.gemm_grouped_fp8.mape_heldout < 0.13


def test_benchmark_rows_with_one_token_per_expert_read_half_the_experts():
    """InferSim's benchmark gives each group int(m·U(0.7, 1.3)) rows: at m = 1 half the groups hold none
    (their weights are not read), from m = 2 every group holds rows, about m − 0.5 of them."""
    assert D.grouped_rows(1) == pytest.approx((0.5, 1.0), abs=1e-3)
    share, mean = D.grouped_rows(32)
    assert share == 1.0 and mean == pytest.approx(31.5, abs=0.1)
    X, _, _ = D.infersim_grouped_gemm("h20")
    assert np.all(X[:, 0] >= 0.5) and np.all(X[:, 1] >= 1)


def _qwen_h20_batch_one() -> list[tuple[str, str, float, float]]:
    """(model, weight dtype, public ms per generated token, simulated) for Qwen's published H20 rows
    (``calibration/data/public/qwen3_speed_h20.csv``: SGLang, batch 1, 1 input token, 2,048 generated)."""
    import csv

    from rollart.calibration import generation_cost
    from rollart.plan.schema import GpuType

    rows = []
    with open(D.QWEN3_SPEED_H20) as f:
        for r in csv.DictReader(f):
            out = int(r["output_tokens"])
            public = (int(r["input_tokens"]) + out) / float(r["speed_tokens_per_s"]) / out
            spec = ModelSpec.model_validate({"preset": r["model"], "weight_dtype": r["weight_dtype"]})
            cost = generation_cost(spec, "H20", GpuType(**GPU_PRESETS["H20"]), int(r["gpus"]), None)
            sim = cost.decode_line(1).total(1, 1, out) / out  # the line grows the context itself
            rows.append((r["model"], r["weight_dtype"], public, sim))
    return rows


def test_batch_one_h20_decode_against_qwens_public_benchmark():
    """A hold-out check (not fitted): per generated token at batch 1 on one H20. Before the 64-row tile
    (``kernels.M_TILE``) the dense models ran 1.3–1.9× faster than measured; now FP8 runs 0.79–1.0× the
    public speed (slow where SGLang's ~1.5 ms per-step overhead, below the 3 ms assumed for vLLM 0.8,
    weighs most: the 8B) and BF16 1.07–1.39× (fast on the large models: H20's BF16 GEMM efficiency is
    derived from its FP8 kernel's)."""
    rows = _qwen_h20_batch_one()
    assert len(rows) == 8
    for model, dtype, public, sim in rows:
        speed = public / sim  # > 1: the model is faster than measured
        assert 0.75 < speed < (1.1 if dtype == "fp8" else 1.45), (model, dtype, public, sim)


def test_the_element_wise_kernels_are_what_the_composed_prefill_lacked(monkeypatch):
    """A layer runs more than its GEMMs and attention: two residual-add RMSNorms, rotary embedding,
    SiLU-and-mul (and FP8 activation quantisation) each stream the step's activations through HBM.
    Without that traffic the composed prefill ran 6–8 % faster than SGLang measured on H20; with it
    (bytes from the geometry at the measured long-stream rate, nothing fitted) within 4.1 % (the MoE,
    +3.3 % before its grouped-GEMM knee moved as time). Decode reads a few MB of activations beside GBs
    of weights and KV: it moves < 1 %."""
    from rollart.calibration.cost import KernelProfileGeneration

    with_term = serving_checks()
    monkeypatch.setattr(KernelProfileGeneration, "_elementwise", lambda self, m: 0.0)
    without = serving_checks()
    for a, b in zip(without, with_term):
        assert (a.model, a.phase) == (b.model, b.phase)
        if a.phase == "prefill":
            assert a.error > 0.05 and abs(b.error) < 0.045 and a.error - b.error > 0.03, (a.model, a.error, b.error)
        else:
            assert abs(a.error - b.error) < 0.01, (a.model, a.error, b.error)
