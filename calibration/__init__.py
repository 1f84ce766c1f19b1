"""Calibration: hardware profiles with their provenance, and the models built from them.

``generation_cost`` is the one place the simulator asks for a GPU's generation cost model:

1. the pool's own ``profile:``: a YAML written by ``rollart calibrate fit``, or ``datasheet`` for the
   datasheet roofline with assumed efficiencies;
2. else the shipped kernel profile of the GPU type (``calibration/profiles/<gpu>.yaml``), when the
   type has that preset's timing numbers (FLOP/s, HBM and NVLink bandwidth: memory size sets the
   KV capacity, not a kernel's time, so a ``cluster.custom_gpus`` entry that only adds memory keeps
   the measured profile, whatever it is called);
3. else measured kernel efficiencies on the GPU type's datasheet, priced by the same composition:
   the named preset's own (a ``cluster.custom_gpus`` entry reusing a preset's name with other
   timing numbers, e.g. an H20 with faster HBM), else those of the measured GPU most like it
   (:func:`transfer_reference`), each step no slower than on any measured preset the type matches or
   beats in every timing figure the step depends on (:func:`custom_generation_cost`).

The returned model's ``source`` says which, and every report prints it."""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported lazily: rollart.plan reads the link table from this package
    from rollart.calibration.profiles import KernelProfile
    from rollart.plan.schema import GpuType, Link, ModelSpec, TrainerPlacement


@lru_cache(maxsize=64)
def _load(path: str):  # noqa: ANN202 - cached profile objects
    from rollart.calibration.profiles import load_profile

    return load_profile(path)


# The datasheet numbers a kernel's time depends on; ``memory_gb`` only sizes the KV cache.
TIMING_FIELDS = ("tflops_bf16", "tflops_fp8", "hbm_tbps", "nvlink_gbps")
# Those a BF16 model's step depends on: it never computes in FP8, so ``tflops_fp8`` is not one of them
BF16_TIMING_FIELDS = ("tflops_bf16", "hbm_tbps", "nvlink_gbps")


def _at_least(gpu: "GpuType", sheet: dict, fields: tuple[str, ...]) -> bool:
    """Whether ``gpu`` matches or beats the datasheet ``sheet`` in every one of ``fields`` it gives (a
    field the sheet leaves unset, A100's ``tflops_fp8``, is no bar; one ``gpu`` leaves unset loses)."""
    return all((mine := getattr(gpu, f)) is not None and mine >= v for f in fields if (v := sheet.get(f)) is not None)


def _same_timings(sheet: dict, gpu: "GpuType") -> bool:
    """Whether ``gpu`` has the preset datasheet ``sheet``'s timing numbers (``TIMING_FIELDS``)."""
    return all(sheet.get(f) == getattr(gpu, f) for f in TIMING_FIELDS)


def _timing_preset(gpu: "GpuType") -> str | None:
    """The preset with a shipped profile whose timing numbers (``TIMING_FIELDS``) ``gpu`` has exactly,
    whatever the custom type is called (an "H20-141G" with H20's FLOP/s and bandwidths is an H20 with
    more memory)."""
    from rollart.calibration.profiles import shipped_profile_path
    from rollart.plan.presets import GPU_PRESETS

    for preset, sheet in GPU_PRESETS.items():
        if shipped_profile_path(preset) is not None and _same_timings(sheet, gpu):
            return preset
    return None


