"""Context parallelism in the trainer (``placement.trainer.cp``, Megatron's context_parallel_size): a
sequence split over cp GPUs holds 1/cp of its activations there, and the keys and values its ring passes
cost only what the attention over a chunk does not hide."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollart.calibration import tp_allreduce, train_cost
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, ModelSpec, TrainerPlacement
from rollart.sim.costs.train import (ATTENTION_PASSES, LINEAR_FLOPS_PER_PARAM_TOKEN, TrainCost, activation_gib,
                                     input_embedding_params, trainer_fits, trainer_memory_problems)

H100 = GpuType(**GPU_PRESETS["H100"])
H800 = GpuType(**GPU_PRESETS["H800"])
QWEN8 = ModelSpec.model_validate("Qwen3-8B")


def _trainer(**fields) -> TrainerPlacement:
    return TrainerPlacement(**{"pool": "p", "gpus": 64, "tp": 1, "mfu": 0.16, **fields})


def _compute_s(c: TrainCost, lens: list[int]) -> float:
    """A step less its optimizer and data-parallel sync."""
    return c.step_time(lens) - 2 * 16 * c.model.params / (c.trainer.gpus * c.gpu.hbm_tbps * 1e12) - c.dp_sync_s


# ---------------------------------------------------------------- memory


def test_a_gpu_holds_one_cpth_of_a_sequences_activations() -> None:
    for tp in (1, 2, 4):
        one = activation_gib(QWEN8, _trainer(tp=tp), 131072)
        for cp in (2, 4, 8):
            assert activation_gib(QWEN8, _trainer(tp=tp, cp=cp), 131072) == pytest.approx(one / cp)


def test_a_long_context_the_trainer_cannot_hold_is_refused_offering_cp() -> None:
    """Qwen3-8B at 128K tokens on 64 H800 at tp 1 needs 164 GiB of activations a GPU: the error offers the
    context-parallel width that fits on the same GPUs, and that width does fit."""
    t = _trainer()
    assert not trainer_fits(QWEN8, H800, t, 131072)
    [problem] = trainer_memory_problems(QWEN8, "H800", H800, t, 131072)
    assert "set placement.trainer.cp=8" in problem and "shrink with tp and cp, not pp" in problem
    assert trainer_fits(QWEN8, H800, _trainer(cp=8), 131072)
    assert not trainer_fits(QWEN8, H800, _trainer(cp=4), 131072)


# ---------------------------------------------------------------- time


# NeMo 24.03 (Megatron-core, TransformerEngine; DGX-H100, FP8), Llama-2-7B pre-training with context
# parallelism, docs/source/performance/performance_long_sequence.md: sequence length (K tokens) → (tp, pp,
# dp, cp, TFLOP/s a GPU as NeMo counts model FLOPs).
NEMO_WITH_CP = {4: (1, 1, 4, 1, 768), 8: (1, 2, 4, 1, 730), 16: (2, 1, 8, 1, 660), 32: (2, 1, 8, 2, 610),
                64: (4, 1, 8, 2, 574), 128: (4, 1, 8, 4, 555), 256: (4, 1, 8, 8, 549), 512: (8, 1, 4, 16, 549),
                1024: (8, 1, 4, 32, 536)}
LLAMA2_7B = ModelSpec(name="llama-2-7b", layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128,
                      intermediate=11008, vocab=32000)


def _nemo_flops_per_token(s: int) -> float:
    """NeMo 24.03's Llama-2 model FLOPs a token (forward and backward; attention over the full s × s)."""
    h, layers, ffn, vocab = 4096, 32, 11008, 32000
    return layers * h * h * (12 + 12 + 18 * ffn / h + 12 * s / h + 6 * vocab / (layers * h))


