"""Generation cost models built from fitted profiles (the simulator's GenerationCost).

A kernel profile is composed for a model geometry and a TP degree:

    prefill(N, A) = o + L·[Σ_linear gemm(N, k, n) + ew(N) + attn_prefill(A)] + 2L·allreduce(N·h·2 B)
    decode(B, X)  = o + L·[Σ_linear gemm(B, k, n) + ew(B) + attn_decode(B, X)] + gemm(B, h, vocab/tp)
                      + 2L·allreduce(B·h·2 B)

with the linear layers QKV (h → (H+2H_kv)·d/tp), O (H·d/tp → h), gate+up (h → 2i/tp) and down
(i/tp → h), and ew the element-wise kernels between them (norms, rotary, SiLU-and-mul: their HBM
traffic at the measured long-stream rate, ``_elementwise``). Decode attention is linear in the batch's cached tokens X for a given batch (its
occupancy term depends on B only), so ``decode_line`` is exact for the engine's closed form.
An all-reduce smaller than ``allreduce_custom.max_bytes`` (8 MiB in vLLM 0.8: a decode step's, a short
prefill's) runs the engine's own peer-to-peer kernel (``profile.allreduce_custom``, priced at most the NCCL
term), a larger one NCCL (``profile.allreduce``).

MoE expert layers use the GEMM terms with the profile's measured grouped ÷ dense departures
(``profiles.expert_gemm_params``: one launch over many small expert weights; the knee moves as time).

Dtypes (``model.weight_dtype`` / ``kv_dtype``): FP8 linear layers compose the profile's measured FP8
GEMM fit as fitted (its compute terms at the FP8 peak, 1 byte per weight at its own e_mem: what the
kernel measured, H20's pinned at the memory-system rate); lm_head and attention stay BF16; an FP8 KV cache reads 1 byte per
element in decode attention. Expert parallelism (``ep``): the worker's tp GPUs form ep ranks
(``sim.costs.moe``), each running attention and the dense layers TP over tp/ep GPUs for 1/ep of
the tokens, the MoE layer over its E/ep experts for the busiest rank's rows, plus the
dispatch/combine all-to-all.

DeepSeek-V3-class models (``ModelSpec``): the dense first layers' MLP (``dense_layers``, width
``dense_intermediate``) and a shared expert (``shared_expert_intermediate``) are dense GEMMs on a rank's
tokens; a layer's terms are the mean over the layers, so L·[...] still sums them. Multi-head latent
attention (MLA, ``kv_lora_rank`` > 0) replaces QKV and O by the fused down-projection q_a + kv_a (hidden →
q_lora_rank + kv_lora_rank + rope, whole on every GPU, as vLLM and SGLang run it), q_b, kv_b (kv_lora_rank →
H/tp·(d + v): prefill's up-projection; the absorbed decode applies the same weights to the query and the
output, the same multiply-adds) and O (H/tp·v → h). Prefill attention is the non-absorbed form, QKᵀ over
d + rope and PV over v per pair (``gpu.prefill_attention_flops``); decode attention the absorbed form over
the latent cache: per cached token and head 2·(2·kv_lora_rank + rope) FLOPs, and (kv_lora_rank + rope)
elements read once per GPU for all its heads (``gpu.decode_attention_flops``). ASSUMED: no MLA kernel is
measured, so the attention fits (e_c, e_bw, t0, t_seq; prefill's e(S)) fitted on GQA kernels
(FlashAttention/FlashInfer) price MLA's FLOPs and bytes as they are, except decode attention's compute and
BF16-KV byte efficiencies on a GPU with FP8 tensor cores (Hopper-class), which are FlashMLA's published H800
shares of peak and HBM (:mod:`rollart.calibration.mla_decode`).
"""

from __future__ import annotations

from rollart.calibration.kernels import (BF16_BYTES, CUSTOM_ALLREDUCE_MAX_BYTES, CUSTOM_ALLREDUCE_WORLD_SIZES,
                                         FP8_BYTES, M_TILE, unsplit_key)
from rollart.calibration.links import inter_node_link, rdma_between_nodes
from rollart.calibration.mla_decode import flashmla_efficiency, flashmla_row_use
from rollart.calibration.profiles import (EngineProfile, KernelProfile, TrainProfile, expert_gemm_params,
                                          stream_efficiency)
from rollart.calibration.sustained import compute_share
from rollart.plan.presets import canonical_gpu, with_article
from rollart.plan.schema import GpuType, Link, ModelSpec
from rollart.sim.costs.gpu import (DecodeLine, EnvelopeLine, RooflineEfficiency, decode_attention_flops, kv_capacity,
                                   kv_heads_per_gpu, prefill_attention_flops)