def transfer_reference(gpu_name: str | None, gpu: "GpuType | None" = None, fp8: bool = False) -> str:
    """The preset whose measured kernel efficiencies price a GPU type without a profile of its own:
    the preset ``gpu_name`` names when it ships one (a custom variant of a measured GPU keeps its
    kernels' measured fractions of peak). Else the measured reference (``profiles.RIDGE_REFERENCES``)
    most like ``gpu``'s datasheet, chosen on the figures the priced terms depend on:

    The references are the GPUs measured on either side of the roofline's ridge and each architecture's:
    Hopper's H100 and H20, Ampere's A100, Blackwell's B200 and GB200 (Hopper's fits at Blackwell's measured
    sustained share of peak, :mod:`rollart.calibration.sustained`), so a sheet at or beyond a Blackwell
    preset (a B300) keeps what Blackwell sustains rather than Hopper's share of its peak.

    * ``fp8`` False (a BF16 model's terms, the trainer's all-reduce and MFU): on the BF16 figures only, so
      a BF16 model's step never depends on ``tflops_fp8``: of all the references, the nearest datasheet
      (the sum of BF16 FLOP/s's and HBM bandwidth's log distances: an H200-like sheet takes the H100's, an
      A800 the A100's, an H20 with faster HBM the H20's, a sheet just short of a B200 the B200's).
    * ``fp8`` True (an FP8 model, whose linear layers compute on the FP8 tensor cores where there are
      any): with ``tflops_fp8``, of the references with FP8 tensor cores (H100, H20, B200, GB200); without
      it, of all (the weights are served weight-only, in BF16 compute); the nearest datasheet.

    The reference prices the type's kernels; :func:`custom_generation_cost` then holds each step between
    its prices on the presets that bound the type's datasheet from below and from above, so a datasheet
    change of a few per cent that moves the reference never reverses an answer. Without a datasheet, H100
    (``profiles.TRANSFER_REFERENCE``)."""
    from rollart.calibration.profiles import RIDGE_REFERENCES, TRANSFER_REFERENCE, shipped_profile_path
    from rollart.plan.presets import GPU_PRESETS, canonical_gpu

    preset = canonical_gpu(gpu_name) if gpu_name else None
    if preset is not None and shipped_profile_path(preset) is not None:
        return preset
    if gpu is None:
        return TRANSFER_REFERENCE

    def nearest(r: str) -> tuple[float, bool]:  # the datasheet distance: both figures' log ratios
        return (sum(abs(math.log(getattr(gpu, f) / GPU_PRESETS[r][f])) for f in ("tflops_bf16", "hbm_tbps")),
                r != TRANSFER_REFERENCE)

    candidates = [r for r in RIDGE_REFERENCES
                  if not fp8 or gpu.tflops_fp8 is None or GPU_PRESETS[r].get("tflops_fp8")]
    return min(candidates, key=nearest)


def _at_most(gpu: "GpuType", sheet: dict, fields: tuple[str, ...]) -> bool:
    """Whether ``gpu`` is no better than the datasheet ``sheet`` in every one of ``fields`` (a field ``gpu``
    leaves unset is no better; one the sheet leaves unset and ``gpu`` gives is better)."""
    for f in fields:
        mine, theirs = getattr(gpu, f), sheet.get(f)
        if mine is not None and (theirs is None or mine > theirs):
            return False
    return True


@lru_cache(maxsize=32)
def _transferred(gpu_name: str, ref: str, tflops_bf16: float, hbm_tbps: float, nvlink_gbps: float,
                 tflops_fp8: float | None) -> "KernelProfile":
    """Preset ``ref``'s measured efficiencies on the datasheet given (cached by its numbers)."""
    from rollart.calibration.profiles import shipped_profile_path, transferred_profile
    from rollart.plan.presets import GPU_PRESETS

    reference = _load(str(shipped_profile_path(ref).resolve()))
    return transferred_profile(reference, gpu_name, tflops_bf16, hbm_tbps, nvlink_gbps,
                               GPU_PRESETS[ref]["nvlink_gbps"], tflops_fp8)


def _shipped_kernel_profile(gpu_name: str | None, gpu: "GpuType") -> "Path | None":
    """The shipped kernel profile's path for the preset ``gpu_name`` names, if ``gpu`` has that preset's
    timing numbers (``TIMING_FIELDS``; a custom type under a preset's name with other ones is priced
    on its own datasheet); for another name, that of the preset whose timing numbers it has exactly."""
    from rollart.calibration.profiles import shipped_profile_path
    from rollart.plan.presets import GPU_PRESETS, canonical_gpu

    preset = canonical_gpu(gpu_name) if gpu_name else None
    if preset is None:
        same = _timing_preset(gpu)
        return shipped_profile_path(same) if same is not None else None
    if not _same_timings(GPU_PRESETS[preset], gpu):
        return None
    return shipped_profile_path(preset)


class StepOverheadOnEngineProfile(ValueError):
    """A plan states an engine step overhead for GPUs an engine profile prices (it measured its own)."""


