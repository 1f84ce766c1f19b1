"""Generation cost models built from fitted profiles (the simulator's GenerationCost).

A kernel profile is composed for a model geometry and a TP degree:

    prefill(N, A) = o + L·[Σ_linear gemm(N, k, n) + attn_prefill(A)] + 2L·allreduce(N·h·2 B)
    decode(B, X)  = o + L·[Σ_linear gemm(B, k, n) + attn_decode(B, X)] + gemm(B, h, vocab/tp)
                      + 2L·allreduce(B·h·2 B)

with the linear layers QKV (h → (H+2H_kv)·d/tp), O (H·d/tp → h), gate+up (h → 2i/tp) and down
(i/tp → h). Decode attention is linear in the batch's cached tokens X for a given batch (its
occupancy term depends on B only), so ``decode_line`` is exact for the engine's closed form.
"""

from __future__ import annotations

from rollart.calibration.kernels import unsplit_key
from rollart.calibration.profiles import EngineProfile, KernelProfile, TrainProfile
from rollart.plan.schema import GpuType, ModelSpec
from rollart.sim.costs.gpu import DecodeLine, RooflineEfficiency, kv_capacity
from rollart.sim.costs.moe import model_experts_touched


class KernelProfileGeneration:
    def __init__(self, model: ModelSpec, gpu: GpuType, tp: int, profile: KernelProfile, origin: str):
        self.model, self.tp, self.profile = model, tp, profile
        self.kv_capacity_tokens = kv_capacity(model, gpu, tp, RooflineEfficiency())
        self._peak = profile.peak_tflops_bf16 * 1e12
        self._bw = profile.hbm_tbps * 1e12
        heads, kv = max(1, model.heads // tp), max(1, model.kv_heads // tp)
        self._heads, self._kv = heads, kv
        h, d, inter = model.hidden, model.head_dim, model.intermediate  # per expert for a MoE model
        self._shapes = [(float(h), float((heads + 2 * kv) * d)), (float(heads * d), float(h))]
        self._mlp_shapes = [(float(h), 2 * inter / tp), (inter / tp, float(h))]
        self._lm_head = [(float(h), model.vocab / tp)]
        self.source = (f"calibrated kernel profile {profile.gpu} ({origin}); prefill MAPE "
                       f"{profile.fit_error.prefill_mape_heldout:.1%}, decode MAPE "
                       f"{profile.fit_error.decode_mape_heldout:.1%} held-out")
        self._lines: dict[int, DecodeLine] = {}
        # decode attention of a head geometry measured without split-KV: below n_SM CTAs
        # (batch × KV heads) part of the GPU idles (kernels.decode_attention_time)
        d = profile.attn_decode.params
        self._decode_sms = d.get("n_sm", 0.0) if d.get(unsplit_key(heads, kv, model.head_dim)) else 0.0
        # BF16 GEMM: compute efficiencies and the GPU's weight-read (memory-system) efficiency e_mem,
        # as the profile derives them (profile.gemm.derived says how when not measured)
        self._gemm = dict(profile.gemm.params)

    def _gemms(self, m: int, shapes: list[tuple[float, float]]) -> float:
        """Σ gemm_time(m, k, n) — the same formula as ``kernels.gemm_time``, in plain floats
        because it runs once per simulated engine step."""
        p = self._gemm
        eff = p["e_max"] * m / (m + p["m_half"])
        total = 0.0
        for k, n in shapes:
            compute = 2 * m * k * n / (self._peak * eff)
            memory = 2 * (m * k + k * n + m * n) / (self._bw * p["e_mem"])
            total += p["t0"] + (compute if compute > memory else memory)
        return total

    def _mlp(self, m: int) -> float:
        """The MLP's gate+up and down GEMMs for ``m`` tokens. A MoE layer is one grouped GEMM
        over the E_t = E·(1 − (1 − k/E)^m) experts the tokens touch (``sim.costs.moe``): m·k
        token rows, m·k/E_t rows per expert (which sets the efficiency), and E_t experts'
        weights read — k experts for one token, all of them for a large batch."""
        if not self.model.moe_experts:
            return self._gemms(m, self._mlp_shapes)
        p = self._gemm
        touched = model_experts_touched(self.model, m)
        rows = m * max(1, self.model.moe_active_experts)
        per_expert = rows / touched
        eff = p["e_max"] * per_expert / (per_expert + p["m_half"])
        total = 0.0
        for k, n in self._mlp_shapes:
            compute = 2 * rows * k * n / (self._peak * eff)
            memory = 2 * (rows * k + touched * k * n + rows * n) / (self._bw * p["e_mem"])
            total += p["t0"] + (compute if compute > memory else memory)
        return total

    def _layer_gemms(self, m: int) -> float:
        """One layer's linear layers (QKV, O, MLP) for ``m`` tokens."""
        return self._gemms(m, self._shapes) + self._mlp(m)

    def _decode_slowdown(self, batch: int) -> float:
        """1 / occupancy of the decode-attention kernel for ``batch`` sequences."""
        return max(1.0, self._decode_sms / (max(1, batch) * self._kv))

    def _allreduce(self, tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        p = self.profile.allreduce.params
        nbytes = tokens * self.model.hidden * 2.0
        return 2 * self.model.layers * (p["alpha_s"] + 2 * (self.tp - 1) / self.tp * nbytes / (p["beta_gbps"] * 1e9 / 8))

    def prefill_time(self, new_tokens: int, attention_pairs: float) -> float:
        if new_tokens <= 0:
            return 0.0
        p = self.profile.attn_prefill.params
        # Efficiency depends on sequence length; the batch's new tokens stand in for it.
        eff = p["e_max"] * new_tokens / (new_tokens + p["s_half"])
        attn = p["t0"] + 4 * self._heads * self.model.head_dim * attention_pairs / (self._peak * eff)
        layers = self.model.layers * (self._layer_gemms(new_tokens) + attn)
        return self.profile.iteration_overhead_s + layers + self._gemms(1, self._lm_head) + self._allreduce(new_tokens)

    def mixed_step_time(self, new_tokens: int, attention_pairs: float, decode_batch: int,
                        decode_context: float) -> float:
        if new_tokens <= 0:
            return self.decode_line(decode_batch).total(decode_context, decode_batch, 1) if decode_batch else 0.0
        m, tokens = self.model, new_tokens + decode_batch
        p = self.profile.attn_prefill.params
        eff = p["e_max"] * new_tokens / (new_tokens + p["s_half"])
        attn = p["t0"] + 4 * self._heads * m.head_dim * attention_pairs / (self._peak * eff)
        if decode_batch:
            d = self.profile.attn_decode.params
            attn += d["t0"] + d["t_seq"] * decode_batch + decode_context * self._decode_slowdown(decode_batch) * max(
                4 * self._heads * m.head_dim / (self._peak * d["e_c"]),
                2 * self._kv * m.head_dim * 2 / (self._bw * d["e_bw"]))
        return (self.profile.iteration_overhead_s + m.layers * (self._layer_gemms(tokens) + attn)
                + self._gemms(max(1, decode_batch), self._lm_head) + self._allreduce(tokens))

    def decode_line(self, batch: int) -> DecodeLine:
        line = self._lines.get(batch)
        if line is None:
            p = self.profile.attn_decode.params
            m = self.model
            slow = self._decode_slowdown(batch)  # fixed for the batch, so the line stays linear in x
            per_token_compute = 4 * self._heads * m.head_dim * slow / (self._peak * p["e_c"])
            per_token_memory = 2 * self._kv * m.head_dim * 2 * slow / (self._bw * p["e_bw"])
            fixed = self.profile.iteration_overhead_s + m.layers * (self._layer_gemms(batch) + p["t0"]
                                                                     + p["t_seq"] * batch) \
                + self._gemms(batch, self._lm_head) + self._allreduce(batch)
            # attention is compute- or bandwidth-bound per cached token: the larger slope wins
            line = DecodeLine(a=fixed, c0=0.0, c1=m.layers * per_token_compute, m0=0.0,
                              m1=m.layers * per_token_memory)
            self._lines[batch] = line
        return line


class EngineProfileGeneration:
    """prefill(N, A) = a + b·N + c·A;  decode(B, X) = a + b·B + c·X  (measured end to end)."""

    def __init__(self, model: ModelSpec, gpu: GpuType, tp: int, profile: EngineProfile, origin: str):
        if profile.model.lower() != model.name.lower():
            raise ValueError(f"engine profile {origin} was measured for {profile.model}, not {model.name}")
        self.profile = profile
        self.request_overhead_s = profile.request_overhead_s
        self.call_step_s = profile.call_step_s
        self.host_parallelism, self.side_by_side = profile.host_parallelism, profile.side_by_side
        self.effect_cpu_s = profile.effect_cpu_s
        self.kv_layout = profile.kv_layout
        self.kv_capacity_tokens = kv_capacity(model, gpu, tp, RooflineEfficiency())
        self.source = (f"calibrated engine profile {profile.gpu}/{profile.model} ({origin}); prefill MAPE "
                       f"{profile.fit_error.prefill_mape_heldout:.1%}, decode MAPE "
                       f"{profile.fit_error.decode_mape_heldout:.1%} held-out")
        self._lines: dict[int, DecodeLine] = {}

    def prefill_time(self, new_tokens: int, attention_pairs: float) -> float:
        if new_tokens <= 0:
            return 0.0
        p = self.profile.prefill.params
        return p["a"] + p["b"] * new_tokens + p["c"] * attention_pairs

    def mixed_step_time(self, new_tokens: int, attention_pairs: float, decode_batch: int,
                        decode_context: float) -> float:
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
