"""The GPU paths' checks, in one process and without Ray (the GPU machine has no Ray wheel).

    python benchmarks/gpu/checks.py megatron --device cuda --out OUT/megatron.json
    python benchmarks/gpu/checks.py digits   --device cuda --steps 4 --out OUT/digits.json
    python benchmarks/gpu/checks.py megatron-cpu --out OUT/mcore.json   # megatron-core, no GPU

* ``megatron``: one GRPO step of :class:`~rollart.runtime.trainer.megatron.MegatronTrainer` on
  the tiny Qwen3-shaped GPT (megatron-core, local layer spec, no Transformer Engine): the loss
  is finite and the weights changed; its version-0 log-probs against the torch trainer's on
  the same samples; then the resume path: save a checkpoint, take a second step, build a new
  trainer, load the checkpoint (weights-only), take the same second step, compare weights.
* ``megatron-cpu``: with megatron-core but no GPU, the adapter's GPTModel and weight conversion
  against the Hugging Face model in one CPU forward (see :func:`megatron_cpu_check`).
* ``digits``: :class:`~rollart.runtime.engines.torch_engine.TorchEngine` generates groups for
  the Digits task, :class:`~rollart.runtime.trainer.grpo.GRPOTrainer` updates on them, the
  engine loads the new weights, for ``--steps`` steps (the loop the Ray driver runs, here in
  process); per step: reward, loss, tokens, seconds.

Each check writes a JSON result (``ok`` false with the error's last lines when it fails, so a
run script carries on) and prints one summary line. ``--device cpu`` runs both code paths'
CPU parts here (the Megatron one reports itself unavailable)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

SPEC = "Qwen3-tiny"


def _samples(vocab: int, groups: int, per_group: int, prompt_len: int, completion_len: int, seed: int) -> list[Any]:
    """Random token sequences in GRPO groups with rewards that differ within each group."""
    import torch

    from rollart.runtime.trainer.grpo import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for gi in range(groups):
        prompt = torch.randint(3, vocab, (prompt_len,), generator=g).tolist()
        for j in range(per_group):
            comp = torch.randint(3, vocab, (completion_len,), generator=g).tolist()
            out.append(Sample(group_id=gi, prompt_ids=prompt, completion_ids=comp, behaviour_logprobs=[0.0] * len(comp),
                              reward=float(j % 2) + 0.1 * gi))
    return out


def _on_policy(trainer: Any, samples: list[Any]) -> list[Any]:
    """The samples with the trainer's own log-probs as behaviour (ratio 1 at the first step)."""
    from dataclasses import replace

    return [replace(s, behaviour_logprobs=lp) for s, lp in zip(samples, trainer.logprobs(samples))]


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _copy(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().float().cpu().clone() for k, v in state.items()}


def megatron_check(device: str = "cuda", seed: int = 0, lr: float = 1e-3) -> dict[str, Any]:
    from rollart.runtime.trainer import megatron as M
    from rollart.runtime.trainer.grpo import GRPOTrainer

    ok, why = M.available()
    if not ok:
        return {"ok": False, "skipped": True, "reason": why}
    t0 = time.perf_counter()
    trainer = M.MegatronTrainer(SPEC, lr=lr, seed=seed, device=device, train_dtype="bf16", micro_batch_size=8)
    vocab = trainer.spec.vocab
    samples = _on_policy(trainer, _samples(vocab, 2, 4, 8, 16, seed))
    # version 0 is the engines' weights: the torch trainer's log-probs on the same tokens
    ref = GRPOTrainer(SPEC, lr=lr, seed=seed, device=device, micro_batch_size=8)
    lp_ref = ref.logprobs(samples)
    del ref
    lp_diff = max(abs(a - b) for s, r in zip(samples, lp_ref) for a, b in zip(s.behaviour_logprobs, r))
    before = _copy(trainer.state_dict("fp32"))
    m1 = trainer.train_step(samples)
    after = _copy(trainer.state_dict("fp32"))
    changed = _max_diff(before, after)
    build_s = time.perf_counter() - t0
    # resume: checkpoint after step 1, step 2 here and on a fresh trainer loaded from it
    second = _on_policy(trainer, _samples(vocab, 2, 4, 8, 16, seed + 1))
    with tempfile.TemporaryDirectory() as tmp:
        trainer.save_checkpoint(tmp)
        m2 = trainer.train_step(second)
        w2 = _copy(trainer.state_dict("fp32"))
        fresh = M.MegatronTrainer(SPEC, lr=lr, seed=seed + 7, device=device, train_dtype="bf16", micro_batch_size=8)
        step, version = fresh.load_checkpoint(tmp)
        loaded = _copy(fresh.state_dict("fp32"))
        m2b = fresh.train_step(second)
        w2b = _copy(fresh.state_dict("fp32"))
    result = {
        "ok": bool(math.isfinite(m1["loss"]) and changed > 0 and _max_diff(loaded, after) == 0.0
                   and math.isfinite(m2b["loss"])),
        "loss": m1["loss"], "grad_norm": m1["grad_norm"], "update_ok": m1.get("update_ok"),
        "weights_max_change": changed, "version0_logprob_max_diff_vs_torch": lp_diff,
        "resume": {"step": step, "version": version, "loaded_weights_max_diff": _max_diff(loaded, after),
                   "second_step_loss": m2["loss"], "second_step_loss_resumed": m2b["loss"],
                   "second_step_weights_max_diff": _max_diff(w2, w2b)},
        "seconds": round(time.perf_counter() - t0, 2), "build_and_first_step_s": round(build_s, 2),
        "first_step_s": m1["time_s"],
    }
    return result


