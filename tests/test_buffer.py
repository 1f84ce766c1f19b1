"""SampleBuffer: group completion, redundant surplus, α window, batch formation."""

from __future__ import annotations

from rollart.core.buffer import SampleBuffer
from rollart.core.trajectory import Group, Trajectory, TrajState


def make_group(buf: SampleBuffer, gid: int, version: int, members: int, size: int = 2) -> Group:
    g = Group(id=gid, task="t", version=version, size=size, batch_index=0)
    for i in range(members):
        g.members.append(Trajectory(id=gid * 100 + i, group=g, task="t", tag="t", start_version=version,
                                    started_at=0.0))
    buf.add_group(g)
    return g


def test_group_completes_at_group_size_and_returns_surplus() -> None:
    buf = SampleBuffer(group_size=2, groups_per_batch=1, alpha=1)
    g = make_group(buf, 0, 0, members=3)
    assert buf.submit(g.members[0], now=1.0) == []
    surplus = buf.submit(g.members[1], now=2.0)
    assert surplus == [g.members[2]]
    assert g.complete and g.completed_at == 2.0
    assert g.members[2].state is TrajState.ABORTED_REDUNDANT
    # A member finishing after the group filled is redundant, not a third sample.
    late = Trajectory(id=99, group=g, task="t", tag="t", start_version=0, started_at=0.0)
    g.members.append(late)
    assert buf.submit(late, now=3.0) == []
    assert late.state is TrajState.ABORTED_REDUNDANT and len(g.scored) == 2


def test_alpha_window_boundary() -> None:
    buf = SampleBuffer(group_size=1, groups_per_batch=1, alpha=2)
    g = make_group(buf, 0, version=3, members=1, size=1)
    assert buf.usable(g, 5)       # 3 >= 5 - 2
    assert not buf.usable(g, 6)   # 3 <  6 - 2


def test_evict_stale_aborts_in_flight_and_drops_ready() -> None:
    buf = SampleBuffer(group_size=1, groups_per_batch=1, alpha=0)
    ready = make_group(buf, 0, version=0, members=1, size=1)
    buf.submit(ready.members[0], now=1.0)
    running = make_group(buf, 1, version=0, members=2, size=2)
    fresh = make_group(buf, 2, version=1, members=1, size=1)
    to_abort = buf.evict_stale(version=1)
    assert set(to_abort) == set(running.members)
    assert all(t.state is TrajState.ABORTED_STALE for t in running.members)
    assert ready.members[0].state is TrajState.ABORTED_STALE and ready.evicted
    assert fresh.id in buf.open and not fresh.evicted
    assert buf.take_batch(1) is None


def test_without_eviction_old_groups_stay_and_are_trained_oldest_first() -> None:
    # AReaL: staleness is bounded by admission only; the buffer drops nothing for age.
    buf = SampleBuffer(group_size=1, groups_per_batch=1, alpha=0, evict=False)
    old = make_group(buf, 0, version=0, members=1, size=1)
    fresh = make_group(buf, 1, version=3, members=1, size=1)
    assert buf.usable(old, 5) and buf.evict_stale(version=5) == []
    assert old.members[0].state is TrajState.RUNNING and not old.evicted
    buf.submit(fresh.members[0], now=1.0)
    buf.submit(old.members[0], now=2.0)
    assert buf.take_batch(5) == [old]  # the oldest version first, whatever its age


def test_take_batch_whole_groups_oldest_version_first() -> None:
    buf = SampleBuffer(group_size=2, groups_per_batch=2, alpha=2)
    groups = [make_group(buf, gid, version=v, members=2) for gid, v in ((0, 2), (1, 1), (2, 2))]
    for t, g in enumerate(groups):
        for m in g.members:
            buf.submit(m, now=float(t))
    batch = buf.take_batch(2)
    assert [g.id for g in batch] == [1, 0]
    assert all(m.state is TrajState.USED for g in batch for m in g.members)
    assert buf.consumed_groups == 2 and [g.id for g in buf.ready] == [2]
    assert buf.take_batch(2) is None  # one group left, two needed


def test_abandon_fails_the_group_and_frees_its_slot() -> None:
    buf = SampleBuffer(group_size=2, groups_per_batch=1, alpha=1)
    g = make_group(buf, 0, version=0, members=2)
    buf.submit(g.members[0], now=1.0)
    running = buf.abandon(g)
    assert running == [g.members[1]]
    assert all(m.state is TrajState.FAILED for m in g.members)
    assert buf.pending_groups == 0 and not g.live
