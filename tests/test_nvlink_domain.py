"""The NVLink domain is a property of the GPU type (``GpuType.nvlink_domain``), not a constant.

An HGX board puts 8 GPUs on one NVSwitch; a GB200/GB300 NVL72 rack puts 72 (NVIDIA's GB200 NVL72
datasheet: 72 Blackwell GPUs, 1.8 TB/s of NVLink 5 per GPU, 130 TB/s in all). A tensor-, expert- or
data-parallel group that fits in one domain talks over NVLink; a wider one crosses the cluster's
network at every domain boundary. Every preset is an HGX board, so its figures do not move
(``tests/test_golden.py``); these tests pin what a wider domain changes and what it must not.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollart.calibration import ep_all_to_all, generation_cost, tp_allreduce, train_cost
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, Link, ModelSpec, TrainerPlacement
from rollart.sim.costs.moe import all_to_all_s, ring_link
from rollart.sim.costs.train import trainer_ep, trainer_memory_gib

QWEN_MOE = ModelSpec.model_validate("Qwen3-30B-A3B")  # 128 experts, 8 active
DSV3 = ModelSpec.model_validate("DeepSeek-V3")  # 256 experts, MLA, dense first layers
GB200 = {"tflops_bf16": 2250, "hbm_tbps": 8, "memory_gb": 186, "nvlink_gbps": 1800, "tflops_fp8": 4500}
LENS = [1500 + 131 * i for i in range(128)]  # a GRPO batch's sequence lengths


def h100(domain: int) -> GpuType:
    """H100's datasheet (so its shipped kernel profile prices the kernels) on a domain of ``domain`` GPUs."""
    return GpuType(**{**GPU_PRESETS["H100"], "nvlink_domain": domain})


def test_presets_are_hgx_boards() -> None:
    """H800, H20, H100, H200 and A100 ship as 8-GPU HGX boards, and a type that says nothing is one too."""
    assert {name: sheet["nvlink_domain"] for name, sheet in GPU_PRESETS.items()} == dict.fromkeys(GPU_PRESETS, 8)
    assert GpuType(tflops_bf16=1, hbm_tbps=1, memory_gb=1).nvlink_domain == 8


@pytest.mark.parametrize("bad", [0, -8])
def test_schema_rejects_an_empty_domain(bad: int) -> None:
    """A domain holds at least the GPU itself: 0 or fewer GPUs is a plan error naming the field."""
    with pytest.raises(ValidationError, match="nvlink_domain"):
        GpuType(tflops_bf16=1, hbm_tbps=1, memory_gb=1, nvlink_domain=bad)


