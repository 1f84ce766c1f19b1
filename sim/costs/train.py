"""Training step time from FLOPs, MFU and parallelism."""

from __future__ import annotations

import heapq
import math

from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, ModelSpec, TrainerPlacement
from rollart.sim.costs.moe import (DEFAULT_NVLINK_DOMAIN, all_to_all_s, domain_name, effective_domain, expert_params,
                                  gpu_weight_bytes, input_embedding_params)

# GRPO step: forward + backward (6·P per token) plus two extra forwards for the
# old-policy and reference log-probs (2·2·P per token).
LINEAR_FLOPS_PER_PARAM_TOKEN = 10
ATTENTION_PASSES = 5  # forward ×1, backward ×2, two extra forwards
# Megatron tensor parallelism: each layer's attention and MLP blocks end in one all-reduce of the
# activations (tokens × hidden × 2 B; with sequence parallelism an all-gather + reduce-scatter pair of
# the same bytes), in the forward and again in the backward. Passes that run them: forward, backward,
# the forward again under full recompute (ROLL's Megatron configs: 64 of 73), and the two log-prob
# forwards. Not overlapped with compute (no ROLL config sets tp_comm_overlap).
TP_ALLREDUCES_PER_LAYER = 2
TP_COMM_PASSES = 5
# Data-parallel gradient synchronisation, once a step (ROLL's agentic configs size one optimizer step
# per rollout batch): Megatron's distributed optimizer reduce-scatters each GPU's gradients in fp32
# (ROLL's mcore_adapter sets accumulate_allreduce_grads_in_fp32 with bf16) and, after the optimizer
# step, all-gathers the updated bf16 weights. Not overlapped with compute: mcore_adapter defaults
# overlap_grad_reduce and overlap_param_gather to False, and no agentic example of ROLL sets them.
DP_GRAD_BYTES = 4
DP_PARAM_BYTES = 2
# Context parallelism (Megatron's default p2p ring, TransformerEngine's fused attention): each of a layer's
# attention calls passes the keys and values of a GPU's chunk of the sequence round the cp ranks in cp − 1
# steps, each overlapped with the attention over the chunk it holds. Calls a layer makes a step: the forward,
# its recompute, the backward and the two log-prob forwards; chunks each step moves: one in each forward, the
# backward its keys and values and their gradients (two).
CP_RING_CALLS = 5
CP_KV_CHUNKS = 6


def stage_layers(layers: int, pp: int) -> list[int]:
    """Layers of each of ``pp`` pipeline stages, first to last: as even as possible, the first
    ``layers % pp`` stages one more (Megatron's default split; 36 layers over 5 stages: 8, 7, 7, 7, 7)."""
    base, extra = divmod(layers, pp)
    return [base + (i < extra) for i in range(pp)]


# placement.trainer.mfu's default (0.16) is the one RL train step measured for us: fitted on H800 to the paper's
# §2 SWE step (training 23 % of 366 s: 128 GRPO sequences of ~20K tokens, Qwen3-8B on 32 H800;
# calibration/tasks/swe-fit.md), the GEMMs' share with the all-reduces, the gradient sync and the colocation
# switch priced beside it. Megatron pretraining reaches 0.35-0.45 of an H100; an agentic RL step (one sequence
# a micro-batch, log-prob passes, the framework between them) did not, and a default of pretraining's halved the
# train step of every plan that states none against the plans that use the fit. Left unset on a named GPU type
# it moves to that type by the GEMM rule, as one measured on an H800 would, so a GB200 trainer runs at the
# share Blackwell sustains (Megatron-Bridge: GB200 2.18 × an H100, not its datasheets' 2.53) and an H20 or
# A100 trainer at the share their GEMMs reach.
DEFAULT_MFU_MEASURED_ON = "H800"


def effective_mfu(trainer: TrainerPlacement, gpu: GpuType, gpu_name: str | None = None,
                  datasheet: bool = False) -> tuple[float, str]:
    """(the MFU the trainer's GPUs compute at, how it was found). ``placement.trainer.mfu`` is the
    trainer GPU's own unless ``mfu_measured_on`` names another type (left at its default, on a named GPU
    type, preset or custom, it is :data:`DEFAULT_MFU_MEASURED_ON`'s): then mfu × e_max(trainer GPU) /
    e_max(measured-on GPU), each the BF16 ``gemm`` fit's e_max of the kernel profile the type is priced
    with (:func:`~rollart.calibration.gemm_share.gemm_e_max`: H20 0.951, H800/H100/H200 0.772, A100
    0.725), capped at 1. A GPU of few FLOP/s per byte of HBM (H20) keeps its tensor cores busier, so the
    same model at the same parallelism reaches a larger share of its peak; the GEMMs' ratio is a lower
    bound of that (the non-GEMM kernels, memory-bound, are relatively cheaper there too). ``datasheet``: the
    pool is priced on its datasheet roofline (``profile: datasheet``), no GPU's kernel efficiencies carry over,
    so a default MFU stays as it is."""
    mfu, stated = trainer.mfu, "mfu" in trainer.model_fields_set
    default = f"(the default, fitted on {DEFAULT_MFU_MEASURED_ON} to the paper's SWE step)"
    own = f"MFU {mfu:.3g} " + ("(placement.trainer.mfu)" if stated else default)
    measured_on, measured_name = trainer.measured_on_gpu(), trainer.mfu_measured_on
    said = f"measured on {measured_name}"
    if measured_on is None:
        # a stated MFU is the trainer GPU's own. The default moves to every named type, a custom one too: its
        # GEMMs' share is its reference profile's, held between the presets it matches or beats and those that
        # beat it (gemm_e_max), so an H20 with more HBM no longer trains 23 % slower than the H20 it beats
        if stated or gpu_name is None or datasheet:
            return mfu, own
        measured_name = DEFAULT_MFU_MEASURED_ON
        measured_on, said = GpuType(**GPU_PRESETS[measured_name]), default
    elif measured_on == gpu and gpu_name in (None, measured_name):
        return mfu, f"MFU {mfu:.3g} {said} (placement.trainer.mfu)"
    from rollart.calibration.gemm_share import gemm_e_max

    here, here_gpu = gemm_e_max(gpu_name, gpu)
    there, _ = gemm_e_max(measured_name, measured_on)
    ratio = here / there
    if trainer.mfu_measured_on is None and ratio == 1.0:  # the default on a Hopper-class GPU: as it is
        return mfu, own
    used = min(1.0, mfu * ratio)
    capped = f", capped at {used:g}" if used < mfu * ratio else ""
    return used, (f"MFU {mfu:.3g} {said} × {ratio:.4g} ({gpu_name or here_gpu} ÷ "
                  f"{measured_name} GEMM e_max{capped}: {used:.3g})")


