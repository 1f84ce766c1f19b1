"""The GRPO trainer (torch, CPU): advantages, the direction of an update, clipping, loss masks,
checkpoints; the Megatron adapter's weight conversion (and the adapter itself on a GPU)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rollart.calibration.profile_engine import build_model  # noqa: E402
from rollart.plan.schema import ModelSpec  # noqa: E402
from rollart.runtime.trainer.grpo import GRPOTrainer, Sample, compute_advantages, list_checkpoints  # noqa: E402
from rollart.runtime.trainer import megatron as mg  # noqa: E402

TINY = ModelSpec.model_validate("Qwen3-tiny")


def make_samples(trainer: GRPOTrainer, rewards: list[list[float]], prompt_len: int = 8, completion_len: int = 12,
                 seed: int = 1) -> list[Sample]:
    """One group per row of ``rewards``; random tokens; behaviour log-probs from ``trainer``
    itself (on-policy)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for gi, row in enumerate(rewards):
        prompt = torch.randint(1, TINY.vocab, (prompt_len,), generator=g).tolist()
        for r in row:
            comp = torch.randint(1, TINY.vocab, (completion_len,), generator=g).tolist()
            out.append(Sample(f"g{gi}", prompt, comp, [0.0] * completion_len, float(r)))
    for s, lp in zip(out, trainer.logprobs(out)):
        s.behaviour_logprobs = lp
    return out


