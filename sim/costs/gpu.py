"""Generation cost: how long one engine iteration takes on a TP group of GPUs.

Prefill is compute-bound, decode bandwidth-bound; both are rooflines with efficiency and
fixed-overhead terms, plus tensor-parallel all-reduces. The decode iteration time is linear
in the batch's total context inside each regime, which lets the engine jump K iterations
in closed form instead of simulating tokens one by one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

from rollart.plan.schema import GpuType, ModelSpec
from rollart.sim.costs.moe import (busiest_rank_sequences, busiest_rank_share, embedding_params,
                                   expert_weight_bytes, input_embedding_params, rank_collectives_s,
                                   rank_expert_rows, rank_experts_touched, replicated_params,
                                   served_weight_bytes, straddle_note, weight_element_bytes, worker_weight_bytes)


@dataclass(frozen=True)
class RooflineEfficiency:
    """Fractions of datasheet peak reached in practice, and per-iteration overheads."""

    prefill_compute: float = 0.55
    decode_compute: float = 0.45
    decode_bandwidth: float = 0.80
    iteration_overhead_s: float = 0.004
    allreduce_latency_s: float = 10e-6
    memory_utilization: float = 0.90
    activation_reserve_gb: float = 4.0
    source: str = "datasheet roofline; efficiencies assumed (profile: datasheet)"


@dataclass(frozen=True)
class DecodeLine:
    """Per-iteration decode time ``a + max(c0 + c1·x, m0 + m1·x)`` for a batch whose total
    context is ``x`` tokens; ``x`` grows by the batch size every iteration."""

    a: float
    c0: float
    c1: float
    m0: float
    m1: float

    def _pieces(self, x0: float, batch: int, k_hi: int) -> list[tuple[int, int, float, float]]:
        p0, p1 = self.c0 + self.c1 * x0, self.c1 * batch
        q0, q1 = self.m0 + self.m1 * x0, self.m1 * batch
        split = k_hi
        if p1 != q1:
            ks = (q0 - p0) / (p1 - q1)
            if 0 < ks < k_hi:
                split = math.ceil(ks)
        pieces = []
        for lo, hi in ((0, split), (split, k_hi)):
            if hi > lo:
                mid = (lo + hi - 1) / 2
                line = (p0, p1) if p0 + p1 * mid >= q0 + q1 * mid else (q0, q1)
                pieces.append((lo, hi, *line))
        return pieces

    def total(self, x0: float, batch: int, iterations: int) -> float:
        """Seconds for ``iterations`` consecutive decode iterations starting at context ``x0``."""
        if iterations <= 0:
            return 0.0
        p0, p1 = self.c0 + self.c1 * x0, self.c1 * batch
        q0, q1 = self.m0 + self.m1 * x0, self.m1 * batch
        last = iterations - 1
        first_compute, last_compute = p0 >= q0, p0 + p1 * last >= q0 + q1 * last
        if first_compute == last_compute:  # one regime throughout (the common case)
            v0, v1 = (p0, p1) if first_compute else (q0, q1)
            return iterations * (self.a + v0) + v1 * last * iterations / 2
        s = self.a * iterations
        for lo, hi, v0, v1 in self._pieces(x0, batch, iterations):
            n = hi - lo
            s += n * v0 + v1 * (lo + hi - 1) * n / 2
        return s

    def linear_pieces(self) -> list[tuple[float, float]]:
        """(alpha, beta) of its compute and its memory regime: ``alpha + beta·x`` seconds an iteration."""
        return [(self.a + self.c0, self.c1), (self.a + self.m0, self.m1)]

    def at(self, x: float) -> tuple[float, float, float]:
        """(seconds, alpha, beta) of one iteration at total context ``x``: the regime that holds there."""
        (c0, c1), (m0, m1) = self.linear_pieces()
        alpha, beta = (c0, c1) if c0 + c1 * x >= m0 + m1 * x else (m0, m1)
        return alpha + beta * x, alpha, beta

    def scaled(self, factor: float) -> "DecodeLine":
        return DecodeLine(a=self.a * factor, c0=self.c0 * factor, c1=self.c1 * factor, m0=self.m0 * factor,
                          m1=self.m1 * factor)

    def iterations_within(self, x0: float, batch: int, limit: int, elapsed: float) -> int:
        """Smallest k ≤ limit with total(k) ≥ elapsed (the iteration in progress completes).

        Solved per linear piece with the quadratic formula, then nudged by ±1 against
        :meth:`total` so rounding never makes it wrong."""
        if elapsed <= 0:
            return 0
        pieces = [(lo, hi, self.a + v0, v1) for lo, hi, v0, v1 in self._pieces(x0, batch, limit)]
        return _first_iteration_reaching(pieces, lambda k: self.total(x0, batch, k), limit, elapsed)


@dataclass(frozen=True)
class EnvelopeLine:
    """Per-iteration decode time ``min(max_j H_j(x), min_i F_i(x))`` for :class:`DecodeLine` lines ``H``
    (the time may not fall below any) and ``F`` (it may not rise above any): a line held between others
    at every context, not a line made of their coefficients (which can lie below all of them). It is
    piecewise linear in ``x``, so it is kept as ``segments``: from each ``x_start`` on, ``alpha + beta·x``
    (:meth:`between`); :meth:`total` and :meth:`iterations_within` sum or solve it piece by piece, as
    :class:`DecodeLine` does."""

    segments: tuple[tuple[float, float, float], ...]  # (x_start, alpha, beta), x_start ascending from 0

    @staticmethod
    def between(high: list[DecodeLine | EnvelopeLine], low: list[DecodeLine | EnvelopeLine]) -> EnvelopeLine:
        pieces = [p for line in high + low for p in line.linear_pieces()]
        cuts = sorted({0.0, *(x for i, (a0, a1) in enumerate(pieces) for b0, b1 in pieces[i + 1:] if a1 != b1
                              and (x := (b0 - a0) / (a1 - b1)) > 0)})
        segments: list[tuple[float, float, float]] = []
        for i, x_start in enumerate(cuts):  # no two pieces cross inside a cut: one of them is the time there
            x = (x_start + cuts[i + 1]) / 2 if i + 1 < len(cuts) else x_start + 1.0
            value = max((line.at(x) for line in high), default=None)
            for floor in (line.at(x) for line in low):
                if value is None or floor[0] < value[0]:
                    value = floor
            _, alpha, beta = value
            if not segments or (segments[-1][1], segments[-1][2]) != (alpha, beta):
                segments.append((x_start, alpha, beta))
        return EnvelopeLine(tuple(segments))

    def linear_pieces(self) -> list[tuple[float, float]]:
        return [(alpha, beta) for _, alpha, beta in self.segments]

    def at(self, x: float) -> tuple[float, float, float]:
        """(seconds, alpha, beta) of one iteration at total context ``x``: the piece that holds there."""
        _, alpha, beta = next(seg for seg in reversed(self.segments) if seg[0] <= x)
        return alpha + beta * x, alpha, beta

    def scaled(self, factor: float) -> "EnvelopeLine":
        return EnvelopeLine(tuple((x, alpha * factor, beta * factor) for x, alpha, beta in self.segments))

    def _pieces(self, x0: float, batch: int, k_hi: int) -> list[tuple[int, int, float, float]]:
        """(first, end, v0, v1): iterations first … end−1 cost v0 + v1·k each (k from 0)."""
        out = []
        for i, (x_start, alpha, beta) in enumerate(self.segments):
            lo = 0 if i == 0 else max(0, min(k_hi, math.ceil((x_start - x0) / batch)))
            hi = k_hi if i + 1 == len(self.segments) else \
                max(0, min(k_hi, math.ceil((self.segments[i + 1][0] - x0) / batch)))
            if hi > lo:
                out.append((lo, hi, alpha + beta * x0, beta * batch))
        return out

    def total(self, x0: float, batch: int, iterations: int) -> float:
        """Seconds for ``iterations`` consecutive decode iterations starting at context ``x0``."""
        if iterations <= 0:
            return 0.0
        return sum((hi - lo) * v0 + v1 * (lo + hi - 1) * (hi - lo) / 2 for lo, hi, v0, v1
                   in self._pieces(x0, batch, iterations))

    def iterations_within(self, x0: float, batch: int, limit: int, elapsed: float) -> int:
        """Smallest k ≤ limit with total(k) ≥ elapsed, as :meth:`DecodeLine.iterations_within`."""
        return _first_iteration_reaching(self._pieces(x0, batch, limit), lambda k: self.total(x0, batch, k),
                                         limit, elapsed)


def _first_iteration_reaching(pieces: list[tuple[int, int, float, float]], total: Callable[[int], float],
                              limit: int, elapsed: float) -> int:
    """Smallest k ≤ ``limit`` whose first k iterations take at least ``elapsed`` seconds, where iterations
    lo … hi−1 of each piece (lo, hi, v0, v1) cost v0 + v1·k. Solved per piece with the quadratic formula
    (Σ_{k=lo}^{lo+j−1} (v0 + v1·k) = j·(v0 + v1·lo) + v1·j(j−1)/2), then nudged by ±1 against ``total``
    (seconds of the first k iterations) so rounding never makes it wrong."""
    if elapsed <= 0:
        return 0
    done = 0.0
    for lo, hi, v0, v1 in pieces:
        n = hi - lo
        piece = n * v0 + v1 * (lo + hi - 1) * n / 2
        if done + piece < elapsed:
            done += piece
            continue
        rem, b = elapsed - done, v0 + v1 * lo - v1 / 2
        j = (-b + math.sqrt(b * b + 2 * v1 * rem)) / v1 if v1 > 0 else (rem / b if b > 0 else 0.0)
        k = min(hi, max(lo, lo + math.ceil(j - 1e-9)))
        while k > 0 and total(k - 1) >= elapsed:
            k -= 1
        while k < limit and total(k) < elapsed:
            k += 1
        return k
    return limit


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads each of ``tp`` tensor-parallel GPUs holds: its share of ``model.kv_heads``, and at
    least one whole head: a head is not split, so with tp > kv_heads every head is replicated on
    tp / kv_heads GPUs (Qwen3's 8 KV heads at tp 16: 2 copies each)."""
    return max(1, math.ceil(model.kv_heads / max(1, tp)))


