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
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rollart.calibration import ep_all_to_all, generation_cost, tp_allreduce, train_cost
from rollart.calibration.links import default_network, effective_bytes_per_s
from rollart.core import mode_config
from rollart.plan.loader import load_plan
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, Link, ModelSpec, TrainerPlacement
from rollart.scenarios_catalog import resolve
from rollart.sim import SimBackend
from rollart.sim.costs.link import WeightTransferCost, all_gather_s
from rollart.sim.costs.moe import all_to_all_s, effective_domain, ring_link, worker_domain
from rollart.sim.costs.train import trainer_ep, trainer_memory_gib

QWEN_MOE = ModelSpec.model_validate("Qwen3-30B-A3B")  # 128 experts, 8 active
QWEN_235B = ModelSpec.model_validate("Qwen3-235B-A22B")  # 128 experts, 8 active
DSV3 = ModelSpec.model_validate("DeepSeek-V3")  # 256 experts, MLA, dense first layers
GPU_PRESETS_H800 = GpuType(**GPU_PRESETS["H800"])
GB200 = {"tflops_bf16": 2250, "hbm_tbps": 8, "memory_gb": 186, "nvlink_gbps": 1800, "tflops_fp8": 4500}
LENS = [1500 + 131 * i for i in range(128)]  # a GRPO batch's sequence lengths


def h100(domain: int) -> GpuType:
    """H100's datasheet (so its shipped kernel profile prices the kernels) on a domain of ``domain`` GPUs."""
    return GpuType(**{**GPU_PRESETS["H100"], "nvlink_domain": domain})


def test_presets_are_hgx_boards_but_the_nvl72_rack() -> None:
    """H800, H20, H100, H200, A100 and B200 ship as 8-GPU HGX boards, GB200 as a 72-GPU NVL72 rack, and a type
    that says nothing is an 8-GPU board."""
    assert {name: sheet["nvlink_domain"] for name, sheet in GPU_PRESETS.items()} == {
        **dict.fromkeys(GPU_PRESETS, 8), "GB200": 72}
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
    the cluster's network at every board: each GPU through its own InfiniBand port (~36 GB/s), 8 a
    board, 289 GB/s under the H100's 352 GB/s of NVLink, at the network's latency."""
    from rollart.calibration.links import default_network

    hgx, nvl = h100(8), h100(72)
    for n in (16, 32, 64, 72):
        a8, b8, w8 = tp_allreduce("H100", hgx, n)
        a72, b72, w72 = tp_allreduce("H100", nvl, n)
        assert b72 > b8 == pytest.approx(8 * default_network()[0]) and a72 <= a8, n
        assert "InfiniBand" in w8 and w72.startswith("NVLink") and "inside the 72-GPU NVLink domain" in w72
    past = tp_allreduce("H100", nvl, 73)  # past the rack: the network again, through the 73rd GPU's one port
    assert "InfiniBand" in past[2] and past[1] == pytest.approx(default_network()[0])
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
    # the wider group buys memory, not time: its all-to-all reaches 64 ranks (~1 % dearer here than ep 8 on
    # boards, whose data-parallel rings cross through 8 ports a board); at ep 8 the rack is the faster
    at8 = tr.model_copy(update={"ep": 8})
    assert train_cost(QWEN_MOE, h100(72), at8, "H100").step_time(LENS) < train_cost(
        QWEN_MOE, h100(8), at8, "H100").step_time(LENS)
    assert wide.step_time(LENS) < 1.02 * train_cost(QWEN_MOE, h100(8), tr, "H100").step_time(LENS)


def test_partial_last_domain_prices_groups_by_whether_they_fit() -> None:
    """A pool need not be a whole number of racks: a 64-GPU group fits one 72-GPU domain, an 80-GPU one
    does not and crosses the network, whatever the pool's count."""
    nvl = h100(72)
    assert "NVLink" in tp_allreduce("H100", nvl, 64)[2]
    assert "InfiniBand" in tp_allreduce("H100", nvl, 80)[2] and "crossing 72-GPU NVLink domains" in tp_allreduce(
        "H100", nvl, 80)[2]


