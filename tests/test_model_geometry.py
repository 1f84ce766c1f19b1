"""Model geometry beyond plain GQA transformers: DeepSeek-V3-class MoE (multi-head latent attention,
a shared expert, dense first layers) and Qwen3-235B-A22B, in the schema's derived sizes and in every
cost model; and every older preset's figures exactly as they were before those fields existed."""

from __future__ import annotations

import pytest

from rollart.calibration import generation_cost, train_cost
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, ModelSpec, TrainerPlacement
from rollart.sim.costs import moe
from rollart.sim.costs.gpu import (RooflineEfficiency, RooflineGeneration, kv_bytes_per_token_held, kv_capacity,
                                   prefill_attention_flops)
from rollart.sim.costs.train import TrainCost


def _model(name: str, **fields: object) -> ModelSpec:
    return ModelSpec.model_validate({"preset": name, **fields})


def _gpu(name: str) -> GpuType:
    return GpuType(**GPU_PRESETS[name])


DSV3 = _model("DeepSeek-V3")
DSV3_FP8 = _model("DeepSeek-V3", weight_dtype="fp8", kv_dtype="fp8")


# ---------------------------------------------------------------- published sizes


@pytest.mark.parametrize("name, total, active", [
    ("DeepSeek-V3", 671e9, 37e9),       # model card (the 14 B MTP module apart)
    ("Qwen3-235B-A22B", 235e9, 22e9),   # model card
    ("Qwen3-30B-A3B", 30.5e9, 3.3e9),   # model card
])
def test_published_parameter_counts(name: str, total: float, active: float) -> None:
    m = _model(name)
    assert m.params == pytest.approx(total, rel=0.02)
    assert m.active_params == pytest.approx(active, rel=0.02)
    # per-layer figures stay consistent with the totals (a mean where the layers differ)
    emb = m.vocab * m.hidden * 2
    assert m.layers * m.params_per_layer + emb == pytest.approx(m.params, rel=1e-12)
    assert m.layers * m.active_params_per_layer + emb == pytest.approx(m.active_params, rel=1e-12)


def test_deepseek_v3_parts() -> None:
    m = DSV3
    # MLA: q_a 7168·1536, q_b 1536·128·192, kv_a 7168·576, kv_b 512·128·256, o 128·128·7168
    assert m.attention_params_per_layer == 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 \
        + 128 * 128 * 7168
    assert m.moe_layers == 58
    # the routed experts live in the 58 MoE layers only; the dense layers and the shared expert are not routed
    assert moe.expert_params(m) == 58 * 256 * 3 * 7168 * 2048
    assert m.params - moe.expert_params(m) == (61 * m.attention_params_per_layer + 58 * 3 * 7168 * 2048
                                               + 3 * 3 * 7168 * 18432 + 2 * 129280 * 7168)


# ---------------------------------------------------------------- KV cache


def test_mla_kv_bytes_per_token() -> None:
    assert DSV3.kv_bytes_per_token == 61 * (512 + 64) * 2
    assert _model("DeepSeek-V3", kv_dtype="fp8").kv_bytes_per_token == 61 * (512 + 64)
    # GQA unchanged: K and V of every KV head
    q = _model("Qwen3-235B-A22B")
    assert q.kv_bytes_per_token == 2 * 94 * 4 * 128 * 2


def test_mla_latent_is_whole_on_every_gpu() -> None:
    kv = DSV3_FP8.kv_bytes_per_token
    for tp in (1, 8, 16):
        assert kv_bytes_per_token_held(DSV3_FP8, tp) == tp * kv  # not split by tensor parallelism
    assert kv_bytes_per_token_held(DSV3_FP8, 16, ep=16) == kv  # DP attention: each rank its own sequences'
    assert kv_bytes_per_token_held(DSV3_FP8, 16, ep=2) == 8 * kv


