"""Environment behaviour drawn from a task's distributions, one seeded stream per trajectory."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rollart.core.effects import EnvOutcome
from rollart.plan.schema import TaskSpec


@dataclass
class _EnvState:
    rng: np.random.Generator
    turns_total: int = 0
    turn: int = 0


class EnvModel:
    """Samples latency, failures and observations of env.reset / env.step.

    A call fails with probability ``failure_prob`` (after its latency) and times out when its
    latency exceeds ``timeout_s`` (the caller waits ``timeout_s``). The number of turns is drawn
    at the first successful reset; ``done`` is reported on the last one. Each trajectory has
    its own RNG seeded by (seed, trajectory id), so results do not depend on event order."""

    def __init__(self, seed: int):
        self.seed = seed
        self._state: dict[int, _EnvState] = {}

    def rng(self, traj_id: int) -> np.random.Generator:
        st = self._state.get(traj_id)
        if st is None:
            st = self._state[traj_id] = _EnvState(np.random.default_rng([self.seed, traj_id]))
        return st.rng

    def _call(self, task: TaskSpec, traj_id: int, latency_dist) -> tuple[float, str | None]:
        rng = self.rng(traj_id)
        latency = latency_dist.sample(rng)
        if latency > task.env.timeout_s:
            return task.env.timeout_s, "timeout"
        if task.env.failure_prob and rng.random() < task.env.failure_prob:
            return latency, "error"
        return latency, None

    def reset(self, task: TaskSpec, traj_id: int) -> tuple[float, EnvOutcome]:
        latency, err = self._call(task, traj_id, task.env.reset)
        if err:
            return latency, EnvOutcome(ok=False, error=err)
        st = self._state[traj_id]
        st.turns_total = max(1, round(task.turns.sample(st.rng)))
        st.turn = 0
        return latency, EnvOutcome(ok=True, obs_tokens=max(1, round(task.prompt_tokens.sample(st.rng))))

    def step(self, task: TaskSpec, traj_id: int) -> tuple[float, EnvOutcome]:
        latency, err = self._call(task, traj_id, task.env.step)
        if err:
            return latency, EnvOutcome(ok=False, error=err)
        st = self._state[traj_id]
        st.turn += 1
        done = st.turn >= st.turns_total
        obs = 0 if done else max(0, round(task.obs_tokens.sample(st.rng)))
        return latency, EnvOutcome(ok=True, obs_tokens=obs, done=done)

    def response_tokens(self, task: TaskSpec, traj_id: int, limit: int) -> int:
        return max(1, min(limit, round(task.response_tokens.sample(self.rng(traj_id)))))

    def forget(self, traj_id: int) -> None:
        self._state.pop(traj_id, None)