def test_a_wider_domain_never_makes_anything_slower() -> None:
    """More GPUs on NVLink only takes traffic off the slower network, so no collective, engine step or
    training step gets slower as the domain grows, given a network no quicker to start than NVLink (here
    30 µs against the NVLink fit's α of 29.7 µs) nor faster (400 Gb/s). A single collective or worker
    keeps this over 1 → 8 → 16 → 72. Groups laid out over many GPUs keep it along domains that are
    multiples of each other (1 → 8 → 16 → 64, 8 → 72: a power-of-two group cut by the wider domain's
    boundaries keeps pieces of at least the narrower domain). A wider domain that is not a multiple of the
    narrower one can be slower: its boundaries cut groups the narrower one kept whole
    (:func:`test_straddling_is_why_a_non_multiple_domain_can_be_slower`).

    Not claimed, and measured in calibration/CHANGES.md (session 47): with the InfiniBand fit's α of
    19.8 µs (a point-to-point latency; NVLink's is an 8-GPU ring all-reduce's) an all-to-all of a few
    hundred KB hides its off-board bytes in that gap, so keeping them on NVLink reads up to +0.8 % of a
    decode step; and a network as fast per GPU as NVLink's fit adds its bandwidth to NVLink's while
    some peers sit outside the domain."""
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
    for chain in ((1, 8, 16, 64), (1, 8, 72)):
        for tr in (TrainerPlacement(pool="p", gpus=64, tp=2), TrainerPlacement(pool="p", gpus=64, tp=1, ep=32),
                   TrainerPlacement(pool="p", gpus=128, tp=16), TrainerPlacement(pool="p", gpus=64, tp=1),
                   TrainerPlacement(pool="p", gpus=144, tp=2, ep=16), TrainerPlacement(pool="p", gpus=128, tp=1),
                   TrainerPlacement(pool="p", gpus=128, tp=2, ep=64)):
            # at one ep: the default widens with the domain (memory), which may cost all-to-all time
            tr = tr if tr.ep else tr.model_copy(update={"ep": trainer_ep(QWEN_MOE, tr, chain[1])})
            steps = [train_cost(QWEN_MOE, h100(d), tr, "H100", network).step_time(LENS) for d in chain]
            assert steps == sorted(steps, reverse=True), (chain, tr, steps)
        for tp, ep, gpus in ((32, 32, 128), (16, 16, 144), (32, 1, 128)):  # the worst worker of each layout
            lines = [generation_cost(DSV3, "H100", h100(d), tp, None, ep, network,
                                     domain=effective_domain(tp, gpus, d)) for d in chain]
            prefill = [c.prefill_time(8192, 8192**2 / 2, 1) for c in lines]
            assert prefill == sorted(prefill, reverse=True), (chain, tp, ep, gpus, prefill)


def test_crossing_a_domain_adds_the_networks_latency_to_nvlinks() -> None:
    """A ring across NVLink domains still makes its NVLink hops, and its network hops add their latency on
    the same dependent chain (NCCL's tuning model sums intra- and inter-node steps), so it never has lower
    latency than a ring inside one domain, and it pays the network's too. With the larger of the two, the
    NVLink all-reduce's 29.7 µs hid InfiniBand's 19.8 µs: Qwen3-235B-A22B at tp 16, batch 1, priced 13.62 ms
    across two HGX B200 boards against 13.60 inside a GB200 NVL72 rack."""
    for nvlink in ((1e11, 1e-6), (7e11, 3e-5)):
        for network in ((3.6e10, 2e-5), (1e10, 5e-5), (1e12, 0.0)):
            for gpus, domain in ((16, 8), (32, 8), (64, 36), (16, 4)):
                rate, latency = ring_link(gpus, nvlink, network, domain)
                assert latency == pytest.approx(nvlink[1] + network[1]) and rate <= nvlink[0]
                assert latency >= ring_link(gpus, nvlink, network, gpus)[1]  # the same ring inside one domain
    ib = default_network()
    # the trainer's tp-16 all-reduce: two HGX H100 boards against one rack of the same GPUs
    across, inside = tp_allreduce("H100", h100(8), 16), tp_allreduce("H100", h100(72), 16)
    assert across[0] == pytest.approx(inside[0] + ib[1])
    # the generation engines, equal GPUs (B200's datasheet and kernel profile) on 8- or 72-GPU domains
    b200 = {d: GpuType(**{**GPU_PRESETS["B200"], "nvlink_domain": d}) for d in (8, 72)}
    for batch in (1, 64):
        hgx, rack = (generation_cost(QWEN_235B, "B200", b200[d], 16).decode_line(batch).total(2048.0 * batch, batch, 1)
                     for d in (8, 72))
        # two all-reduces a layer, each paying InfiniBand's latency on top (and its bandwidth)
        assert hgx > rack + 2 * QWEN_235B.layers * ib[1], (batch, hgx, rack)


