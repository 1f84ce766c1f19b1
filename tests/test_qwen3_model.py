"""The torch Qwen3 (rollart.runtime.qwen3) computes what transformers' Qwen3ForCausalLM computes
on the same weights: plain prefill, right padding (the trainer's batches), a cache filled in
chunks (the profiler) and a left-padded decode with explicit positions (the engine)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rollart.plan.schema import ModelSpec  # noqa: E402
from rollart.runtime import qwen3  # noqa: E402

TOL = 1e-5


def _pair(spec: ModelSpec):
    transformers = pytest.importorskip("transformers")
    ours = qwen3.build(spec, seed=0).eval()
    cfg = transformers.Qwen3Config(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim, tie_word_embeddings=spec.tied_embeddings, rms_norm_eps=qwen3.RMS_NORM_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": qwen3.ROPE_THETA}, attn_implementation="sdpa")
    reference = transformers.Qwen3ForCausalLM(cfg).eval()
    assert set(reference.state_dict()) == set(ours.state_dict())   # the names vLLM and the stores use
    reference.load_state_dict(ours.state_dict())
    return ours, reference, transformers


@pytest.mark.parametrize("tied", [True, False])
def test_logits_match_transformers_with_padding_and_a_chunked_cache(tied: bool) -> None:
    spec = ModelSpec.model_validate({"preset": "Qwen3-tiny", "tied_embeddings": tied})
    ours, ref, transformers = _pair(spec)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, spec.vocab, (3, 40), generator=gen)
    with torch.inference_mode():
        assert (ours(ids).logits - ref(input_ids=ids).logits).abs().max() < TOL
        att = torch.ones(3, 40, dtype=torch.long)
        att[1, 30:], att[2, 10:] = 0, 0
        diff = ours(ids, attention_mask=att).logits - ref(input_ids=ids, attention_mask=att).logits
        assert diff[att.bool()].abs().max() < TOL

        cache, ref_cache = qwen3.KVCache(), transformers.DynamicCache(config=ref.config)
        for lo, hi in ((0, 25), (25, 39), (39, 40)):
            out = ours(ids[:, lo:hi], cache=cache, use_cache=True)
            expected = ref(input_ids=ids[:, lo:hi], cache=ref_cache, use_cache=True)
        assert cache.get_seq_length() == 40
        assert (out.logits - expected.logits).abs().max() < TOL

        mask = torch.ones(3, 41, dtype=torch.bool)
        mask[0, :5] = False                       # row 0 is left-padded: its token sits at position 35
        pos = torch.tensor([[35], [40], [40]])
        nxt = torch.randint(0, spec.vocab, (3, 1), generator=gen)
        out = ours(nxt, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        expected = ref(input_ids=nxt, attention_mask=mask, position_ids=pos, cache=ref_cache, use_cache=True)
        assert (out.logits - expected.logits).abs().max() < TOL


def test_the_cache_crops_back_and_a_padding_only_query_stays_finite() -> None:
    spec = ModelSpec.model_validate("Qwen3-tiny")
    model = qwen3.build(spec, seed=1).eval()
    ids = torch.randint(0, spec.vocab, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        cache = qwen3.KVCache()
        first = model(ids[:, :8], cache=cache, use_cache=True, logits_to_keep=1).logits
        model(ids[:, 8:], cache=cache, use_cache=True)
        cache.crop(-4)
        assert cache.get_seq_length() == 8
        again = model(ids[:, 8:], cache=cache, use_cache=True).logits
        assert first.shape == (2, 1, spec.vocab)
        assert torch.allclose(again[:, -1], model(ids).logits[:, -1], atol=TOL)
        left = torch.ones(2, 12, dtype=torch.long)
        left[0, :3] = 0                           # left padding: queries 0-2 of row 0 see no real token
        assert torch.isfinite(model(ids, attention_mask=left).logits).all()


def test_a_mixture_of_experts_is_refused_with_the_reason() -> None:
    spec = ModelSpec.model_validate({"preset": "Qwen3-tiny", "moe_experts": 4, "moe_active_experts": 2})
    with pytest.raises(ValueError, match="mixture of experts"):
        qwen3.Qwen3Config.from_spec(spec)


def test_a_passed_cache_is_used_and_masks_follow_the_input_device() -> None:
    """A cache the caller passes is appended to with or without use_cache (as transformers does); the
    causal mask of several new tokens over a cache is built where the input lives (the meta device
    stands in for CUDA: a CPU mask there fails)."""
    spec = ModelSpec.model_validate("Qwen3-tiny")
    model = qwen3.build(spec, seed=2).eval()
    ids = torch.randint(0, spec.vocab, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        cache = qwen3.KVCache()
        model(ids[:, :6], cache=cache, use_cache=True)
        out = model(ids[:, 6:], cache=cache)
        assert cache.get_seq_length() == 10
        assert (out.logits - model(ids).logits[:, 6:]).abs().max() < TOL
    meta = qwen3.Qwen3ForCausalLM(qwen3.Qwen3Config.from_spec(spec)).to("meta").eval()
    cache = qwen3.KVCache()
    tokens = torch.zeros(2, 4, dtype=torch.long, device="meta")
    meta(tokens, cache=cache, use_cache=True)
    assert meta(tokens, cache=cache, use_cache=True).logits.shape == (2, 4, spec.vocab)


def test_a_mask_of_the_wrong_shape_is_refused() -> None:
    spec = ModelSpec.model_validate("Qwen3-tiny")
    model = qwen3.build(spec).eval()
    cache = qwen3.KVCache()
    ids = torch.randint(0, spec.vocab, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        model(ids, cache=cache, use_cache=True)
        with pytest.raises(ValueError, match=r"expected \(batch, cached \+ new\) = \(2, 6\)"):
            model(ids[:, :1], attention_mask=torch.ones(2, 1, dtype=torch.bool), cache=cache, use_cache=True)


def test_rope_frequencies_stay_fp32_in_a_bf16_model() -> None:
    spec = ModelSpec.model_validate("Qwen3-tiny")
    rotary = qwen3.build(spec).to(torch.bfloat16).model.rotary_emb
    exact = 1.0 / (qwen3.ROPE_THETA ** (torch.arange(0, spec.head_dim, 2).double() / spec.head_dim))
    assert rotary.inv_freq.dtype == torch.float32
    assert torch.allclose(rotary.inv_freq.double(), exact, rtol=1e-6)


def test_grouped_query_attention_copies_heads_only_where_the_fused_kernel_refuses_it() -> None:
    assert qwen3.native_gqa("cpu", masked=True) and qwen3.native_gqa("cpu", masked=False)
    assert qwen3.native_gqa("cuda", masked=False)        # flash attention: GQA, no mask
    assert not qwen3.native_gqa("cuda", masked=True)     # a mask: memory-efficient attention, equal heads


def test_the_repeated_heads_path_computes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """What CUDA runs with a mask (key/value heads repeated), run here on CPU against the native path."""
    spec = ModelSpec.model_validate("Qwen3-tiny")
    model = qwen3.build(spec, seed=4).eval()
    ids = torch.randint(0, spec.vocab, (2, 9), generator=torch.Generator().manual_seed(4))
    att = torch.ones(2, 9, dtype=torch.long)
    att[1, 6:] = 0
    with torch.inference_mode():
        native = model(ids, attention_mask=att).logits
        monkeypatch.setattr(qwen3, "native_gqa", lambda device_type, masked: False)
        repeated = model(ids, attention_mask=att).logits
    assert spec.heads > spec.kv_heads and (native - repeated).abs().max() < TOL