def generation_cost(model: "ModelSpec", gpu_name: str, gpu: "GpuType", tp: int, profile: str | None = None,  # noqa: ANN201
                    ep: int = 1, network: "Link | None" = None, memory_utilization: float = 0.90,
                    domain: int | None = None, bounded: bool = True, fp8_compute: bool = True,
                    step_overhead_s: float | None = None):
    """The generation cost model for ``tp`` GPUs of type ``gpu_name`` serving ``model``, with ``ep``
    expert-parallel ranks (MoE) whose all-to-all, like the tensor-parallel ring, crosses ``network`` (the
    cluster's link) where a worker does not fit one NVLink domain (the GPU type's ``nvlink_domain``); the
    engine may use ``memory_utilization`` of each GPU's memory. ``domain``: the NVLink domain this worker's
    collectives see where it straddles a domain boundary (:func:`~rollart.sim.costs.moe.worker_domain`:
    the backend lays a generation group's workers out as ``tp`` consecutive GPUs each from a domain
    boundary, so of 4 × tp 32 on 128 GPUs of 72-GPU racks the third, on GPUs 64–95, gets 8 and crosses the
    network); None: the GPU type's ``nvlink_domain`` (a worker alone, from a boundary).

    A shipped kernel profile is held under the same floors as a custom type's (``bounded``; see
    :func:`custom_generation_cost`): each step at most its price on every preset the type matches or beats in
    each timing figure, and an FP8 model's at most its price served weight-only. The derived profiles (H100,
    H200, B200, GB200) borrow the H800's measured FP8 GEMM launch cost (9.6 µs against the H20's 4.6 µs),
    which alone would price an FP8 MoE's batch-1 decode on them slower than on the H20 they beat in every
    figure. ``fp8_compute`` False prices FP8 weights weight-only (W8A16) on a profile with FP8 GEMM timings.
    ``step_overhead_s``: the engine's fixed cost a step where the plan states it, for the kernel profile's
    assumed ``iteration_overhead_s`` (the floors take it too); an engine profile measured its own."""
    from rollart.calibration.cost import EngineProfileGeneration, KernelProfileGeneration
    from rollart.calibration.links import inter_node_link, rdma_between_nodes
    from rollart.calibration.profiles import EngineProfile, TrainProfile
    from rollart.sim.costs.gpu import RooflineEfficiency, RooflineGeneration

    def roofline() -> RooflineGeneration:
        eff = RooflineEfficiency(memory_utilization=memory_utilization) if step_overhead_s is None else \
            RooflineEfficiency(memory_utilization=memory_utilization, iteration_overhead_s=step_overhead_s)
        return RooflineGeneration(model, gpu, tp, eff,
                                  ep=ep, network=inter_node_link(network), domain=domain,
                                  rdma=rdma_between_nodes(network))

    if profile == "datasheet":
        return roofline()
    path = Path(profile) if profile else _shipped_kernel_profile(gpu_name, gpu)
    if path is None:  # no timings of this GPU: the measured reference's efficiencies on its datasheet
        return custom_generation_cost(model, gpu_name, gpu, tp, ep, network, memory_utilization, domain,
                                      step_overhead_s)
    loaded = _load(str(path.resolve()))
    origin = path.name if profile is None else str(path)
    if isinstance(loaded, TrainProfile):
        raise ValueError(f"{path} is a train profile: give it to placement.trainer.profile, not to a GPU pool")
    if isinstance(loaded, EngineProfile):
        if step_overhead_s is not None:
            raise StepOverheadOnEngineProfile(f"{path.name} is an engine profile, measured end to end with its "
                                              "engine's own step overhead: drop step_overhead_ms or price the pool "
                                              "with a kernel profile")
        return EngineProfileGeneration(model, gpu, tp, loaded, origin,  # measured end to end: as measured
                                       memory_utilization=memory_utilization, ep=ep)
    args = (model, gpu, tp, loaded, origin, ep, network, memory_utilization, domain)
    floors = []
    if profile is None and bounded:  # a profile the user gives is priced as measured
        floors = _dominated_floors(model, gpu, tp, ep, network, memory_utilization, domain, step_overhead_s)
        if model.weight_dtype != "bf16" and loaded.fp8_tensor_cores and loaded.gemm_fp8 is not None and fp8_compute:
            floors.append((f"{gpu_name} served weight-only",
                           KernelProfileGeneration(*args, fp8_compute=False, step_overhead_s=step_overhead_s)))
    if floors:
        from rollart.calibration.cost import BoundedGeneration

        return BoundedGeneration(*args, floors=floors, fp8_compute=fp8_compute, step_overhead_s=step_overhead_s)
    return KernelProfileGeneration(*args, fp8_compute=fp8_compute, step_overhead_s=step_overhead_s)


