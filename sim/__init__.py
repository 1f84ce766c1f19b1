"""The SimPy backend: a simulated cluster that executes the core's effects with
calibrated cost models (GPU generation, training, environments, reward, links)."""

from rollart.sim.backend import SimBackend, SimOutcome, simulate_plan

__all__ = ["SimBackend", "SimOutcome", "simulate_plan"]
