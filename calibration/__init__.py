"""Calibration: hardware profiles with their provenance, and the models built from them.

``generation_cost`` is the one place the simulator asks for a GPU's generation cost model.
No fitted profile ships yet, so it returns the datasheet roofline with assumed efficiencies;
the model's ``source`` says so in every report."""

from __future__ import annotations

from rollart.plan.schema import GpuType, ModelSpec
from rollart.sim.costs.gpu import GenerationCost, RooflineGeneration

def generation_cost(model: ModelSpec, gpu_name: str, gpu: GpuType, tp: int) -> GenerationCost:
    """The generation cost model for ``tp`` GPUs of type ``gpu_name`` serving ``model``."""
    return RooflineGeneration(model, gpu, tp)


__all__ = ["generation_cost"]