def kv_bytes_per_token_held(model: ModelSpec, tp: int, ep: int = 1) -> float:
    """Bytes of KV cache a worker of ``tp`` GPUs holds per cached token, over all its GPUs: with
    ``ep`` ranks each rank's tp/ep GPUs hold its own sequences' KV, each GPU its
    :func:`kv_heads_per_gpu` heads. Equals ``model.kv_bytes_per_token`` while tp/ep divides the
    KV heads; above that it stops shrinking per GPU at one head (1/kv_heads of a token's KV).
    MLA's latent is one "head" all the query heads read: every GPU of a rank holds all of it (as
    vLLM and SGLang shard MLA), so tp/ep copies of ``model.kv_bytes_per_token``."""
    rank_tp = max(1, tp // max(1, ep))
    if model.mla:
        return float(model.kv_bytes_per_token * rank_tp)
    return model.kv_bytes_per_token * rank_tp * kv_heads_per_gpu(model, rank_tp) / model.kv_heads


def prefill_attention_flops(model: ModelSpec) -> int:
    """Attention FLOPs of one (query, key) pair in one layer as prefill computes it: QKᵀ and PV over
    every query head, 4·H·d for standard attention. MLA prefills in the non-absorbed form (the new
    tokens' latents up-projected by kv_b, a linear layer counted with the weights): QKᵀ over
    head_dim + rope, PV over v_head_dim. Re-expanding a cached prefix's latents is not counted."""
    if not model.mla:
        return 4 * model.heads * model.head_dim
    return 2 * model.heads * (model.head_dim + model.qk_rope_head_dim + model.value_head_dim)


def decode_attention_flops(model: ModelSpec) -> int:
    """Attention FLOPs of one cached token in one layer for a decoding query: 4·H·d for standard
    attention. MLA decodes in the absorbed form (W_UK folded into the query, W_UV into the output:
    the same kv_b weights, counted as linear layers), so per head QKᵀ runs over kv_lora_rank + rope
    and PV over kv_lora_rank, straight on the latent cache: more FLOPs per cached byte read."""
    if not model.mla:
        return 4 * model.heads * model.head_dim
    return 2 * model.heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim)


