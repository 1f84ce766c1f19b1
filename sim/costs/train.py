"""Training step time from FLOPs, MFU and parallelism."""

from __future__ import annotations

import heapq

from rollart.plan.schema import GpuType, ModelSpec, TrainerPlacement
from rollart.sim.costs.moe import expert_params, input_embedding_params

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


class TrainCost:
    """step = [dp · max_rank(10·P'·T_r + 5·2·L·H·d·Σ_r s²) / (gpus · peak · MFU) + comm] / (1 − bubble) + optimizer

    P' the parameters whose matmuls every token runs: the active parameters less the input embedding
    (a lookup, no FLOPs; the lm_head is a GEMM and counts), as Megatron counts model FLOPs. Each of
    the dp = gpus / (tp·pp) data-parallel ranks trains whole sequences, handed out longest first to
    the least-loaded rank, so the step waits for the busiest rank: T_r its tokens, s its sequences'
    lengths. A batch of fewer sequences than ranks leaves ranks idle instead of shrinking the step.
    The pipeline bubble is (pp − 1) / (micro_batches + pp − 1). The optimizer step streams fp32 Adam
    state (16 bytes per parameter, read and written) at HBM bandwidth, sharded over the GPUs.

    comm is the tensor-parallel all-reduces a GPU waits for (tp > 1, given ``allreduce`` = (α s,
    bus bytes/s) of the trainer GPUs' link):
    5 passes · 2 · (L / pp) · (micro_batches · α + T_r · hidden · 2 B · 2(tp − 1)/tp / β),
    T_r a rank's tokens; the step then waits for the rank whose compute and comm together are the
    most. MFU is the compute's alone: an MFU fitted to a measured step at some tp keeps that step's
    time only with the comm term beside it."""

    def __init__(self, model: ModelSpec, gpu: GpuType, trainer: TrainerPlacement,
                 allreduce: tuple[float, float, str] | None = None):
        self.model, self.gpu, self.trainer = model, gpu, trainer
        m = model
        self._linear_per_token = LINEAR_FLOPS_PER_PARAM_TOKEN * (m.active_params - input_embedding_params(m))
        self._attention_per_sq = ATTENTION_PASSES * 2 * m.layers * m.heads * m.head_dim
        self.dp = max(1, trainer.gpus // (trainer.tp * trainer.pp))
        tp = trainer.tp
        self._comm: tuple[float, float] | None = None  # (seconds per rank token, fixed seconds)
        self.source = f"FLOPs model, MFU {trainer.mfu:.3g} (placement.trainer.mfu)"
        if tp > 1 and allreduce is not None:
            alpha, beta, where = allreduce
            calls = TP_COMM_PASSES * TP_ALLREDUCES_PER_LAYER * m.layers / trainer.pp
            self._comm = (calls * m.hidden * 2.0 * 2 * (tp - 1) / tp / beta, calls * trainer.micro_batches * alpha)
            self.source += f"; tp {tp} all-reduces on {where}"

    def _flops(self, s: int) -> float:
        return self._linear_per_token * s + self._attention_per_sq * s * s

    def _ranks(self, seq_lens: list[int]) -> list[tuple[float, int]]:
        """(FLOPs, tokens) of each data-parallel rank with work, sequences dealt longest first to the
        least-loaded rank (longest-processing-time packing: the busiest rank exceeds an even share by
        less than its last sequence's work); one sequence a rank when there are no more than ranks."""
        if len(seq_lens) <= self.dp:
            return [(self._flops(s), s) for s in seq_lens]
        ranks = [(0.0, 0)] * self.dp
        for s in sorted(seq_lens, reverse=True):
            flops, tokens = ranks[0]
            heapq.heapreplace(ranks, (flops + self._flops(s), tokens + s))
        return ranks

    def busiest_rank_flops(self, seq_lens: list[int]) -> float:
        """FLOPs of the data-parallel rank with the most work."""
        return max((flops for flops, _ in self._ranks(seq_lens)), default=0.0)

    def step_time(self, seq_lens: list[int]) -> float:
        m, t = self.model, self.trainer
        peak = t.gpus * self.gpu.tflops_bf16 * 1e12 * t.mfu
        bubble = (t.pp - 1) / (t.micro_batches + t.pp - 1)
        optimizer = 2 * 16 * m.params / (t.gpus * self.gpu.hbm_tbps * 1e12)
        ranks = self._ranks(seq_lens)
        if self._comm is None or not ranks:
            work = self.dp * max((flops for flops, _ in ranks), default=0.0) / peak
        else:  # the step waits for the rank with the most compute and communication together
            per_token, fixed = self._comm
            work = max(self.dp * flops / peak + per_token * tokens for flops, tokens in ranks) + fixed
        return work / (1 - bubble) + optimizer


# What one trainer GPU holds (Megatron with bf16 weights and the distributed optimizer, as ROLL's
# example configs run it: use_distributed_optimizer in 93 of 94, full recompute in 64 of 73).
ADAM_STATE_BYTES_PER_PARAM = 12   # fp32 master weights + Adam m and v (distributed optimizer: sharded over all GPUs)
TRAIN_WEIGHT_GRAD_BYTES = 2 + 4   # bf16 weights + fp32 gradient buffer (bf16 training accumulates in fp32)
TRAIN_ACTIVATION_RESERVE_GIB = 4.0  # ASSUMED: activations under full recompute, workspace, CUDA context


def trainer_memory_gib(model: ModelSpec, trainer: TrainerPlacement) -> float:
    """GiB one trainer GPU needs at least: its shard of the weights and gradients (dense layers
    split over tp·pp; a MoE's experts over as many ranks as there are experts, up to gpus / pp:
    the widest expert parallelism), its 1/gpus of the fp32 master weights and Adam moments
    (sharded over every rank by the distributed optimizer), and the activation reserve."""
    experts = expert_params(model)
    dense = model.params - experts
    ep = max(1, min(model.moe_experts, trainer.gpus // trainer.pp)) if experts else 1
    shard = dense / (trainer.tp * trainer.pp) + experts / (ep * trainer.pp)
    optimizer = ADAM_STATE_BYTES_PER_PARAM * model.params / trainer.gpus
    return (TRAIN_WEIGHT_GRAD_BYTES * shard + optimizer) / 2**30 + TRAIN_ACTIVATION_RESERVE_GIB


def trainer_fits(model: ModelSpec, gpu: GpuType, trainer: TrainerPlacement) -> bool:
    """Whether each of the trainer's GPUs holds :func:`trainer_memory_gib`."""
    return trainer_memory_gib(model, trainer) <= gpu.memory_gb


def trainer_memory_problems(model: ModelSpec, gpu_name: str, gpu: GpuType, trainer: TrainerPlacement) -> list[str]:
    """A one-line plan error when the trainer's GPUs cannot hold its state, else nothing."""
    if trainer_fits(model, gpu, trainer):
        return []
    need = trainer_memory_gib(model, trainer)
    fit = next((g for g in (2 ** k for k in range(20))
                if trainer_fits(model, gpu, trainer.model_copy(update={"gpus": g * trainer.tp * trainer.pp}))), None)
    hint = (f"at tp {trainer.tp} · pp {trainer.pp} it fits from {fit * trainer.tp * trainer.pp} GPUs; or raise tp/pp"
            if fit is not None else "raise tp or pp")
    return [f"placement.trainer.gpus: training {model.name} needs {need:.0f} GiB a GPU on {trainer.gpus} × {gpu_name} "
            f"(bf16 weights + fp32 gradients over tp·pp, Adam state over all GPUs, activations), more than its "
            f"{gpu.memory_gb:g} GB; {hint}"]


# Colocated placement: bytes that cross PCIe at each switch between training and rollout.
SWITCH_FIXED_S = 1.0              # ASSUMED per switch: allocator re-map, process barriers, engine wake-up


class ColocationSwitch:
    """The cost of time-sharing one pool between the trainer and the engines (verl/ROLL-style
    offload), per GPU, everything over the host link at ``h2d`` bytes/s:

    * before a train step: the engines free their KV cache and drop their weights (they are
      replaced anyway); the trainer onloads its bf16 weight shard ``2·P / (tp·pp)`` and its
      optimizer shard ``12·P / gpus`` from pinned host memory;
    * after it: the trainer offloads the same bytes, the engines load the new weights
      ``2·P / tp_gen`` (resharded from the trainer's layout) and re-allocate the KV cache.

    Each direction also pays ``SWITCH_FIXED_S``. The KV of requests cut off by the switch is
    recomputed by the engine when it resumes (as after a weight update)."""

    def __init__(self, model: ModelSpec, trainer: TrainerPlacement, gen_tp: int, h2d_bytes_per_s: float):
        p = model.params
        self.trainer_bytes = 2 * p / (trainer.tp * trainer.pp) + ADAM_STATE_BYTES_PER_PARAM * p / trainer.gpus
        self.engine_bytes = 2 * p / gen_tp
        self.h2d = h2d_bytes_per_s

    @property
    def before_s(self) -> float:
        return SWITCH_FIXED_S + self.trainer_bytes / self.h2d

    @property
    def after_s(self) -> float:
        return SWITCH_FIXED_S + (self.trainer_bytes + self.engine_bytes) / self.h2d
