"""The core's processes on asyncio (the runtime's driver), with fast in-process effect handlers:
the same invariants as in the simulator, including aborts delivered by task cancellation."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import pytest

from rollart.core import Controller, mode_config
from rollart.core.effects import (BroadcastWeights, ComputeReward, EnvClose, EnvOutcome, EnvReset, EnvStep, Generate,
                                  GenOutcome, PublishWeights, TrainStep, UpdateWeights)
from rollart.core.trajectory import TrajState
from rollart.runtime.driver import AsyncDriver
from tests.conftest import small_plan


class FastHandlers:
    """Millisecond stand-ins for envs and engines; a share of env calls fail."""

    def __init__(self, failure: float, seed: int):
        self.rng = random.Random(seed)
        self.failure = failure
        self.aborted_generations = 0
        self.turns: dict[int, int] = {}

    async def reset(self, eff: EnvReset) -> EnvOutcome:
        await asyncio.sleep(self.rng.uniform(0, 0.004))
        if self.rng.random() < self.failure:
            return EnvOutcome(ok=False, error="error")
        self.turns[eff.traj.id] = self.rng.randint(1, 3)
        return EnvOutcome(ok=True, obs_tokens=20)

    async def step(self, eff: EnvStep) -> EnvOutcome:
        await asyncio.sleep(self.rng.uniform(0, 0.004))
        self.turns[eff.traj.id] -= 1
        return EnvOutcome(ok=True, obs_tokens=10, done=self.turns[eff.traj.id] <= 0)

    async def close(self, eff: EnvClose) -> None:
        self.turns.pop(eff.traj.id, None)

    async def generate(self, eff: Generate) -> GenOutcome:
        try:
            await asyncio.sleep(self.rng.uniform(0.001, 0.01))
        except asyncio.CancelledError:
            self.aborted_generations += 1
            raise
        return GenOutcome(tokens=5, text="ok")

    async def reward(self, eff: ComputeReward) -> float:
        return 1.0

    async def nothing(self, eff: object) -> None:
        await asyncio.sleep(0.001)


async def _run(plan, mode: str, failure: float, seed: int):
    t0 = time.monotonic()
    ctl = Controller(plan, mode_config(plan, mode), clock=lambda: time.monotonic() - t0)
    h = FastHandlers(failure, seed)
    driver = AsyncDriver({EnvReset: h.reset, EnvStep: h.step, EnvClose: h.close, Generate: h.generate,
                          ComputeReward: h.reward, TrainStep: h.nothing, BroadcastWeights: h.nothing,
                          PublishWeights: h.nothing, UpdateWeights: h.nothing})
    main = driver.spawn(ctl.main())
    await asyncio.wait_for(main, timeout=60)
    await driver.cancel_all()
    assert not driver.failures
    return ctl, h


@pytest.mark.parametrize("mode", ["sync", "sync+", "one-off", "areal", "rollart"])
def test_core_runs_on_asyncio_with_the_same_invariants(mode: str) -> None:
    plan = small_plan(["algorithm.redundancy=0.5", "algorithm.alpha=1", "algorithm.steps=4"])
    ctl, h = asyncio.run(_run(plan, mode, failure=0.1, seed=1))
    counts = ctl.outcome_counts()
    assert sum(counts.values()) == len(ctl.trajectories)
    ids = [i for b in ctl.batches for i in b]
    assert len(ids) == len(set(ids)) == plan.algorithm.steps * plan.algorithm.batch_size
    for n, batch in enumerate(ctl.batches):
        assert set(Counter(ctl.trajectories[i].group.id for i in batch).values()) == {plan.algorithm.group_size}
        assert all(ctl.trajectories[i].start_version >= n - ctl.mode.alpha for i in batch) \
            or not ctl.mode.evict_stale  # AReaL: staleness bounded by admission only
    assert counts["used"] == len(ids)
    if mode == "rollart":  # redundant members were cancelled mid-generation and ABORTed
        assert counts["aborted_redundant"] > 0
        assert h.aborted_generations > 0
    assert not any(t.state is TrajState.RUNNING and t.group.consumed for t in ctl.trajectories)