def weights(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def same_weights(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- advantages


def test_advantages_normalised_per_group():
    s = [Sample("a", [1], [2], [0.0], r) for r in (1.0, 0.0, 0.0, 1.0)] + [Sample("b", [1], [2], [0.0], 5.0)]
    adv = compute_advantages(s, eps=0.0)
    # mean 0.5, sample std sqrt(1/3): ±0.5/0.577
    assert adv[:4] == pytest.approx([math.sqrt(3) / 2, -math.sqrt(3) / 2, -math.sqrt(3) / 2, math.sqrt(3) / 2])
    assert adv[4] == 0.0  # a group of one carries no signal


def test_equal_rewards_give_zero_advantage_and_no_update():
    tr = GRPOTrainer(TINY, lr=1e-2, seed=0)
    samples = make_samples(tr, [[0.1, 0.1, 0.1, 0.1], [1.0, 1.0]])
    assert compute_advantages(samples) == [0.0] * 6
    before = weights(tr)
    m = tr.train_step(samples, 1)
    assert m["adv_abs_mean"] == 0.0 and m["loss"] == 0.0
    assert same_weights(before, weights(tr))  # zero gradient, no weight decay: Adam moves nothing
    assert (tr.step, tr.version) == (1, 1)


# ---------------------------------------------------------------- the update


def test_step_raises_high_advantage_and_lowers_low_advantage_logprobs():
    tr = GRPOTrainer(TINY, lr=1e-3, seed=0)
    samples = make_samples(tr, [[1, 0, 0, 1], [0, 1, 1, 0]])
    adv = compute_advantages(samples)
    before = [sum(x) for x in tr.logprobs(samples)]
    m = tr.train_step(samples, 1)
    after = [sum(x) for x in tr.logprobs(samples)]
    delta = [a - b for a, b in zip(after, before)]
    assert m["tokens"] == 8 * 12 and m["reward_mean"] == 0.5
    assert m["adv_abs_mean"] == pytest.approx(math.sqrt(3) / 2, rel=1e-4)
    for d, a in zip(delta, adv):  # every completion moves the way its advantage says, clearly
        assert d * a > 0, (delta, adv)
        assert abs(d) > 0.1
    hi = [d for d, a in zip(delta, adv) if a > 0]
    lo = [d for d, a in zip(delta, adv) if a < 0]
    assert min(hi) > 0 > max(lo)


def test_clip_fraction_zero_on_policy_and_one_far_off_policy():
    tr = GRPOTrainer(TINY, lr=1e-3, seed=0, clip_eps=0.2)
    samples = make_samples(tr, [[1, 0, 0.5, 0.2]])
    m = tr.train_step(samples, 1)
    assert m["clip_frac"] == 0.0
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)

    tr2 = GRPOTrainer(TINY, lr=1e-3, seed=0, clip_eps=0.2)
    off = make_samples(tr2, [[1, 0, 0.5, 0.2]])
    for s in off:  # the engine thought every token 1 nat less likely: ratio e ≈ 2.7
        s.behaviour_logprobs = [x - 1.0 for x in s.behaviour_logprobs]
    m2 = tr2.train_step(off, 1)
    assert m2["clip_frac"] == 1.0
    assert m2["ratio_mean"] == pytest.approx(math.e, rel=1e-4)


def test_loss_mask_trains_only_generated_positions():
    """Multi-turn: a flattened sequence with env tokens masked out. Behaviour log-probs given
    per generated token or per position (junk where unmasked) train identically."""
    mask = [1, 1, 1, 0, 0, 0, 1, 1, 0, 1]
    a = GRPOTrainer(TINY, lr=1e-3, seed=0)
    b = GRPOTrainer(TINY, lr=1e-3, seed=0)
    base = make_samples(a, [[1, 0, 1, 0]], completion_len=len(mask))
    per_token, per_position = [], []
    for s in base:
        lp = s.behaviour_logprobs
        per_token.append(Sample(s.group_id, s.prompt_ids, s.completion_ids,
                                [x for x, m in zip(lp, mask) if m], s.reward, mask))
        per_position.append(Sample(s.group_id, s.prompt_ids, s.completion_ids,
                                   [x if m else -99.0 for x, m in zip(lp, mask)], s.reward, mask))
    ma, mb = a.train_step(per_token, 1), b.train_step(per_position, 1)
    assert ma["tokens"] == mb["tokens"] == 4 * sum(mask)
    assert ma["loss"] == mb["loss"] and ma["clip_frac"] == mb["clip_frac"] == 0.0
    assert same_weights(weights(a), weights(b))
    with pytest.raises(ValueError):
        Sample("g", [1], [1, 2, 3], [0.0, 0.0], 1.0, [1, 1, 1]).aligned_behaviour()


def test_kl_penalty_to_the_initial_policy():
    tr = GRPOTrainer(TINY, lr=1e-3, seed=0, kl_coef=0.1)
    samples = make_samples(tr, [[1, 0, 0, 1]])
    assert tr.train_step(samples, 1)["kl"] == 0.0  # the reference is the initial policy
    for s, lp in zip(samples, tr.logprobs(samples)):
        s.behaviour_logprobs = lp
    m = tr.train_step(samples, 2)
    assert m["kl"] > 0 and m["clip_frac"] == 0.0


def test_micro_batches_accumulate_to_the_full_batch_gradient():
    a = GRPOTrainer(TINY, lr=1e-3, seed=0, micro_batch_size=16)
    b = GRPOTrainer(TINY, lr=1e-3, seed=0, micro_batch_size=3)
    samples = make_samples(a, [[1, 0, 0, 1], [0.3, 0.9, 0.1, 0.5]])
    w0 = weights(a)
    ma, mb = a.train_step(samples, 1), b.train_step(samples, 1)
    assert ma["loss"] == pytest.approx(mb["loss"], abs=1e-6)
    assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-4)
    # Adam's first step is ~lr·sign(g): elements with a near-zero gradient may flip on float
    # noise, so compare the updates as vectors.
    wa, wb = weights(a), weights(b)
    da = torch.cat([(wa[k] - w0[k]).flatten() for k in w0])
    db = torch.cat([(wb[k] - w0[k]).flatten() for k in w0])
    assert torch.nn.functional.cosine_similarity(da, db, dim=0) > 0.99