class TrainCost:
    """step = max_r [S_r + (pp − 1) · max_i t_r,i] + dp_sync + optimizer,
    S_r = dp · pp · max_k (10·P'_k·T_r + 5·2·L_k·H·d·Σ_r s²) / (gpus · peak · MFU) + comm_r

    S_r is the busiest stage's time over rank r's micro-batches, t_r,i its time for micro-batch i (the
    same terms over that micro-batch's tokens): the pipeline fills and drains for (pp − 1) micro-batch
    times, the longest's bounding them (with equal ones S_r / (1 − bubble_r), bubble_r = (pp − 1) / (m_r + pp − 1)).

    P'_k the parameters of pipeline stage k whose matmuls every token runs: its L_k layers' active
    parameters, and on the last stage the lm_head (vocab × hidden, a GEMM, present even with tied
    embeddings); the input embedding is a lookup, no FLOPs, as Megatron counts model FLOPs. Summed
    over the stages that is the active parameters less the input embedding. The stages take the
    layers as evenly as possible, the first ``L % pp`` one more (:func:`stage_layers`, Megatron's
    default), and a pipeline runs at its busiest stage's pace: each of a rank's tp·pp GPUs is priced
    at pp × the busiest stage's FLOPs over tp·pp (that stage's work on its tp GPUs). With Qwen's
    151,936-token vocabulary the last of Qwen3-8B's 4 stages does 1.21× the mean stage's work at 8K
    tokens. pp = 1: one stage, the whole model. With MLA the attention term's 2·H·d becomes
    H·(d + rope + v) (QKᵀ over d + rope, PV over v). Each of the dp = gpus / (tp·cp·pp) data-parallel
    ranks trains whole sequences (context parallelism splits each over the rank's cp GPU groups),
    handed out longest first to the least-loaded rank, so the step waits for the slowest rank r: T_r
    its tokens, s its sequences' lengths. A batch of fewer sequences than ranks leaves ranks idle
    instead of shrinking the step. A micro-batch holds whole
    sequences, by default one (``placement.trainer.micro_batches`` unset, as ROLL trains agentic
    sequences): rank r runs m_r = its sequences micro-batches; with ``micro_batches`` set, each holds
    ceil(sequences / micro_batches) and m_r = ceil(sequences / that). Its pipeline fills and drains
    for (pp − 1) × its longest micro-batch (:meth:`_rank_s`; with equal micro-batches the bubble
    (pp − 1) / (m_r + pp − 1) of the whole). The optimizer step streams fp32 Adam state (16 bytes per parameter,
    read and written) at HBM bandwidth, sharded over the GPUs. MFU: :func:`effective_mfu`.

    comm_r is the communication a GPU of rank r waits for, each pass (forward, backward, recompute,
    two log-prob forwards) over its stage's layers, each micro-batch paying its latency:

    * tp > 1, given ``allreduce`` = (α s, bus bytes/s, where) of the trainer GPUs' link, the
      tensor-parallel all-reduces of stage k's L_k layers: 5 · 2 · L_k · (m_r · α + T_r · hidden · 2 B ·
      2(tp − 1)/tp / β), a stage's communication beside its own compute (the pace is the stage whose
      sum is largest);
    * a MoE with ep > 1 (:func:`trainer_ep`), given ``all_to_all`` = the (α, β, where) of a group
      inside one NVLink domain and of one across domains, the expert-parallel dispatch + combine of
      every MoE layer: 5 · m_r · (stage k's share of the MoE layers) ·
      :func:`~rollart.sim.costs.moe.all_to_all_s` over a group of ep GPUs each sending its T_r / (m_r · tp · cp)
      tokens of a micro-batch (sequence parallel splits a rank's tokens over its tp GPUs) to their k experts' GPUs and back, NVLink within the GPU type's
      ``nvlink_domain`` (an HGX node of 8, an NVL72 rack of 72), the cluster's network across domains.
      The ep groups are consecutive GPUs over all the trainer's (a stage is a contiguous block, and ep
      divides it): where a group straddles a domain boundary (ep 16 on 144 GPUs of 72-GPU racks: GPUs
      64–79) the worst group's smallest piece sets the off-domain share
      (:func:`~rollart.sim.costs.moe.effective_domain`), and the step waits for that group;
    * cp > 1, given ``cp_link`` = (α s, bytes/s, where) of a ring of cp GPUs tp apart, the context-parallel
      ring steps of every layer beyond the attention they overlap (:meth:`_cp_sequence_s`); the tp all-reduces
      and ep all-to-alls above then carry a GPU's 1/cp of the rank's tokens.

    Once a step, dp·cp > 1: the data-parallel gradient reduce-scatter (fp32) and weight all-gather (bf16)
    of the GPU's shard, each group on its own ring: 2α + (4 + 2) B · shard · (d − 1)/d / β, the dense
    weights over tp·pp with d = gpus / (tp·pp) = dp·cp on ``dp_link`` = (α s, bus bytes/s, where) of a ring of
    d members tp GPUs apart, a MoE's experts over ep·pp with d = gpus / (ep·pp) on ``expert_dp_link``,
    a ring of members ep GPUs apart (default ``dp_link``); NVLink within a domain, the network across
    through each member's own port (:data:`DP_GRAD_BYTES`).

    MFU is the compute's alone: an MFU fitted to a measured step at some tp keeps that step's time
    only with the comm terms beside it. It is the GEMMs' rate: the causal attention FLOPs run at
    ``attention_efficiency`` × it (flash attention forward and backward reach a lower share of peak than
    the GEMMs), so a rank's compute takes (linear FLOPs + attention FLOPs / attention_efficiency) / (GPUs ×
    peak × MFU) (:meth:`_work`)."""

    def __init__(self, model: ModelSpec, gpu: GpuType, trainer: TrainerPlacement,
                 allreduce: tuple[float, float, str] | None = None,
                 all_to_all: tuple[tuple[float, float, str], tuple[float, float, str]] | None = None,
                 dp_link: tuple[float, float, str] | None = None, gpu_name: str | None = None,
                 expert_dp_link: tuple[float, float, str] | None = None,
                 cp_link: tuple[float, float, str] | None = None, datasheet: bool = False,
                 reference: bool = True):
        # gpu_name: the trainer pool's GPU type name (None: known by its timing numbers), for the MFU's transfer;
        # datasheet: the pool is priced on its datasheet roofline (effective_mfu); reference: the step runs the
        # frozen reference model's forward for a KL term (algorithm.reference_kl), one of the two extra forwards
        self.model, self.gpu, self.trainer = model, gpu, trainer
        m = model
        skip = 0 if reference else 1  # the reference forward's share of each pass count
        self._linear_flops = LINEAR_FLOPS_PER_PARAM_TOKEN - 2 * skip
        self._comm_passes = TP_COMM_PASSES - skip
        self._linear_per_token = self._linear_flops * (m.active_params - input_embedding_params(m))
        attention_per_layer_sq = (ATTENTION_PASSES - skip) * 2 * m.heads * m.head_dim
        if m.mla:  # training runs MLA non-absorbed: QKᵀ over head_dim + rope, PV over v_head_dim (s²/2 pairs)
            attention_per_layer_sq = (ATTENTION_PASSES - skip) * m.heads * (m.head_dim + m.qk_rope_head_dim
                                                                            + m.value_head_dim)
        self._attention_per_sq = attention_per_layer_sq * m.layers
        # Attention runs at attention_efficiency × the GEMMs' rate: its FLOPs weigh 1/efficiency in the time
        self._attention_weight = 1.0 / trainer.attention_efficiency
        self.stage_layers = stage_layers(m.layers, trainer.pp)
        # each stage's share of the model's MoE layers (the first dense_layers have none)
        first_moe = m.layers - m.moe_layers
        bounds = [sum(self.stage_layers[:k]) for k in range(trainer.pp + 1)]
        self._moe_share = [max(0, bounds[k + 1] - max(bounds[k], first_moe)) / max(1, m.moe_layers)
                           for k in range(trainer.pp)]
        # (linear FLOPs a token, attention FLOPs per s²) of each pipeline stage; pp 1: the whole model's
        self.stages = [(self._linear_per_token, self._attention_per_sq)]
        if trainer.pp > 1:
            # each layer's parameters a token's matmuls run (ModelSpec.active_params' split)
            per_layer, first = m.layer_params(max(1, m.moe_active_experts)), 0
            self.stages = []
            for n in self.stage_layers:
                self.stages.append((self._linear_flops * sum(per_layer[first:first + n]),
                                    attention_per_layer_sq * n))
                first += n
            linear, attention = self.stages[-1]  # the lm_head, a vocab × hidden GEMM, on the last stage
            self.stages[-1] = (linear + self._linear_flops * m.vocab * m.hidden, attention)
        cp = trainer.cp  # a rank's sequences are split over cp GPUs: each computes 1/cp of their tokens
        self.dp = trainer.dp
        self.mfu, mfu_source = effective_mfu(trainer, gpu, gpu_name, datasheet)
        self._peak = trainer.gpus * gpu.tflops_bf16 * 1e12 * self.mfu
        tp = trainer.tp
        # (seconds a micro-batch, seconds a rank token) of one layer's tensor-parallel all-reduces
        self._allreduce: tuple[float, float] | None = None
        self.source = f"FLOPs model, {mfu_source}; attention at {trainer.attention_efficiency:g} × the GEMMs' rate"
        if not reference:
            self.source += "; no reference-model forward (algorithm.reference_kl false)"
        if trainer.pp > 1 and max(self.stage_layers) > min(self.stage_layers):
            self.source += f"; pp {trainer.pp} stages of {', '.join(map(str, self.stage_layers))} layers"
        if tp > 1 and allreduce is not None:
            alpha, beta, where = allreduce
            calls = self._comm_passes * TP_ALLREDUCES_PER_LAYER  # a layer's
            # a tp group all-reduces the activations of its 1/cp of the rank's tokens
            self._allreduce = (calls * alpha, calls * m.hidden * 2.0 * 2 * (tp - 1) / tp / beta / cp)
            self.source += f"; tp {tp} all-reduces on {where}"
        # (seconds a sequence, seconds a sequence's token) of one ring step of a layer's context-parallel ring
        self._cp_ring: tuple[float, float] | None = None
        if cp > 1 and cp_link is not None:
            alpha, beta, where = cp_link
            self._cp_ring = ((CP_RING_CALLS - skip) * alpha,
                             (CP_KV_CHUNKS - skip) * ring_kv_bytes_per_token(m, tp) / cp / beta)
            self.source += f"; cp {cp} ring attention on {where}, each step beside the attention of the chunk held"
        domain = gpu.nvlink_domain
        self.ep = trainer_ep(m, trainer, domain)
        # the domain the ep groups' all-to-all sees: the worst group's smallest piece where one straddles
        self._a2a_domain = effective_domain(self.ep, trainer.gpus, domain)
        self._all_to_all: tuple[float, float, float, float] | None = None  # all_to_all_s's link arguments
        if self.ep > 1 and all_to_all is not None:
            (nv_alpha, nv_beta, nv_where), (net_alpha, net_beta, net_where) = all_to_all
            self._all_to_all = (nv_beta, nv_alpha, net_beta, net_alpha)
            where = nv_where if self.ep <= self._a2a_domain else f"{nv_where} and {net_where}"
            if self._a2a_domain < domain:
                where += (f" (ep groups over {trainer.gpus} GPUs straddle {domain_name(domain)}s: as few as "
                          f"{self._a2a_domain} of a group on one side)")
            self.source += f"; ep {self.ep} all-to-alls on {where}"
        self.dp_sync_s = 0.0  # the data-parallel gradient reduce-scatter and weight all-gather, once a step
        experts = expert_params(m)
        # replicas of each shard: the dense weights' over dp·cp (the context-parallel ranks hold the same weights
        # and reduce their gradients with the data-parallel ones), the experts' over gpus / (ep·pp)
        d_dense, d_expert = self.dp * cp, max(1, trainer.gpus // (self.ep * trainer.pp))
        expert_dp_link = expert_dp_link or dp_link
        per_byte = DP_GRAD_BYTES + DP_PARAM_BYTES
        if dp_link is not None and d_dense > 1:
            alpha, beta, where = dp_link
            moved = (m.params - experts) / (tp * trainer.pp) * (d_dense - 1) / d_dense
            self.dp_sync_s += 2 * alpha + per_byte * moved / beta
            group = f"dp·cp {d_dense}" if cp > 1 else f"dp {d_dense}"
            self.source += f"; {group} gradient sync on {where}"
        if expert_dp_link is not None and experts and d_expert > 1:  # its own group, after the dense one
            alpha, beta, where = expert_dp_link
            moved = experts / (self.ep * trainer.pp) * (d_expert - 1) / d_expert
            self.dp_sync_s += 2 * alpha + per_byte * moved / beta
            self.source += f"; experts' dp {d_expert} gradient sync on {where}"

    def _flops(self, s: int) -> float:
        return self._work(s, s * s, attention_weight=1.0)

    def _work(self, tokens: int, squares: int, attention_weight: float | None = None) -> float:
        """FLOPs at the GEMMs' rate that take as long as ``tokens`` tokens whose sequences' squared lengths
        sum to ``squares``: the attention FLOPs weighted by 1 / attention_efficiency (``attention_weight`` 1:
        the FLOPs themselves)."""
        w = self._attention_weight if attention_weight is None else attention_weight
        return self._linear_per_token * tokens + w * self._attention_per_sq * squares

    def _ranks(self, seq_lens: list[int]) -> list[tuple[float, int, int, int, int, float]]:
        """(work, tokens, sequences, Σ s², longest s, Σ ring exposure) of each data-parallel rank with
        work (work: :meth:`_work`; ring exposure: :meth:`_cp_sequence_s`, 0 without cp), sequences dealt
        longest first to the least-loaded rank (longest-processing-time packing: the busiest rank exceeds
        an even share by less than its last sequence's work); one sequence a rank when there are no more
        than ranks."""
        ring = self._cp_sequence_s if self._cp_ring is not None else (lambda s: 0.0)
        if len(seq_lens) <= self.dp:
            return [(self._work(s, s * s), s, 1, s * s, s, ring(s)) for s in seq_lens]
        ranks = [(0.0, 0, 0, 0, 0, 0.0)] * self.dp
        for s in sorted(seq_lens, reverse=True):
            work, tokens, seqs, squares, longest, exposed = ranks[0]
            heapq.heapreplace(ranks, (work + self._work(s, s * s), tokens + s, seqs + 1, squares + s * s,
                                      max(longest, s), exposed + ring(s)))
        return ranks

    def busiest_rank_flops(self, seq_lens: list[int]) -> float:
        """FLOPs of the data-parallel rank with the most work (all its stages together)."""
        busiest = max(self._ranks(seq_lens), default=None)
        return 0.0 if busiest is None else self._work(busiest[1], busiest[3], attention_weight=1.0)

    def stage_flops(self, tokens: int, squares: int, attention_weight: float = 1.0) -> list[float]:
        """FLOPs each pipeline stage runs for a rank of ``tokens`` tokens whose sequences' squared
        lengths sum to ``squares`` (with ``attention_weight``, the attention's weighted as in :meth:`_work`)."""
        return [linear * tokens + attention_weight * attention * squares for linear, attention in self.stages]

    def sequences_per_micro_batch(self, seqs: int) -> int:
        """Sequences one micro-batch of a rank of ``seqs`` sequences holds (:func:`sequences_per_micro_batch`)."""
        return sequences_per_micro_batch(self.trainer, seqs)

    def micro_batches(self, seqs: int) -> int:
        """Micro-batches a rank of ``seqs`` sequences runs, each of :meth:`sequences_per_micro_batch`
        whole sequences: ``seqs`` by default."""
        return max(1, math.ceil(seqs / self.sequences_per_micro_batch(seqs)))

    def bubble(self, micro_batches: int) -> float:
        """Share of a pipeline's time its stages idle filling and draining: (pp − 1) / (m + pp − 1)."""
        pp = self.trainer.pp
        return (pp - 1) / (micro_batches + pp - 1)

    def _stage_comm_s(self, tokens: int, micro_batches: int, exposed: float = 0.0) -> list[float]:
        """Seconds a GPU of each pipeline stage of a rank training ``tokens`` in ``micro_batches`` waits
        for its tensor-parallel all-reduces (its layers') and expert-parallel all-to-alls (its MoE
        layers' share of the model's), not overlapped with compute, and for ``exposed`` seconds a layer
        of context-parallel ring steps its attention does not hide (:meth:`_cp_sequence_s`, summed over
        its sequences)."""
        layers = self.stage_layers
        t = [0.0] * len(layers)
        if self._allreduce is not None:
            per_micro_batch, per_token = self._allreduce
            one_layer = micro_batches * per_micro_batch + tokens * per_token
            t = [n * one_layer for n in layers]
        if exposed:
            t = [a + n * exposed for a, n in zip(t, layers)]
        if self._all_to_all is not None:
            # all_to_all_s takes a whole group's tokens (a "worker" of ep GPUs in ep ranks): each GPU's
            # share of one micro-batch (sequence parallel splits the rank's over its tp GPUs, context
            # parallel over its cp) × ep
            gpu_tokens = tokens / (micro_batches * self.trainer.tp * self.trainer.cp)
            one = all_to_all_s(self.model, gpu_tokens * self.ep, self.ep, self.ep, *self._all_to_all,
                               domain=self._a2a_domain)
            whole = self._comm_passes * micro_batches * one
            t = [a + whole * share for a, share in zip(t, self._moe_share)]
        return t

    def _cp_sequence_s(self, s: int) -> float:
        """Seconds one layer's context-parallel ring steps add to a GPU for one sequence of ``s`` tokens:
        each of the cp − 1 steps moves a chunk's keys and values while the GPU computes the attention over
        the chunk it holds, a 1/cp of its attention, so a step costs max(0, c − a/cp) beyond the compute:
        (cp − 1) · max(0, c − a/cp), c the step's :data:`CP_RING_CALLS` latencies and :data:`CP_KV_CHUNKS`
        chunks at the ring's rate, a the layer's attention time for the sequence on the GPU. Each sequence
        hides its own ring behind its own attention (a micro-batch is one by default; packed ones pay each
        sequence's latencies): long ones hide it (attention grows with s², the chunk with s), short ones on a
        slow ring pay it, whatever else the rank trains."""
        cp = self.trainer.cp
        per_call, per_token = self._cp_ring
        attention = self._attention_weight * self._attention_per_sq * s * s / self.model.layers \
            / (self.trainer.tp * cp) / (self._peak / self.trainer.gpus)
        return (cp - 1) * max(0.0, per_call + s * per_token - attention / cp)

    def _comm_s(self, tokens: int, micro_batches: int, exposed: float = 0.0) -> float:
        """The busiest stage's communication (pp 1: the rank's)."""
        return max(self._stage_comm_s(tokens, micro_batches, exposed))

    def _stage_s(self, work: float, tokens: int, micro_batches: int, squares: int, exposed: float = 0.0) -> float:
        """Seconds the busiest pipeline stage of a rank computes and communicates for ``tokens`` tokens in
        ``micro_batches`` micro-batches (pp 1: the rank's whole ``work``, :meth:`_work`; ``exposed``: its
        sequences' ring exposure a layer, :meth:`_cp_sequence_s`)."""
        comm = self._stage_comm_s(tokens, micro_batches, exposed)
        if self.trainer.pp == 1:
            return self.dp * work / self._peak + comm[0]
        return max(self.dp * self.trainer.pp * f / self._peak + c
                   for f, c in zip(self.stage_flops(tokens, squares, self._attention_weight), comm))

    def _longest_micro_batch_s(self, tokens: int, seqs: int, squares: int, longest: int,
                               exposed: float = 0.0) -> float:
        """The busiest stage's seconds for the rank's longest micro-batch: the one holding its longest
        sequence, with the rest of its :meth:`sequences_per_micro_batch` at the mean of the others (an
        expected value: with ``micro_batches`` set, the data order can pack longer ones beside it)."""
        k = self.sequences_per_micro_batch(seqs)
        others = max(0, min(k, seqs) - 1)
        rest = max(1, seqs - 1)
        mb_tokens = round(longest + others * (tokens - longest) / rest)
        mb_squares = round(longest * longest + others * (squares - longest * longest) / rest)
        own = self._cp_sequence_s(longest) if exposed else 0.0
        mb_exposed = own + others * max(0.0, exposed - own) / rest
        return self._stage_s(self._work(mb_tokens, mb_squares), mb_tokens, 1, mb_squares, mb_exposed)

    def _rank_s(self, work: float, tokens: int, seqs: int, squares: int, longest: int,
                exposed: float = 0.0) -> float:
        """One rank's time at its busiest stage's pace (compute and communication together) plus its pipeline's
        fill and drain: Σ tᵢ + (pp − 1) · max tᵢ over its micro-batches (the makespan of pp identical
        stages in line, whatever their order; with equal micro-batches Σ t / (1 − bubble)). The longest
        micro-batch must cross every stage: with lengths this uneven the mean would undercount it."""
        m = self.micro_batches(seqs)
        stage = self._stage_s(work, tokens, m, squares, exposed)
        if self.trainer.pp == 1:
            return stage
        longest_s = max(stage / m, self._longest_micro_batch_s(tokens, seqs, squares, longest, exposed))
        return stage + (self.trainer.pp - 1) * longest_s

    def step_time(self, seq_lens: list[int]) -> float:
        m, t = self.model, self.trainer
        optimizer = 2 * 16 * m.params / (t.gpus * self.gpu.hbm_tbps * 1e12)
        compute = max((self._rank_s(*rank) for rank in self._ranks(seq_lens)), default=0.0)
        return compute + (self.dp_sync_s if compute else 0.0) + optimizer


# What one trainer GPU holds (Megatron with bf16 weights and the distributed optimizer, as ROLL's
# example configs run it: use_distributed_optimizer in 93 of 94, full recompute in 64 of 73).
ADAM_STATE_BYTES_PER_PARAM = 12   # fp32 master weights + Adam m and v (distributed optimizer: sharded over all GPUs)
TRAIN_WEIGHT_GRAD_BYTES = 2 + 4   # bf16 weights + fp32 gradient buffer (bf16 training accumulates in fp32)
TRAIN_ACTIVATION_RESERVE_GIB = 4.0  # ASSUMED: workspace, CUDA context, allocator slack
# Activations that grow with the sequence (full recompute, sequence parallel over tp; per sequence of a
# micro-batch, one by default): each layer's input kept for its recompute, s·h·2 B / tp a layer; one layer recomputed
# whole during its backward, ~34·s·h B / tp (Korthikanti et al. 2022, "Reducing Activation
# Recomputation", with sequence parallelism and flash attention: no s² term); the last stage's logits,
# s·V / tp in BF16 and again in FP32 for the log-softmax of the policy loss.
RECOMPUTED_LAYER_BYTES_PER_TOKEN_HIDDEN = 34
LOGIT_BYTES = 2 + 4


def ring_kv_bytes_per_token(model: ModelSpec, tp: int) -> float:
    """Bytes of one layer's keys and values a token has on one of a tensor-parallel group's ``tp`` GPUs in
    training (BF16), what a context-parallel ring step moves (not the serving KV cache,
    ``ModelSpec.kv_bytes_per_token``): grouped-query attention's kv_heads (at least one a GPU) × head_dim each; MLA trains
    non-absorbed, every head with its own key (head_dim + the rotary part) and value (v_head_dim)."""
    if model.mla:
        return 2.0 * model.heads / tp * (model.head_dim + model.qk_rope_head_dim + model.value_head_dim)
    return 2.0 * 2 * math.ceil(model.kv_heads / tp) * model.head_dim


def trainer_ep(model: ModelSpec, trainer: TrainerPlacement, domain: int = DEFAULT_NVLINK_DOMAIN) -> int:
    """Expert-parallel ranks a MoE trainer shards its experts over: ``placement.trainer.ep``; by
    default the widest group inside one NVLink domain of ``domain`` GPUs (the trainer GPU type's
    ``nvlink_domain``), the largest ep ≤ domain that divides both the experts and a pipeline stage's
    GPUs (gpus / pp) and whose groups, ep consecutive GPUs over all the trainer's, straddle no domain
    boundary (:func:`~rollart.sim.costs.moe.effective_domain` is the domain itself), as public
    Megatron MoE recipes run (Qwen3-30B-A3B at ep 8 on HGX nodes in slime's and NeMo-RL's examples):
    beyond the domain, or across a boundary, the all-to-all would leave NVLink for the NIC. On 128 GPUs
    of 72-GPU racks that is ep 8 (ep 64's second group has 8 GPUs in the first rack; ep 16's on GPUs
    64–79 and ep 32's on 64–95 straddle too); on 64 of them ep 64, on 144 ep 8 (ep 16 straddles at
    GPU 72). ep 1 always qualifies; on HGX boards with power-of-two choices nothing changes. 1 for a
    dense model."""
    if not model.moe_experts:
        return 1
    if trainer.ep:
        return trainer.ep
    return max(d for d in _ep_choices(model, trainer.gpus // trainer.pp)
               if d <= domain and effective_domain(d, trainer.gpus, domain) == domain)


def _ep_choices(model: ModelSpec, stage: int) -> list[int]:
    """Expert-parallel degrees a stage of ``stage`` GPUs can take: those dividing both its GPUs and the
    model's experts, ascending."""
    return [d for d in range(1, min(stage, model.moe_experts) + 1) if stage % d == 0 and model.moe_experts % d == 0]


def trainer_weight_shard_params(model: ModelSpec, trainer: TrainerPlacement,
                                domain: int = DEFAULT_NVLINK_DOMAIN) -> float:
    """Parameters of the weights one trainer GPU holds: dense / (tp·pp) + experts / (ep·pp), ep
    :func:`trainer_ep` on GPUs of NVLink domain ``domain``."""
    experts = expert_params(model)
    return ((model.params - experts) / (trainer.tp * trainer.pp)
            + experts / (trainer_ep(model, trainer, domain) * trainer.pp))


def activation_gib(model: ModelSpec, trainer: TrainerPlacement, seq_tokens: int, sequences: int = 1) -> float:
    """GiB of activations one trainer GPU holds for micro-batches of ``sequences`` sequences of
    ``seq_tokens`` tokens (one by default), on its busiest pipeline stage: the first keeps its layers'
    checkpointed inputs for pp micro-batches in flight under 1F1B (every layer's where pp divides them;
    :func:`stage_layers`), the last its own layers' and the logits; each also one layer recomputed whole.
    A micro-batch of k sequences holds k times one's. Tensor parallelism (with sequence parallelism) splits
    every term over tp GPUs, context parallelism the sequence over cp: a GPU holds s / (tp·cp) tokens' worth
    (the keys and values a ring step brings, s·kv / (tp·cp) bytes a layer, are a few per cent of that)."""
    if seq_tokens <= 0:
        return 0.0
    split, pp = trainer.tp * trainer.cp, trainer.pp
    layers = stage_layers(model.layers, pp)
    layer_input = seq_tokens * model.hidden * 2 / split
    recomputed = RECOMPUTED_LAYER_BYTES_PER_TOKEN_HIDDEN * seq_tokens * model.hidden / split
    logits = LOGIT_BYTES * seq_tokens * model.vocab / split
    first = (pp * layers[0]) * layer_input
    last = layers[-1] * layer_input + logits
    return sequences * (max(first, last) + recomputed) / 2**30


def micro_batch_sequences(trainer: TrainerPlacement, batch_size: int | None = None) -> int:
    """Sequences a micro-batch holds at plan time: one with ``micro_batches`` unset (the default); else
    ceil(ceil(batch_size / dp) / micro_batches), dp = gpus / (tp·cp·pp). ``batch_size`` None (not known): one."""
    if batch_size is None:
        return 1
    return sequences_per_micro_batch(trainer, math.ceil(batch_size / trainer.dp))


def sequences_per_micro_batch(trainer: TrainerPlacement, seqs: int) -> int:
    """Sequences one micro-batch of a rank of ``seqs`` sequences holds: one with ``micro_batches`` unset
    (the default), else ceil(seqs / micro_batches)."""
    if trainer.micro_batches is None:
        return 1
    return max(1, math.ceil(seqs / trainer.micro_batches))


def trainer_memory_gib(model: ModelSpec, trainer: TrainerPlacement, seq_tokens: int = 0,
                       domain: int = DEFAULT_NVLINK_DOMAIN, batch_size: int | None = None) -> float:
    """GiB one trainer GPU needs at least: its shard of the weights and gradients
    (:func:`trainer_weight_shard_params`: dense layers split over tp·pp, a MoE's experts over
    ep·pp), its 1/gpus of the fp32 master weights and Adam moments (sharded over every rank by the
    distributed optimizer), the activations of micro-batches of :func:`micro_batch_sequences`
    ``seq_tokens`` sequences (:func:`activation_gib`; ``batch_size`` the sequences of a step, which
    ``micro_batches`` divides over each rank's) and a fixed reserve. ``domain``: the GPU type's
    ``nvlink_domain``, which bounds the default ep."""
    shard = trainer_weight_shard_params(model, trainer, domain)
    optimizer = ADAM_STATE_BYTES_PER_PARAM * model.params / trainer.gpus
    acts = activation_gib(model, trainer, seq_tokens, micro_batch_sequences(trainer, batch_size))
    return (TRAIN_WEIGHT_GRAD_BYTES * shard + optimizer) / 2**30 + acts + TRAIN_ACTIVATION_RESERVE_GIB


def trainer_fits(model: ModelSpec, gpu: GpuType, trainer: TrainerPlacement, seq_tokens: int = 0,
                 batch_size: int | None = None) -> bool:
    """Whether each of the trainer's GPUs holds :func:`trainer_memory_gib`."""
    return trainer_memory_gib(model, trainer, seq_tokens, gpu.nvlink_domain, batch_size) <= gpu.usable_memory_gib


def trainer_memory_problems(model: ModelSpec, gpu_name: str, gpu: GpuType, trainer: TrainerPlacement,
                            seq_tokens: int = 0, batch_size: int | None = None) -> list[str]:
    """A one-line plan error when the trainer's GPUs cannot hold its state, else nothing. ``batch_size``:
    the sequences of a step (``algorithm.batch_size``), which set a micro-batch's with ``micro_batches``."""
    if trainer_fits(model, gpu, trainer, seq_tokens, batch_size):
        return []
    need = trainer_memory_gib(model, trainer, seq_tokens, gpu.nvlink_domain, batch_size)
    per_micro_batch = micro_batch_sequences(trainer, batch_size)
    act = activation_gib(model, trainer, seq_tokens, per_micro_batch)
    rank = trainer.rank_gpus
    fit = next((g for g in (2 ** k for k in range(20))
                if trainer_fits(model, gpu, trainer.model_copy(update={"gpus": g * rank}),
                                seq_tokens, batch_size)), None)
    layout = f"tp {trainer.tp} · pp {trainer.pp}" + (f" · cp {trainer.cp}" if trainer.cp > 1 else "")
    hint = (f"at {layout} it fits from {fit * rank} GPUs; or raise tp/pp" if fit is not None else "raise tp or pp")
    if act:  # the first stage keeps every layer's input and the last the logits, whatever pp: tp and cp split both
        hint += " (the activations shrink with tp and cp, not pp)"
        # context parallelism on these GPUs: the sequence split over more of them, if that fits
        cps = [trainer.cp * 2 ** k for k in range(1, 7)]
        wider_cp = next((c for c in cps if trainer.gpus % (trainer.tp * c * trainer.pp) == 0
                         and trainer_fits(model, gpu, trainer.model_copy(update={"cp": c}), seq_tokens, batch_size)),
                        None)
        if wider_cp is not None:
            hint = (f"set placement.trainer.cp={wider_cp} (each sequence split over {wider_cp} GPUs, its "
                    f"activations with it); or {hint}")
    if per_micro_batch > 1:
        hint += "; or leave placement.trainer.micro_batches unset (one sequence a micro-batch)"
    # sized for the longest sequence the tasks allow (their context window, not what they usually reach): a
    # shorter window is offered only where it would fit
    shorter = next((s for s in (seq_tokens // 2 ** k for k in range(1, 6))
                    if s >= 1024 and trainer_fits(model, gpu, trainer, s, batch_size)), None) if act else None
    if shorter is not None:
        hint += f"; or shorten the tasks' max_context_tokens (it holds {shorter:,}-token sequences)"
    spread = "dense weights over tp·pp"
    if model.moe_experts:
        ep = trainer_ep(model, trainer, gpu.nvlink_domain)
        spread += f", experts over ep·pp (ep {ep})"
        # a wider expert-parallel group on these GPUs, if one fits
        wider = next((e for e in _ep_choices(model, trainer.gpus // trainer.pp)
                      if e > ep and trainer_fits(model, gpu, trainer.model_copy(update={"ep": e}), seq_tokens)), None)
        if wider is not None:
            crossing = ("on NVLink" if effective_domain(wider, trainer.gpus, gpu.nvlink_domain) >= wider
                        else f"across {domain_name(gpu.nvlink_domain)}s")
            hint = f"set placement.trainer.ep={wider} (experts over more GPUs, all-to-all {crossing}); or {hint}"
    held = (f"a {seq_tokens:,}-token sequence" if per_micro_batch == 1 else
            f"micro-batches of {per_micro_batch} {seq_tokens:,}-token sequences (placement.trainer.micro_batches "
            f"{trainer.micro_batches})")
    split = f"tp {trainer.tp}" + (f" · cp {trainer.cp}" if trainer.cp > 1 else "")
    acts = f"{act:.0f} GiB of activations for {held} at {split}" if act else "activations"
    return [f"placement.trainer.gpus: training {model.name} needs {need:.1f} GiB a GPU on {trainer.gpus} × {gpu_name} "
            f"(bf16 weights + fp32 gradients, {spread}; Adam state over all GPUs; {acts}), more than its "
            f"{gpu.usable_memory_gib:.4g} GiB; {hint}"]


# Colocated placement: bytes that cross PCIe at each switch between training and rollout.
SWITCH_FIXED_S = 1.0              # ASSUMED per switch: allocator re-map, process barriers, engine wake-up


class ColocationSwitch:
    """The cost of time-sharing one pool between the trainer and the engines (verl/ROLL-style
    offload), per GPU, everything over the host link at ``h2d`` bytes/s:

    * before a train step: the engines free their KV cache and drop their weights (they are
      replaced anyway); the trainer onloads its bf16 weight shard ``2·shard`` (the
      :func:`trainer_weight_shard_params`: dense / (tp·pp) + experts / (ep·pp)) and its optimizer
      shard ``12·P / gpus`` from pinned host memory;
    * after it: the trainer offloads the same bytes, the engines load the new weights as they
      serve them (:func:`~rollart.sim.costs.moe.gpu_weight_bytes` of a worker of ``gen_tp`` GPUs
      in ``gen_ep`` ranks: ``served / tp_gen`` without expert parallelism; resharded
      from the trainer's layout) and re-allocate the KV cache.

    Each direction also pays ``SWITCH_FIXED_S``. The KV of requests cut off by the switch is
    recomputed by the engine when it resumes (as after a weight update)."""

    def __init__(self, model: ModelSpec, trainer: TrainerPlacement, gen_tp: int, h2d_bytes_per_s: float,
                 gen_ep: int = 1, domain: int = DEFAULT_NVLINK_DOMAIN):
        # domain: the trainer GPU type's nvlink_domain, which bounds its default ep (trainer_ep)
        self.trainer_bytes = 2 * trainer_weight_shard_params(model, trainer, domain) \
            + ADAM_STATE_BYTES_PER_PARAM * model.params / trainer.gpus
        self.engine_bytes = gpu_weight_bytes(model, gen_ep, gen_tp)
        self.h2d = h2d_bytes_per_s

    @property
    def before_s(self) -> float:
        return SWITCH_FIXED_S + self.trainer_bytes / self.h2d

    @property
    def after_s(self) -> float:
        return SWITCH_FIXED_S + (self.trainer_bytes + self.engine_bytes) / self.h2d
