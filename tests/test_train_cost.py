"""The FLOPs/MFU training-step model: what a step's time is made of, and where it stops scaling."""

from __future__ import annotations

import pytest

from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, ModelSpec, TrainerPlacement
from rollart.sim.costs.train import ATTENTION_PASSES, LINEAR_FLOPS_PER_PARAM_TOKEN, TrainCost

H800 = GpuType(**GPU_PRESETS["H800"])


def _cost(model: str = "Qwen3-8B", gpus: int = 64, tp: int = 2, **model_fields) -> TrainCost:
    m = ModelSpec.model_validate({"preset": model, **model_fields})
    return TrainCost(m, H800, TrainerPlacement(pool="p", gpus=gpus, tp=tp, mfu=0.5))


@pytest.mark.parametrize("model", ["Qwen3-8B", "Qwen3-32B"])
def test_the_input_embedding_is_a_lookup_not_a_matmul(model: str) -> None:
    # Megatron counts model FLOPs over the layers' matmuls and the output (logit) layer; the input
    # embedding is a gather. One sequence of s tokens on one rank: 10·(P − V·h)·s + attention.
    c = _cost(model, gpus=2, tp=2)
    m = c.model
    s = 4096
    expect = LINEAR_FLOPS_PER_PARAM_TOKEN * (m.active_params - m.vocab * m.hidden) * s \
        + ATTENTION_PASSES * 2 * m.layers * m.heads * m.head_dim * s * s
    assert c.busiest_rank_flops([s]) == pytest.approx(expect)
    # tied embeddings: the one matrix is the lm_head's GEMM and counts once
    tied = _cost(model, gpus=2, tp=2, tied_embeddings=True)
    assert tied.busiest_rank_flops([s]) == pytest.approx(
        LINEAR_FLOPS_PER_PARAM_TOKEN * tied.model.active_params * s
        + ATTENTION_PASSES * 2 * m.layers * m.heads * m.head_dim * s * s)


def test_a_step_stops_shrinking_once_ranks_outnumber_sequences() -> None:
    # Each data-parallel rank trains whole sequences: with 16 sequences, 32 or 64 ranks leave
    # ranks idle and the step is one sequence on one tp-wide copy of the model, not 1/dp of the batch.
    lens = [8192] * 16
    t = {gpus: _cost(gpus=gpus).step_time(lens) for gpus in (16, 32, 64, 128)}
    assert t[32] == pytest.approx(t[16] / 2, rel=0.02)  # 8 → 16 ranks: twice as fast
    one_seq = _cost(gpus=2).busiest_rank_flops([8192])
    for gpus in (64, 128):
        c = _cost(gpus=gpus)
        assert c.busiest_rank_flops(lens) == one_seq
        assert t[gpus] >= t[32] * 0.99  # no faster than at one sequence per rank (the optimizer shard shrinks)


def test_the_step_waits_for_the_busiest_rank() -> None:
    # Three equal sequences on two ranks: one rank trains two of them, and the step is that rank's
    # time, not half the batch's (1.5 sequences' worth).
    c = _cost(gpus=4)  # tp 2: 2 ranks
    s = 8192
    assert c.busiest_rank_flops([s, s, s]) == 2 * c._flops(s)
    assert c.step_time([s, s, s]) == pytest.approx(c.step_time([s, s, s, s]), rel=1e-9)


def test_longest_first_packing_stays_within_one_sequence_of_an_even_share() -> None:
    c = _cost(gpus=16)  # 8 ranks
    lens = [32768, 30000, 20000, 16000, 12000, 9000, 8000, 6000, 4000, 3000, 2000, 1000] * 3
    total = sum(c._flops(s) for s in lens)
    busiest = c.busiest_rank_flops(lens)
    assert total / c.dp <= busiest < total / c.dp + c._flops(max(lens))


# ---------------------------------------------------------------- what a trainer GPU must hold