def test_the_ring_hides_behind_long_attention_as_nemo_measured_up_to_a_million_tokens() -> None:
    """Fit the GEMMs' and the attention's rates to NeMo's rows up to 64K (time a token = a + b·s, cp ≤ 2),
    then price the rows it ran at 128K-1M tokens with cp 4-32 (rings crossing DGX nodes from 128K: tp 4 ·
    cp 4 is 16 GPUs) on the modelled links: each row's time a token ÷ 4K's within 6 % of NeMo's, with no
    ring step exposed. NeMo runs tensor parallelism overlapped with its GEMMs (tp_comm_overlap), which
    ROLL does not, so the comparison prices the compute and the cp ring alone."""
    short = [k for k in NEMO_WITH_CP if k <= 64]
    s = np.array([k * 1024 for k in short], dtype=float)
    seconds = np.array([_nemo_flops_per_token(x) / (NEMO_WITH_CP[k][4] * 1e12) for k, x in zip(short, s)])
    (a, b), *_ = np.linalg.lstsq(np.vstack([np.ones_like(s), s]).T, seconds, rcond=None)
    linear = 6 * (LLAMA2_7B.active_params - input_embedding_params(LLAMA2_7B))  # pre-training: 6·P a token
    gemm_rate = linear / a
    attention_rate = 3 * 2 * LLAMA2_7B.heads * LLAMA2_7B.head_dim * LLAMA2_7B.layers / b  # causal: s²/2 pairs
    assert 0.2 < attention_rate / gemm_rate < 0.4  # flash attention well below the GEMMs (0.31)

    def per_token(k: int) -> tuple[float, float]:
        tp, pp, dp, cp, _ = NEMO_WITH_CP[k]
        gpus, seq = tp * pp * dp * cp, k * 1024
        trainer = _trainer(gpus=gpus, tp=tp, pp=pp, cp=cp, mfu=gemm_rate / (H100.tflops_bf16 * 1e12),
                           attention_efficiency=attention_rate / gemm_rate)
        link = tp_allreduce("H100", H100, cp, None, gpus, stride=tp) if cp > 1 else None
        c = TrainCost(LLAMA2_7B, H100, trainer, cp_link=link)
        lens = [seq] * dp * 64  # many micro-batches a rank: the pp-2 row's bubble 1/65
        exposed = c._cp_sequence_s(seq) if cp > 1 else 0.0
        return _compute_s(c, lens) * gpus / sum(lens), exposed

    base, _ = per_token(4)
    for k in (128, 256, 512, 1024):
        modelled, exposed = per_token(k)
        measured = (_nemo_flops_per_token(k * 1024) / NEMO_WITH_CP[k][4]) / (_nemo_flops_per_token(4096) / 768)
        assert modelled / base == pytest.approx(measured, rel=0.06), k
        assert exposed == 0.0, k


def test_the_ring_shows_where_the_attention_is_too_short_to_hide_it() -> None:
    """Qwen3-8B's 1K-token sequences at tp 4 on 64 H800: cp 4 rings span two HGX nodes and each step's
    keys and values outlast a 256-token chunk's attention, so the step is slower than at cp 1 on the same
    GPUs; at 128K tokens the attention hides the ring and the two are one step."""
    def step(cp: int, seq: int) -> float:
        return train_cost(QWEN8, H800, _trainer(tp=4, cp=cp), "H800").step_time([seq] * 64)

    assert step(4, 1024) > 1.4 * step(1, 1024)
    assert step(4, 131072) == pytest.approx(step(1, 131072), rel=0.01)


def test_each_sequence_hides_its_ring_behind_its_own_attention_only() -> None:
    """One rank (tp 4 · cp 4 on 16 H800) training fifteen 1K-token sequences and one of 128K: the long
    sequence's attention cannot hide the short ones' ring steps (they run as their own micro-batches), so
    the rank's time is the long one's plus the short ones' (helper-85: summed over the rank, the 128K
    sequence's attention hid the 1K ones' exposed 0.42 s)."""
    c = train_cost(QWEN8, H800, _trainer(gpus=16, tp=4, cp=4), "H800")
    fixed = c.step_time([]) + c.dp_sync_s  # the optimizer step (no compute: no sync either)
    shorts, long = [1024] * 15, [131072]
    assert c.step_time(shorts) - fixed > 1.3 * (train_cost(QWEN8, H800, _trainer(gpus=16, tp=4), "H800")
                                                 .step_time(shorts[:4]) - fixed)  # the ring shows at 1K
    assert c.step_time(shorts + long) - c.step_time(long) == pytest.approx(c.step_time(shorts) - fixed, rel=1e-9)


def test_cp_splits_the_tp_all_reduces_and_the_gradient_ring_keeps_dp_times_cp_members() -> None:
    """At the same GPUs and tp, cp 2 halves the data-parallel ranks and doubles a rank's GPUs: every GPU
    computes and all-reduces the same tokens as before, in twice the (half-length) micro-batches, so only the
    all-reduces' latency grows; its gradients sync over the same dp·cp ring."""
    lens = [32768] * 64
    one, two = (train_cost(QWEN8, H800, _trainer(tp=2, cp=cp), "H800") for cp in (1, 2))
    assert two.dp == one.dp // 2
    assert two.dp_sync_s == pytest.approx(one.dp_sync_s)
    per_micro_batch, _ = one._allreduce
    extra_calls = (64 // two.dp - 64 // one.dp) * QWEN8.layers  # a layer's calls for each extra micro-batch
    assert _compute_s(two, lens) - _compute_s(one, lens) == pytest.approx(extra_calls * per_micro_batch, rel=1e-6)
    assert "cp 2 ring attention on NVLink" in two.source


@settings(max_examples=40, deadline=None)
@given(cp=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2, 4]), seq=st.integers(256, 131072),
       n=st.integers(1, 200))
