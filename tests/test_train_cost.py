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

    proc = rollart("simulate", "paper/qwen3-8b-128gpu", "--steps", "1", "--mode", "sync+",
                   "--set", "placement.trainer.gpus=1", "--set", "placement.trainer.tp=1", cwd=tmp_path)
    assert_clean_usage_error(proc, "placement.trainer.gpus", "141 GiB", "fits from 4 GPUs")
