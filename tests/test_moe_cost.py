"""MoE weight traffic: the expected number of distinct experts a batch touches, and that the
roofline and the calibrated kernel-profile cost both read that many experts per step."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollart.calibration import generation_cost
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, ModelSpec
from rollart.sim.costs.gpu import RooflineGeneration
from rollart.sim.costs.moe import experts_touched, model_experts_touched, weight_bytes_read

MOE = ModelSpec(name="Qwen3-30B-A3B", layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128,
                intermediate=768, vocab=151936, moe_experts=128, moe_active_experts=8)
H800 = GpuType(**GPU_PRESETS["H800"])


def test_one_token_touches_its_k_experts() -> None:
    assert experts_touched(1, 128, 8) == pytest.approx(8)
    assert experts_touched(1, 64, 2) == pytest.approx(2)
    assert experts_touched(0, 128, 8) == 0.0


def test_large_batch_touches_every_expert() -> None:
    assert experts_touched(4096, 128, 8) == pytest.approx(128)
    assert experts_touched(10**9, 128, 8) <= 128


def test_closed_form() -> None:
    assert experts_touched(16, 128, 8) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 16))


@given(st.integers(1, 1023), st.integers(1, 256), st.integers(1, 16))
def test_monotone_and_bounded(b: int, experts: int, active: int) -> None:
    active = min(active, experts)
    lo, hi = experts_touched(b, experts, active), experts_touched(b + 1, experts, active)
    assert active - 1e-9 <= lo <= hi + 1e-9
    assert hi <= experts


def test_dense_model_reads_all_its_weights() -> None:
    dense = ModelSpec(preset="Qwen3-8B")
    assert model_experts_touched(dense, 64) == 1.0
    assert weight_bytes_read(dense, 1) == weight_bytes_read(dense, 512) == dense.weight_bytes


def test_moe_weight_bytes_grow_from_active_to_all() -> None:
    one, many = weight_bytes_read(MOE, 1), weight_bytes_read(MOE, 100_000)
    assert many == pytest.approx(MOE.weight_bytes)
    assert one == pytest.approx(2 * MOE.active_params, rel=1e-9)  # k experts + the dense part
    assert one < weight_bytes_read(MOE, 32) < many


@pytest.mark.parametrize("profile", ["datasheet", None])  # roofline and the shipped kernel profile
def test_moe_decode_cost_follows_the_experts_touched(profile: str | None) -> None:
    cost = generation_cost(MOE, "H800", H800, 1, profile)
    per_token = [cost.decode_line(b).total(0.0, b, 1) / b for b in (1, 8, 64, 512)]
    t1, t512 = cost.decode_line(1).total(0.0, 1, 1), cost.decode_line(512).total(0.0, 512, 1)
    # Reading all 128 experts at batch 512 costs far more than one token's 8, yet far less per token.
    assert t512 > 3 * t1
    assert per_token == sorted(per_token, reverse=True)


def test_roofline_moe_decode_one_token_reads_active_weights_only() -> None:
    cost = RooflineGeneration(MOE, H800, 1)
    bw = H800.hbm_tbps * 1e12 * cost.eff.decode_bandwidth
    assert cost.decode_line(1).m0 == pytest.approx(2 * MOE.active_params / bw)
    assert cost.decode_line(4096).m0 == pytest.approx(MOE.weight_bytes / bw)