def test_straddling_is_why_a_non_multiple_domain_can_be_slower() -> None:
    """16-GPU domains hold a tp-16 trainer's groups whole; 72-GPU racks cut the one on GPUs 64–79 in two,
    so that ring crosses the network and the step waits for it: as slow as on 8-GPU boards."""
    network = Link(kind="tcp", bandwidth_gbps=100, latency_us=30)  # 8 ports a board stay under NVLink
    ring = {d: tp_allreduce("H100", h100(d), 16, network, 128) for d in (8, 16, 72)}
    assert ring[16][1] > ring[72][1] == ring[8][1] and ring[16][0] < ring[72][0] == ring[8][0]
    assert "straddling" in ring[72][2] and ring[16][2].startswith("NVLink")


# ---------------------------------------------------------------- groups straddling domain boundaries


def _pieces_brute_force(group: int, total: int, domain: int) -> int:
    """The fewest GPUs of a straddling group in one domain, by laying every GPU out; ``domain`` if none
    straddles or a group holds whole domains only."""
    smallest = domain
    for start in range(0, total // group * group, group):
        counts: dict[int, int] = {}
        for gpu in range(start, start + group):
            counts[gpu // domain] = counts.get(gpu // domain, 0) + 1
        if len(counts) > 1:
            smallest = min(smallest, *counts.values())
    return smallest


def test_effective_domain_cases() -> None:
    """Groups of consecutive GPUs from a domain boundary: the worst group's smallest piece on one side of a
    boundary, or the domain where none is cut unevenly."""
    for domain in (8, 72):
        for group in (d for d in range(1, domain + 1) if domain % d == 0):  # tiling groups: unchanged
            for total in (domain // 2 or 1, domain, 2 * domain, 5 * domain + 3):
                assert effective_domain(group, total, domain) == domain, (group, total, domain)
    assert effective_domain(16, 128, 8) == effective_domain(64, 256, 8) == 8  # whole boards
    assert effective_domain(16, 144, 72) == 8  # GPUs 64–79: 8 in each rack
    assert effective_domain(64, 128, 72) == 8  # GPUs 64–127: 64–71 in the first rack
    assert effective_domain(32, 128, 72) == 8  # GPUs 64–95: 64–71 in the first rack
    assert effective_domain(32, 64, 72) == effective_domain(64, 72, 72) == 72  # one rack holds them all
    assert effective_domain(16, 72, 72) == 72 and effective_domain(1, 1000, 72) == 72
    assert effective_domain(144, 288, 72) == 72  # two whole racks a group
    assert effective_domain(128, 256, 72) == 16  # GPUs 128–255: 128–143 in the second rack
    assert effective_domain(64, 128, 36) == 8  # wider than a domain, cut unevenly: GPUs 64–71
    assert effective_domain(32, 256, 36) == 4  # GPUs 32–63: 32–35 in the first domain
    assert effective_domain(6, 16, 8) == 2  # GPUs 6–11: 6, 7 on the first board
    assert effective_domain(48, 40, 72) == 72  # no whole group: nothing to price


@settings(max_examples=400, deadline=None)
@given(group=st.integers(1, 160), total=st.integers(1, 600), domain=st.integers(1, 160))
def test_effective_domain_property(group: int, total: int, domain: int) -> None:
    eff = effective_domain(group, total, domain)
    assert 1 <= eff <= domain
    if domain % group == 0 or total <= domain or group % domain == 0:
        assert eff == domain
    assert eff == _pieces_brute_force(group, total, domain)
    # the worst of the layout's workers, each on its own
    assert eff == min([domain, *(worker_domain(i * group, group, domain) for i in range(total // group))])


def test_trainer_ep_group_straddling_two_racks_pays_the_network() -> None:
    """ep 16 on 144 GPUs of 72-GPU racks: the group on GPUs 64–79 has 8 GPUs in each, so its all-to-all
    sends 8/15 of its traffic over the network, as on 8-GPU boards, and the step waits for it: dearer
    than ep 8 (whole groups) on the same racks or ep 16 in one 144-GPU domain."""
    network = Link(kind="ib", bandwidth_gbps=400)
    gb = {d: GpuType(**GB200, nvlink_domain=d) for d in (8, 72, 144)}
    ep16 = TrainerPlacement(pool="p", gpus=144, tp=2, mfu=0.125, ep=16)
    ep8 = ep16.model_copy(update={"ep": 8})
    step = {d: train_cost(QWEN_MOE, gb[d], ep16, "GB200", network) for d in gb}
    assert step[72].step_time(LENS) > train_cost(QWEN_MOE, gb[72], ep8, "GB200", network).step_time(LENS)
    assert step[72].step_time(LENS) > step[144].step_time(LENS)
    assert "straddle 72-GPU NVLink domains: as few as 8" in step[72].source
    assert "straddle" not in step[144].source
    # the tensor-parallel ring and the weight gather follow the same layout
    assert "straddling 72-GPU NVLink domains" in tp_allreduce("GB200", gb[72], 16, network, 144)[2]
    assert tp_allreduce("GB200", gb[72], 16, network, 64)[2].startswith("NVLink")
    assert tp_allreduce("GB200", gb[72], 16, network, 144)[1] == tp_allreduce("GB200", gb[8], 16, network)[1]
    assert all_gather_s(1e9, 16, "GB200", gb[72], network, 144) > all_gather_s(1e9, 16, "GB200", gb[72], network, 64)


def test_default_trainer_ep_does_not_straddle() -> None:
    """By default the trainer takes the widest ep whose groups fit the domain without straddling a boundary:
    on 128 GPUs of 72-GPU racks ep 64, 32 and 16 all straddle GPU 72, so ep 8; on 64 GPUs (one rack) 64."""
    tr = TrainerPlacement(pool="p", gpus=128, tp=1)
    assert trainer_ep(QWEN_MOE, tr, 72) == 8 and effective_domain(8, 128, 72) == 72
    assert trainer_ep(QWEN_MOE, tr.model_copy(update={"gpus": 144}), 72) == 8
    assert trainer_ep(QWEN_MOE, tr.model_copy(update={"gpus": 64}), 72) == 64
    assert trainer_ep(QWEN_MOE, tr.model_copy(update={"gpus": 256}), 64) == 64  # whole domains: unchanged
    for gpus in (8, 16, 64, 128, 256):  # HGX boards: as before
        assert trainer_ep(QWEN_MOE, tr.model_copy(update={"gpus": gpus}), 8) == 8
    cost = train_cost(QWEN_MOE, GpuType(**GB200, nvlink_domain=72), tr, "GB200")
    assert cost.ep == 8 and "straddle" not in cost.source


def _engine_backend(workers: int, tp: int, count: int, domain: int, scale_approx: int = 1) -> SimBackend:
    sheet = "{" + ", ".join(f"{k}: {v}" for k, v in {**GB200, "nvlink_domain": domain}.items()) + "}"
    plan = load_plan(resolve("paper/experiments/pd-disaggregation-swe-moe"), [
        "model=Qwen3-235B-A22B", f"cluster.custom_gpus.GB200={sheet}", "cluster.gpu_pools.train.gpu=GB200",
        "cluster.gpu_pools.train.count=128", "placement.trainer.gpus=128", "placement.trainer.ep=32",
        "cluster.gpu_pools.h800.gpu=GB200", f"cluster.gpu_pools.h800.count={count}",
        f"placement.generation=[{{pool: h800, workers: {workers}, tp: {tp}, ep: {tp}}}]"])
    return SimBackend(plan, mode_config(plan), 0, scale_approx=scale_approx)


def test_engines_straddling_a_rack_are_priced_across_the_network() -> None:
    """4 workers of tp 32 · ep 32 on 128 GPUs of 72-GPU racks (tp consecutive GPUs each from the pool's
    first rack): the third, on GPUs 64–95, has 8 GPUs in the first rack, so its TP ring and EP all-to-all
    cross the network, as dear as on 8-GPU boards; the other three, and 2 workers on 64 GPUs, stay on NVLink."""
    wide, one_rack = _engine_backend(4, 32, 128, 72), _engine_backend(2, 32, 64, 72)
    boards = _engine_backend(4, 32, 128, 8)
    assert [worker_domain(i * 32, 32, 72) for i in range(4)] == [72, 72, 8, 72]

    def prefill(backend: SimBackend, worker: int) -> float:
        return backend.engines[worker].cost.prefill_time(8192, 8192**2 / 2, 1)

    assert prefill(wide, 2) > 3 * prefill(one_rack, 0) and prefill(wide, 2) == prefill(boards, 2)
    assert prefill(wide, 0) == prefill(wide, 1) == prefill(wide, 3) == prefill(one_rack, 0) == prefill(one_rack, 1)
    assert wide.engines[0].cost is wide.engines[3].cost  # one cost model per group and piece
    assert "a tp-32 worker straddling 72-GPU NVLink domains (as few as 8" in wide.engines[2].cost.source
    assert "straddling" in wide.cost_sources["GB200"]  # the report flags it
    assert "straddling" not in one_rack.cost_sources["GB200"] and "straddling" not in boards.cost_sources["GB200"]
    # --scale-approx simulates 2 of the 4 and cannot say which: both at the group's worst, conservatively
    half = _engine_backend(4, 32, 128, 72, scale_approx=2)
    assert len(half.engines) == 2 and all(prefill(half, i) == prefill(boards, 2) for i in (0, 1))
    # the cost model alone: the third worker's domain, from either model
    for profile in (None, "datasheet"):
        nvl = GpuType(**GB200, nvlink_domain=72)
        alone = generation_cost(QWEN_235B, "GB200", nvl, 32, profile, 32)
        rack = generation_cost(QWEN_235B, "GB200", nvl, 32, profile, 32, domain=72)
        assert rack.decode_line(64) == alone.decode_line(64)
        assert generation_cost(QWEN_235B, "GB200", nvl, 32, profile, 32, domain=8).prefill_time(
            8192, 8192**2 / 2, 1) > alone.prefill_time(8192, 8192**2 / 2, 1)


def _broadcast(overrides: list[str]) -> WeightTransferCost:
    return WeightTransferCost(load_plan(resolve("default"), ["weight_sync.transport=nccl_broadcast",
                                                             "placement.hw_affinity={default: h800}", *overrides]))


def test_a_broadcast_inside_one_nvlink_domain_rides_nvlink() -> None:
    """NCCL broadcasts the new weights over the fastest path every hop has: when the trainer and every engine
    share one pool and its GPUs in use fit one NVLink domain, that is NVLink at the bus rate of a ring
    that size (a broadcast's bus rate is its algorithm rate); one engine beyond the domain, or on another
    pool, and the ring's slowest hop is the network, priced as before."""
    board = _broadcast(["cluster.gpu_pools.h800.count=8", "placement.trainer.gpus=4",
                        "placement.generation=[{pool: h800, workers: 4, tp: 1}]"])
    two_boards = _broadcast(["cluster.gpu_pools.h800.count=16", "placement.trainer.gpus=8",
                             "placement.generation=[{pool: h800, workers: 8, tp: 1}]"])
    latency, rate, _ = tp_allreduce("H800", GPU_PRESETS_H800, 8)
    assert board.nvlink_broadcast == (latency, rate) and two_boards.nvlink_broadcast is None
    wire = board.broadcast_s() - board.gather_s - board.convert_s
    assert wire == pytest.approx(latency + board.weight_bytes / rate)
    ib = two_boards.cross
    assert two_boards.broadcast_s() - two_boards.gather_s - two_boards.convert_s == pytest.approx(
        ib.latency_s + two_boards.weight_bytes / effective_bytes_per_s(ib))
    assert rate > effective_bytes_per_s(ib)  # so one board's broadcast is the quicker
    # the default plan's H20 engines sit on another pool: the ring crosses the network, as before
    assert _broadcast([]).nvlink_broadcast is None
    # the bucketed store stages through host memory either way: the domain does not change it
    assert board.publish_pull_s() == pytest.approx(_broadcast([
        "cluster.gpu_pools.h800.count=8", "placement.trainer.gpus=4", "weight_sync.transport=bucketed_store",
        "placement.generation=[{pool: h800, workers: 4, tp: 1}]"]).publish_pull_s())
    # a 72-GPU rack holds 32 train + 40 rollout GPUs, not 64 + 16
    sheet = "{" + ", ".join(f"{k}: {v}" for k, v in {**GB200, "nvlink_domain": 72}.items()) + "}"
    rack = [f"cluster.custom_gpus.GB200={sheet}", "cluster.gpu_pools.h800.gpu=GB200"]
    assert _broadcast([*rack, "cluster.gpu_pools.h800.count=72", "placement.trainer.gpus=32",
                       "placement.generation=[{pool: h800, workers: 40, tp: 1}]"]).nvlink_broadcast is not None
    assert _broadcast([*rack, "cluster.gpu_pools.h800.count=80", "placement.trainer.gpus=64",
                       "placement.generation=[{pool: h800, workers: 16, tp: 1}]"]).nvlink_broadcast is None


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


def test_a_rank_straddling_two_boards_cannot_use_the_engines_peer_to_peer_all_reduce() -> None:
    """vLLM's custom all-reduce needs peer-to-peer access among all a rank's GPUs, so a tp-6 worker on GPUs
    6–11 of two 8-GPU boards runs NCCL across the network; the model had kept the P2P kernel's price for it
    (helper-80: 666.5 µs a decode step, the same as one inside a board)."""
    m = ModelSpec.model_validate("Qwen3-8B")
    h800 = GpuType(**GPU_PRESETS["H800"])
    inside = generation_cost(m, "H800", h800, 6, None, 1, domain=8)
    straddling = generation_cost(m, "H800", h800, 6, None, 1, domain=2)  # 2 of its GPUs on one board
    assert straddling.decode_line(16).total(16 * 2048, 16, 1) > inside.decode_line(16).total(16 * 2048, 16, 1)
