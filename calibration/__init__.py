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
   timing numbers, e.g. an H20 with faster HBM), else the H100's (a type without timings of its own).

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


def transfer_reference(gpu_name: str | None, gpu: "GpuType | None" = None) -> str:
    """The preset whose measured kernel efficiencies price a GPU type without a profile of its own:
    the preset ``gpu_name`` names when it ships one (a custom variant of a measured GPU keeps its
    kernels' measured fractions of peak). Else the measured reference (``profiles.RIDGE_REFERENCES``)
    most like ``gpu``'s datasheet:

    * of its architecture class: with FP8 tensor cores (``tflops_fp8``) Hopper's H100 and H20,
      without them Ampere's A100;
    * of those, the ones ``gpu`` is at least as good as in every timing figure, when there are any
      (so an H20 with faster HBM is never priced slower than an H20);
    * of those, the nearest in ridge point (BF16 FLOP per HBM byte, on a log scale). The ridge decides
      which side of the roofline a kernel runs on: H20 (37) was timed where small-batch GEMMs are
      compute-floored, H100 (295) where they read weights.

    Without a datasheet, H100 (``profiles.TRANSFER_REFERENCE``)."""
    from rollart.calibration.profiles import RIDGE_REFERENCES, TRANSFER_REFERENCE, shipped_profile_path
    from rollart.plan.presets import GPU_PRESETS, canonical_gpu

    preset = canonical_gpu(gpu_name) if gpu_name else None
    if preset is not None and shipped_profile_path(preset) is not None:
        return preset
    if gpu is None:
        return TRANSFER_REFERENCE
    same_class = [r for r in RIDGE_REFERENCES if (GPU_PRESETS[r].get("tflops_fp8") is None) == (gpu.tflops_fp8 is None)]
    dominated = [r for r in same_class if all(getattr(gpu, f) >= v for f in TIMING_FIELDS
                                              if (v := GPU_PRESETS[r].get(f)) is not None)]
    ridge = math.log(gpu.tflops_bf16 / gpu.hbm_tbps)
    return min(dominated or same_class, key=lambda r: (
        abs(ridge - math.log(GPU_PRESETS[r]["tflops_bf16"] / GPU_PRESETS[r]["hbm_tbps"])), r != TRANSFER_REFERENCE))


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


def generation_cost(model: "ModelSpec", gpu_name: str, gpu: "GpuType", tp: int, profile: str | None = None,  # noqa: ANN201
                    ep: int = 1, network: "Link | None" = None, memory_utilization: float = 0.90,
                    domain: int | None = None):
    """The generation cost model for ``tp`` GPUs of type ``gpu_name`` serving ``model``, with ``ep``
    expert-parallel ranks (MoE) whose all-to-all, like the tensor-parallel ring, crosses ``network`` (the
    cluster's link) where a worker does not fit one NVLink domain (the GPU type's ``nvlink_domain``); the
    engine may use ``memory_utilization`` of each GPU's memory. ``domain``: the NVLink domain this worker's
    collectives see where it straddles a domain boundary (:func:`~rollart.sim.costs.moe.worker_domain`:
    the backend lays a generation group's workers out as ``tp`` consecutive GPUs each from a domain
    boundary, so of 4 × tp 32 on 128 GPUs of 72-GPU racks the third, on GPUs 64–95, gets 8 and crosses the
    network); None: the GPU type's ``nvlink_domain`` (a worker alone, from a boundary)."""
    from rollart.calibration.cost import EngineProfileGeneration, KernelProfileGeneration
    from rollart.calibration.links import inter_node_link, rdma_between_nodes
    from rollart.calibration.profiles import EngineProfile, TrainProfile
    from rollart.sim.costs.gpu import RooflineEfficiency, RooflineGeneration

    def roofline() -> RooflineGeneration:
        return RooflineGeneration(model, gpu, tp, RooflineEfficiency(memory_utilization=memory_utilization),
                                  ep=ep, network=inter_node_link(network), domain=domain,
                                  rdma=rdma_between_nodes(network))

    if profile == "datasheet":
        return roofline()
    path = Path(profile) if profile else _shipped_kernel_profile(gpu_name, gpu)
    if path is None:  # no timings of this GPU: the measured reference's efficiencies on its datasheet
        moved = _transferred(gpu_name, transfer_reference(gpu_name, gpu), gpu.tflops_bf16, gpu.hbm_tbps,
                             gpu.nvlink_gbps, gpu.tflops_fp8)
        return KernelProfileGeneration(model, gpu, tp, moved, f"{gpu_name} datasheet", ep, network, memory_utilization,
                                       domain)
    loaded = _load(str(path.resolve()))
    origin = path.name if profile is None else str(path)
    if isinstance(loaded, TrainProfile):
        raise ValueError(f"{path} is a train profile: give it to placement.trainer.profile, not to a GPU pool")
    if isinstance(loaded, EngineProfile):
        return EngineProfileGeneration(model, gpu, tp, loaded, origin,  # measured end to end: as measured
                                       memory_utilization=memory_utilization, ep=ep)
    return KernelProfileGeneration(model, gpu, tp, loaded, origin, ep, network, memory_utilization, domain)


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
               gpu_name: str | None = None, network: "Link | None" = None):
    """The training cost model: the trainer placement's ``profile:`` (a measured train
    profile) when set, else the FLOPs/MFU model with the tensor-parallel all-reduces, a MoE's
    expert-parallel all-to-alls and the data-parallel gradient sync on the links of the trainer's GPU
    type ``gpu_name``: NVLink inside one NVLink domain (the type's ``nvlink_domain``), ``network`` (the
    cluster's link) across domains, also for a group that straddles a domain boundary (groups are laid
    out as consecutive GPUs over the trainer's ``gpus``)."""
    from rollart.calibration.cost import ProfiledTrainCost
    from rollart.calibration.profiles import TrainProfile
    from rollart.sim.costs.train import TrainCost, trainer_ep

    if not trainer.profile:
        stage = trainer.gpus // trainer.pp  # a data-parallel ring's span: the stage's GPUs
        ep = trainer_ep(model, trainer, gpu.nvlink_domain)

        def ring(stride: int) -> "tuple[float, float, str] | None":  # one member of each group of stride
            return tp_allreduce(gpu_name, gpu, stage // stride, network, trainer.gpus, stride=stride) \
                if stage > stride else None

        return TrainCost(model, gpu, trainer,
                         tp_allreduce(gpu_name, gpu, trainer.tp, network, trainer.gpus) if trainer.tp > 1 else None,
                         ep_all_to_all(gpu_name, gpu, network) if ep > 1 else None,
                         ring(trainer.tp), gpu_name, ring(ep) if model.moe_experts else None)
    loaded = _load(str(Path(trainer.profile).resolve()))
    if not isinstance(loaded, TrainProfile):
        raise ValueError(f"placement.trainer.profile: {trainer.profile} is a {loaded.kind} profile, not a train "
                         "profile (written by `rollart validate`)")
    return ProfiledTrainCost(model, loaded, trainer.profile)


__all__ = ["generation_cost", "train_cost"]