def test_trainer_state_per_gpu_is_weights_and_grads_over_tp_pp_and_adam_over_all() -> None:
    from rollart.sim.costs.train import TRAIN_ACTIVATION_RESERVE_GIB, trainer_memory_gib

    m = ModelSpec.model_validate("Qwen3-8B")
    one = trainer_memory_gib(m, TrainerPlacement(pool="p", gpus=1))
    # 8.2 B parameters × (2 bf16 + 4 fp32 grad + 12 Adam) bytes on one GPU: ~141 GiB, no 80 GB GPU holds it
    assert one == pytest.approx(18 * m.params / 2**30 + TRAIN_ACTIVATION_RESERVE_GIB)
    # the optimizer state shards over every GPU, the weights and gradients only over tp·pp
    wide = trainer_memory_gib(m, TrainerPlacement(pool="p", gpus=64, tp=2))
    assert wide == pytest.approx((6 * m.params / 2 + 12 * m.params / 64) / 2**30 + TRAIN_ACTIVATION_RESERVE_GIB)
    # a MoE's experts spread over expert-parallel ranks: far less than its dense equivalent
    moe = ModelSpec.model_validate("Qwen3-30B-A3B")
    t = TrainerPlacement(pool="p", gpus=16, tp=2)
    assert trainer_memory_gib(moe, t) < 0.5 * (6 * moe.params / 2 + 12 * moe.params / 16) / 2**30


def test_a_trainer_that_cannot_hold_its_state_is_refused_in_seconds_naming_the_fix(tmp_path) -> None:
    from tests.test_cli import assert_clean_usage_error, rollart

    # a short sequence: the state alone decides (141 GiB on one GPU), and the hint finds the GPU count
    proc = rollart("simulate", "paper/qwen3-8b-128gpu", "--steps", "1", "--mode", "sync+",
                   "--set", "placement.trainer.gpus=1", "--set", "placement.trainer.tp=1",
                   *[a for t in ("FrozenLake", "WebShop", "GEM-Math", "GEM-Game")
                     for a in ("--set", f"tasks.{t}.max_context_tokens=2048")],
                   "--set", "tasks.GEM-Math.response_tokens.max=1024", "--set", "tasks.GEM-Game.response_tokens.max=1024",
                   "--set", "tasks.FrozenLake.turns={kind: uniform, low: 3, high: 5}",
                   "--set", "tasks.WebShop.turns={kind: uniform, low: 3, high: 5}", cwd=tmp_path)
    assert_clean_usage_error(proc, "placement.trainer.gpus", "GiB of activations for a 2,048-token sequence",
                             "fits from 4 GPUs")
    # at the paper's 32K context the logits alone (32,768 × 151,936 in BF16 and FP32) outgrow tp 1
    proc = rollart("simulate", "paper/qwen3-8b-128gpu", "--steps", "1", "--mode", "sync+",
                   "--set", "placement.trainer.gpus=1", "--set", "placement.trainer.tp=1", cwd=tmp_path)
    assert_clean_usage_error(proc, "placement.trainer.gpus", "182.4 GiB", "41 GiB of activations for a 32,768-token",
                             "raise tp or pp")
    assert "max_context_tokens" not in proc.stderr  # weights, gradients and Adam alone outgrow one H800
    # where a shorter window would fit, it is offered (the trainer is sized for the tasks' window)
    proc = rollart("simulate", "paper/qwen3-32b-128gpu", "--steps", "1", "--set", "placement.trainer.gpus=8",
                   cwd=tmp_path)
    assert_clean_usage_error(proc, "placement.trainer.gpus", "79.3 GiB",
                             "shorten the tasks' max_context_tokens (it holds 16,384-token sequences)")


def test_activations_grow_with_the_sequence_and_shrink_with_tp() -> None:
    from rollart.sim.costs.train import activation_gib, trainer_memory_gib

    m = ModelSpec.model_validate("Qwen3-8B")
    t2 = TrainerPlacement(pool="p", gpus=64, tp=2)
    acts = [activation_gib(m, t2, s) for s in (0, 8192, 32768, 131072)]
    assert acts[0] == 0 and acts[1] < acts[2] < acts[3] == pytest.approx(4 * acts[2])  # linear in s
    assert activation_gib(m, t2.model_copy(update={"tp": 8}), 32768) == pytest.approx(acts[2] / 4)
    # 32K: layer inputs 36·s·h·2/tp + one layer's 34·s·h/tp + logits 6·s·V/tp, about 20 GiB at tp 2
    expected = (36 * 32768 * 4096 * 2 + 34 * 32768 * 4096 + 6 * 32768 * 151936) / 2 / 2**30
    assert acts[2] == pytest.approx(expected)
    # the paper's Qwen3-8B trainer (64 H800, tp 2) holds a 32K sequence; a 128K one does not fit 80 GB
    assert trainer_memory_gib(m, t2, 32768) < 80 < trainer_memory_gib(m, t2, 131072)
    # pipeline stages: the first keeps every layer's input (pp micro-batches in flight under 1F1B), the
    # last a quarter of them and the logits; the busier stage decides, and pp leaves the first's share whole
    t_pp = t2.model_copy(update={"pp": 4})
    first = 36 * 32768 * 4096 * 2 / 2
    last = first / 4 + 6 * 32768 * 151936 / 2
    layer = 34 * 32768 * 4096 / 2
    assert activation_gib(m, t_pp, 32768) == pytest.approx((max(first, last) + layer) / 2**30)
    long_ctx = ModelSpec.model_validate({"preset": "Qwen3-8B", "vocab": 1000})  # tiny logits: the first stage rules
    assert activation_gib(long_ctx, t_pp, 32768) == pytest.approx(activation_gib(long_ctx, t2, 32768)
                                                                   - 6 * 32768 * 1000 / 2 / 2**30)


