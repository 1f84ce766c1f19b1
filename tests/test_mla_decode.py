"""MLA decode attention on Hopper-class GPUs runs at FlashMLA's published rates, not the GQA fit's."""

from __future__ import annotations

import pytest

from rollart.calibration import generation_cost
from rollart.calibration.mla_decode import flashmla_efficiency
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, ModelSpec
from rollart.sim.costs.gpu import decode_attention_flops

DSV3 = ModelSpec.model_validate({"preset": "DeepSeek-V3", "weight_dtype": "fp8"})


def test_flashmla_shares_are_its_published_h800_rates() -> None:
    e_c, e_bw, source = flashmla_efficiency()
    assert e_c == pytest.approx(660 / 989)  # 660 TFLOP/s compute-bound on H800 SXM5 (2025-04-22 release)
    assert e_bw == pytest.approx(3000 / 3350)  # 3,000 GB/s memory-bound
    assert "FlashMLA" in source


@pytest.mark.parametrize("gpu", ["H800", "H20", "H200"])
def test_mla_decode_attention_is_priced_at_flashmla_rates_on_hopper(gpu: str) -> None:
    cost = generation_cost(DSV3, gpu, GpuType(**GPU_PRESETS[gpu]), 8, ep=8)
    e_c, e_bw, _ = flashmla_efficiency()
    compute, memory = cost._per_cached_token(64 * 8)  # 64 sequences a rank: no occupancy slowdown
    # one cached token of one layer: all 128 heads on the rank's GPU, the absorbed form's FLOPs
    flops = decode_attention_flops(DSV3)
    assert compute == pytest.approx(flops / 8 / (cost._peak * e_c))
    assert memory == pytest.approx(cost._decode_token_bytes / 8 / (cost._bw * e_bw))
    assert "FlashMLA" in cost.source


def test_without_fp8_tensor_cores_the_gqa_fit_stays() -> None:
    # A100 has no FlashMLA (engines run Triton's MLA kernel): its decode attention keeps the profile's fit
    a100 = generation_cost(DSV3.model_copy(update={"weight_dtype": "bf16"}), "A100", GpuType(**GPU_PRESETS["A100"]), 16,
                           ep=16)
    assert "FlashMLA" not in a100.source
    assert a100._attn_decode["e_c"] == a100.profile.attn_decode.params["e_c"]
    # on H800 FlashMLA beats the GQA fit's compute share, so a long-context MLA decode step gets faster
    h800 = generation_cost(DSV3, "H800", GpuType(**GPU_PRESETS["H800"]), 16, ep=16)
    assert h800._attn_decode["e_c"] > h800.profile.attn_decode.params["e_c"]


def test_fewer_heads_than_a_flashmla_tile_pad_it() -> None:
    # tensor parallelism over the 128 heads: tp 8 leaves 16 heads a GPU, a quarter of FlashMLA's 64-row
    # query tile, so the compute runs at a quarter of the published share; a rank holding all 128 fills it
    from rollart.calibration.mla_decode import flashmla_row_use

    assert flashmla_row_use(16) == 0.25 and flashmla_row_use(128) == 1.0 and flashmla_row_use(64) == 1.0
    e_c = flashmla_efficiency()[0]
    tp8 = generation_cost(DSV3, "H20", GpuType(**GPU_PRESETS["H20"]), 8)
    ep8 = generation_cost(DSV3, "H20", GpuType(**GPU_PRESETS["H20"]), 8, ep=8)
    assert tp8._attn_decode["e_c"] == pytest.approx(e_c * 16 / 64)
    assert ep8._attn_decode["e_c"] == pytest.approx(e_c)
