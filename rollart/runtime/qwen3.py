"""The dense Qwen3 decoder that the CPU runtime trains and serves and ``rollart calibrate
profile --engine torch`` measures, written against torch alone.

Why not ``transformers.Qwen3ForCausalLM``: importing its modelling stack costs ~4.5 CPU-s a
process on a small machine (it pulls in ``torch._dynamo``, ``torch.distributed.tensor`` and
``scipy.optimize``), and a local run starts it in every engine and trainer actor. This module
computes the same function (``tests/test_qwen3_model.py`` compares its logits with
transformers' on the same weights, with and without a cache and padding) and keeps Hugging
Face's parameter names, so its ``state_dict`` is what vLLM and the weight stores expect.

The architecture, per layer (pre-norm residual blocks, no biases)::

    h = x + o_proj(attention(rope(q_norm(q_proj(n1(x)))), rope(k_norm(k_proj(n1(x)))), v_proj(n1(x))))
    y = h + down_proj(silu(gate_proj(n2(h))) * up_proj(n2(h)))

``n1``, ``n2``, ``q_norm``, ``k_norm`` and the final norm are RMSNorms (``x / rms(x) · w``, in
fp32); q/k norms act per head. Attention is causal, grouped-query (``heads / kv_heads`` query
heads share a key/value head), scaled by ``head_dim^-1/2``. RoPE rotates the two halves of each
head by ``position · theta^(-2i/head_dim)``. Weights start as N(0, 0.02) (norm scales at 1), as
transformers initialises Qwen3.

:class:`KVCache` holds each layer's keys and values ``[batch, kv_heads, length, head_dim]``;
a forward with a cache appends to it. ``attention_mask`` ``[batch, cached + new]`` marks real
tokens (1) and padding (0); ``position_ids`` default to each token's index in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from rollart.plan.schema import ModelSpec

# Qwen3's released configs: RoPE base 1,000,000, RMSNorm epsilon 1e-6. The engines' config.json
# (``hf_config_dict``) and the Megatron trainer read the same values from here.
ROPE_THETA = 1_000_000.0
RMS_NORM_EPS = 1e-6
INIT_STD = 0.02


@dataclass(frozen=True)
class Qwen3Config:
    """The geometry of a dense Qwen3 model, under Hugging Face's attribute names."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 32768
    rope_theta: float = ROPE_THETA
    rms_norm_eps: float = RMS_NORM_EPS

    @classmethod
    def from_spec(cls, spec: ModelSpec, max_positions: int = 32768) -> "Qwen3Config":
        if spec.moe_experts:
            raise ValueError(f"model '{spec.name}' is a mixture of experts; the torch engine builds dense Qwen3 "
                             "models only (profile MoE models with --engine vllm and their config.json)")
        return cls(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                   num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                   num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim,
                   tie_word_embeddings=bool(spec.tied_embeddings),
                   max_position_embeddings=max(int(max_positions), 1))


@dataclass
class LayerKV:
    keys: torch.Tensor      # [batch, kv_heads, length, head_dim]
    values: torch.Tensor