from rollart.sim.costs.moe import (busiest_rank_sequences, busiest_rank_share, rank_collectives_s, rank_expert_rows,
                                   rank_experts_touched, straddle_note)

_TOKEN_MEMO = 1 << 14  # entries of KernelProfileGeneration._token_terms' memo (≈ 2.5 MB at most)


class KernelProfileGeneration:
    def __init__(self, model: ModelSpec, gpu: GpuType, tp: int, profile: KernelProfile, origin: str,
                 ep: int = 1, network: Link | None = None, memory_utilization: float = 0.90,
                 domain: int | None = None, fp8_compute: bool = True, step_overhead_s: float | None = None):
        self.model, self.tp, self.ep, self.profile = model, tp, ep, profile
        # the engine's fixed cost a step (scheduling, sampling, launches the CUDA graph does not hide): the
        # profile's assumption unless the plan states its engine's (placement.generation[].step_overhead_ms)
        self.step_overhead_s = profile.iteration_overhead_s if step_overhead_s is None else step_overhead_s
        # GPUs on one NVLink; wider groups cross self._network. ``domain``: this worker's smallest piece
        # where it straddles a domain boundary (moe.worker_domain), else the GPU type's
        self._domain = gpu.nvlink_domain if domain is None else domain
        self.kv_capacity_tokens = kv_capacity(model, gpu, tp, RooflineEfficiency(memory_utilization=memory_utilization),
                                              ep)
        self._peak = profile.peak_tflops_bf16 * 1e12
        self._bw = profile.hbm_tbps * 1e12
        rank_tp = tp // ep  # GPUs per expert-parallel rank; attention and dense layers are TP over them
        self._rank_tp = rank_tp
        # ≥ 1 whole KV head; MLA's latent is one "head" all the query heads share, whole on every GPU
        heads, kv = max(1, model.heads // rank_tp), (1 if model.mla else kv_heads_per_gpu(model, rank_tp))
        self._heads, self._kv = heads, kv
        self._kv_elem = 1.0 if model.kv_dtype == "fp8" else 2.0
        h, d, inter = model.hidden, model.head_dim, model.intermediate  # per expert for a MoE model
        if model.mla:
            r, rope, ql, v = model.kv_lora_rank, model.qk_rope_head_dim, model.q_lora_rank, model.value_head_dim
            q_heads = float(heads * (d + rope))  # this GPU's query heads, nope and rope parts
            self._shapes = ([(float(h), float(ql + r + rope)), (float(ql), q_heads)] if ql  # q_a + kv_a, q_b
                            else [(float(h), q_heads + r + rope)])  # q and kv_a in one GEMM
            self._shapes += [(float(r), float(heads * (d + v))), (float(heads * v), float(h))]  # kv_b, o
        else:
            self._shapes = [(float(h), float((heads + 2 * kv) * d)), (float(heads * d), float(h))]
        self._mlp_shapes = [(float(h), 2 * inter / rank_tp), (inter / rank_tp, float(h))]
        # DeepSeek-V3-class layers: a shared expert in every MoE layer and dense MLPs in the first
        # layers, dense GEMMs on a rank's tokens; each layer's terms then average over the layers
        self._mixed_layers = bool(model.dense_layers or model.shared_expert_intermediate)
        shared, dense = model.shared_expert_intermediate, model.dense_mlp_width
        self._shared_shapes = ([(float(h), 2 * shared / rank_tp), (shared / rank_tp, float(h))] if shared else [])
        self._dense_shapes = ([(float(h), 2 * dense / rank_tp), (dense / rank_tp, float(h))]
                              if model.dense_layers else [])
        # attention FLOPs per (query, key) pair in prefill and per cached token in decode, this GPU's
        # heads; KV bytes a GPU reads per cached token (MLA: the whole latent, once for all its heads)
        self._prefill_pair_flops = heads * prefill_attention_flops(model) // model.heads if model.mla \
            else 4 * heads * d
        self._decode_token_flops = heads * decode_attention_flops(model) // model.heads if model.mla \
            else 4 * heads * d
        self._decode_token_bytes = (model.kv_elements_per_token_layer * self._kv_elem if model.mla
                                    else 2 * kv * d * self._kv_elem)
        self._lm_head = [(float(h), model.vocab / rank_tp)]
        self._lines: dict[int, DecodeLine] = {}
        self._mixed_batch: dict[int, tuple[float, float, float]] = {}
        self._per_tokens: dict[float, tuple[float, float]] = {}  # _token_terms' memo
        # decode attention of a head geometry measured without split-KV: below n_SM CTAs
        # (batch × KV heads) part of the GPU idles (kernels.decode_attention_time)
        d = dict(profile.attn_decode.params)
        if model.kv_dtype == "fp8":  # the FP8-KV kernel's own t0 and byte rate (dequantisation on the SMs)
            d.update(profile.attn_decode_fp8_kv.params if profile.attn_decode_fp8_kv else {})
        # what the GPU sustains of Hopper's share of peak (Blackwell < 1): the profile's own, or for a transferred
        # one its reference's (calibration.sustained); the build folds it into the fitted terms
        self._compute_share = compute_share(canonical_gpu(profile.transferred_from or profile.gpu) or "")[0]
        self._flashmla = model.mla and profile.fp8_tensor_cores  # FP8 tensor cores: the engines run FlashMLA
        if self._flashmla:  # its published fractions of peak and HBM (calibration.mla_decode)
            e_c, e_bw, _ = flashmla_efficiency()
            # a GPU's heads fill its 64-row query tile or pad it; a GPU that sustains less of its peak than
            # Hopper (Blackwell: calibration.sustained) reaches that share of FlashMLA's too
            d["e_c"] = e_c * flashmla_row_use(heads) * self._compute_share
            if model.kv_dtype != "fp8":
                d["e_bw"] = e_bw
        self._attn_decode = d
        self._decode_sms = (d.get("n_sm", 0.0) if not model.mla and d.get(unsplit_key(heads, kv, model.head_dim))
                            else 0.0)  # MLA kernels split the KV (FlashMLA): no occupancy term
        # BF16 GEMMs (lm_head always): compute efficiencies and the GPU's weight-read (memory-system)
        # efficiency e_mem, as the profile derives them (profile.gemm.derived says how)
        self._bf16 = (dict(profile.gemm.params), self._peak, BF16_BYTES)
        # FP8 linear layers: the measured FP8 GEMM fit as it was fitted (the composition is the fit), 1 byte
        # per weight. A profile without FP8 timings stores FP8 weights only (BF16 compute, 1-byte weight
        # reads at the BF16 GEMM's rate: weight-only quantisation).
        if model.weight_dtype == "bf16":
            self._linear, dtype = self._bf16, "BF16 weights"
        elif profile.gemm_fp8 is not None and profile.fp8_tensor_cores and fp8_compute:
            self._linear = (dict(profile.gemm_fp8.params), profile.peak_tflops_fp8 * 1e12, FP8_BYTES)
            dtype = "FP8 weights (FP8 GEMM compute)"
        else:  # ``fp8_compute`` False: the engine serves FP8 weights weight-only (W8A16) on FP8 tensor cores too
            self._linear = (dict(profile.gemm.params), self._peak, (2.0, 1.0, 2.0))
            dtype = ("FP8 weights (no FP8 tensor cores: BF16 compute)" if not profile.fp8_tensor_cores
                     else "FP8 weights (no FP8 timings: BF16 compute)" if profile.gemm_fp8 is None
                     else "FP8 weights served weight-only (BF16 compute)")
        # MoE expert layers: the linear layers' terms times the measured grouped ÷ dense GEMM factors
        # (one grouped launch over many small expert weights); e_max and e_mem stay ≤ 1
        self._experts = self._linear
        if model.moe_experts:
            base, peak_, nbytes = self._linear
            grouped = expert_gemm_params(profile, base, peak_)
            self._experts = ({**base, **grouped}, peak_, nbytes) if grouped is not None else self._linear
        p = profile.allreduce.params
        self._nvlink = (p["beta_gbps"] * 1e9 / 8, p["alpha_s"])
        # (alpha_s, bytes/s, max bytes) of the engine's own kernel for small tensor-parallel
        # all-reduces, where the profile has it and the rank's TP size is one it runs at
        c = profile.allreduce_custom
        self._ar_custom = ((c.params["alpha_s"], c.params["beta_gbps"] * 1e9 / 8,
                            c.params.get("max_bytes", CUSTOM_ALLREDUCE_MAX_BYTES))
                           if c is not None and rank_tp in CUSTOM_ALLREDUCE_WORLD_SIZES else None)
        self._network = inter_node_link(network)
        self._rdma = rdma_between_nodes(network)  # DeepEP's kernels across nodes need RDMA
        # element-wise kernels: bytes per token (attention side, per rank) and per expert row (MLP);
        # activations are quantised only where the linear layers compute in FP8
        i_rank, fp8 = inter / rank_tp, self._linear[2] == FP8_BYTES
        hd = model.head_dim
        if model.mla:  # norms of the two latents, rotary on q's and the shared k's rope part, the latent cached
            per_token = (2.0 * (8 * h + 2 * (ql + r) + 2 * (heads + 1) * rope) + (2.0 + self._kv_elem) * (r + rope)
                         + (3.0 * (2 * h + ql + r + heads * v) if fp8 else 0.0))
        else:
            per_token = (2.0 * (8 * h + 2 * (heads + kv) * hd) + (2.0 + self._kv_elem) * 2 * kv * hd
                         + (3.0 * (2 * h + heads * hd) if fp8 else 0.0))
        per_row = 2.0 * 3 * i_rank + (3.0 * i_rank if fp8 else 0.0)
        if self._mixed_layers:  # per token, averaged over the layers: MoE layers' sum and shared expert, dense MLPs
            f_moe, f_dense = model.moe_layers / model.layers, model.dense_layers / model.layers
            s_rank, dense_rank = shared / rank_tp, dense / rank_tp
            moe_token = 2.0 * (max(1, model.moe_active_experts) + 1 + (1 if shared else 0)) * h \
                + (2.0 * 3 * s_rank + (3.0 * s_rank if fp8 else 0.0))
            per_token += f_moe * moe_token + f_dense * (2.0 * 3 * dense_rank + (3.0 * dense_rank if fp8 else 0.0))
            per_row *= f_moe
        elif model.moe_experts:
            per_token += 2.0 * (max(1, model.moe_active_experts) + 1) * h
        self._ew_bytes = (per_token, per_row)
        self._ew_rate = self._bw * stream_efficiency(profile)
        mla = (" (MLA latent; decode attention at FlashMLA's published H800 share of peak"
               + (", the FP8-KV fit's byte rate)" if model.kv_dtype == "fp8" else " and HBM)")
               if self._flashmla else " (MLA latent; GQA-fitted attention kernels)")
        kind = (f"{dtype}, {model.kv_dtype.upper()} KV" + (mla if model.mla else "") + (f", ep {ep}" if ep > 1 else ""))
        ref = profile.transferred_from  # a GPU type without a profile (profiles.transferred_profile)
        borrowed = all(c.derived for _, c in profile.terms())  # nothing measured on this GPU (H200)
        self.source = ((f"{ref} kernel profile on the custom {profile.gpu} datasheet ({profile.hbm_tbps:g} TB/s, "
                        f"{profile.peak_tflops_bf16:g} TFLOP/s: the shipped {ref}'s fitted efficiencies); {kind}"
                        if ref and ref.lower() == profile.gpu.lower() else
                        f"{ref} kernel profile on the {profile.gpu} datasheet (no {profile.gpu} timings: {ref}'s "
                        f"fitted efficiencies); {kind}") if ref else
                       f"calibrated kernel profile {profile.gpu} ({origin}); {kind}; prefill MAPE "
                       f"{profile.fit_error.prefill_mape_heldout:.1%}, decode MAPE "
                       f"{profile.fit_error.decode_mape_heldout:.1%} held-out"
                       + (f" on other GPUs' timings: no term measured on {with_article(profile.gpu)}, their fitted "
                          "efficiencies applied to its datasheet" if borrowed else "")
                       + (f", compute at {self._compute_share:g} of them (what {profile.gpu} is measured to sustain "
                          "of its peak, calibration/sustained.py)" if self._compute_share < 1.0 else ""))
        if step_overhead_s is not None:
            self.source += f"; engine step overhead {step_overhead_s * 1e3:g} ms (the plan's, for the assumed " \
                           f"{profile.iteration_overhead_s * 1e3:g})"
        self.source += straddle_note(tp, gpu.nvlink_domain, self._domain)

    def _gemms(self, m: float, shapes: list[tuple[float, float]], kind: tuple | None = None) -> float:
        """Σ gemm_time(m, k, n) — the same formula as ``kernels.gemm_time`` (a 64-row tile at least)."""
        p, peak, (ba, bw_, bo) = kind or self._linear
        tiles = max(m + p["m_half"], M_TILE) / (peak * p["e_max"])
        total = 0.0
        for k, n in shapes:
            compute = 2 * tiles * k * n
            memory = (ba * m * k + bw_ * k * n + bo * m * n) / (self._bw * p["e_mem"])
            total += p["t0"] + (compute if compute > memory else memory)
        return total

    def _mlp(self, m: float) -> float:
        """The MLP's gate+up and down GEMMs for ``m`` tokens (all the worker's tokens for a MoE
        layer, a rank's share for a dense one). A MoE layer is one grouped GEMM over the experts
        the busiest rank's tokens touch (``sim.costs.moe``; all ranks when ep = 1): its token-expert
        rows, rows per expert (which sets the efficiency), and those experts' weights read — k
        experts for one token, all of the rank's for a large batch — at the grouped-GEMM terms
        (``profiles.expert_gemm_params``), the formula of ``kernels.grouped_gemm_time``."""
        if not self.model.moe_experts:
            return self._gemms(m, self._mlp_shapes)
        p, peak, (ba, bw_, bo) = self._experts
        touched = rank_experts_touched(self.model, m, self.ep)
        rows = rank_expert_rows(self.model, m, self.ep)
        per_expert = rows / touched
        tiles = touched * max(per_expert + p["m_half"], M_TILE) / (peak * p["e_max"])  # each expert's own tiles
        total = 0.0
        for k, n in self._mlp_shapes:
            compute = 2 * tiles * k * n
            memory = (ba * rows * k + bw_ * touched * k * n + bo * rows * n) / (self._bw * p["e_mem"])
            total += p["t0"] + (compute if compute > memory else memory)
        return total

    def _elementwise(self, m: float) -> float:
        """One layer's element-wise kernels for a step over ``m`` tokens of the worker: HBM traffic
        only, at the GPU's measured long-stream rate (``profile.stream``). Per token of a rank, in BF16
        activations: the two fused residual-add RMSNorms (read x and the residual, write both: 4h
        each), rotary embedding in place on q and k (read and write (H_q + H_kv)·d), the new k and v
        written into the KV cache (read 2·H_kv·d, write them in the cache's dtype), SiLU-and-mul
        (read gate and up, write their product: 3·i per expert row), for a MoE layer the sum of each
        token's k expert outputs ((k + 1)·h); with FP8 linear layers, each layer's input quantised
        (read 2 bytes, write 1 per element of h, H_q·d, h and i). Qwen3's per-head q/k RMSNorm is
        not counted (the spec has no field for it)."""
        per = self._ew_bytes
        rows = rank_expert_rows(self.model, m, self.ep) if self.model.moe_experts else m / self.ep
        return (m / self.ep * per[0] + rows * per[1]) / self._ew_rate

    def _rank_gemms(self, m: float) -> float:
        """One layer's dense linear layers a rank runs on its ``m`` tokens: QKV and O (MLA's projections),
        and, averaged over the layers, a shared expert in the MoE layers and the dense first layers' MLP."""
        t = self._gemms(m, self._shapes)
        if self._mixed_layers:
            mdl = self.model
            t += (mdl.moe_layers * self._gemms(m, self._shared_shapes)
                  + mdl.dense_layers * self._gemms(m, self._dense_shapes)) / mdl.layers
        return t

    def _layer_gemms(self, m: float) -> float:
        """One layer's linear layers for a step over ``m`` tokens of the worker: QKV and O on a
        rank's share (m/ep), the MLP as :meth:`_mlp` (the routed experts in the MoE layers only)."""
        mlp = self._mlp(m if self.model.moe_experts else m / self.ep)
        if self._mixed_layers:
            mlp *= self.model.moe_layers / self.model.layers
        return self._rank_gemms(m / self.ep) + mlp

    def _layer_tokens(self, m: float) -> float:
        """One layer's work that scales with a step's ``m`` tokens: linear layers, element-wise kernels."""
        return self._layer_gemms(m) + self._elementwise(m)

    def _decode_slowdown(self, batch: float) -> float:
        """1 / occupancy of the decode-attention kernel for ``batch`` sequences on a rank."""
        return max(1.0, self._decode_sms / (max(1.0, batch) * self._kv))

    def _allreduce(self, tokens: float, rank_tokens: float | None = None, kernel: str = "low_latency") -> float:
        """The two all-reduces per layer inside a rank, plus the MoE all-to-alls between ranks
        (:func:`~rollart.sim.costs.moe.rank_collectives_s`), with the engine's custom all-reduce kernel
        where its world size has one."""
        return rank_collectives_s(self.model, tokens, self.ep, self.tp, self._nvlink, self._network, self._domain,
                                  self._rdma, kernel, rank_tokens, self._ar_custom)

    def _prefill_attention(self, new_tokens: float, attention_pairs: float) -> float:
        """One layer's prefill attention for ``new_tokens`` (a rank's) attending ``attention_pairs``
        (query, key) pairs in all. The kernel's efficiency rises with the length of each query
        block's loop over the keys: the fit's curve e(S) = e_max·S/(S+s_half) was measured on causal
        prefills of S tokens, whose mean loop is S/2 keys, so a step is read at S = 2·pairs/tokens —
        S itself for a fresh prefill, 2·cached + new for a turn appended to a cached conversation
        (120 new tokens on a 20K prefix loop over ~20K keys, like a 40K prefill, not a 120-token one)."""
        p = self.profile.attn_prefill.params
        if new_tokens <= 0 or attention_pairs <= 0:
            return p["t0"]
        loop = 2.0 * attention_pairs / (new_tokens * self.ep)
        eff = p["e_max"] * loop / (loop + p["s_half"])
        return p["t0"] + self._prefill_pair_flops * attention_pairs / self.ep / (self._peak * eff)

    def _per_cached_token(self, batch: float) -> tuple[float, float]:
        """Decode-attention seconds per cached token of the worker, (compute, memory), one layer:
        the busiest rank holds ⌈batch/ep⌉ whole sequences, that share of the batch's context (1/ep
        when ep divides the batch; all of it for one sequence)."""
        d = self._attn_decode
        seqs = busiest_rank_sequences(batch, self.ep)
        slow = self._decode_slowdown(seqs) * (seqs / batch if batch > 0 else 1.0 / self.ep)
        return (self._decode_token_flops * slow / (self._peak * d["e_c"]),
                self._decode_token_bytes * slow / (self._bw * d["e_bw"]))

    def _rank_extra(self, extra: float, rank_tokens: float) -> float:
        """One layer's attention-side linear layers (QKV, O) and element-wise kernels for ``extra``
        tokens the busiest rank prefills beyond its even share ``rank_tokens``."""
        return (self._rank_gemms(rank_tokens + extra) - self._rank_gemms(rank_tokens)
                + extra * self._ew_bytes[0] / self._ew_rate)

    def prefill_time(self, new_tokens: int, attention_pairs: float, sequences: int = 0) -> float:
        if new_tokens <= 0:
            return 0.0
        f = busiest_rank_share(sequences, self.ep)  # a prompt prefills on one rank
        attn = self._prefill_attention(new_tokens / self.ep * f, attention_pairs * f)
        gemms, allreduce = self._token_terms(new_tokens)
        if f > 1.0:  # the busiest rank prefills, and sends to the experts, more than an even share
            gemms += self._rank_extra(new_tokens * (f - 1) / self.ep, new_tokens / self.ep)
            allreduce = self._allreduce(new_tokens, new_tokens * f / self.ep, "normal")
        layers = self.model.layers * (gemms + attn)
        return (self.step_overhead_s + layers + self._gemms(1, self._lm_head, self._bf16)
                + allreduce)

    def mixed_step_time(self, new_tokens: int, attention_pairs: float, decode_batch: int,
                        decode_context: float, sequences: int = 0) -> float:
        if new_tokens <= 0:
            return self.decode_line(decode_batch).total(decode_context, decode_batch, 1) if decode_batch else 0.0
        tokens = new_tokens + decode_batch
        f = busiest_rank_share(sequences, self.ep)  # a prompt prefills on one rank
        attn = self._prefill_attention(new_tokens / self.ep * f, attention_pairs * f)
        if f > 1.0:  # the busiest rank prefills more than its even share of the new prompts
            attn += self._rank_extra(new_tokens * (f - 1) / self.ep, tokens / self.ep)
        # The terms that depend only on the decode batch, and those that depend only on the step's
        # token count, are memoised (an engine prices one mixed step per admission); each is the
        # same expression as before, summed in the same order, so every step time is bit-for-bit
        # what the unmemoised formula gives.
        per_batch = self._mixed_batch.get(decode_batch)
        if per_batch is None:
            per_batch = self._mixed_batch[decode_batch] = self._mixed_batch_terms(decode_batch)
        fixed, per_context, lm_head = per_batch
        if decode_batch:
            attn += fixed + decode_context * per_context
        gemms, allreduce = self._token_terms(tokens)
        if self.ep > 1:  # the busiest rank's prompts and decoding sequences, not an even share
            allreduce = self._allreduce(tokens, new_tokens * f / self.ep + busiest_rank_sequences(decode_batch, self.ep),
                                        "normal")
        return (self.step_overhead_s + self.model.layers * (gemms + attn) + lm_head + allreduce)

    def _token_terms(self, tokens: float) -> tuple[float, float]:
        """(one layer's linear layers and element-wise kernels, the step's all-reduces and all-to-alls) for a step over
        ``tokens`` tokens, memoised: a step's token count is a new prefill plus the decode batch,
        and the same counts recur all run long (a paper-scale run prices ~28 k mixed steps a
        training step over ~1,600 counts after the first step, ~220 new ones each step after). The
        memo is emptied past ``_TOKEN_MEMO`` entries, so it stays bounded whatever the run's length."""
        terms = self._per_tokens.get(tokens)
        if terms is None:
            if len(self._per_tokens) >= _TOKEN_MEMO:
                self._per_tokens.clear()
            terms = self._per_tokens[tokens] = (self._layer_tokens(tokens), self._allreduce(tokens, kernel="normal"))
        return terms

    def _mixed_batch_terms(self, decode_batch: int) -> tuple[float, float, float]:
        """(decode attention's fixed time, its seconds per cached token, the lm_head GEMM) for a
        mixed step whose decode batch is ``decode_batch``."""
        d = self._attn_decode
        seqs = busiest_rank_sequences(decode_batch, self.ep)
        fixed = d["t0"] + d["t_seq"] * seqs
        per_context = max(*self._per_cached_token(decode_batch)) if decode_batch else 0.0
        return fixed, per_context, self._gemms(max(1.0, seqs), self._lm_head, self._bf16)

    def decode_line(self, batch: int) -> DecodeLine:
        line = self._lines.get(batch)
        if line is None:
            p = self._attn_decode
            m = self.model
            # fixed for the batch (its occupancy term), so the line stays linear in x
            per_token_compute, per_token_memory = self._per_cached_token(batch)
            seqs = busiest_rank_sequences(batch, self.ep)
            fixed = self.step_overhead_s + m.layers * (self._layer_tokens(batch) + p["t0"]
                                                                     + p["t_seq"] * seqs) \
                + self._gemms(seqs, self._lm_head, self._bf16) + self._allreduce(batch, seqs)
            # attention is compute- or bandwidth-bound per cached token: the larger slope wins
            line = DecodeLine(a=fixed, c0=0.0, c1=m.layers * per_token_compute, m0=0.0,
                              m1=m.layers * per_token_memory)
            self._lines[batch] = line
        return line


class BoundedGeneration(KernelProfileGeneration):
    """A transferred composition held between the presets that bound its datasheet
    (:func:`rollart.calibration.custom_generation_cost`): a prefill or mixed step costs the greatest of its
    own and the ceilings' times, lowered to the least of the floors'; so does a decode iteration at every
    context (:class:`~rollart.sim.costs.gpu.EnvelopeLine`): at most every floor's, and at least every
    ceiling's where that does not break a floor."""

    def __init__(self, *args, floors: list[tuple[str, object]], ceilings: list[object] = (),  # noqa: ANN002
                 **kwargs) -> None:  # noqa: ANN003
        super().__init__(*args, **kwargs)
        self._floors = [cost for _, cost in floors]
        self._ceilings = list(ceilings)
        self._bounded_lines: dict[int, EnvelopeLine] = {}
        if floors:
            self.source += ("; each step at most its price on the measured "
                            + ", ".join(name for name, _ in floors) + " (every timing figure matched or beaten)")
        if self._ceilings:
            self.source += "; and at least on the presets that beat it in every figure"

    def _bounded(self, own: float, step) -> float:  # noqa: ANN001
        high = max([own, *(step(c) for c in self._ceilings)])
        return min([high, *(step(f) for f in self._floors)])

    def prefill_time(self, new_tokens: int, attention_pairs: float, sequences: int = 0) -> float:
        return self._bounded(super().prefill_time(new_tokens, attention_pairs, sequences),
                             lambda c: c.prefill_time(new_tokens, attention_pairs, sequences))

    def mixed_step_time(self, new_tokens: int, attention_pairs: float, decode_batch: int,
                        decode_context: float, sequences: int = 0) -> float:
        return self._bounded(super().mixed_step_time(new_tokens, attention_pairs, decode_batch, decode_context,
                                                     sequences),
                             lambda c: c.mixed_step_time(new_tokens, attention_pairs, decode_batch, decode_context,
                                                         sequences))

    def decode_line(self, batch: int) -> EnvelopeLine:
        line = self._bounded_lines.get(batch)
        if line is None:
            high = [super().decode_line(batch), *(c.decode_line(batch) for c in self._ceilings)]
            line = self._bounded_lines[batch] = EnvelopeLine.between(high, [f.decode_line(batch)
                                                                             for f in self._floors])
        return line


class EngineProfileGeneration:
    """prefill(N, A) = a + b·N + c·A;  decode(B, X) = a + b·B + c·X  (measured end to end)."""

    def __init__(self, model: ModelSpec, gpu: GpuType, tp: int, profile: EngineProfile, origin: str,
                 memory_utilization: float = 0.90, ep: int = 1):
        if profile.model.lower() != model.name.lower():
            raise ValueError(f"engine profile {origin} was measured for {profile.model}, not {model.name}")
        self.profile = profile
        self.request_overhead_s = profile.request_overhead_s
        self.call_step_s = profile.call_step_s
        self.host_parallelism, self.side_by_side = profile.host_parallelism, profile.side_by_side
        self.effect_cpu_s = profile.effect_cpu_s
        self.kv_layout = profile.kv_layout
        # the KV room of the worker as placed (ep: each rank holds the non-expert weights), as the kernel model's
        self.kv_capacity_tokens = kv_capacity(model, gpu, tp, RooflineEfficiency(memory_utilization=memory_utilization),
                                              ep)
        self.source = (f"calibrated engine profile {profile.gpu}/{profile.model} ({origin}); prefill MAPE "
                       f"{profile.fit_error.prefill_mape_heldout:.1%}, decode MAPE "
                       f"{profile.fit_error.decode_mape_heldout:.1%} held-out")
        self._lines: dict[int, DecodeLine] = {}

    def prefill_time(self, new_tokens: int, attention_pairs: float, sequences: int = 0) -> float:
        if new_tokens <= 0:
            return 0.0
        p = self.profile.prefill.params
        return p["a"] + p["b"] * new_tokens + p["c"] * attention_pairs

    def mixed_step_time(self, new_tokens: int, attention_pairs: float, decode_batch: int,
                        decode_context: float, sequences: int = 0) -> float:
        d = self.profile.decode.params
        decode = d["b"] * decode_batch + d["c"] * decode_context if decode_batch else 0.0
        if new_tokens <= 0:
            return d["a"] + decode if decode_batch else 0.0
        if decode_batch and self.profile.mixed_step == "both_fixed_costs":
            decode += d["a"]  # prefill and decode run as separate forwards
        return self.prefill_time(new_tokens, attention_pairs) + decode

    def decode_line(self, batch: int) -> DecodeLine:
        line = self._lines.get(batch)
        if line is None:
            p = self.profile.decode.params
            line = self._lines[batch] = DecodeLine(a=p["a"] + p["b"] * batch, c0=0.0, c1=0.0, m0=0.0, m1=p["c"])
        return line


class ProfiledTrainCost:
    """step = a + b·T + c·Σ s² (measured), T the batch's tokens, s each sequence's length;
    the weight hand-off times are the measured ones."""

    def __init__(self, model: ModelSpec, profile: TrainProfile, origin: str):
        if profile.model.lower() != model.name.lower():
            raise ValueError(f"placement.trainer.profile: {origin} was measured for {profile.model}, not {model.name}")
        self.profile = profile
        fit = profile.step
        self.source = (f"measured train profile {profile.gpu}/{profile.model} ({origin}); step MAPE "
                       f"{(fit.mape_heldout or 0):.1%} held-out")

    def step_time(self, seq_lens: list[int]) -> float:
        p = self.profile.step.params
        return p["a"] + p["b"] * sum(seq_lens) + p["c"] * sum(s * s for s in seq_lens)


def compare_gpus(models: tuple[str, ...] = ("Qwen3-8B", "Qwen3-14B", "Qwen3-32B"), gpus: tuple[str, ...] = ("H800", "H20"),
                 batches: tuple[int, ...] = (1, 16, 64, 256), prefill: tuple[int, ...] = (1024, 4096),
                 context: int = 2048, weight_dtype: str = "bf16") -> list[tuple[str, str, int, dict[str, float]]]:
    """Per-GPU (tp = 1) step times in seconds from the shipped profiles: one decode iteration of a
    batch whose sequences hold ``context`` cached tokens each, one prefill of N new tokens."""
    from rollart.calibration import generation_cost
    from rollart.plan.presets import GPU_PRESETS

    rows = []
    for name in models:
        m = ModelSpec.model_validate({"preset": name, "weight_dtype": weight_dtype})
        costs = {g: generation_cost(m, g, GpuType(**GPU_PRESETS[g]), 1) for g in gpus}
        for b in batches:
            rows.append((name, "decode", b, {g: c.decode_line(b).total(b * context, b, 1) for g, c in costs.items()}))
        for n in prefill:
            rows.append((name, "prefill", n, {g: c.prefill_time(n, n * n / 2) for g, c in costs.items()}))
    return rows


if __name__ == "__main__":  # python -m rollart.calibration.cost [bf16|fp8]: the H20 vs H800 table
    import sys

    dtype = sys.argv[1] if len(sys.argv) > 1 else "bf16"
    print(f"{dtype} weights, tp 1; decode: one iteration, 2048 cached tokens per sequence; prefill: one sequence; ms")
    print(f"{'model':10} {'phase':8} {'B/N':>6} {'H800':>9} {'H20':>9} {'H20/H800':>9}")
    for name, phase, size, t in compare_gpus(weight_dtype=dtype):
        print(f"{name:10} {phase:8} {size:>6} {t['H800'] * 1e3:9.2f} {t['H20'] * 1e3:9.2f} {t['H20'] / t['H800']:9.2f}")