# ---------------------------------------------------------------- tensor-parallel communication


def _planned(gpu: str, tp: int, gpus: int = 64, model: str = "Qwen3-8B", pp: int = 1, **placement):
    from rollart.calibration import train_cost

    m = ModelSpec.model_validate(model)
    trainer = TrainerPlacement(pool="p", gpus=gpus, tp=tp, pp=pp, mfu=0.35, **placement)
    return train_cost(m, GpuType(**GPU_PRESETS[gpu]), trainer, gpu)


def test_tensor_parallel_all_reduces_are_priced_on_the_trainer_gpus_nvlink() -> None:
    """Megatron's TP all-reduces (2 a layer, in the forward, backward, recompute and two log-prob
    passes) move 2(tp−1)/tp × tokens × hidden × 2 B each. At a fixed compute MFU the step is then
    slower at tp 8 than tp 2 (more bytes per GPU, the rank's tokens spread over fewer ranks), and an
    H800 (NVLink 400 GB/s, the fit × 0.444) trains slower than an H100 (900) at tp 8 — the
    difference between the two GPUs is exactly their all-reduce times; at tp 1 they differ by their
    data-parallel sync alone (its ring crosses nodes through 8 ports a node, which the H800's NVLink caps)."""
    from rollart.calibration import tp_allreduce
    from rollart.sim.costs.train import TP_ALLREDUCES_PER_LAYER, TP_COMM_PASSES

    lens = [20_000] * 128
    tp1 = {g: _planned(g, 1) for g in ("H800", "H100")}
    assert tp1["H800"].step_time(lens) - tp1["H800"].dp_sync_s == pytest.approx(
        tp1["H100"].step_time(lens) - tp1["H100"].dp_sync_s, rel=1e-12)
    assert tp1["H800"].dp_sync_s > tp1["H100"].dp_sync_s
    assert "all-reduces" not in _planned("H800", 1).source
    h800, h100 = _planned("H800", 8), _planned("H100", 8)
    assert "tp 8 all-reduces on NVLink (H800 NCCL all-reduce fit)" in h800.source
    m = h800.model
    tokens = 20_000 * 128 // (64 // 8)  # the busiest of 8 ranks: 16 sequences
    calls = TP_COMM_PASSES * TP_ALLREDUCES_PER_LAYER * m.layers

    def comm(gpu: str) -> float:
        alpha, beta, _ = tp_allreduce(gpu, GpuType(**GPU_PRESETS[gpu]), 8)
        return calls * (16 * alpha + tokens * m.hidden * 2 * 2 * 7 / 8 / beta)

    assert h800.step_time(lens) - h100.step_time(lens) == pytest.approx(comm("H800") - comm("H100"))
    assert comm("H800") > 2 * comm("H100")  # 400 vs 900 GB/s NVLink
    assert _planned("H800", 8).step_time(lens) > 1.05 * _planned("H800", 2).step_time(lens)