def test_cp_never_beats_the_compute_and_never_changes_the_flops(cp: int, tp: int, seq: int, n: int) -> None:
    """Whatever the layout, a step is at least its compute (the FLOPs at the modelled rates over the
    trainer's GPUs, the busiest rank's share) and the ring only adds to it."""
    t = _trainer(gpus=64, tp=tp, cp=cp)
    c = train_cost(QWEN8, H800, t, "H800")
    lens = [seq] * n
    bare = TrainCost(QWEN8, H800, t)  # no links: the compute alone
    assert _compute_s(c, lens) >= _compute_s(bare, lens) * (1 - 1e-12)
    per_token = LINEAR_FLOPS_PER_PARAM_TOKEN * (QWEN8.active_params - input_embedding_params(QWEN8))
    attention = ATTENTION_PASSES * 2 * QWEN8.heads * QWEN8.head_dim * QWEN8.layers * seq * seq
    assert c.busiest_rank_flops(lens) == pytest.approx(
        (per_token * seq + attention) * -(-n // c.dp), rel=1e-9)


# ---------------------------------------------------------------- plan checks


def test_the_trainer_must_be_whole_ranks_of_tp_cp_pp(tmp_path) -> None:
    from tests.test_cli import assert_clean_usage_error, rollart

    proc = rollart("simulate", "paper/qwen3-8b-128gpu", "--steps", "1", "--set", "placement.trainer.cp=3",
                   cwd=tmp_path)
    assert_clean_usage_error(proc, "placement.trainer.gpus", "not a multiple of tp × cp × pp = 6")


def test_the_planner_splits_a_context_too_long_for_the_scenarios_trainer() -> None:
    """The default scenario's trainer (tp 2) cannot hold a 128K-token FrozenLake sequence on an H800: the
    plan's space splits each sequence over the narrowest cp some trainer size holds, says so, and sizes the
    trainer in whole tp·cp·pp ranks; the scenario's own window needs none."""
    from rollart.plan import load_plan
    from rollart.planner import Budget, Space
    from rollart.scenarios_catalog import default_scenario

    plain = Space.from_plan(load_plan(default_scenario(), []), Budget(gpus=64), step=8, tps=[1])
    assert plain.trainer_overrides == [] and plain.trainer_notes == []
    plan = load_plan(default_scenario(), ["tasks.FrozenLake.max_context_tokens=131072"])
    space = Space.from_plan(plan, Budget(gpus=64), step=8, tps=[1])
    [override] = space.trainer_overrides
    cp = int(override.removeprefix("placement.trainer.cp="))
    tr = plan.placement.trainer
    sheet = plan.cluster.gpu_type(plan.cluster.gpu_pools[tr.pool].gpu)
    assert trainer_fits(QWEN8, sheet, tr.model_copy(update={"cp": cp, "gpus": space.trainer_gpus[0]}), 131072)
    assert not any(trainer_fits(QWEN8, sheet, tr.model_copy(update={"cp": cp // 2, "gpus": n}), 131072)
                   for n in range(cp // 2, 57, cp // 2))
    assert all(n % (tr.tp * cp * tr.pp) == 0 for n in space.trainer_gpus)
    assert f"splits each sequence over {cp} GPUs" in space.trainer_notes[0]


def test_plan_writes_the_cp_it_needed_and_says_why(tmp_path) -> None:
    from tests.test_planner import _small_plan_run

    out = tmp_path / "plan.yaml"
    res = _small_plan_run(out, "--confirm-seeds", "1", "--set", "tasks.FrozenLake.max_context_tokens=131072",
                          "--budget-gpus", "24")
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "trainer cp 2: the scenario's tp 2 · pp 1 · cp 1 holds no 131,072-token sequence on H800" in said
    assert "(H800, tp 2, cp 2, pp 1)" in said
    from rollart.plan import load_plan

    assert load_plan(out).placement.trainer.cp == 2