def kv_capacity(model: ModelSpec, gpu: GpuType, tp: int, eff: RooflineEfficiency, ep: int = 1) -> int:
    """Tokens of KV cache a worker of ``tp`` GPUs holds: the memory CUDA sees × utilisation − weights (as served:
    BF16 or FP8; with ``ep`` ranks the non-expert weights once per rank; MLA's down-projections on
    every GPU) − activations; a token's KV in ``model.kv_dtype``, replicated where tp/ep exceeds the KV
    heads, and MLA's latent on every GPU of a rank (:func:`kv_bytes_per_token_held`)."""
    free = tp * gpu.usable_memory_gib * 2**30 * eff.memory_utilization - worker_weight_bytes(model, ep, tp) \
        - tp * eff.activation_reserve_gb * 2**30
    return int(max(0.0, free) // kv_bytes_per_token_held(model, tp, ep))


class GenerationCost(Protocol):
    """What the engine needs from a GPU model; calibrated profiles implement the same."""

    source: str
    kv_capacity_tokens: int

    def prefill_time(self, new_tokens: int, attention_pairs: float, sequences: int = 0) -> float: ...

    def decode_line(self, batch: int) -> DecodeLine | EnvelopeLine: ...

    def mixed_step_time(self, new_tokens: int, attention_pairs: float, decode_batch: int,
                        decode_context: float, sequences: int = 0) -> float:
        """One engine step that prefills ``new_tokens`` and decodes one token for each of
        ``decode_batch`` sequences holding ``decode_context`` cached tokens in all: one
        overhead and one weight read, not a prefill step plus a decode step. ``sequences``: how
        many prompts the new tokens belong to (0: not known), which sets the busiest
        expert-parallel rank's share where each prompt attends on one rank."""
        ...


class RooflineGeneration:
    """First-principles iteration times for ``model`` on ``tp`` GPUs of type ``gpu``.

    prefill(N, A) = o + max(F / (tp·peak·e_p), W(N) / (tp·bw·e_bw)) + 2·L·allreduce(N·h·2 B)
        with F = 2·P_lin·N + 2·V·h + 4·L·H·d·A  (A = Σ new·(cached + new/2) attention pairs)
    decode(B, X)  = o + max((2·P_lin·B + 2·V·h·B + 4·L·H·d·X) / (tp·peak·e_c),
                            (W(B) + kv·X) / (tp·bw·e_bw)) + 2·L·allreduce(B·h·2 B)
    mixed         = o + max(F_new / (tp·peak·e_p) + F_dec / (tp·peak·e_c), (W(N + B) + kv·X) / (tp·bw·e_bw)) + …
        (the new tokens' FLOPs at prefill's share of peak, the B decoding rows' at decode's)

    P_lin is the active parameters less the embeddings: the input embedding is a row lookup and
    the lm_head (V·h) runs only for the rows that sample a token (one per prefill step, as the
    kernel-profile composition counts it; one per decoding sequence). W(N) is the weight bytes a
    step over N tokens reads: the layers and the lm_head (not the input embedding table) when
    dense; for a MoE model the non-expert weights plus the E·(1 − (1 − k/E)^N) experts the tokens touch
    (``sim.costs.moe``), so a one-token step reads k experts and a large batch all of them.
    FP8 weights (``model.weight_dtype``) read 1 byte each and run the linear layers' FLOPs at the
    GPU's FP8 peak (``gpu.tflops_fp8``: 2 × BF16 on Hopper; the BF16 peak where its tensor cores
    have no FP8, weights only stored in FP8); embeddings, lm_head and attention stay BF16. An FP8 KV cache reads 1 byte
    per element. With ``ep`` expert-parallel ranks (``sim.costs.moe``) every term is the busiest
    rank's on its tp/ep GPUs: 1/ep of the tokens and context, all the non-expert weights, the
    experts and token-expert rows of its E/ep experts; plus the dispatch/combine all-to-all.

    DeepSeek-V3-class geometry: a shared expert and the dense first layers are non-expert weights
    (read and computed for every token); the routed experts live in the ``moe_layers`` only. With MLA
    the attention term 4·L·H·d becomes :func:`prefill_attention_flops` per pair for the new tokens and
    :func:`decode_attention_flops` per cached token for the decoding ones (absorbed form), and
    ``kv`` is the latent every GPU of a rank reads whole; its replicated down-projections are read
    by every GPU.

    The TP ring and the EP all-to-all ride NVLink within one NVLink domain of ``domain`` GPUs and
    ``network`` beyond it: the GPU type's ``nvlink_domain``, or, for a worker that straddles a domain
    boundary, its smallest piece on one side (``moe.worker_domain``), so they cross the network.
    """

    def __init__(self, model: ModelSpec, gpu: GpuType, tp: int, eff: RooflineEfficiency | None = None,
                 ep: int = 1, network: tuple[float, float] | None = None, domain: int | None = None,
                 rdma: bool = True):
        self.model, self.gpu, self.tp, self.ep = model, gpu, tp, ep
        self._domain = gpu.nvlink_domain if domain is None else domain
        fp8_peak_ratio = gpu.tflops_fp8 / gpu.tflops_bf16 if gpu.tflops_fp8 else 1.0
        self.eff = eff or RooflineEfficiency()
        self.source = self.eff.source + (f"; FP8 weights at {fp8_peak_ratio:g} × the BF16 peak"
                                          if model.weight_dtype == "fp8" else "") + (f"; ep {ep}" if ep > 1 else "") \
            + straddle_note(tp, gpu.nvlink_domain, self._domain)
        self._rank_tp = tp // ep  # GPUs of one expert-parallel rank (sim.costs.moe); tp when ep = 1
        self._peak = self._rank_tp * gpu.tflops_bf16 * 1e12  # one rank's
        self._bw = self._rank_tp * gpu.hbm_tbps * 1e12
        # peak-seconds (× BF16 peak) per token of the matmuls every token passes through: the linear
        # layers in the served dtype; a MoE model's expert part per token-expert row apart, since with
        # ep each rank computes only its experts' rows. The input embedding is a lookup (no FLOPs, a
        # few rows read); the lm_head (BF16) runs only for the rows that sample a token: one per
        # decoding sequence, one per prefill step (as the kernel-profile composition counts them).
        lin_ratio = fp8_peak_ratio if model.weight_dtype == "fp8" else 1.0
        emb = embedding_params(model)
        self._expert_flops_per_row = (2.0 * model.moe_layers * 3 * model.hidden * model.intermediate / lin_ratio
                                      if model.moe_experts else 0.0)
        rows_per_token = max(1, model.moe_active_experts) if model.moe_experts else 0
        self._flops_per_token = 2.0 * (model.active_params - emb) / lin_ratio \
            - rows_per_token * self._expert_flops_per_row
        if model.mla:  # the unsplit down-projections run on every GPU of the rank for all its tokens
            self._flops_per_token += 2.0 * (self._rank_tp - 1) * replicated_params(model) / lin_ratio
        self._lm_head_flops_per_row = 2.0 * model.vocab * model.hidden
        self._dense_bytes = served_weight_bytes(model) - expert_weight_bytes(model) \
            - 2.0 * input_embedding_params(model)  # embeddings are BF16
        if model.mla:  # every GPU of a rank reads its own copy of the unsplit down-projections
            self._dense_bytes += (self._rank_tp - 1) * weight_element_bytes(model) * float(replicated_params(model))
        self._bytes_per_expert = expert_weight_bytes(model) / model.moe_experts if model.moe_experts else 0.0
        self._nvlink = gpu.nvlink_gbps * 1e9 / 2  # datasheet NVLink counts both directions
        self._network = network or (self._nvlink, self.eff.allreduce_latency_s)
        self._rdma = rdma  # DeepEP's kernels across nodes (moe.all_to_all_s); False on a TCP network
        self._attn_flops_per_pair = model.layers * prefill_attention_flops(model) / ep  # a rank's share
        # a decoding token's FLOPs per cached token (MLA's absorbed form) over a prefill pair's: 1.0 for GQA,
        # so the plain models' sums are the same floating-point expressions as before
        self._decode_attn_ratio = decode_attention_flops(model) / prefill_attention_flops(model)
        self._attn_flops_per_cached = self._attn_flops_per_pair * self._decode_attn_ratio
        # a rank's GPUs read their own KV heads (replicated beyond one head per GPU) for 1/ep of the context
        self._kv_bytes_per_token = kv_bytes_per_token_held(model, tp, ep) / ep
        self.kv_capacity_tokens = kv_capacity(model, gpu, tp, self.eff, ep)
        self._lines: dict[int, DecodeLine] = {}

    def _flops(self, tokens: float) -> float:
        """Linear-layer FLOPs (BF16-peak equivalent) of the busiest rank for a step over ``tokens``."""
        rows = rank_expert_rows(self.model, tokens, self.ep) if self.model.moe_experts else 0.0
        return self._flops_per_token * tokens / self.ep + self._expert_flops_per_row * rows

    def _weights(self, tokens: float) -> float:
        """Weight bytes the busiest rank reads: ``weight_bytes_read`` less the input embedding table
        (a lookup) when ep = 1."""
        if not self.model.moe_experts:
            return self._dense_bytes
        return self._dense_bytes + self._bytes_per_expert * rank_experts_touched(self.model, max(1.0, tokens), self.ep)

    def _allreduce(self, tokens: float, rank_tokens: float | None = None, kernel: str = "low_latency") -> float:
        """The MoE all-to-alls and the all-reduces inside a rank (:func:`~rollart.sim.costs.moe.rank_collectives_s`)."""
        return rank_collectives_s(self.model, tokens, self.ep, self.tp, (self._nvlink, self.eff.allreduce_latency_s),
                                  self._network, self._domain, self._rdma, kernel, rank_tokens)

    def _lm_head(self, rows: float) -> float:
        """lm_head FLOPs of the busiest rank for ``rows`` sampling rows (1/ep of them, vocab over tp)."""
        return self._lm_head_flops_per_row * max(1.0, busiest_rank_sequences(rows, self.ep))

    def prefill_time(self, new_tokens: int, attention_pairs: float, sequences: int = 0) -> float:
        if new_tokens <= 0:
            return 0.0
        # a prompt attends on one rank: the busiest holds ⌈sequences/ep⌉ of them (busiest_rank_share)
        pairs = attention_pairs * busiest_rank_share(sequences, self.ep)
        flops = self._flops(new_tokens) + self._lm_head(1) + self._attn_flops_per_pair * pairs
        compute = flops / (self._peak * self.eff.prefill_compute)
        memory = self._weights(new_tokens) / (self._bw * self.eff.decode_bandwidth)
        return self.eff.iteration_overhead_s + max(compute, memory) \
            + self._allreduce(new_tokens, new_tokens / self.ep * busiest_rank_share(sequences, self.ep), "normal")

    def mixed_step_time(self, new_tokens: int, attention_pairs: float, decode_batch: int,
                        decode_context: float, sequences: int = 0) -> float:
        if new_tokens <= 0:
            return self.decode_line(decode_batch).total(decode_context, decode_batch, 1) if decode_batch else 0.0
        tokens = new_tokens + decode_batch
        context = decode_context * busiest_rank_share(decode_batch, self.ep)
        pairs = attention_pairs * busiest_rank_share(sequences, self.ep)
        # the decoding rows' work at decode's share of peak, the new tokens' at prefill's: one share for
        # both would make a compute-bound decode step faster for a prefill token joining it
        # (the lm_head samples the decoding rows, or the prompt's last row when none decode)
        linear, lm_head = self._flops(tokens), self._lm_head(decode_batch)
        decode_linear = linear * decode_batch / tokens
        prefill_flops = linear - decode_linear + self._attn_flops_per_pair * pairs + (0.0 if decode_batch else lm_head)
        decode_flops = decode_linear + (lm_head if decode_batch else 0.0) + self._attn_flops_per_cached * context
        compute = prefill_flops / (self._peak * self.eff.prefill_compute) \
            + decode_flops / (self._peak * self.eff.decode_compute)
        memory = (self._weights(tokens) + self._kv_bytes_per_token * context) \
            / (self._bw * self.eff.decode_bandwidth)
        rank_tokens = new_tokens * busiest_rank_share(sequences, self.ep) / self.ep \
            + busiest_rank_sequences(decode_batch, self.ep)
        return self.eff.iteration_overhead_s + max(compute, memory) + self._allreduce(tokens, rank_tokens, "normal")

    def decode_line(self, batch: int) -> DecodeLine:
        line = self._lines.get(batch)
        if line is None:
            pc = self._peak * self.eff.decode_compute
            bw = self._bw * self.eff.decode_bandwidth
            line = DecodeLine(
                a=self.eff.iteration_overhead_s + self._allreduce(batch, busiest_rank_sequences(batch, self.ep)),
                c0=(self._flops(batch) + self._lm_head(batch)) / pc,
                c1=self._attn_flops_per_cached * busiest_rank_share(batch, self.ep) / pc,
                m0=self._weights(batch) / bw,
                m1=self._kv_bytes_per_token * busiest_rank_share(batch, self.ep) / bw,
            )
            self._lines[batch] = line
        return line