def test_state_dict_matches_the_engines_model_and_exports_bf16():
    tr = GRPOTrainer(TINY, lr=1e-3, seed=7, export_dtype="bf16")
    engine = build_model(TINY, dtype="fp32", seed=7)  # what an inference engine builds
    sd32 = tr.state_dict("fp32")
    assert list(sd32) == list(engine.state_dict())
    assert all(torch.equal(sd32[k], v) for k, v in engine.state_dict().items())  # version 0: identical
    sd = tr.state_dict()
    assert {v.dtype for v in sd.values()} == {torch.bfloat16}
    assert sd["lm_head.weight"] is sd["model.embed_tokens.weight"]  # tied stays tied
    engine_bf16 = build_model(TINY, dtype="bf16", seed=0)
    engine_bf16.load_state_dict(sd)
    assert torch.equal(engine_bf16.state_dict()["model.norm.weight"], sd["model.norm.weight"])


# ---------------------------------------------------------------- checkpoints


def _optim_equal(a: dict, b: dict) -> bool:
    if a["param_groups"] != b["param_groups"] or set(a["state"]) != set(b["state"]):
        return False
    for k in a["state"]:
        sa, sb = a["state"][k], b["state"][k]
        if set(sa) != set(sb) or not all(torch.equal(torch.as_tensor(sa[n]), torch.as_tensor(sb[n])) for n in sa):
            return False
    return True


def test_checkpoint_restores_everything_and_the_next_step_is_identical(tmp_path: Path):
    a = GRPOTrainer(TINY, lr=1e-3, seed=0, keep_checkpoints=2)
    batches = [make_samples(a, [[1, 0, 0, 1], [0.2, 0.4, 0.9, 0.1]], seed=s) for s in (1, 2, 3)]
    a.train_step(batches[0], 1)
    a.train_step(batches[1], 2)
    path = a.save_checkpoint(tmp_path)
    assert path.name == "step_00000002" and not list(tmp_path.glob(".tmp-*"))
    torch.manual_seed(1234)
    random.seed(99)
    np.random.seed(7)
    a.save_checkpoint(tmp_path)  # the same step again: replaced, with the RNG as of now
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]
    expected = (torch.rand(3), random.random(), np.random.rand())  # the draws right after the save

    b = GRPOTrainer(TINY, lr=1e-3, seed=5, keep_checkpoints=2)  # different initial weights and RNG
    assert not same_weights(weights(a), weights(b))
    assert b.load_checkpoint(tmp_path) == (2, 2)
    assert (b.step, b.version) == (2, 2)
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]
    assert same_weights(weights(a), weights(b))
    assert _optim_equal(a.optimizer.state_dict(), b.optimizer.state_dict())

    ma, mb = a.train_step(batches[2], 3), b.train_step(batches[2], 3)
    assert ma == {**mb, "time_s": ma["time_s"]}
    assert same_weights(weights(a), weights(b))


def test_checkpoints_keep_the_newest_k_and_a_failed_save_changes_nothing(tmp_path: Path, monkeypatch):
    tr = GRPOTrainer(TINY, lr=1e-3, seed=0, keep_checkpoints=2)
    for step in (1, 2, 3, 4):
        tr.save_checkpoint(tmp_path, step=step, version=step + 10)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]

    real_save = torch.save

    def failing_save(obj, f, *args, **kw):
        if str(f).endswith("optim.pt"):
            raise OSError("disk full")
        return real_save(obj, f, *args, **kw)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError):
        tr.save_checkpoint(tmp_path, step=5)
    monkeypatch.undo()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert not list(tmp_path.glob(".tmp-*"))
    fresh = GRPOTrainer(TINY, lr=1e-3, seed=0)
    assert fresh.load_checkpoint(tmp_path) == (4, 14)
    assert fresh.load_checkpoint(tmp_path / "step_00000003") == (3, 13)
    with pytest.raises(FileNotFoundError):
        fresh.load_checkpoint(tmp_path / "nothing-here")