def bounding_presets(gpu: "GpuType", fields: tuple[str, ...]) -> list[tuple[str, bool, bool]]:
    """(preset, ``gpu`` matches or beats it, it matches or beats ``gpu``) in every one of ``fields``, for
    every preset with a shipped kernel profile that bounds ``gpu`` from either side; a preset with ``gpu``'s
    exact timing figures is ``gpu`` itself and bounds nothing."""
    from rollart.calibration.profiles import shipped_profile_path
    from rollart.plan.presets import GPU_PRESETS

    out = []
    for preset, sheet in GPU_PRESETS.items():
        below, above = _at_least(gpu, sheet, fields), _at_most(gpu, sheet, fields)
        if (below or above) and shipped_profile_path(preset) is not None and not _same_timings(sheet, gpu):
            out.append((preset, below, above))
    return out


def beaten_presets(gpu: "GpuType", fp8: bool) -> list[str]:
    """The presets with a shipped kernel profile that ``gpu`` matches or beats in every timing figure a
    model's steps depend on (``TIMING_FIELDS`` for FP8 weights, ``BF16_TIMING_FIELDS`` for BF16)."""
    return [p for p, below, _ in bounding_presets(gpu, TIMING_FIELDS if fp8 else BF16_TIMING_FIELDS) if below]


def _preset_twin(gpu: "GpuType", preset: str) -> "GpuType":
    """``gpu`` with ``preset``'s timing figures: the preset priced by its own profile, with ``gpu``'s NVLink
    domain and memory (neither is a kernel's speed)."""
    from rollart.plan.presets import GPU_PRESETS

    return gpu.model_copy(update={f: GPU_PRESETS[preset].get(f) for f in TIMING_FIELDS})


def _dominated_floors(model: "ModelSpec", gpu: "GpuType", tp: int, ep: int, network: "Link | None",
                      memory_utilization: float, domain: int | None,
                      step_overhead_s: float | None = None) -> list[tuple[str, object]]:
    """(name, cost model) of every preset with a shipped kernel profile that ``gpu`` matches or beats in each
    timing figure ``model``'s steps depend on, priced by its own profile as measured (unbounded) with ``gpu``'s
    NVLink domain and memory, and for an FP8 model on a preset with FP8 tensor cores also served weight-only.
    Matching or beating is transitive, so this flat set bounds as a chain of bounded presets would, at one
    level of cost models."""
    from rollart.plan.presets import GPU_PRESETS

    fp8 = model.weight_dtype != "bf16"
    floors = []
    for preset in beaten_presets(gpu, fp8):
        twin = _preset_twin(gpu, preset)
        floors.append((preset, generation_cost(model, preset, twin, tp, None, ep, network, memory_utilization,
                                               domain, bounded=False, step_overhead_s=step_overhead_s)))
        if fp8 and GPU_PRESETS[preset].get("tflops_fp8"):
            floors.append((f"{preset} served weight-only",
                           generation_cost(model, preset, twin, tp, None, ep, network, memory_utilization, domain,
                                           bounded=False, fp8_compute=False, step_overhead_s=step_overhead_s)))
    return floors


def _preset_bounds(model: "ModelSpec", gpu: "GpuType", tp: int, ep: int, network: "Link | None",
                   memory_utilization: float, domain: int | None,
                   step_overhead_s: float | None = None) -> tuple[list[tuple[str, object]], list[object]]:
    """(floors, ceilings): the cost models of every preset with a shipped kernel profile that ``gpu`` matches
    or beats (floors: no step may cost more) or that matches or beats ``gpu`` (ceilings: no step may cost
    less) in each timing figure ``model``'s steps depend on (``BF16_TIMING_FIELDS`` for BF16 weights, else
    ``TIMING_FIELDS``); each priced by its own profile with ``gpu``'s NVLink domain and memory (neither is a
    kernel's speed), so that it differs from the preset only where the plan lays workers out differently
    (:func:`bounding_presets`); the floors as :func:`_dominated_floors` gives them, weight-only ones too."""
    fields = BF16_TIMING_FIELDS if model.weight_dtype == "bf16" else TIMING_FIELDS
    above_it = [generation_cost(model, preset, _preset_twin(gpu, preset), tp, None, ep, network, memory_utilization,
                                domain, bounded=False, step_overhead_s=step_overhead_s)
                for preset, _, above in bounding_presets(gpu, fields) if above]
    return _dominated_floors(model, gpu, tp, ep, network, memory_utilization, domain, step_overhead_s), above_it