@pytest.mark.parametrize("gpu, tp, ep", [("H800", 16, 1), ("H200", 8, 1), ("H200", 16, 1), ("H800", 16, 16)])
def test_deepseek_v3_fp8_has_kv_room_where_it_fits(gpu: str, tp: int, ep: int) -> None:
    g = _gpu(gpu)
    eff = RooflineEfficiency()
    free = tp * g.usable_memory_gib * 2**30 * eff.memory_utilization - moe.worker_weight_bytes(DSV3_FP8, ep, tp) \
        - tp * eff.activation_reserve_gb * 2**30
    cap = kv_capacity(DSV3_FP8, g, tp, eff, ep)
    assert cap == int(free // kv_bytes_per_token_held(DSV3_FP8, tp, ep)) > 100_000
    for cost in (RooflineGeneration(DSV3_FP8, g, tp, ep=ep), generation_cost(DSV3_FP8, gpu, g, tp, ep=ep)):
        assert cost.kv_capacity_tokens == cap


def test_deepseek_v3_does_not_fit_one_h800_node() -> None:
    """671 B FP8 weights (~627 GiB) exceed 8 × 80 GiB × 0.9: no KV room, as in practice (two nodes)."""
    g = _gpu("H800")
    assert moe.worker_weight_bytes(DSV3_FP8, 1, 8) > 8 * g.usable_memory_gib * 2**30 * 0.9
    assert kv_capacity(DSV3_FP8, g, 8, RooflineEfficiency()) == 0


def test_mla_replicated_down_projections_count_per_gpu() -> None:
    one = moe.worker_weight_bytes(DSV3_FP8, 1, 1)
    assert one == moe.served_weight_bytes(DSV3_FP8)
    extra = moe.worker_weight_bytes(DSV3_FP8, 1, 8) - one
    assert extra == 7 * 61 * 7168 * (1536 + 512 + 64)  # FP8: one byte each, seven more copies
    plain = _model("Qwen3-235B-A22B")
    assert moe.worker_weight_bytes(plain, 1, 8) == moe.worker_weight_bytes(plain, 1)  # GQA splits every weight


# ---------------------------------------------------------------- decode attention


def _as_gqa(m: ModelSpec) -> ModelSpec:
    """The same model with standard attention over its heads (what the schema could express before)."""
    return m.model_copy(update={"kv_lora_rank": 0, "q_lora_rank": 0, "qk_rope_head_dim": 0, "v_head_dim": None})


@pytest.mark.parametrize("gpu, tp", [("H800", 8), ("H200", 8), ("H800", 16)])
def test_mla_decode_reads_far_fewer_kv_bytes(gpu: str, tp: int) -> None:
    g = _gpu(gpu)
    gqa = _as_gqa(DSV3)
    batch, ctx = 64, 32_768
    # the kernel composition itself (a floored preset's decode line is an envelope of its floors')
    for make in (lambda m: RooflineGeneration(m, g, tp), lambda m: generation_cost(m, gpu, g, tp, bounded=False)):
        mla_cost, gqa_cost = make(DSV3), make(gqa)
        mla_line, gqa_line = mla_cost.decode_line(batch), gqa_cost.decode_line(batch)
        # seconds of KV read per cached token: a GPU's 128/tp heads' K and V (512 B a head and layer in BF16)
        # against the whole 1152 B latent on every GPU: 7 × fewer bytes at tp 8, 3.6 × at tp 16, 57 × at tp 1;
        # the calibrated model reads MLA's at FlashMLA's published byte rate, GQA's at the FlashInfer fit's
        rates = (mla_cost._attn_decode["e_bw"] / gqa_cost._attn_decode["e_bw"]
                 if hasattr(mla_cost, "_attn_decode") else 1.0)
        assert gqa_line.m1 / mla_line.m1 == pytest.approx(2 * (128 // tp) * 128 * 2 / ((512 + 64) * 2) * rates)
        assert mla_line.m1 * 3 < gqa_line.m1
        assert mla_line.c1 > gqa_line.c1  # absorbed attention: more FLOPs per cached token
        assert mla_cost.decode_line(batch).total(batch * ctx, batch, 1) \
            < gqa_cost.decode_line(batch).total(batch * ctx, batch, 1)
    # the roofline's bytes: every GPU reads the whole latent
    r = RooflineGeneration(DSV3, g, tp)
    eff = RooflineEfficiency()
    assert r.decode_line(batch).m1 * tp * g.hbm_tbps * 1e12 * eff.decode_bandwidth \
        == pytest.approx(tp * DSV3.kv_bytes_per_token)


def test_mla_attention_flops() -> None:
    # absorbed decode: QK over 512 + 64 and V over 512 per head; prefill: QK over 128 + 64, V over 128
    r = RooflineGeneration(DSV3, _gpu("H800"), 8)
    eff = RooflineEfficiency()
    pc = 8 * 989e12 * eff.decode_compute
    assert r.decode_line(1).c1 * pc == pytest.approx(61 * 2 * 128 * (2 * 512 + 64))
    assert prefill_attention_flops(DSV3) == 2 * 128 * (128 + 64 + 128)
    gqa = _model("Qwen3-8B")
    assert prefill_attention_flops(gqa) == 4 * 32 * 128


# ---------------------------------------------------------------- always-read weights


def _always_read_bytes(m: ModelSpec) -> float:
    """Served bytes of the weights every token runs: attention, the dense layers' MLP, the shared
    expert, the lm_head; plus the k routed experts of one token."""
    b = moe.weight_element_bytes(m)
    layers = (m.layers * m.attention_params_per_layer + m.dense_layers * 3 * m.hidden * m.dense_mlp_width
              + m.moe_layers * 3 * m.hidden * (m.shared_expert_intermediate
                                               + m.moe_active_experts * m.intermediate))
    return b * layers + 2.0 * m.vocab * m.hidden


@pytest.mark.parametrize("fields", [{}, {"weight_dtype": "fp8"}])
def test_shared_expert_and_dense_layers_always_read(fields: dict) -> None:
    m = _model("DeepSeek-V3", **fields)
    floor = _always_read_bytes(m)
    assert moe.weight_bytes_read(m, 1) == pytest.approx(floor + 2.0 * m.vocab * m.hidden)  # + the input embedding
    # without them a batch-1 step reads less, by their bytes
    bare = m.model_copy(update={"dense_layers": 0, "shared_expert_intermediate": 0})
    b = moe.weight_element_bytes(m)
    assert moe.weight_bytes_read(m, 1) - moe.weight_bytes_read(bare, 1) == pytest.approx(
        b * 3 * 7168 * (58 * 2048 + 3 * 18432 - 3 * 8 * 2048))  # the shared experts, 3 dense MLPs for 3 × 8 experts
    g = _gpu("H200")
    for cost in (RooflineGeneration(m, g, 8), generation_cost(m, "H200", g, 8)):
        step = cost.decode_line(1).total(1024, 1, 1)
        assert step >= floor / (8 * g.hbm_tbps * 1e12)
    r = RooflineGeneration(m, g, 8)
    assert r.decode_line(1).m0 * 8 * g.hbm_tbps * 1e12 * RooflineEfficiency().decode_bandwidth >= floor


def test_dense_layers_have_no_all_to_all() -> None:
    nv, net = (450e9, 2e-6), (50e9, 5e-6)
    full = moe.all_to_all_s(DSV3, 1024, 16, 16, *nv, *net)
    no_dense = moe.all_to_all_s(DSV3.model_copy(update={"dense_layers": 0}), 1024, 16, 16, *nv, *net)
    assert full == pytest.approx(no_dense * 58 / 61)


def test_train_flops_mla() -> None:
    t = TrainerPlacement(pool="p", gpus=256, tp=8, ep=8, pp=8)
    cost = train_cost(DSV3, _gpu("H800"), t, "H800")
    assert isinstance(cost, TrainCost)
    s = 4096
    linear = 10 * (DSV3.active_params - DSV3.vocab * DSV3.hidden) * s
    attention = 5 * 61 * 128 * (128 + 64 + 128) * s * s
    assert cost.busiest_rank_flops([s]) == pytest.approx(linear + attention)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("fields, needle", [
    ({"preset": "Qwen3-8B", "dense_layers": 2}, "dense_layers"),
    ({"preset": "Qwen3-8B", "shared_expert_intermediate": 512}, "shared_expert_intermediate"),
    ({"preset": "Qwen3-8B", "v_head_dim": 64}, "v_head_dim"),
    ({"preset": "Qwen3-8B", "qk_rope_head_dim": 64}, "qk_rope_head_dim"),
    ({"preset": "DeepSeek-V3", "dense_layers": 61}, "dense_layers"),
    ({"preset": "DeepSeek-V3", "kv_lora_rank": -1}, "kv_lora_rank"),
])
def test_bad_geometry_is_one_line_naming_the_field(fields: dict, needle: str) -> None:
    with pytest.raises(ValueError) as err:
        ModelSpec.model_validate(fields)
    lines = [ln for ln in str(err.value).splitlines() if needle in ln]
    assert lines


# ---------------------------------------------------------------- older presets unchanged
#
# Captured on the tree before MLA, shared experts and dense layers existed (same formulas for every plain
# model): params, active params, KV bytes a token, KV capacity on 8 × H800, step times in seconds. Since
# moved on purpose: H200/tp16 decode (2026-12-06: a ring across two boards crosses through 8 ports a
# board, capped by NVLink, not one port's rate); the MoE's train/64/8 (its experts sync on a ring of their
# own: one more ring latency); the FP8 MoE's ep-2 decode (DeepEP dispatches FP8, combines BF16).

KEYS = ("params", "active", "kv", "H800/tp8/ep1/cap", "H800/tp8/ep1/roof/dec64", "H800/tp8/ep1/kern/dec64",
        "H800/tp8/ep1/kern/pre", "H20/tp1/ep1/kern/mix", "H200/tp16/ep1/kern/dec256", "train/64/8",
        "H800/tp8/ep2/kern/dec64", "H800/tp8/ep2/roof/pre", "H800/tp8/ep2/cap")
# (session 50: a prefill step's all-to-all sends a token once per destination rank, DeepEP's normal kernels:
# Qwen3-30B-A3B's H800/tp8/ep2/roof/pre moved 0.022641 → 0.019618 s in BF16, 0.019097 → 0.016806 s in FP8)
# (session 55: FP8-KV decode attention is the BF16 fit with e_bw × 0.683, fitted side by side (was × 0.614 off
# H20, and H20's own fit alone): the fp8 rows' kernel decode moved, H800 tp8 dec64 −0.05 to −2.7 %, H200 tp16
# dec256 −0.1 to −4.7 %, H20 mix −0.15 to +0.65 %)
# (session 56: a ring across NVLink domains pays NVLink's α plus the network's (was the larger alone, NVLink's
# 29.7 µs, which hid InfiniBand's 19.8 µs): H200 tp16 dec256 (3 steps, 2 all-reduces a layer) + 6·L × 19.77 µs,
# +2.4 to +10.3 %; train/64/8's data-parallel rings cross nodes, + 2 × 19.77 µs a ring, +0.00 % (tiny +0.68 %))
# (session 56: training's attention runs at attention_efficiency 0.52 × the GEMMs' rate, so train/64/8 (Qwen3
# at 4K and 16K sequences) rose by the attention's weight: +12.0% to +14.7%)
BEFORE: dict[str, tuple] = {
    'Qwen2.5-7B/bf16': (
        7615283200, 7615283200, 57344, 4960283, 0.02474766588179104, 0.02510709718317341,
        0.036561121245767075, 0.11457157011381726, 0.04477509650988403, 1.65524041630194, None, None, None),
    'Qwen2.5-7B/fp8': (
        7615283200, 7615283200, 28672, 10034358, 0.01962727462208955, 0.02364636861975656,
        0.03369651342859358, 0.07009671860641335, 0.03992709092201942, 1.65524041630194, None, None, None),
    'Qwen3-14B/bf16': (
        14767882240, 14767882240, 163840, 3384886, 0.031712324776119405, 0.033964649820817344,
        0.0694160572994752, 0.2291270404461153, 0.06232711176811927, 3.282612471630833, None, None, None),
    'Qwen3-14B/fp8': (
        14767882240, 14767882240, 81920, 6931052, 0.023853140059701492, 0.03149176943246716,
        0.06307599124127689, 0.13815469302850245, 0.05497872469036558, 3.282612471630833, None, None, None),
    'Qwen3-30B-A3B/bf16': (
        30519328768, 3340238848, 98304, 2660506, 0.03828911609703816, 0.03942638382371132, 0.0395302918966263,
        0.08373934146056045, 0.07009399996534245, 2.410318551556244, 0.04162127329641526, 0.019618331176655946,
        5289920),
    'Qwen3-30B-A3B/fp8': (
        30519328768, 3340238848, 49152, 5625141, 0.026958399357175797, 0.0351481373751868,
        0.03907665025254557, 0.062390187059039856, 0.061101652694698964, 2.410318551556244,
        0.03867488680809372, 0.01680593166819869, 11206528),
    'Qwen3-32B/bf16': (
        32761446400, 32761446400, 262144, 1978274, 0.04622616988656717, 0.05130464312894723,
        0.12518971852161678, 0.5321648486188255, 0.09658169420068827, 6.573956793019635, None, None, None),
    'Qwen3-32B/fp8': (
        32761446400, 32761446400, 131072, 4194628, 0.03224293941492538, 0.046255649966985335,
        0.10865842573099221, 0.3184153672691249, 0.08343425916644331, 6.573956793019635, None, None, None),
    'Qwen3-8B/bf16': (
        8190427136, 8190427136, 147456, 3850197, 0.02808771072, 0.02962271785441567, 0.04789493485925016,
        0.1295858855584339, 0.055126100677674886, 2.0743435502429706, None, None, None),
    'Qwen3-8B/fp8': (
        8190427136, 8190427136, 73728, 7794602, 0.02170638725731343, 0.027913154239300957,
        0.04513904218062674, 0.08127205811921012, 0.0490496712489553, 2.0743435502429706, None, None, None),
    'Qwen3-tiny/bf16': (
        139264, 139264, 256, 570425072, 0.012196030165970151, 0.009490875408152966, 0.003170811711631642,
        0.0031355781501724053, 0.010087794782698117, 0.005929975916819658, None, None, None),
    'Qwen3-tiny/fp8': (
        139264, 139264, 128, 1140850288, 0.01215845433313433, 0.009548347653283178, 0.0031965078441372505,
        0.0031330806635891427, 0.010115534269090294, 0.005929975916819658, None, None, None),
}


def _figures(name: str, dtype: str) -> tuple:
    m = _model(name, weight_dtype=dtype, kv_dtype=dtype)
    h800, h20, h200 = _gpu("H800"), _gpu("H20"), _gpu("H200")
    h800 = h800.model_copy(update={"memory_visible_gib": None})  # pinned before presets had it: 80 GiB
    # the kernel compositions as pinned: unbounded (the floors of session 58 lower some FP8 steps by design;
    # test_custom_gpu_types holds them)
    kern8 = generation_cost(m, "H800", h800, 8, bounded=False)
    out = [m.params, m.active_params, m.kv_bytes_per_token, kv_capacity(m, h800, 8, RooflineEfficiency()),
           RooflineGeneration(m, h800, 8).decode_line(64).total(64 * 8192, 64, 3),
           kern8.decode_line(64).total(64 * 8192, 64, 3),
           kern8.prefill_time(4096, 4096 * 4096 / 2, 2),
           generation_cost(m, "H20", h20, 1, bounded=False).mixed_step_time(1000, 1000 * 3000.0, 32, 32 * 4000.0, 3),
           generation_cost(m, "H200", h200, 16, bounded=False).decode_line(256).total(256 * 8192, 256, 3),
           train_cost(m, h800, TrainerPlacement(pool="p", gpus=64, tp=8, mfu=0.35), "H800").step_time([4096] * 32 + [16384] * 4)]
    if m.moe_experts:
        out += [generation_cost(m, "H800", h800, 8, ep=2, bounded=False).decode_line(64).total(64 * 8192, 64, 3),
                RooflineGeneration(m, h800, 8, ep=2).prefill_time(4096, 4096 * 4096 / 2, 2),
                kv_capacity(m, h800, 8, RooflineEfficiency(), 2)]
    else:
        out += [None, None, None]
    return tuple(out)


@pytest.mark.parametrize("key", sorted(BEFORE))
def test_older_presets_unchanged(key: str) -> None:
    name, dtype = key.split("/")
    now = _figures(name, dtype)
    for field, was, value in zip(KEYS, BEFORE[key], now):
        if isinstance(was, int) or was is None:
            assert value == was, field
        else:
            assert value == pytest.approx(was, rel=1e-12, abs=0), field


def test_a_hugging_face_config_keeps_the_deepseek_geometry() -> None:
    """`rollart profile` reads a model from its config.json: a DeepSeek-V3 config must come back as the
    preset (latent attention, dense first layers, the shared expert), not as a plain MoE."""
    from rollart.calibration.profile_engine import spec_from_hf_config

    cfg = {"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128,
           "intermediate_size": 18432, "moe_intermediate_size": 2048, "vocab_size": 129280, "n_routed_experts": 256,
           "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3, "q_lora_rank": 1536,
           "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
           "tie_word_embeddings": False}
    got = spec_from_hf_config(cfg, "DeepSeek-V3")
    assert got == ModelSpec.model_validate("DeepSeek-V3")
    qwen = {"num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768, "vocab_size": 151936,
            "num_experts": 128, "num_experts_per_tok": 8, "tie_word_embeddings": False}
    assert spec_from_hf_config(qwen, "Qwen3-30B-A3B") == ModelSpec.model_validate("Qwen3-30B-A3B")


def test_a_dense_width_without_dense_layers_is_refused() -> None:
    with pytest.raises(ValueError, match="dense_intermediate"):
        ModelSpec.model_validate({"preset": "Qwen3-30B-A3B", "dense_intermediate": 1000})


def test_a_dense_mla_model_keeps_its_mlp() -> None:
    """MLA changes the attention's weights only: a dense model with latent attention holds the same MLP in
    every layer as its GQA twin (a review found its params without one)."""
    base = dict(layers=4, hidden=1024, heads=8, kv_heads=8, head_dim=128, intermediate=4096, vocab=1000)
    gqa = ModelSpec.model_validate(base)
    mla = ModelSpec.model_validate({**base, "kv_lora_rank": 256, "q_lora_rank": 512, "qk_rope_head_dim": 64,
                                    "v_head_dim": 128})
    mlp = 4 * 3 * 1024 * 4096
    for m in (gqa, mla):
        assert m.params - m.layers * m.attention_params_per_layer - 2 * 1000 * 1024 == mlp
        assert m.active_params == m.params