def megatron_cpu_check(seed: int = 0) -> dict[str, Any]:
    """Where megatron-core is installed but there is no GPU: the adapter's GPTModel
    (:func:`~rollart.runtime.trainer.megatron.build_gpt`) with the converted weights against the
    Hugging Face model, one forward on the CPU over gloo. Two CUDA-only calls of megatron-core
    are stood in for, in this process only: the rotary embedding moves its frequencies to
    ``torch.cuda.current_device()``, and attention forks the CUDA RNG tracker (dropout is 0)."""
    import contextlib
    import importlib.util
    import os

    import torch

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return {"ok": False, "skipped": True, "reason": "megatron-core is not installed"}
    from megatron.core import parallel_state, tensor_parallel

    from rollart.calibration.profile_engine import build_model
    from rollart.runtime.trainer import megatron as M
    from rollart.runtime.trainer.grpo import as_spec

    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(M._free_port()))
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
        tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()  # type: ignore[method-assign]
    spec = as_spec(SPEC)
    _, gpt, _ = M.build_gpt(spec, "fp32", 512)
    hf = build_model(spec, dtype="fp32", device="cpu", seed=seed, max_positions=512)
    M.MegatronTrainer._load_mcore(gpt, M.hf_to_mcore(hf.state_dict(), spec))
    back = M.mcore_to_hf({k: v for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}, spec)
    ref = hf.state_dict()
    roundtrip = max(float((back[k] - ref[k]).abs().max()) for k in ref)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, spec.vocab, (2, 12), generator=g)
    pos = torch.arange(12).unsqueeze(0).expand(2, -1)
    causal = torch.triu(torch.ones(12, 12, dtype=torch.bool), diagonal=1)[None, None]
    with torch.no_grad():
        diff = float((gpt(ids, pos, causal) - hf(input_ids=ids).logits).abs().max())
    return {"ok": bool(roundtrip == 0.0 and diff < 1e-4 and set(back) == set(ref)), "weights_roundtrip_max_diff": roundtrip,
            "logits_max_diff_vs_hf": diff}


