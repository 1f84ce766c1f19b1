"""The control plane, written once: it imports neither SimPy nor Ray.

Processes are generators that yield effects (``rollart.core.effects``); a backend executes
them. Decisions live in plain objects: LLMProxy (routing), SampleBuffer (α window, batch
formation), RolloutScheduler (admission, redundancy), LockstepBarrier (Sync baseline)."""

from rollart.core.controller import Controller, RunAborted, build_workers
from rollart.core.modes import ModeConfig, mode_config

__all__ = ["Controller", "ModeConfig", "RunAborted", "build_workers", "mode_config"]