def custom_generation_cost(model: "ModelSpec", gpu_name: str, gpu: "GpuType", tp: int, ep: int = 1,  # noqa: ANN201
                           network: "Link | None" = None, memory_utilization: float = 0.90,
                           domain: int | None = None, step_overhead_s: float | None = None):
    """The generation cost model of a GPU type without kernel timings of its own (``generation_cost``'s
    third case): :func:`transfer_reference`'s measured efficiencies on its datasheet, held between the
    presets that bound its datasheet.

    * The reference: for a BF16 model chosen on the BF16 figures, and transferred with the reference's
      own FP8 ÷ BF16 peak ratio (the FP8 fits enter a BF16 MoE only as the grouped ÷ dense factors), so
      ``tflops_fp8`` never moves a BF16 model's step; for an FP8 model chosen as ``transfer_reference``
      with ``fp8`` says.
    * The floors: each step (prefill, mixed, a decode iteration) is at most its price on every preset the
      type matches or beats in each timing figure that step depends on (``_preset_bounds``): a datasheet at
      least as good in every figure is never priced slower (kernel by kernel, a reference can lose to
      another GPU: the H100's FP8 GEMM launch, 9.6 µs, against the H20's 4.6 µs, at batch 1 on a MoE's small
      expert GEMMs). An FP8 model on a type with FP8 tensor cores is also floored by the same type without
      them (``tflops_fp8`` None: FP8 weights served weight-only, W8A16, as an engine may on any GPU), so
      adding FP8 tensor cores never makes an FP8 model slower.
    * The ceilings: and at least its price on every preset that matches or beats the type in each of those
      figures, so a datasheet no better in any figure is never priced faster (a sheet just short of a B200
      would otherwise keep a reference's larger share of peak). Where the presets themselves disagree (a
      B200 or GB200, on the H800's borrowed launch costs, decodes an FP8 MoE at batch 1 slower than the H20
      it beats in every figure), the floor wins: being no slower than what it beats is the firmer rule.
    * A decode iteration is bounded the same way at every context (its line is the envelope of the
      reference's, the ceilings' and the floors' lines, :class:`~rollart.sim.costs.gpu.EnvelopeLine`).

    Without any bound it is the reference's composition as is (a ``KernelProfileGeneration``)."""
    from rollart.calibration.cost import BoundedGeneration, KernelProfileGeneration
    from rollart.plan.presets import GPU_PRESETS

    fp8 = model.weight_dtype != "bf16"
    ref = transfer_reference(gpu_name, gpu, fp8=fp8)
    if fp8:
        tflops_fp8 = gpu.tflops_fp8
    else:  # the reference's FP8 ÷ BF16 ratio on this BF16 peak: a BF16 model reads no FP8 figure of the type
        ref_fp8 = GPU_PRESETS[ref].get("tflops_fp8")
        tflops_fp8 = ref_fp8 * gpu.tflops_bf16 / GPU_PRESETS[ref]["tflops_bf16"] if ref_fp8 else None
    moved = _transferred(gpu_name, ref, gpu.tflops_bf16, gpu.hbm_tbps, gpu.nvlink_gbps, tflops_fp8)
    floors, ceilings = _preset_bounds(model, gpu, tp, ep, network, memory_utilization, domain, step_overhead_s)
    if fp8 and gpu.tflops_fp8 is not None:
        floors.append((f"{gpu_name} served weight-only",
                       generation_cost(model, gpu_name, gpu.model_copy(update={"tflops_fp8": None}), tp, None, ep,
                                       network, memory_utilization, domain, step_overhead_s=step_overhead_s)))
    args = (model, gpu, tp, moved, f"{gpu_name} datasheet", ep, network, memory_utilization, domain)
    if floors or ceilings:
        return BoundedGeneration(*args, floors=floors, ceilings=ceilings, step_overhead_s=step_overhead_s)
    return KernelProfileGeneration(*args, step_overhead_s=step_overhead_s)


# GPUs in the ring the shipped NCCL all-reduce fits were measured on (an 8×H100 DGX, calibration.datasets)
NCCL_FIT_GPUS = 8


