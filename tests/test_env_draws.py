"""Blocked per-trajectory draws (sim.costs.env): the same values as one scalar draw at a time."""

from __future__ import annotations

import pytest

from rollart.sim.costs import env as env_costs
from rollart.sim.costs.env import EnvModel, _single_kind
from tests.conftest import small_plan


def _episode(model: EnvModel, task, traj_id: int) -> list:
    out = [model.reset(task, traj_id)]
    for _ in range(60):
        out.append(model.response_tokens(task, traj_id, 10_000))
        latency, outcome = model.step(task, traj_id)
        out.append((latency, outcome))
        if not outcome.ok or outcome.done:
            break
    return out


@pytest.mark.parametrize("overrides", [[], ["tasks.FrozenLake.env.failure_prob=0", "tasks.CodeExec.env.failure_prob=0"],
                                       ["tasks.GEM-Math.response_tokens={kind: uniform, low: 10, high: 900}"]])
def test_blocked_draws_equal_scalar_draws(overrides: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    plan = small_plan(overrides)
    blocked = {t.name: [_episode(EnvModel(5), t, i) for i in range(30)] for t in plan.tasks}
    assert any(_single_kind(t) is not None for t in plan.tasks)  # the blocked path ran
    monkeypatch.setattr(env_costs, "_single_kind", lambda task: None)  # one scalar call per draw
    scalar = {t.name: [_episode(EnvModel(5), t, i) for i in range(30)] for t in plan.tasks}
    assert blocked == scalar


def test_mixed_streams_are_not_blocked() -> None:
    plan = small_plan(["tasks.GEM-Math.env.failure_prob=0.1"])
    assert _single_kind(plan.task("GEM-Math")) is None  # lognormal response + a uniform failure draw