def test_a_tensor_parallel_group_wider_than_a_node_all_reduces_over_infiniband() -> None:
    from rollart.calibration import tp_allreduce
    from rollart.calibration.links import default_network
    from rollart.sim.costs.moe import ring_link

    h800 = GpuType(**GPU_PRESETS["H800"])
    nvlink, ib = tp_allreduce("H800", h800, 8), tp_allreduce("H800", h800, 16)
    # 8 GPUs a node, each through its own InfiniBand port (8 × 36 GB/s): more than the H800's NVLink
    # (157 GB/s), which then paces the ring; the latency is NVLink's 29.7 µs plus InfiniBand's 19.8 µs (it was
    # the higher of the two, NVLink's, as if crossing the network cost nothing)
    assert "InfiniBand" in ib[2] and ib[1] == nvlink[1] < 8 * default_network()[0]
    rate, latency = ring_link(16, (nvlink[1], nvlink[0]), default_network())
    assert ib[:2] == pytest.approx((latency, rate)) and ib[0] == pytest.approx(nvlink[0] + default_network()[1])
    # the plan's own intra-cluster link, when it names one: 8 ports of a slow one pace the ring, a faster
    # one is no faster than the NVLink hops inside each node
    from rollart.plan.schema import Link

    from rollart.calibration.links import LINK_EFFICIENCY

    slow = tp_allreduce("H800", h800, 16, Link(kind="tcp", bandwidth_gbps=100, latency_us=5))
    assert slow[:2] == pytest.approx((nvlink[0] + 5e-6, 8 * 12.5e9 * LINK_EFFICIENCY["tcp"])) \
        and "intra-cluster link" in slow[2]
    assert slow[1] < ib[1]
    fast = tp_allreduce("H800", h800, 16, Link(kind="rdma", bandwidth_gbps=800, latency_us=5))
    assert fast[1] == pytest.approx(nvlink[1])
    fabric = tp_allreduce("H800", h800, 16, Link(kind="rdma", bandwidth_gbps=3200, latency_us=5))
    assert fabric[1] == pytest.approx(nvlink[1])
    assert tp_allreduce("H800", h800, 8, Link(kind="rdma", bandwidth_gbps=800))[:2] == nvlink[:2]  # inside a node
    # a GPU without a shipped profile (a custom type): its reference's fit (calibration.transfer_reference)
    # scaled by its NVLink; a Hopper-like type (FP8 tensor cores, a high ridge) scales H100's
    h100 = tp_allreduce("H100", GpuType(**GPU_PRESETS["H100"]), 4)
    custom = tp_allreduce("GX", GpuType(**{**GPU_PRESETS["H100"], "tflops_bf16": 1000.0, "nvlink_gbps": 600.0}), 4)
    assert "H100 NCCL all-reduce fit × 0.667" in custom[2] and custom[1] == pytest.approx(h100[1] * 600 / 900)
    # a type named like a preset but with other numbers is not that preset: its own NVLink scales H100's fit
    assert tp_allreduce("H100", h800, 4)[1] == pytest.approx(h100[1] * 400 / 900)
    # an Ampere-like type (no FP8 tensor cores) keeps the A100's fit, as the shipped A100 profile
    ampere = tp_allreduce("GX", GpuType(**{**GPU_PRESETS["A100"], "tflops_bf16": 320.0}), 4)
    assert "A100 NCCL all-reduce fit × 1" in ampere[2]
    assert tp_allreduce("A100", GpuType(**GPU_PRESETS["A100"]), 4)[1] == pytest.approx(ampere[1], rel=1e-5)


def test_pipeline_stages_all_reduce_only_their_own_layers() -> None:
    # pp 2 halves the layers a GPU holds, so its share of the TP all-reduces halves (and the bubble
    # factor applies to both compute and communication); the compute halves only as far as the stages
    # are even: the last holds the lm_head, and the pipeline runs at its pace
    lens = [8_000] * 64
    # attention at the GEMMs' rate: the stages' times are then in the ratio of their FLOPs
    one, two = (_planned("H800", 4, gpus=32, attention_efficiency=1.0),
                _planned("H800", 4, gpus=64, pp=2, attention_efficiency=1.0))  # dp 8 both
    for tokens, micro_batches in ((64_000, 8), (64_000, 1), (1, 16)):
        assert two._comm_s(tokens, micro_batches) == pytest.approx(one._comm_s(tokens, micro_batches) / 2)
    m = one.model

    def optimizer(c) -> float:  # and the data-parallel sync: once a step, outside the pipeline
        return 2 * 16 * m.params / (c.trainer.gpus * c.gpu.hbm_tbps * 1e12) + c.dp_sync_s

    tokens, squares = 8 * 8_000, 8 * 8_000 ** 2  # a rank's 8 sequences
    compute = one.step_time(lens) - optimizer(one) - one._comm_s(tokens, 8)
    stages = two.stage_flops(tokens, squares)
    assert stages[1] > stages[0] and sum(stages) == pytest.approx(one.busiest_rank_flops(lens))
    bubble = 1 / (8 + 1)  # 8 sequences a rank: 8 micro-batches of one sequence each
    assert two.step_time(lens) - optimizer(two) == pytest.approx(
        (compute * max(stages) / sum(stages) + one._comm_s(tokens, 8) / 2) / (1 - bubble))