def tp_allreduce(gpu_name: str | None, gpu: "GpuType", tp: int, network: "Link | None" = None,
                 gpus: int | None = None, stride: int = 1) -> tuple[float, float, str]:
    """(latency s, bus bytes/s, where from) of a training tensor-parallel all-reduce (large messages:
    NCCL, not the serving engines' custom kernel). Within one NVLink domain (tp ≤ the GPU type's
    ``nvlink_domain``: 8 on an HGX board, 72 in an NVL72 rack): the NCCL fit of the GPU's shipped kernel
    profile (NVLink-scaled from 8×H100 timings), else the fit of :func:`transfer_reference` scaled by the
    GPU's NVLink ÷ that preset's; a ring of more than :data:`NCCL_FIT_GPUS` inside a wider domain keeps
    that fit (NCCL's bus bandwidth is the per-GPU link rate whatever the ring's length; its α, measured
    on 8 GPUs, is not extrapolated). A group wider than the domain: a ring through the domain's NVLink and
    :func:`cluster_network`, each member in a domain crossing through its own port, capped by NVLink
    (``moe.ring_link``, the engines' rule).

    ``gpus``: the GPUs the groups of ``tp`` are laid out over, consecutive from a domain boundary (the
    trainer's: its tp groups, its data-parallel rings over a pipeline stage); a group that straddles a
    domain boundary (tp 16 on 144 GPUs of 72-GPU racks: GPUs 64–79) crosses the network too, and the step
    waits for it (:func:`~rollart.sim.costs.moe.effective_domain`). None: one group alone.

    ``stride``: GPUs between consecutive ring members (a data-parallel ring of tp-wide ranks: tp), so a
    domain holds domain ÷ stride of them, each crossing the network through its own port
    (``moe.ring_link``'s ports). The ring is priced as ``tp`` members laid out ``stride`` apart."""
    from rollart.calibration.profiles import KernelProfile, shipped_profile_path
    from rollart.plan.presets import GPU_PRESETS
    from rollart.sim.costs.moe import domain_name, effective_domain, ring_link

    domain = gpu.nvlink_domain
    piece = effective_domain(tp, gpus, domain) if gpus else domain
    if stride == 1 and tp <= domain and piece < tp:  # inside the domain's size, but some group straddles one
        nv_latency, nv_rate, _ = tp_allreduce(gpu_name, gpu, tp)
        net_latency, net_rate, where = cluster_network(network)
        rate, latency = ring_link(tp, (nv_rate, nv_latency), (net_rate, net_latency), piece)
        return (latency, rate,
                f"{where}, {tp}-GPU rings over {gpus} GPUs straddling {domain_name(domain)}s (as few as {piece} "
                "on one side, each through its own port)")
    if tp * stride > domain and (stride > 1 or tp > domain):
        # the generation engines' rule (moe.ring_link): NVLink inside a domain, each member's own port across;
        # the domain holding the fewest of the ring's members sets how many ports carry it
        if stride == 1:
            ports = min(tp, effective_domain(tp, gpus or tp, domain))
        else:
            held = Counter(k * stride // domain for k in range(tp))
            ports = min(held.values())
        node_latency, node_rate, _ = tp_allreduce(gpu_name, gpu, min(domain, max(2, ports)))
        net_latency, net_rate, where = cluster_network(network)
        rate, latency = ring_link(tp * stride, (node_rate, node_latency), (net_rate, net_latency), domain, ports)
        return (latency, rate,
                f"{where}, a ring over {tp} GPUs crossing {domain_name(domain)}s through {ports} port"
                f"{'s' if ports > 1 else ''} a {domain_name(domain)}, capped by NVLink")
    # a ring longer than the fits' 8 GPUs, on NVLink all the way (an NVL72 rack): said where it is used
    inside = f"; a ring over {tp} GPUs inside the {domain}-GPU NVLink domain" if tp > NCCL_FIT_GPUS else ""
    path = _shipped_kernel_profile(gpu_name, gpu)
    profile = _load(str(path.resolve())) if path is not None else None
    if isinstance(profile, KernelProfile):
        p = profile.allreduce.params
        return p["alpha_s"], p["beta_gbps"] * 1e9 / 8, f"NVLink ({profile.gpu} NCCL all-reduce fit{inside})"
    ref = transfer_reference(gpu_name, gpu)
    fit = _load(str(shipped_profile_path(ref).resolve())).allreduce.params
    scale = gpu.nvlink_gbps / GPU_PRESETS[ref]["nvlink_gbps"]
    return (fit["alpha_s"], fit["beta_gbps"] * scale * 1e9 / 8,
            f"NVLink ({ref} NCCL all-reduce fit × {scale:.3g}, {gpu.nvlink_gbps:g} GB/s{inside})")


def cluster_network(network: "Link | None" = None) -> tuple[float, float, str]:
    """(latency s, bytes/s, where from) of the network between a cluster's NVLink domains (HGX boards,
    NVL72 racks): the plan's intra-cluster link when it names one, else the InfiniBand fit of the link
    table."""
    from rollart.calibration.links import inter_node_link

    rate, latency = inter_node_link(network)
    return latency, rate, "the intra-cluster link" if network is not None else "InfiniBand (NCCL fit)"


def ep_all_to_all(gpu_name: str | None, gpu: "GpuType", network: "Link | None" = None
                  ) -> tuple[tuple[float, float, str], tuple[float, float, str]]:
    """The (latency s, bytes/s, where from) an expert-parallel all-to-all moves at inside one NVLink
    domain (the GPU type's ``nvlink_domain``) and across domains: NVLink as :func:`tp_allreduce` prices
    a group within the domain, and :func:`cluster_network`. Which share of a group's traffic takes which
    is the caller's (``TrainCost``: ``moe.all_to_all_s`` at the ep groups' ``moe.effective_domain``)."""
    return tp_allreduce(gpu_name, gpu, min(gpu.nvlink_domain, NCCL_FIT_GPUS)), cluster_network(network)


def train_cost(model: "ModelSpec", gpu: "GpuType", trainer: "TrainerPlacement",  # noqa: ANN201
               gpu_name: str | None = None, network: "Link | None" = None, datasheet: bool = False,
               reference: bool = True):
    """The training cost model: the trainer placement's ``profile:`` (a measured train
    profile) when set, else the FLOPs/MFU model with the tensor-parallel all-reduces, a MoE's
    expert-parallel all-to-alls and the data-parallel gradient sync on the links of the trainer's GPU
    type ``gpu_name``: NVLink inside one NVLink domain (the type's ``nvlink_domain``), ``network`` (the
    cluster's link) across domains, also for a group that straddles a domain boundary (groups are laid
    out as consecutive GPUs over the trainer's ``gpus``). ``datasheet``: the pool is priced on its datasheet
    roofline (``profile: datasheet``), so a default MFU is not moved by any GPU's GEMM efficiency. ``reference``:
    the step runs the reference model's forward for a KL term (``algorithm.reference_kl``)."""
    from rollart.calibration.cost import ProfiledTrainCost
    from rollart.calibration.profiles import TrainProfile
    from rollart.sim.costs.train import TrainCost, trainer_ep

    if not trainer.profile:
        stage = trainer.gpus // trainer.pp  # a data-parallel ring's span: the stage's GPUs
        ep = trainer_ep(model, trainer, gpu.nvlink_domain)

        def ring(stride: int) -> "tuple[float, float, str] | None":  # one member of each group of stride
            return tp_allreduce(gpu_name, gpu, stage // stride, network, trainer.gpus, stride=stride) \
                if stage > stride else None

        # a context-parallel ring: cp GPUs tp apart (Megatron's tp-cp-dp-pp order), inside tp·cp consecutive ones
        cp_ring = tp_allreduce(gpu_name, gpu, trainer.cp, network, trainer.gpus, stride=trainer.tp) \
            if trainer.cp > 1 else None
        return TrainCost(model, gpu, trainer,
                         tp_allreduce(gpu_name, gpu, trainer.tp, network, trainer.gpus) if trainer.tp > 1 else None,
                         ep_all_to_all(gpu_name, gpu, network) if ep > 1 else None,
                         ring(trainer.tp), gpu_name, ring(ep) if model.moe_experts else None, cp_link=cp_ring,
                         datasheet=datasheet, reference=reference)
    loaded = _load(str(Path(trainer.profile).resolve()))
    if not isinstance(loaded, TrainProfile):
        raise ValueError(f"placement.trainer.profile: {trainer.profile} is a {loaded.kind} profile, not a train "
                         "profile (written by `rollart validate`)")
    return ProfiledTrainCost(model, loaded, trainer.profile)


__all__ = ["custom_generation_cost", "generation_cost", "train_cost"]
