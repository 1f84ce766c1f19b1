"""The SimPy backend: a simulated cluster that executes the core's effects with
calibrated cost models (GPU generation, training, environments, reward, links)."""

from typing import Any

__all__ = ["SimBackend", "SimOutcome", "simulate_plan"]


def __getattr__(name: str) -> Any:
    # Imported lazily so the cost models (rollart.sim.costs) load without the backend,
    # which itself depends on rollart.calibration.
    if name in __all__:
        from rollart.sim import backend

        return getattr(backend, name)
    raise AttributeError(name)