# ---------------------------------------------------------------- micro-batches and the pipeline bubble


def _lens(n: int = 128) -> list[int]:
    return [1500 + (i * 997) % 1500 for i in range(n)]  # deterministic, 1500..2999 tokens


def test_a_rank_runs_no_more_micro_batches_than_it_has_sequences() -> None:
    """A micro-batch holds at least one whole sequence, so a rank of n sequences runs at most n
    micro-batches and its pipeline idles (pp − 1) / (m + pp − 1) of the step. With one sequence a rank
    (128 sequences, dp 128) a 4-stage pipeline passes its one micro-batch through the stages one after
    the other (bubble 3/4): no faster than the same dp without pipelining, whatever micro_batches the
    plan asks for — slower by as much as its busiest stage (the last, with the lm_head) exceeds a
    quarter of the model."""
    lens = _lens()
    piped = _planned("H800", 2, gpus=1024, model="Qwen3-32B", pp=4, attention_efficiency=1.0)  # dp 128: one a rank
    flat = _planned("H800", 2, gpus=256, model="Qwen3-32B", attention_efficiency=1.0)  # dp 128, pp 1
    assert piped.micro_batches(1) == 1 and piped.bubble(1) == 0.75

    def optimizer(c) -> float:  # and the data-parallel sync (pp 4 holds a quarter of the shard)
        return 2 * 16 * c.model.params / (c.trainer.gpus * c.gpu.hbm_tbps * 1e12) + c.dp_sync_s

    s = max(lens)  # the slowest rank: the longest sequence, alone
    comm = flat._comm_s(s, 1)  # a quarter of the layers' all-reduces, stretched 4 times by the bubble
    assert piped._comm_s(s, 1) / (1 - 0.75) == pytest.approx(comm)
    stages = piped.stage_flops(s, s * s)
    compute = flat.step_time(lens) - optimizer(flat) - comm
    assert piped.step_time(lens) - optimizer(piped) == pytest.approx(comm + compute * 4 * max(stages) / sum(stages))
    one_micro_batch = _planned("H800", 2, gpus=1024, model="Qwen3-32B", pp=4, micro_batches=1,
                               attention_efficiency=1.0)
    assert piped.step_time(lens) == one_micro_batch.step_time(lens)


def test_pipelining_does_not_beat_more_data_parallel_ranks_at_few_sequences_a_rank() -> None:
    """256 GPUs, 128 sequences: pp 4 (dp 32, 4 sequences a rank) runs 4 micro-batches with a 3/7
    bubble, so its compute is slower than pp 1's (dp 128, one sequence a rank, no bubble); the plan's
    16 micro-batches would have hidden the bubble. pp 1's GPU holds 4 times pp 4's shard of the weights
    and syncs it over 128 ranks each step, but through 4 ports a node (tp 2): that does not win back the
    bubble and the last stage's lm_head."""
    lens = _lens()
    pp4, pp1 = _planned("H800", 2, gpus=256, model="Qwen3-32B", pp=4), _planned("H800", 2, gpus=256, model="Qwen3-32B")
    assert pp4.step_time(lens) - pp4.dp_sync_s > pp1.step_time(lens) - pp1.dp_sync_s
    assert pp1.dp_sync_s > 3.5 * pp4.dp_sync_s and pp4.step_time(lens) > pp1.step_time(lens)
    assert pp4.bubble(pp4.micro_batches(4)) == pytest.approx(3 / 7)


# ---------------------------------------------------------------- expert parallelism