def digits_check(device: str = "cpu", steps: int = 3, groups: int = 4, group_size: int = 4, max_new_tokens: int = 16,
                 seed: int = 0, lr: float = 3e-3) -> dict[str, Any]:
    """Generate → score → train → load weights, ``steps`` times, on ``device``."""
    import torch

    from rollart.runtime.engines.tokenizer import build_tokenizer, render_chat
    from rollart.runtime.engines.torch_engine import TorchEngine
    from rollart.runtime.envs.toy import DigitsEnv
    from rollart.runtime.trainer.grpo import GRPOTrainer, Sample

    t_all = time.perf_counter()
    trainer = GRPOTrainer(SPEC, lr=lr, seed=seed, device=device, micro_batch_size=16, export_dtype="fp32")
    tok = build_tokenizer(trainer.spec.vocab)
    engine = TorchEngine(SPEC, tok, device=device, dtype="fp32", seed=seed, max_batch=groups * group_size,
                         max_model_len=512)
    initial = _copy(trainer.state_dict())
    engine.load_weights(trainer.state_dict())  # identical already (same seed); loading is part of the loop
    history = []
    for step in range(steps):
        t0 = time.perf_counter()
        samples, envs = [], {}
        for gi in range(groups):
            env = DigitsEnv()
            prompt = tok.encode(render_chat([{"role": "user", "content": env.reset(seed=step * groups + gi)}]))
            for j in range(group_size):
                rid = f"s{step}-g{gi}-{j}"
                envs[rid] = (gi, prompt, env)
                engine.add(rid, prompt, max_new_tokens, temperature=1.0, seed=seed * 1_000_003 + step * 10_007 + gi * 101 + j)
        done = {}
        engine_steps = 0
        while engine.has_work():
            for c in engine.step():
                done[c.request_id] = c
            engine_steps += 1
        gen_s = time.perf_counter() - t0
        for rid, c in sorted(done.items()):
            gi, prompt, env = envs[rid]
            reward = env.step(c.text).reward
            if not c.token_ids:
                continue
            samples.append(Sample(group_id=gi, prompt_ids=prompt, completion_ids=c.token_ids,
                                  behaviour_logprobs=c.logprobs, reward=reward, version=trainer.version))
        metrics = trainer.train_step(samples)
        engine.load_weights(trainer.state_dict())
        history.append({"step": step + 1, "reward_mean": metrics["reward_mean"], "loss": metrics["loss"],
                        "ratio_mean": metrics["ratio_mean"], "grad_norm": metrics["grad_norm"],
                        "tokens": metrics["tokens"], "engine_steps": engine_steps, "generate_s": round(gen_s, 3),
                        "train_s": round(metrics["time_s"], 3), "step_s": round(time.perf_counter() - t0, 3)})
    final = _copy(trainer.state_dict())
    in_engine = _copy({k: v for k, v in engine.state_dict().items() if k in final})
    changed = _max_diff(initial, final)
    engine_gap = _max_diff(final, in_engine)
    return {
        "ok": bool(all(math.isfinite(h["loss"]) for h in history) and changed > 0 and engine_gap == 0.0),
        "device": device, "steps": history, "weights_max_change": changed, "engine_vs_trainer_max_diff": engine_gap,
        "ratio_first_step": history[0]["ratio_mean"] if history else None,
        "cuda": torch.cuda.is_available() and str(device).startswith("cuda"),
        "seconds": round(time.perf_counter() - t_all, 2),
    }


def _guarded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the run script reports what broke and carries on
        tail = traceback.format_exc().strip().splitlines()[-12:]
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500], "traceback": tail}


def summary(name: str, r: dict[str, Any]) -> str:
    if r.get("skipped"):
        return f"{name}: skipped ({r['reason']})"
    if "error" in r:
        return f"{name}: FAILED {r['error']}"
    if name == "megatron-cpu":
        return (f"megatron-cpu: {'ok' if r['ok'] else 'NOT OK'} · logits vs HF {r['logits_max_diff_vs_hf']:.3g} · "
                f"weights round trip {r['weights_roundtrip_max_diff']:.3g}")
    if name == "megatron":
        res = r["resume"]
        return (f"megatron: {'ok' if r['ok'] else 'NOT OK'} · loss {r['loss']:.4g} · grad norm {r['grad_norm']:.3g} · "
                f"max weight change {r['weights_max_change']:.3g} · v0 log-prob gap to torch "
                f"{r['version0_logprob_max_diff_vs_torch']:.3g} · resume: weights equal "
                f"{res['loaded_weights_max_diff'] == 0}, step-2 gap {res['second_step_weights_max_diff']:.3g} · "
                f"{r['seconds']:.1f} s")
    rewards = " → ".join(f"{h['reward_mean']:.2f}" for h in r["steps"])
    mean_step = sum(h["step_s"] for h in r["steps"]) / max(1, len(r["steps"]))
    return (f"digits ({r['device']}): {'ok' if r['ok'] else 'NOT OK'} · {len(r['steps'])} steps · reward {rewards} · "
            f"max weight change {r['weights_max_change']:.3g} · engine = trainer weights "
            f"{r['engine_vs_trainer_max_diff'] == 0} · {mean_step:.2f} s/step")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("check", choices=("megatron", "megatron-cpu", "digits"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.check == "megatron":
        result = _guarded(lambda: megatron_check(args.device))
    elif args.check == "megatron-cpu":
        result = _guarded(megatron_cpu_check)
    else:
        result = _guarded(lambda: digits_check(args.device, steps=args.steps))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(summary(args.check, result), flush=True)
    return 0 if result.get("ok") or result.get("skipped") else 1


if __name__ == "__main__":
    sys.exit(main())