@dataclass
class KVCache:
    """Per-layer keys and values; empty until the first forward fills it."""

    layers: list[LayerKV] = field(default_factory=list)

    @classmethod
    def from_layers(cls, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> "KVCache":
        return cls([LayerKV(k, v) for k, v in pairs])

    def get_seq_length(self) -> int:
        return int(self.layers[0].keys.shape[2]) if self.layers else 0

    def update(self, index: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append one layer's new keys and values; returns the layer's whole cache."""
        if index == len(self.layers):
            self.layers.append(LayerKV(keys, values))
        else:
            layer = self.layers[index]
            layer.keys = torch.cat([layer.keys, keys], dim=2)
            layer.values = torch.cat([layer.values, values], dim=2)
        layer = self.layers[index]
        return layer.keys, layer.values

    def crop(self, length: int) -> None:
        """Keep the first ``length`` tokens (a negative ``length`` drops that many from the end)."""
        keep = length if length >= 0 else self.get_seq_length() + length
        for layer in self.layers:
            layer.keys, layer.values = layer.keys[:, :, :keep], layer.values[:, :, :keep]


@dataclass
class CausalLMOutput:
    logits: torch.Tensor    # [batch, kept positions, vocab]
    cache: Optional[KVCache]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Rotary(nn.Module):
    """cos/sin of ``position · inv_freq`` for each head dimension, computed in fp32: the frequencies stay
    fp32 when the model moves to bf16 (rounding them would shift long positions' angles, ~0.4 % at
    head_dim 128), as vLLM keeps them."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", self._frequencies(None), persistent=False)

    def _frequencies(self, device: Optional[torch.device]) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        return 1.0 / (self.theta ** exponents)

    def _apply(self, fn, recurse: bool = True):  # .to(), .cuda(), .half(): move, then recompute in fp32
        super()._apply(fn, recurse)
        self.inv_freq = self._frequencies(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1)           # [batch, tokens, head_dim]
        return angles.cos().to(dtype).unsqueeze(1), angles.sin().to(dtype).unsqueeze(1)


def native_gqa(device_type: str, masked: bool) -> bool:
    """Whether ``scaled_dot_product_attention(enable_gqa=True)`` reaches a fused kernel: on CPU always;
    on CUDA only without a mask."""
    return device_type == "cpu" or not masked


class Attention(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: Optional[torch.Tensor],
                cache: Optional[KVCache], index: int) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(index, k, v)
        causal = mask is None and t > 1   # a fresh prompt; a lone decode token sees everything cached
        group = self.heads // self.kv_heads   # query heads per key/value head
        # Native grouped-query attention (no copy) where the kernel takes it: always on CPU; on CUDA
        # only without a mask (flash attention takes no mask, memory-efficient attention no GQA: torch
        # would fall back to the math kernel and its full score matrix). Otherwise repeat the heads.
        native = group > 1 and native_gqa(q.device.type, mask is not None)
        if group > 1 and not native:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=native)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: Optional[torch.Tensor],
                cache: Optional[KVCache], index: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, mask, cache, index)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Model(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = Rotary(cfg.head_dim, cfg.rope_theta)


def _attention_mask(attention_mask: Optional[torch.Tensor], batch: int, past: int, new: int,
                    device: torch.device) -> Optional[torch.Tensor]:
    """A boolean ``[batch, 1, new, past + new]`` mask (True: may attend), or None where the causal
    flag or nothing at all says the same (no padding, and no cache or a single new token)."""
    if attention_mask is not None and tuple(attention_mask.shape) != (batch, past + new):
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; expected (batch, cached + new) "
                         f"= ({batch}, {past + new})")
    if attention_mask is None and (past == 0 or new == 1):
        return None
    query = torch.arange(past, past + new, device=device).unsqueeze(1)
    allowed = torch.arange(past + new, device=device).unsqueeze(0) <= query     # [new, past + new]
    allowed = allowed.unsqueeze(0).unsqueeze(0)
    if attention_mask is not None:
        allowed = allowed & attention_mask.bool()[:, None, None, :]
        # A padding query before every real token would attend to nothing (NaN); let it see
        # everything instead: its output is padding and nobody reads it.
        allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
    return allowed


class Qwen3ForCausalLM(nn.Module):
    """``model`` (embeddings, layers, final norm) and ``lm_head``, named as in Hugging Face."""

    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.config = cfg
        self.model = Qwen3Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def reset_parameters(self) -> None:
        """N(0, INIT_STD) matrices and embeddings, unit norm scales (torch's global RNG)."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)) and not (
                        module is self.lm_head and self.config.tie_word_embeddings):
                    module.weight.normal_(0.0, INIT_STD)
                elif isinstance(module, RMSNorm):
                    module.weight.fill_(1.0)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None, cache: Optional[KVCache] = None,
                use_cache: bool = False, logits_to_keep: int = 0) -> CausalLMOutput:
        if use_cache and cache is None:
            cache = KVCache()   # a cache the caller passes is always used (and appended to)
        past = cache.get_seq_length() if cache is not None else 0
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=input_ids.device).unsqueeze(0).expand(b, t)
        x = self.model.embed_tokens(input_ids)
        rope = self.model.rotary_emb(position_ids, x.dtype)
        mask = _attention_mask(attention_mask, b, past, t, input_ids.device)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, rope, mask, cache, i)
        x = self.model.norm(x)
        if logits_to_keep:
            x = x[:, -logits_to_keep:, :]
        return CausalLMOutput(self.lm_head(x), cache)


def build(spec: ModelSpec, max_positions: int = 32768, seed: int = 0) -> Qwen3ForCausalLM:
    """A random-init model of ``spec``'s geometry, seeded (``torch.manual_seed(seed)``)."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config.from_spec(spec, max_positions))
    model.reset_parameters()
    return model


__all__ = ["CausalLMOutput", "INIT_STD", "KVCache", "LayerKV", "Qwen3Config", "Qwen3ForCausalLM", "RMS_NORM_EPS",
           "ROPE_THETA", "build", "native_gqa"]