def test_a_moe_trainer_pays_its_expert_parallel_all_to_all() -> None:
    """Each MoE layer sends every token's hidden state (BF16) to its k experts' GPUs and back
    (dispatch + combine), in the forward, backward, recompute and two log-prob passes. 8 GPUs at
    tp 1 shard the 128 experts over ep 8 (one node, NVLink): a GPU of the busiest rank (16
    sequences, 16 micro-batches) moves 2 · L · T · k · hidden · 2 B · 7/8 a pass and pays the link's
    latency twice a layer each micro-batch. At equal compute an H800 (NVLink 400 GB/s) is slower
    than an H100 (900 GB/s) by exactly the difference; a dense model pays nothing of it."""
    from rollart.calibration import tp_allreduce
    from rollart.sim.costs.train import TP_COMM_PASSES

    lens = [2000] * 128
    h800, h100 = (_planned(g, 1, gpus=8, model="Qwen3-30B-A3B") for g in ("H800", "H100"))
    m = h800.model
    assert h800.ep == 8 and "ep 8 all-to-alls on NVLink (H800 NCCL all-reduce fit)" in h800.source

    def all_to_all(gpu: str) -> float:
        alpha, beta, _ = tp_allreduce(gpu, GpuType(**GPU_PRESETS[gpu]), 8)
        sent = 16 * 2000 * m.moe_active_experts * m.hidden * 2 * 7 / 8  # bytes a GPU sends a layer, one way
        return TP_COMM_PASSES * 2 * m.layers * (16 * alpha + sent / beta)

    no_links = TrainCost(m, H800, h800.trainer)
    assert h800.step_time(lens) - h800.dp_sync_s - no_links.step_time(lens) == pytest.approx(all_to_all("H800"))
    assert (h800.step_time(lens) - h800.dp_sync_s) - (h100.step_time(lens) - h100.dp_sync_s) == pytest.approx(
        all_to_all("H800") - all_to_all("H100"))
    assert all_to_all("H800") > 2 * all_to_all("H100")
    dense = _planned("H800", 1, gpus=8)
    assert dense.ep == 1 and "all-to-all" not in dense.source
    assert dense.step_time(lens) == pytest.approx(TrainCost(dense.model, H800, dense.trainer).step_time(lens)
                                                  + dense.dp_sync_s)


def test_an_explicit_trainer_ep_sets_the_expert_shard_and_the_all_to_all() -> None:
    """placement.trainer.ep: unset, the experts spread over the widest group inside a node (the
    largest ep ≤ 8 dividing the experts and a pipeline stage's GPUs); ep 1 keeps every expert on
    every GPU (more memory, no all-to-all); ep 2 half of them on each."""
    from rollart.sim.costs.moe import expert_params
    from rollart.sim.costs.train import trainer_ep, trainer_memory_gib

    moe = ModelSpec.model_validate("Qwen3-30B-A3B")
    widest = TrainerPlacement(pool="p", gpus=16, tp=2)
    assert trainer_ep(moe, widest) == 8  # one node, not all 16 GPUs
    assert trainer_ep(moe, widest.model_copy(update={"pp": 4})) == 4
    assert trainer_ep(moe, widest.model_copy(update={"gpus": 12})) == 4  # 8 and 6 do not divide 12 and 128
    assert trainer_ep(ModelSpec.model_validate("Qwen3-8B"), widest) == 1
    mem = {ep: trainer_memory_gib(moe, widest.model_copy(update={"ep": ep})) for ep in (1, 2, 8, 16)}
    assert mem[8] == trainer_memory_gib(moe, widest) and mem[16] < mem[8]
    # each halving of ep adds half the experts' bf16 weights and fp32 gradients to a GPU
    assert mem[1] - mem[2] == pytest.approx(6 * expert_params(moe) / 2 / 2**30)
    lens = [2000] * 128
    one, no_ep = (_planned("H800", 1, gpus=8, model="Qwen3-30B-A3B", ep=ep) for ep in (None, 1))
    assert no_ep.ep == 1 and "all-to-all" not in no_ep.source and no_ep.step_time(lens) < one.step_time(lens)