def test_train_step_time_for_16_samples_of_200_tokens():
    """The figure quoted in the runtime notes (printed with -s); asserts only that it ran."""
    tr = GRPOTrainer(TINY, lr=1e-4, seed=0)
    g = torch.Generator().manual_seed(0)
    samples = []
    for gi in range(4):
        prompt = torch.randint(1, TINY.vocab, (50,), generator=g).tolist()
        for j in range(4):
            comp = torch.randint(1, TINY.vocab, (150,), generator=g).tolist()
            samples.append(Sample(gi, prompt, comp, [-6.9] * 150, float(j)))
    tr.train_step(samples, 1)  # warm-up
    m = tr.train_step(samples, 2)
    print(f"\nGRPO train_step, Qwen3-tiny, 16 × 200 tokens: {m['time_s'] * 1e3:.0f} ms")
    assert m["tokens"] == 16 * 150 and m["time_s"] > 0


# ---------------------------------------------------------------- Megatron


def test_megatron_weight_conversion_round_trips():
    """HF Qwen3 → megatron-core names (fused per-group QKV, [gate; up] FC1) → HF, bit-exact,
    for tied and untied heads and grouped-query attention. Pure torch: runs everywhere."""
    for spec in (TINY, ModelSpec.model_validate({"preset": "Qwen3-tiny", "tied_embeddings": 0, "heads": 8,
                                                 "kv_heads": 2})):
        hf = build_model(spec, seed=3).state_dict()
        mc = mg.hf_to_mcore(hf, spec)
        qkv = mc["decoder.layers.0.self_attention.linear_qkv.weight"]
        assert qkv.shape == ((spec.heads + 2 * spec.kv_heads) * spec.head_dim, spec.hidden)
        # group 0 = its query heads, then its key head, then its value head
        qpg = spec.heads // spec.kv_heads
        d = spec.head_dim
        assert torch.equal(qkv[qpg * d:(qpg + 1) * d], hf["model.layers.0.self_attn.k_proj.weight"][:d])
        assert ("output_layer.weight" in mc) == (not spec.tied_embeddings)
        back = mg.mcore_to_hf(mc, spec)
        assert list(back) == list(hf) and all(torch.equal(back[k], hf[k]) for k in hf)
        fused = mg.mcore_to_hf(mg.hf_to_mcore(hf, spec, fused_norms=True), spec)
        assert all(torch.equal(fused[k], hf[k]) for k in hf)


def test_megatron_available_says_why_not():
    ok, why = mg.available()
    if not ok:
        assert why
        with pytest.raises(RuntimeError, match="unavailable"):
            mg.MegatronTrainer(TINY, lr=1e-4, seed=0)
    else:  # pragma: no cover - GPU machines
        assert why == ""


@pytest.mark.skipif(not mg.available()[0], reason=f"Megatron adapter: {mg.available()[1]}")
def test_megatron_trainer_step_and_checkpoint(tmp_path: Path):  # pragma: no cover - needs a GPU
    ref = GRPOTrainer(TINY, lr=1e-3, seed=0)
    tr = mg.MegatronTrainer(TINY, lr=1e-3, seed=0, train_dtype="fp32", export_dtype="fp32")
    start = tr.state_dict()
    assert all(torch.equal(start[k], v) for k, v in ref.state_dict().items())  # same version 0
    samples = make_samples(ref, [[1, 0, 0, 1], [0, 1, 1, 0]])
    adv = compute_advantages(samples)
    before = [sum(x) for x in tr.logprobs(samples)]
    m = tr.train_step(samples, 1)
    assert m["clip_frac"] < 0.05
    after = [sum(x) for x in tr.logprobs(samples)]
    assert all((a - b) * s > 0 for a, b, s in zip(after, before, adv))
    tr.save_checkpoint(tmp_path)
    tr2 = mg.MegatronTrainer(TINY, lr=1e-3, seed=1, train_dtype="fp32", export_dtype="fp32")
    assert tr2.load_checkpoint(tmp_path) == (1, 1)
    s1, s2 = tr.state_dict(), tr2.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
