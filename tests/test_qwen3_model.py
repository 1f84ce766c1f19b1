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