@pytest.mark.parametrize("overrides, words", [
    (["placement.trainer.tp=3", "placement.trainer.gpus=3"],
     "placement.trainer.tp: 3 does not divide the model's 32 heads"),
    (["model=Qwen3-235B-A22B", "placement.trainer.tp=8", "placement.trainer.gpus=8", "cluster.gpu_pools.h800.count=16"],
     "placement.trainer.tp: 8 does not divide the model's 4 KV heads"),
    (["placement.trainer.pp=64", "placement.trainer.tp=1", "placement.trainer.gpus=64",
      "cluster.gpu_pools.h800.count=72"], "placement.trainer.pp: 64 pipeline stages for the model's 36 layers"),
])
def test_a_trainer_split_megatron_cannot_run_is_a_plan_error(overrides: list[str], words: str) -> None:
    """Megatron splits query heads and KV groups over the tensor-parallel ranks and gives each pipeline
    stage whole layers: a trainer tp that does not divide both, or more stages than layers, is refused
    naming the field, where it was priced with fractional heads and layers."""
    from rollart.plan import PlanError, load_plan
    from rollart.scenarios_catalog import default_scenario

    with pytest.raises(PlanError) as err:
        load_plan(default_scenario(), overrides)
    assert any(p.startswith(words) for p in err.value.problems), err.value.problems
    # DeepSeek-V3's MLA caches no KV groups: only its 128 heads bound the trainer's tp
    from rollart.plan.schema import trainer_split_problems

    plan = load_plan(default_scenario())
    wide = plan.placement.model_copy(update={"trainer": plan.placement.trainer.model_copy(update={"tp": 16})})
    assert trainer_split_problems(plan.model_copy(update={"model": ModelSpec.model_validate("DeepSeek-V3"),
                                                          "placement": wide})) == []
    assert trainer_split_problems(plan.model_copy(update={"placement": wide})) != []  # Qwen3-8B: 8 KV heads


def test_trainer_ep_is_validated_against_its_gpus_and_the_experts() -> None:
    from rollart.plan import PlanError
    from tests.conftest import small_plan

    moe = ("model={name: moe, layers: 4, hidden: 256, heads: 8, kv_heads: 2, head_dim: 32, intermediate: 64, "
           "vocab: 1000, moe_experts: 8, moe_active_experts: 2}")  # the default trainer: 4 GPUs, tp 2
    assert small_plan([moe, "placement.trainer.ep=4"]).placement.trainer.ep == 4
    assert small_plan(["placement.trainer.ep=1"]).placement.trainer.ep == 1  # ep 1 is no expert parallelism
    for overrides, words in (([moe, "placement.trainer.ep=8"], "does not divide the trainer's 4 GPUs"),
                             ([moe.replace("moe_experts: 8", "moe_experts: 2"), "placement.trainer.ep=4"],
                              "does not divide the model's 2 experts"),
                             ([moe.replace("moe_experts: 8", "moe_experts: 6"), "placement.trainer.ep=4"],
                              "does not divide the model's 6 experts"),
                             (["placement.trainer.ep=2"], "is dense")):
        with pytest.raises(PlanError) as err:
            small_plan(overrides)
        assert [p for p in err.value.problems if p.startswith("placement.trainer.ep: ") and words in p], \
            err.value.problems


def test_data_parallel_ranks_sync_gradients_and_weights_once_a_step() -> None:
    """Megatron's distributed optimizer, as ROLL runs it (fp32 gradient reduce-scatter, bf16 weight
    all-gather, not overlapped): (4 + 2) B × the GPU's shard × (dp − 1)/dp over the data-parallel
    ring's link, once a step. Strong scaling therefore turns over: GPU-seconds a step never fall as
    the trainer grows, and a slower network makes a multi-node trainer slower. The ring's members (one of
    each tp group) cross nodes each through its own port: 4 a node at tp 2, under NVLink's rate."""
    from rollart.calibration import tp_allreduce
    from rollart.plan.schema import Link
    from rollart.sim.costs.train import DP_GRAD_BYTES, DP_PARAM_BYTES

    lens = [8000] * 128
    one = _planned("H800", 2, gpus=2)
    assert one.dp_sync_s == 0.0  # one data-parallel rank: nothing to sync
    node = _planned("H800", 2, gpus=8)  # dp 4 inside a node: NVLink
    alpha, beta, where = tp_allreduce("H800", GpuType(**GPU_PRESETS["H800"]), 8)
    shard = ModelSpec.model_validate("Qwen3-8B").params / 2
    assert node.dp_sync_s == pytest.approx(2 * alpha + (DP_GRAD_BYTES + DP_PARAM_BYTES) * shard * 3 / 4 / beta)
    assert "dp 4 gradient sync on NVLink" in node.source
    wide = _planned("H800", 2, gpus=64)  # dp 32 over 8 nodes: 4 ports a node (4 × 36 GB/s < NVLink's 157)
    assert "InfiniBand" in wide.source and "through 4 ports a node" in wide.source
    assert wide.dp_sync_s > node.dp_sync_s * 157 / 144
    tp8 = _planned("H800", 8, gpus=64)  # dp 8 over 8 nodes, one member a node: one port
    assert "through 1 port a node" in tp8.source
    gpu_s = [g * _planned("H800", 2, gpus=g).step_time(lens) for g in (8, 64, 256, 1024)]
    assert all(a <= b for a, b in zip(gpu_s, gpu_s[1:])), gpu_s
    slow = _planned("H800", 2, gpus=64).step_time(lens)
    from rollart.calibration import train_cost
    from rollart.plan.schema import TrainerPlacement

    tcp = train_cost(ModelSpec.model_validate("Qwen3-8B"), GpuType(**GPU_PRESETS["H800"]),
                     TrainerPlacement(pool="p", gpus=64, tp=2), "H800", Link(kind="tcp", bandwidth_gbps=100))
    assert tcp.step_time(lens) > slow + 0.5


