"""The share of its BF16 peak a GPU type's large GEMMs reach: the ``e_max`` of the BF16 ``gemm`` fit of
the kernel profile the type is priced with, in :func:`rollart.calibration.generation_cost`'s order:

1. the shipped kernel profile of the preset whose timing numbers the type has (H800 and H100: 0.772
   from the H100's Vidur timings; H20: 0.951 from its own; A100: 0.725);
2. else :func:`~rollart.calibration.transfer_reference`'s: a transferred profile keeps its reference's
   fractions of peak (``profiles.transferred_profile``), so its e_max is the reference's.

A trainer's model-FLOPs utilisation measured on one GPU type is carried to another by the ratio of the two
(``sim.costs.train.effective_mfu``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollart.calibration import _load, _shipped_kernel_profile, transfer_reference

if TYPE_CHECKING:
    from rollart.plan.schema import GpuType


def gemm_e_max(gpu_name: str | None, gpu: "GpuType") -> tuple[float, str]:
    """(e_max of the BF16 ``gemm`` fit, the GPU whose timings it was fitted to) for the GPU type ``gpu``
    named ``gpu_name`` (None: known by its timing numbers alone)."""
    from rollart.calibration.profiles import shipped_profile_path

    path = _shipped_kernel_profile(gpu_name, gpu)
    if path is None:  # no timings of its own: the measured reference's fractions of peak
        path = shipped_profile_path(transfer_reference(gpu_name, gpu))
    profile = _load(str(path.resolve()))
    return float(profile.gemm.params["e_max"]), profile.gpu


__all__ = ["gemm_e_max"]