def _rollart(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "rollart"
    exe = str(exe) if exe.is_file() else shutil.which("rollart")
    if exe is None:  # pragma: no cover - the package is installed editable in the venv
        pytest.skip("the rollart console script is not installed")
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_cli_rejects_a_zero_domain_in_one_line(tmp_path: Path) -> None:
    proc = _rollart("simulate", "--set",
                    "cluster.custom_gpus.X={tflops_bf16: 1, hbm_tbps: 1, memory_gb: 1, nvlink_domain: 0}", cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cluster.custom_gpus.X.nvlink_domain" in lines[0] and "greater than 0" in lines[0]


def test_wide_groups_ride_nvlink_inside_a_wide_domain() -> None:
    """On an NVL72-class type, a 16-GPU tensor-parallel ring and a 32-rank expert-parallel all-to-all
    stay on NVLink (the GPU's NCCL fit), so they beat the same GPU on 8-GPU boards, whose groups cross
    the cluster's network (InfiniBand: about a tenth of NVLink's rate) at every board."""
    hgx, nvl = h100(8), h100(72)
    for n in (16, 32, 64, 72):
        a8, b8, w8 = tp_allreduce("H100", hgx, n)
        a72, b72, w72 = tp_allreduce("H100", nvl, n)
        assert b72 > 5 * b8 and a72 <= a8, n
        assert "InfiniBand" in w8 and w72.startswith("NVLink") and "inside the 72-GPU NVLink domain" in w72
    assert tp_allreduce("H100", nvl, 73)[1] == tp_allreduce("H100", hgx, 16)[1]  # past the rack: the network again
    nv, net = ep_all_to_all("H100", nvl)
    assert nv[:2] == ep_all_to_all("H100", hgx)[0][:2]  # the same NVLink, only more GPUs on it
    link = (nv[1], nv[0], net[1], net[0])
    for ep in (16, 32, 64):
        # a decode batch of 64 sequences a rank (latency-bound: NVLink's α is most of it), a 4K-token prefill
        # chunk a rank (bandwidth-bound: all the bytes at NVLink's 352 GB/s instead of the half or more that
        # leave an 8-GPU board at InfiniBand's 36 GB/s: about 5× faster)
        for per_rank, gain in ((64.0, 1.0), (4096.0, 0.25)):
            assert all_to_all_s(QWEN_MOE, per_rank * ep, ep, ep, *link, domain=72) < gain * all_to_all_s(
                QWEN_MOE, per_rank * ep, ep, ep, *link, domain=8), (ep, per_rank)
    # the generation engines (kernel profile and datasheet roofline) price the same way
    for profile in (None, "datasheet"):
        for tp, ep in ((16, 1), (16, 16), (32, 32)):
            on8 = generation_cost(DSV3, "H100", h100(8), tp, profile, ep)
            on72 = generation_cost(DSV3, "H100", h100(72), tp, profile, ep)
            assert on72.prefill_time(4096, 4096**2 / 2, 1) < on8.prefill_time(4096, 4096**2 / 2, 1), (profile, tp, ep)


def test_groups_inside_eight_gpus_price_the_same() -> None:
    """A group of at most 8 GPUs is on NVLink in either domain: a wider rack changes nothing for it."""
    hgx, nvl = h100(8), h100(72)
    for n in (1, 2, 4, 8):
        assert tp_allreduce("H100", nvl, n) == tp_allreduce("H100", hgx, n)
    for profile in (None, "datasheet"):
        for tp, ep in ((1, 1), (4, 1), (8, 1), (8, 8), (8, 2)):
            on8 = generation_cost(QWEN_MOE, "H100", hgx, tp, profile, ep)
            on72 = generation_cost(QWEN_MOE, "H100", nvl, tp, profile, ep)
            assert on72.decode_line(64) == on8.decode_line(64)
            assert on72.prefill_time(2048, 2048**2 / 2, 1) == on8.prefill_time(2048, 2048**2 / 2, 1)
    for tr in (TrainerPlacement(pool="p", gpus=8, tp=2), TrainerPlacement(pool="p", gpus=8, tp=1, ep=8)):
        assert train_cost(QWEN_MOE, nvl, tr, "H100").step_time(LENS) == train_cost(QWEN_MOE, hgx, tr, "H100").step_time(LENS)


def test_trainer_ep_default_widens_with_the_domain() -> None:
    """By default a MoE trainer spreads its experts over the widest group inside one NVLink domain:
    a 128-expert model on 64 GPUs takes ep 8 on HGX boards and all 64 in an NVL72 rack, where that
    all-to-all is still NVLink; each GPU then holds 1/64 of the experts instead of 1/8."""
    tr = TrainerPlacement(pool="p", gpus=64, tp=1)
    assert trainer_ep(QWEN_MOE, tr, 8) == trainer_ep(QWEN_MOE, tr) == 8
    assert trainer_ep(QWEN_MOE, tr, 72) == 64
    assert trainer_ep(QWEN_MOE, tr, 16) == 16
    assert trainer_ep(QWEN_MOE, tr.model_copy(update={"ep": 4}), 72) == 4  # an explicit ep is kept
    assert trainer_memory_gib(QWEN_MOE, tr, 0, 72) < trainer_memory_gib(QWEN_MOE, tr, 0, 8)
    wide = train_cost(QWEN_MOE, h100(72), tr, "H100")
    assert wide.ep == 64 and "ep 64 all-to-alls on NVLink" in wide.source and "InfiniBand" not in wide.source
    assert wide.step_time(LENS) < train_cost(QWEN_MOE, h100(8), tr, "H100").step_time(LENS)


def test_partial_last_domain_prices_groups_by_whether_they_fit() -> None:
    """A pool need not be a whole number of racks: a 64-GPU group fits one 72-GPU domain, an 80-GPU one
    does not and crosses the network, whatever the pool's count."""
    nvl = h100(72)
    assert "NVLink" in tp_allreduce("H100", nvl, 64)[2]
    assert "InfiniBand" in tp_allreduce("H100", nvl, 80)[2] and "crossing 72-GPU NVLink domains" in tp_allreduce(
        "H100", nvl, 80)[2]


def test_a_wider_domain_never_makes_anything_slower() -> None:
    """More GPUs on NVLink only takes traffic off the slower network, so no collective, engine step or
    training step gets slower as the domain grows (1 → 8 → 16 → 72), given a network no quicker to start
    than NVLink (here 30 µs against the NVLink fit's α of 29.7 µs). With a network whose α is below
    NVLink's fitted one (the InfiniBand fit's 19.8 µs: a point-to-point latency, where NVLink's α is an
    8-GPU ring all-reduce's), an HGX all-to-all of a few hundred KB hides the bytes it sends off the board
    in that latency gap, and a domain that keeps them on NVLink pays their NVLink time instead; this test
    does not claim monotonicity there (measured: at most +1 % of a decode step's fixed part, Qwen3-235B at
    tp 16 · ep 4 behind a 400 Gb/s NIC)."""
    network = Link(kind="ib", bandwidth_gbps=400, latency_us=30)
    nv, net = ep_all_to_all("H100", h100(8), network)
    link = (nv[1], nv[0], net[1], net[0])
    domains = (1, 8, 16, 72)
    for ep in (2, 4, 8, 16, 32, 64):
        for rank_tp in (1, 2, 4):
            for tokens in (1.0, 64.0, 4096.0, 65536.0):
                times = [all_to_all_s(DSV3, tokens * ep, ep, ep * rank_tp, *link, domain=d) for d in domains]
                assert times == sorted(times, reverse=True), (ep, rank_tp, tokens, times)
    for n in (2, 8, 16, 64, 128):
        paces = [ring_link(n, link[:2], link[2:], d) for d in domains]
        assert [p[0] for p in paces] == sorted(p[0] for p in paces) and \
            [p[1] for p in paces] == sorted((p[1] for p in paces), reverse=True)
    for tp, ep in ((16, 1), (16, 16), (32, 32), (32, 8)):
        lines = [generation_cost(DSV3, "H100", h100(d), tp, None, ep, network) for d in domains]
        for batch in (1, 32, 256):
            decode = [c.decode_line(batch).total(batch * 8192.0, batch, 1) for c in lines]
            assert decode == sorted(decode, reverse=True), (tp, ep, batch, decode)
        prefill = [c.prefill_time(8192, 8192**2 / 2, 1) for c in lines]
        assert prefill == sorted(prefill, reverse=True)
    for tr in (TrainerPlacement(pool="p", gpus=64, tp=2), TrainerPlacement(pool="p", gpus=64, tp=1, ep=32),
               TrainerPlacement(pool="p", gpus=128, tp=16), TrainerPlacement(pool="p", gpus=64, tp=1)):
        steps = [train_cost(QWEN_MOE, h100(d), tr, "H100", network).step_time(LENS) for d in domains]
        assert steps == sorted(steps, reverse=True), (tr, steps)


def test_simulate_a_gb200_nvl72_pool_end_to_end(tmp_path: Path) -> None:
    """`rollart simulate` with a GB200-like type (NVL72: 72 GPUs on NVLink 5 at 1.8 TB/s each) for the
    trainer and an ep-16 engine runs, prices the 64-GPU trainer's all-to-all and gradient ring on NVLink
    and reports finite step times."""
    sheet = "{" + ", ".join(f"{k}: {v}" for k, v in {**GB200, "nvlink_domain": 72}.items()) + "}"
    out = tmp_path / "gb200.json"
    proc = _rollart("simulate", "paper/experiments/pd-disaggregation-swe-moe", "-q", "--steps", "1",
                    "--set", "algorithm.batch_size=16", "--set", f"cluster.custom_gpus.GB200={sheet}",
                    "--set", "cluster.gpu_pools.h800.gpu=GB200", "--set", "cluster.gpu_pools.train.gpu=GB200",
                    "--set", "cluster.gpu_pools.train.count=64", "--set", "placement.trainer.gpus=64",
                    "--set", "placement.generation=[{pool: h800, workers: 1, tp: 16, ep: 16}]",
                    "--json", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["steps"] and all(math.isfinite(s["time_s"]) and s["time_s"] > 0 for s in result["steps"])
    trainer = result["calibration"]["trainer"]
    assert "ep 64 all-to-alls on NVLink" in trainer and "inside the 72-GPU NVLink domain" in trainer
    assert "crossing" not in trainer