def test_collectives_reach_the_share_of_a_links_line_rate_a_transfer_does() -> None:
    """NCCL's rings and all-to-alls over a cluster's network reach the same share of its line rate as a
    weight transfer over that wire (calibration/links.LINK_EFFICIENCY): 0.6 on TCP, 0.9 on InfiniBand; so
    a TCP network trains slower than InfiniBand of the same line rate. A link without a bandwidth takes
    the measured NCCL fit, which no share discounts again."""
    from rollart.calibration import cluster_network, train_cost
    from rollart.calibration.links import LINK_EFFICIENCY, calibrated_links
    from rollart.plan.schema import Link

    for kind in ("tcp", "ib", "rdma"):
        link = Link(kind=kind, bandwidth_gbps=400)
        assert cluster_network(link)[1] == pytest.approx(400e9 / 8 * LINK_EFFICIENCY[kind])
    assert cluster_network(Link(kind="ib"))[1] == pytest.approx(calibrated_links()["ib"]["bandwidth_gbps"] * 1e9 / 8)
    lens = [8000] * 128

    def dp_sync(kind: str) -> float:
        return train_cost(ModelSpec.model_validate("Qwen3-8B"), H800, TrainerPlacement(pool="p", gpus=64, tp=2),
                          "H800", Link(kind=kind, bandwidth_gbps=400)).dp_sync_s

    # 4 ports a node (tp 2) of 400 Gb/s: TCP's 4 × 30 GB/s under NVLink's 157, InfiniBand's 4 × 45 above it
    assert dp_sync("tcp") > 1.2 * dp_sync("ib")
    tcp = train_cost(ModelSpec.model_validate("Qwen3-8B"), H800, TrainerPlacement(pool="p", gpus=64, tp=2),
                     "H800", Link(kind="tcp", bandwidth_gbps=400))
    ib = train_cost(ModelSpec.model_validate("Qwen3-8B"), H800, TrainerPlacement(pool="p", gpus=64, tp=2),
                    "H800", Link(kind="ib", bandwidth_gbps=400))
    assert tcp.step_time(lens) > ib.step_time(lens)


def test_replicated_experts_and_pipeline_stages_sync_their_own_shards() -> None:
    """The sync moves each GPU's own shard: dense weights over tp·pp, a MoE's experts over ep·pp, each
    replicated gpus / (its split) times. A MoE trainer whose dense part is one replica (tp 8 on 8 GPUs)
    still syncs its experts when ep < 8 holds them twice; pp 2 halves every shard."""
    from rollart.calibration import tp_allreduce
    from rollart.sim.costs.moe import expert_params
    from rollart.sim.costs.train import DP_GRAD_BYTES, DP_PARAM_BYTES

    moe = _planned("H800", 8, gpus=8, model="Qwen3-30B-A3B", ep=4)
    experts = expert_params(moe.model)
    alpha, beta, _ = tp_allreduce("H800", GpuType(**GPU_PRESETS["H800"]), 8)
    assert moe.dp == 1 and moe.dp_sync_s == pytest.approx(
        2 * alpha + (DP_GRAD_BYTES + DP_PARAM_BYTES) * experts / 4 * (2 - 1) / 2 / beta)
    assert _planned("H800", 8, gpus=8, model="Qwen3-30B-A3B", ep=8).dp_sync_s == 0.0  # one replica of everything
    assert _planned("H800", 8, gpus=8).dp_sync_s == 0.0  # dense, tp 8 on 8 GPUs
    flat, piped = _planned("H800", 2, gpus=64), _planned("H800", 2, gpus=128, pp=2)  # dp 32 both
    assert piped.dp_sync_s - 2 * alpha < (flat.dp_sync_s - 2 * alpha) / 2 * 1.001
