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
    plan = small_plan(["tasks.GEM-Math.obs_tokens={kind: uniform, low: 10, high: 100}"])
    assert _single_kind(plan.task("GEM-Math")) is None  # lognormal response + a uniform observation


def test_failures_draw_from_a_stream_of_their_own() -> None:
    # a run with failures sees the same latencies and token counts as one without, call for call,
    # until a trajectory's first failure (its retry draws a new latency): comparisons stay paired
    clean, faulty = (small_plan([f"tasks.GEM-Math.env.failure_prob={p}"]).task("GEM-Math") for p in (0, 0.2))
    assert _single_kind(faulty) == _single_kind(clean)  # a failure draw no longer mixes the stream
    failed = 0
    for i in range(40):
        a, b = _episode(EnvModel(5), clean, i), _episode(EnvModel(5), faulty, i)
        for x, y in zip(a, b):
            if isinstance(y, tuple) and not y[1].ok:
                assert y[0] == x[0]  # the failed call took the clean call's latency
                failed += 1
                break
            assert x == y
    assert failed >= 5
