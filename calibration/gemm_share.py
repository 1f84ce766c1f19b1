"""The share of its BF16 peak a GPU type's large GEMMs reach: the ``e_max`` of the BF16 ``gemm`` fit of
the kernel profile the type is priced with, in :func:`rollart.calibration.generation_cost`'s order:

1. the shipped kernel profile of the preset whose timing numbers the type has (H800 and H100: 0.772
   from the H100's Vidur timings; H20: 0.951 from its own; A100: 0.725);
2. else :func:`~rollart.calibration.transfer_reference`'s: a transferred profile keeps its reference's
   fractions of peak (``profiles.transferred_profile``), so its e_max is the reference's, with the sustained
   rate it gives (peak × e_max) held between the presets that bound the type's BF16 datasheet from below
   and from above.

A trainer's model-FLOPs utilisation measured on one GPU type is carried to another by the ratio of the two
(``sim.costs.train.effective_mfu``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rollart.calibration import _load, _shipped_kernel_profile, transfer_reference

if TYPE_CHECKING:
    from rollart.plan.schema import GpuType


def gemm_e_max(gpu_name: str | None, gpu: "GpuType") -> tuple[float, str]:
    """(e_max of the BF16 ``gemm`` fit, the GPU whose timings it was fitted to) for the GPU type ``gpu``
    named ``gpu_name`` (None: known by its timing numbers alone)."""
    from rollart.calibration.profiles import shipped_profile_path

    path = _shipped_kernel_profile(gpu_name, gpu)
    if path is not None:
        profile = _load(str(path.resolve()))
        return float(profile.gemm.params["e_max"]), profile.gpu
    # no timings of its own: the reference's fractions of peak, its sustained BF16 rate (peak × e_max) held
    # between those of the presets it matches or beats and of those that match or beat it in BF16 FLOP/s and
    # HBM, as custom_generation_cost holds its steps (a sheet just short of a B200 trains no faster than one)
    from rollart.calibration import BF16_TIMING_FIELDS, bounding_presets
    from rollart.plan.presets import GPU_PRESETS

    profile = _load(str(shipped_profile_path(transfer_reference(gpu_name, gpu)).resolve()))
    rate = gpu.tflops_bf16 * float(profile.gemm.params["e_max"])
    low, high = 0.0, math.inf
    for preset, below, above in bounding_presets(gpu, BF16_TIMING_FIELDS):
        theirs = GPU_PRESETS[preset]["tflops_bf16"] * float(_load(str(shipped_profile_path(preset).resolve()))
                                                            .gemm.params["e_max"])
        if below:
            low = max(low, theirs)
        if above:
            high = min(high, theirs)
    return min(max(rate, low), high) / gpu.tflops_bf16, profile.gpu


__all__ = ["gemm_e_max"]
