"""Shared helpers: small plans built from the embedded default scenario."""

from __future__ import annotations

from typing import Iterable

import pytest

from rollart.core import mode_config
from rollart.core.trajectory import TrajState
from rollart.plan import Plan, load_plan
from rollart.scenarios_catalog import default_scenario
from rollart.sim import SimBackend, SimOutcome


def small_plan(overrides: Iterable[str] = ()) -> Plan:
    """The default scenario shrunk to seconds of wall time: batch 16 (2 groups of 8), 3 steps."""
    base = ["algorithm.batch_size=16", "algorithm.steps=3"]
    return load_plan(default_scenario(), [*base, *overrides])


def run_sim(plan: Plan, mode: str | None = None, seed: int | None = None, watch_running: bool = False) -> SimOutcome:
    """Simulate; with ``watch_running`` record the most trajectories ever RUNNING at once
    (checked at every launch) as ``outcome.running_high_water``."""
    backend = SimBackend(plan, mode_config(plan, mode), plan.algorithm.seed if seed is None else seed)
    high = [0]
    if watch_running:
        ctl = backend.ctl
        launch = ctl.new_trajectory

        def watched(group):
            traj = launch(group)
            high[0] = max(high[0], sum(1 for t in ctl.trajectories if t.state is TrajState.RUNNING))
            return traj

        ctl.new_trajectory = watched  # type: ignore[method-assign]
    out = backend.run()
    out.running_high_water = high[0]  # type: ignore[attr-defined]
    return out


@pytest.fixture
def plan() -> Plan:
    return small_plan()
