"""GRPO on megatron-core: the GPU trainer, with the same surface as :class:`GRPOTrainer`.

The policy is a megatron-core ``GPTModel`` with Qwen3's geometry (RMSNorm, SwiGLU, GQA, RoPE,
per-head q/k RMSNorm, no biases), wrapped in megatron's ``DistributedDataParallel`` and
driven by ``get_megatron_optimizer`` (Adam with decoupled weight decay, gradient clipping,
fp32 main weights under bf16). Its initial weights are converted from the same random-init
model the engines build (Hugging Face names; ``build_model(spec, seed=...)``), so version 0 matches
them, and :meth:`MegatronTrainer.state_dict` converts back to Hugging Face names (what the
engines load). The loss is :mod:`rollart.runtime.trainer.grpo`'s, token for token.

Single process, tensor/pipeline parallel size 1 (``torch.distributed`` on NCCL with a world of
one when nothing initialised it). megatron-core and CUDA are imported lazily:
:func:`available` says whether this machine can run it. The weight-name conversion
(:func:`hf_to_mcore`, :func:`mcore_to_hf`) is plain torch and works anywhere.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from rollart.plan.schema import ModelSpec
from rollart.runtime.trainer.grpo import (Sample, accumulate_gradients, as_spec, build_batch, capture_rng,
                                          checkpoint_meta, compute_advantages, read_checkpoint_meta,
                                          restore_rng, step_metrics, token_logprobs, write_checkpoint_atomic)

if TYPE_CHECKING:  # pragma: no cover
    import torch


def available() -> tuple[bool, str]:
    """(True, "") when megatron-core is installed and a CUDA GPU is visible, else (False, why)."""
    reasons = []
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        reasons.append("megatron-core is not installed (the optional 'gpu' extra)")
    try:
        import torch

        if not torch.cuda.is_available():
            reasons.append(f"no CUDA GPU (torch {torch.__version__}, cuda build: {torch.version.cuda or 'none'}); "
                           "megatron-core's forward pass needs one")
    except ImportError:  # pragma: no cover
        reasons.append("torch is not installed")
    return (not reasons, "; ".join(reasons))


# ---------------------------------------------------------------- weight names


def _geometry(spec: ModelSpec) -> tuple[int, int, int, int]:
    return spec.heads, spec.kv_heads, spec.head_dim, spec.hidden


def hf_to_mcore(hf: Mapping[str, "torch.Tensor"], spec: ModelSpec, fused_norms: bool = False) -> dict[str, "torch.Tensor"]:
    """Hugging Face Qwen3 names → megatron-core GPTModel names (local layer spec; with
    ``fused_norms`` the Transformer Engine spec, whose pre-norms live in the next linear).

    megatron's ``linear_qkv`` holds, per query group, that group's query heads then its key
    head then its value head; ``linear_fc1`` is ``[gate; up]``."""
    import torch

    heads, kv, hd, hidden = _geometry(spec)
    qpg = heads // kv
    out: dict[str, torch.Tensor] = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"]}
    for i in range(spec.layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = hf[h + "self_attn.q_proj.weight"].reshape(kv, qpg * hd, hidden)
        k = hf[h + "self_attn.k_proj.weight"].reshape(kv, hd, hidden)
        v = hf[h + "self_attn.v_proj.weight"].reshape(kv, hd, hidden)
        out[m + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, hidden)
        out[m + "self_attention.linear_proj.weight"] = hf[h + "self_attn.o_proj.weight"]
        out[m + "self_attention.q_layernorm.weight"] = hf[h + "self_attn.q_norm.weight"]
        out[m + "self_attention.k_layernorm.weight"] = hf[h + "self_attn.k_norm.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]], 0)
        out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"]
        if fused_norms:
            out[m + "self_attention.linear_qkv.layer_norm_weight"] = hf[h + "input_layernorm.weight"]
            out[m + "mlp.linear_fc1.layer_norm_weight"] = hf[h + "post_attention_layernorm.weight"]
        else:
            out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
            out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
    out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    if not spec.tied_embeddings:
        out["output_layer.weight"] = hf["lm_head.weight"]
    return out


def mcore_to_hf(mc: Mapping[str, Any], spec: ModelSpec) -> dict[str, "torch.Tensor"]:
    """megatron-core names → Hugging Face Qwen3 names (either layer spec; ``_extra_state``
    entries are ignored). A tied LM head is the embedding tensor itself."""
    heads, kv, hd, hidden = _geometry(spec)
    qpg = heads // kv
    fused = "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in mc
    emb = mc["embedding.word_embeddings.weight"]
    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": emb}
    for i in range(spec.layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        qkv = mc[m + "self_attention.linear_qkv.weight"].reshape(kv, (qpg + 2) * hd, hidden)
        q, k, v = qkv.split([qpg * hd, hd, hd], dim=1)
        out[h + "self_attn.q_proj.weight"] = q.reshape(heads * hd, hidden)
        out[h + "self_attn.k_proj.weight"] = k.reshape(kv * hd, hidden)
        out[h + "self_attn.v_proj.weight"] = v.reshape(kv * hd, hidden)
        out[h + "self_attn.o_proj.weight"] = mc[m + "self_attention.linear_proj.weight"]
        out[h + "self_attn.q_norm.weight"] = mc[m + "self_attention.q_layernorm.weight"]
        out[h + "self_attn.k_norm.weight"] = mc[m + "self_attention.k_layernorm.weight"]
        gate, up = mc[m + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out[h + "mlp.gate_proj.weight"] = gate
        out[h + "mlp.up_proj.weight"] = up
        out[h + "mlp.down_proj.weight"] = mc[m + "mlp.linear_fc2.weight"]
        if fused:
            out[h + "input_layernorm.weight"] = mc[m + "self_attention.linear_qkv.layer_norm_weight"]
            out[h + "post_attention_layernorm.weight"] = mc[m + "mlp.linear_fc1.layer_norm_weight"]
        else:
            out[h + "input_layernorm.weight"] = mc[m + "input_layernorm.weight"]
            out[h + "post_attention_layernorm.weight"] = mc[m + "pre_mlp_layernorm.weight"]
    out["model.norm.weight"] = mc["decoder.final_layernorm.weight"]
    out["lm_head.weight"] = emb if spec.tied_embeddings else mc["output_layer.weight"]
    return out


# ---------------------------------------------------------------- checkpoint state without pickled objects

OPAQUE = "__rollart_opaque__"  # marks an object a weights-only checkpoint cannot hold


def to_weights_only(obj: Any, path: str = "state") -> Any:
    """A copy of ``obj`` that ``torch.load(weights_only=True)`` reads back: tensors (detached,
    on the CPU), numbers, strings, None, and dicts / lists / tuples of them. Any other object
    (megatron's optimizer state carries its config objects in the param groups) becomes
    ``{OPAQUE: its type name}``; :func:`from_weights_only` takes it back from the live
    optimizer, which the same constructor arguments rebuilt. So loading a checkpoint never
    runs code from the file."""
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()  # a Parameter becomes a plain tensor
    if obj is None or isinstance(obj, (bool, int, float, str, torch.dtype, torch.device)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: to_weights_only(v, f"{path}[{k!r}]") for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(to_weights_only(v, f"{path}[{i}]") for i, v in enumerate(obj))
    return {OPAQUE: f"{type(obj).__module__}.{type(obj).__qualname__}"}


_MISSING = object()


def from_weights_only(saved: Any, live: Any, path: str = "state") -> Any:
    """``saved`` (from :func:`to_weights_only`) with each opaque marker replaced by the object at
    the same place in ``live`` (the freshly built optimizer's ``state_dict()``). A marker with no
    counterpart raises ValueError naming its place."""
    if isinstance(saved, dict):
        if set(saved) == {OPAQUE}:
            if live is _MISSING or (isinstance(live, dict) and set(live) == {OPAQUE}):
                raise ValueError(f"checkpoint: {path} held a {saved[OPAQUE]}, which a weights-only checkpoint does "
                                 "not store, and the live optimizer has none there to take its place")
            return live
        return {k: from_weights_only(v, live.get(k, _MISSING) if isinstance(live, dict) else _MISSING,
                                     f"{path}[{k!r}]") for k, v in saved.items()}
    if type(saved) in (list, tuple):
        seq = live if isinstance(live, (list, tuple)) else ()
        return type(saved)(from_weights_only(v, seq[i] if i < len(seq) else _MISSING, f"{path}[{i}]")
                           for i, v in enumerate(saved))
    return saved


# ---------------------------------------------------------------- the trainer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_gpt(spec: ModelSpec, train_dtype: str = "bf16", max_positions: int = 32768) -> tuple[Any, Any, Any]:
    """megatron-core's TransformerConfig and a GPTModel (local layer spec: RMSNorm, SwiGLU, GQA,
    RoPE with the torch Qwen3's theta, q/k RMSNorm, no biases, no fusions, no Transformer
    Engine) for ``spec``, initialised on the CPU, and a function building another like it.
    Needs an initialised model-parallel state, not CUDA."""
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from rollart.calibration.profile_engine import model_config, short_dtype, torch_dtype

    cfg = model_config(spec, max_positions)
    params_dtype = torch_dtype(train_dtype)
    config = TransformerConfig(**_kwargs_for(
        TransformerConfig,
        num_layers=spec.layers, hidden_size=spec.hidden, num_attention_heads=spec.heads,
        num_query_groups=spec.kv_heads, kv_channels=spec.head_dim,
        ffn_hidden_size=spec.intermediate, normalization="RMSNorm", layernorm_epsilon=cfg.rms_norm_eps,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
        qk_layernorm=True, hidden_dropout=0.0, attention_dropout=0.0, bf16=short_dtype(train_dtype) == "bf16",
        params_dtype=params_dtype, pipeline_dtype=params_dtype, use_cpu_initialization=True,
        bias_activation_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False))
    layer_spec = get_gpt_layer_local_spec(**_kwargs_for(get_gpt_layer_local_spec, qk_layernorm=True,
                                                         normalization="RMSNorm"))

    def new_gpt() -> Any:
        return GPTModel(**_kwargs_for(
            GPTModel.__init__, config=config, transformer_layer_spec=layer_spec, vocab_size=spec.vocab,
            max_sequence_length=max_positions, pre_process=True, post_process=True,
            share_embeddings_and_output_weights=bool(spec.tied_embeddings), position_embedding_type="rope",
            rotary_percent=1.0, rotary_base=cfg.rope_theta))

    return config, new_gpt(), new_gpt


def _kwargs_for(fn: Any, **kw: Any) -> dict[str, Any]:
    """Only the keyword arguments ``fn`` accepts (megatron-core's signatures move between releases)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kw
    return {k: v for k, v in kw.items() if k in params}


class MegatronTrainer:
    """GRPO on a megatron-core GPTModel (one GPU). Same constructor arguments, ``train_step``,
    ``state_dict`` and checkpoint methods as :class:`GRPOTrainer`; ``train_dtype`` is
    ``"bf16"`` (bf16 weights, fp32 main weights in the optimizer) or ``"fp32"``."""

    name = "grpo-megatron"

    def __init__(self, spec: ModelSpec | str | Mapping[str, Any], lr: float, seed: int, clip_eps: float = 0.2,
                 kl_coef: float = 0.0, device: str = "cuda", *, export_dtype: str = "bf16", train_dtype: str = "bf16",
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999), max_grad_norm: float = 1.0,
                 micro_batch_size: int = 16, temperature: float = 1.0, adv_eps: float = 1e-6, pad_id: int = 0,
                 keep_checkpoints: int = 3, max_positions: int = 32768):
        ok, why = available()
        if not ok:
            raise RuntimeError(f"MegatronTrainer unavailable: {why}")
        import torch
        from megatron.core import parallel_state
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        from rollart.calibration.profile_engine import build_model, short_dtype, torch_dtype

        self.spec = as_spec(spec)
        self.lr, self.seed, self.clip_eps, self.kl_coef = float(lr), int(seed), float(clip_eps), float(kl_coef)
        self.export_dtype, self.train_dtype = short_dtype(export_dtype), short_dtype(train_dtype)
        self.max_grad_norm = max_grad_norm
        self.micro_batch_size = max(1, int(micro_batch_size))
        self.temperature, self.adv_eps, self.pad_id = float(temperature), float(adv_eps), int(pad_id)
        self.keep_checkpoints = keep_checkpoints
        self.device = torch.device(device if str(device).startswith("cuda") else "cuda")
        if self.device.index is None:  # torch.cuda.set_device refuses a device without an index
            self.device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(self.device)

        if not torch.distributed.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            torch.distributed.init_process_group("nccl", rank=0, world_size=1)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(self.seed)

        params_dtype = torch_dtype(self.train_dtype)
        bf16 = self.train_dtype == "bf16"
        self.config, module, new_gpt = build_gpt(self.spec, self.train_dtype, max_positions)
        # Version 0 = the engines' weights: the same random-init HF model, converted.
        hf = build_model(self.spec, dtype="fp32", device="cpu", seed=self.seed, max_positions=max_positions)
        self._load_mcore(module, hf_to_mcore(hf.state_dict(), self.spec))
        del hf
        module = module.to(device=self.device, dtype=params_dtype)
        ddp_config = DistributedDataParallelConfig(**_kwargs_for(
            DistributedDataParallelConfig, grad_reduce_in_fp32=True, overlap_grad_reduce=False,
            use_distributed_optimizer=False))
        self.model = DistributedDataParallel(config=self.config, ddp_config=ddp_config, module=module)
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(**_kwargs_for(
                OptimizerConfig, optimizer="adam", lr=self.lr, min_lr=self.lr, weight_decay=weight_decay,
                adam_beta1=betas[0], adam_beta2=betas[1], adam_eps=1e-8, clip_grad=float(max_grad_norm or 0.0),
                bf16=bf16, params_dtype=params_dtype, use_distributed_optimizer=False,
                decoupled_weight_decay=True)),
            [self.model])
        self.ref_model = None
        if self.kl_coef:
            ref = new_gpt()
            ref.load_state_dict(module.state_dict())
            self.ref_model = ref.to(device=self.device, dtype=params_dtype).eval().requires_grad_(False)
        self.step = 0
        self.version = 0

    @staticmethod
    def _load_mcore(module: Any, weights: Mapping[str, Any]) -> None:
        sd = module.state_dict()  # keeps the ``_extra_state`` entries megatron expects
        missing = [k for k in weights if k not in sd]
        if missing:
            raise KeyError(f"megatron model has no parameters {missing[:4]}")
        for k, v in weights.items():
            sd[k] = v
        module.load_state_dict(sd)

    @property
    def module(self) -> Any:
        return self.model.module

    def _logprobs(self, model: Any, batch: Any) -> "torch.Tensor":
        import torch

        B, T = batch.input_ids.shape
        pos = torch.arange(T, device=self.device).unsqueeze(0).expand(B, -1)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=self.device), diagonal=1)[None, None]
        logits = model(batch.input_ids, pos, causal)  # [B, T, V] when no labels are given
        return token_logprobs(logits[:, :-1, :], batch.targets, self.temperature)

    def logprobs(self, samples: Sequence[Sample]) -> list[list[float]]:
        import torch

        out: list[list[float]] = []
        self.model.eval()
        for lo in range(0, len(samples), self.micro_batch_size):
            chunk = samples[lo:lo + self.micro_batch_size]
            batch = build_batch(chunk, [0.0] * len(chunk), self.pad_id, self.device)
            with torch.no_grad():
                lp = self._logprobs(self.model, batch).float().cpu()
            for b, s in enumerate(chunk):
                p = len(s.prompt_ids)
                out.append(lp[b, p - 1:p - 1 + len(s.completion_ids)].tolist())
        return out

    def train_step(self, samples: Sequence[Sample], version: int | None = None) -> dict[str, float]:
        from megatron.core.distributed import finalize_model_grads

        if not samples:
            raise ValueError("train_step needs at least one sample")
        t0 = time.perf_counter()
        adv = compute_advantages(samples, self.adv_eps)
        tokens = sum(sum(s.mask()) for s in samples)
        denom = float(max(tokens, 1))
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        loss_total, sums = accumulate_gradients(self, samples, adv, denom)
        finalize_model_grads([self.model])
        ok, grad_norm, _ = self.optimizer.step()
        self.step += 1
        self.version = int(version) if version is not None else self.version + 1
        metrics = step_metrics(self, samples, adv, tokens, loss_total, sums, float(grad_norm or 0.0), t0)
        metrics["update_ok"] = float(bool(ok))
        return metrics

    def state_dict(self, dtype: str | None = None) -> dict[str, "torch.Tensor"]:
        """Hugging Face-named CPU weights in ``dtype`` (default ``export_dtype``)."""
        from rollart.calibration.profile_engine import torch_dtype

        dt = torch_dtype(dtype or self.export_dtype)
        mc = {k: v for k, v in self.module.state_dict().items() if not k.endswith("_extra_state")}
        hf = mcore_to_hf(mc, self.spec)
        cache: dict[int, Any] = {}
        out = {}
        for k, v in hf.items():
            key = id(v)
            if key not in cache:
                cache[key] = v.detach().to(device="cpu", dtype=dt).contiguous()
            out[k] = cache[key]
        return out

    def save_checkpoint(self, directory: str | Path, step: int | None = None, version: int | None = None) -> Path:
        import torch
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        step = self.step if step is None else int(step)
        version = self.version if version is None else int(version)

        def write(tmp: Path) -> None:
            weights = {k: v.detach().cpu() for k, v in self.module.state_dict().items()
                       if not k.endswith("_extra_state")}
            torch.save(weights, tmp / "model.pt")
            torch.save(to_weights_only(self.optimizer.state_dict()), tmp / "optim.pt")
            torch.save(to_weights_only({**capture_rng(), "megatron": get_cuda_rng_tracker().get_states()}),
                       tmp / "rng.pt")

        return write_checkpoint_atomic(directory, step, write, checkpoint_meta(self, step, version),
                                       self.keep_checkpoints)

    def load_checkpoint(self, directory: str | Path) -> tuple[int, int]:
        import torch
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        path, meta = read_checkpoint_meta(directory, self.name, self.spec)
        # Weights-only loads: a checkpoint is data, never code. The optimizer's config objects
        # were left out when it was saved and come back from the live optimizer.
        weights = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
        optim = from_weights_only(torch.load(path / "optim.pt", map_location="cpu", weights_only=True),
                                  self.optimizer.state_dict(), "optim.pt")
        rng = from_weights_only(torch.load(path / "rng.pt", map_location="cpu", weights_only=True), {}, "rng.pt")
        self._load_mcore(self.module, weights)
        self.optimizer.load_state_dict(optim)
        restore_rng(rng)
        if "megatron" in rng:
            get_cuda_rng_tracker().set_states(rng["megatron"])
        self.step, self.version = int(meta["step"]), int(meta["version"])
        return self.step, self.version
