"""RolloutScheduler admission and task mix, LockstepBarrier, and the five mode configs."""

from __future__ import annotations

from collections import Counter

import pytest

from rollart.core.barrier import LockstepBarrier
from rollart.core.modes import mode_config
from rollart.core.scheduler import RolloutScheduler


@pytest.mark.parametrize("redundancy,expected", [(0.0, 8), (0.25, 10), (0.1, 9), (1.0, 16)])
def test_members_per_group(plan, redundancy: float, expected: int) -> None:
    mode = mode_config(plan.model_copy(update={}), "rollart")
    mode = type(mode)(**{**mode.__dict__, "redundancy": redundancy})
    assert RolloutScheduler(plan.tasks, mode, 2, 8).members_per_group == expected


def test_task_mix_follows_shares_exactly(plan) -> None:
    sched = RolloutScheduler(plan.tasks, mode_config(plan), 2, 8)
    counts = Counter(sched.next_task().name for _ in range(50))  # shares 0.4 / 0.4 / 0.2
    assert counts == {"FrozenLake": 20, "GEM-Math": 20, "CodeExec": 10}


def test_admission_limits(plan) -> None:
    cont = RolloutScheduler(plan.tasks, mode_config(plan, "rollart"), groups_per_batch=4, group_size=8)
    assert cont.admission_limit(proxy_version=0) == (0 + 1 + plan.algorithm.alpha) * 4
    assert cont.admission_limit(proxy_version=3) == (3 + 1 + plan.algorithm.alpha) * 4
    batch = RolloutScheduler(plan.tasks, mode_config(plan, "sync"), groups_per_batch=4, group_size=8)
    assert batch.admission_limit(proxy_version=7) == 4  # batch 0 only until it finishes
    batch.maybe_open_next_batch(proxy_version=7)
    assert batch.batch_index == 0  # batch 0 has not finished


def test_barrier_opens_when_all_active_arrived() -> None:
    b = LockstepBarrier("t")
    for k in "abc":
        b.join(k)
    woken: list[object] = []
    sig = b.arrive("a")
    assert sig is not None
    sig.add_waiter(woken.append)
    assert b.arrive("b") is sig
    assert b.arrive("c") is None and len(woken) == 1


def test_barrier_leave_releases_waiters_and_aborted_arrivals_do_not_count() -> None:
    b = LockstepBarrier("t")
    for k in "abc":
        b.join(k)
    woken: list[object] = []
    b.arrive("a").add_waiter(woken.append)
    b.leave("a")       # a was aborted after arriving
    b.arrive("b").add_waiter(woken.append)
    assert woken == []  # c has not arrived; a's arrival no longer counts
    b.leave("c")       # c finished its rollout
    assert len(woken) == 2  # the barrier opened once, waking both registered waiters
    assert b.arrived == set()


@pytest.mark.parametrize("mode,alpha,lockstep,after_batch,affinity,batch_level", [
    ("sync", 0, True, True, False, True),
    ("sync+", 0, False, False, False, True),
    ("one-off", 1, False, False, False, True),
    ("areal", 1, False, False, False, False),
    ("rollart", 1, False, False, True, False),
])
def test_modes_are_configurations(plan, mode, alpha, lockstep, after_batch, affinity, batch_level) -> None:
    cfg = mode_config(plan, mode)
    assert (cfg.alpha, cfg.lockstep_env, cfg.reward_after_batch, cfg.hw_affinity, cfg.batch_level_launch) == \
        (alpha, lockstep, after_batch, affinity, batch_level)
    assert cfg.redundancy == (plan.algorithm.redundancy if mode == "rollart" else 0.0)
    assert cfg.async_weight_transfer == (mode == "rollart")
    # α = 0 must sync first; AReaL pushes the weights right after each train step (issue 14, item 8), and
    # ROLLART updates before get_batch as ROLL's pipeline does (issue 14, ROLLART ÷ AReaL)
    assert cfg.sync_before_get_batch == (alpha == 0 or mode in ("areal", "rollart"))


def test_unknown_mode_is_rejected(plan) -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        mode_config(plan, "turbo")


def test_weight_updates_run_one_at_a_time() -> None:
    """A publish that lands while the previous update is still running waits for it, instead
    of suspending and resuming the proxy a second time in the middle of the first update."""
    from types import SimpleNamespace

    from rollart.core.effects import UpdateWeights, Wait
    from rollart.core.signals import Signal
    from rollart.core.trainer import sync_weights

    calls: list[str] = []
    proxy = SimpleNamespace(version=0, worker_ids=(0, 1), suspend=lambda: calls.append("suspend"),
                            resume=lambda v: (calls.append(f"resume {v}"), setattr(proxy, "version", v)))
    ctl = SimpleNamespace(proxy=proxy, mode=SimpleNamespace(async_weight_transfer=True), published_version=1,
                          weights_published=Signal(), updating_weights=False, weights_updated=Signal(),
                          buffer=SimpleNamespace(changed=Signal()), now=lambda: 0.0,
                          tracer=SimpleNamespace(trainer_span=lambda *a: None),
                          weights_arrived=lambda: calls.append("arrived"))
    first, second = sync_weights(ctl, 1), sync_weights(ctl, 2)
    assert isinstance(next(first), UpdateWeights)          # v1 is being swapped in ...
    eff = next(second)
    assert isinstance(eff, Wait) and eff.signal is ctl.weights_updated  # ... so v2 waits
    assert calls == ["suspend"]
    with pytest.raises(StopIteration):
        first.send(None)                                    # v1 done: the proxy resumes on it
    ctl.published_version = 2                               # v2's pull lands
    assert isinstance(second.send(1), UpdateWeights)        # then v2 runs its own update
    with pytest.raises(StopIteration):
        second.send(None)
    assert calls == ["suspend", "resume 1", "arrived", "suspend", "resume 2", "arrived"] and proxy.version == 2


def test_a_publish_does_not_run_two_versions_ahead_of_the_workers() -> None:
    """The store keeps the two newest versions: version 2 is published only once the workers serve
    version 1, so an update (or a restarted worker) still finds the version it pulls."""
    from types import SimpleNamespace

    from rollart.core.effects import PublishWeights, Wait
    from rollart.core.signals import Signal
    from rollart.core.trainer import publish

    proxy = SimpleNamespace(version=0, worker_ids=(0,))
    ctl = SimpleNamespace(proxy=proxy, weights_updated=Signal(), now=lambda: 0.0)
    eff = next(publish(ctl, 2))
    assert isinstance(eff, Wait) and eff.signal is ctl.weights_updated
    proxy.version = 1
    assert isinstance(next(publish(ctl, 2)), PublishWeights)
