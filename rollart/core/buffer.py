"""SampleBuffer: scored trajectories waiting for training, kept by GRPO group."""

from __future__ import annotations

from rollart.core.signals import Signal
from rollart.core.trajectory import Group, Trajectory, TrajState


class SampleBuffer:
    """Holds groups from admission to consumption and enforces the staleness window.

    A group admitted at policy version ``v`` is usable by the batch trained at version ``n``
    while ``v >= n - alpha``. Groups that fall out of the window are evicted; their members
    still in flight are returned for the caller to abort (never dropped silently). A batch
    is ``groups_per_batch`` whole groups, oldest version first.

    With ``evict=False`` (AReaL) the window is not enforced here: staleness is bounded only by
    admission, and a group that finishes late is trained on, oldest first, however old it is.
    """

    def __init__(self, group_size: int, groups_per_batch: int, alpha: int, evict: bool = True):
        self.group_size = group_size
        self.groups_per_batch = groups_per_batch
        self.alpha = alpha
        self.evict = evict
        self.open: dict[int, Group] = {}     # admitted, not yet complete
        self.ready: list[Group] = []         # complete, not consumed (admission order)
        self.changed = Signal("buffer.changed")
        self.consumed_groups = 0
        self.pending_high_water = 0  # most groups ever pending (open + ready) at once

    # ---- admission & scoring -------------------------------------------------------------

    def add_group(self, group: Group) -> None:
        self.open[group.id] = group
        self.pending_high_water = max(self.pending_high_water, self.pending_groups)

    def submit(self, traj: Trajectory, now: float) -> list[Trajectory]:
        """A member was scored. Returns the group's other running members to abort as
        redundant once the group holds ``group_size`` scored members."""
        group = traj.group
        if group.complete or group.evicted or traj.state is not TrajState.RUNNING:
            # The group filled (or was evicted) while this member was being scored.
            if traj.state is TrajState.RUNNING:
                traj.state = TrajState.ABORTED_STALE if group.evicted else TrajState.ABORTED_REDUNDANT
            return []
        traj.state = TrajState.SCORED
        group.scored.append(traj)
        if len(group.scored) < group.size:
            return []
        group.complete = True
        group.completed_at = now
        del self.open[group.id]
        self.ready.append(group)
        surplus = group.running
        for t in surplus:
            t.state = TrajState.ABORTED_REDUNDANT
        self.changed.fire()
        return surplus

    def fail(self, traj: Trajectory) -> None:
        traj.state = TrajState.FAILED

    def abandon(self, group: Group) -> list[Trajectory]:
        """The group cannot be filled (refills exhausted): release its slot."""
        group.abandoned = True
        self.open.pop(group.id, None)
        running = group.running
        for t in running:
            t.state = TrajState.FAILED
        for t in group.scored:
            t.state = TrajState.FAILED
        self.changed.fire()
        return running

    # ---- staleness ---------------------------------------------------------------------

    def usable(self, group: Group, version: int) -> bool:
        return not self.evict or group.version >= version - self.alpha

    def evict_stale(self, version: int) -> list[Trajectory]:
        """Drop every group outside the window for ``version``; return in-flight members to abort."""
        if not self.evict:
            return []
        to_abort: list[Trajectory] = []
        keep: list[Group] = []
        for g in self.ready:
            if self.usable(g, version):
                keep.append(g)
            else:
                g.evicted = True
                for t in g.scored:
                    t.state = TrajState.ABORTED_STALE
        evicted_any = len(keep) != len(self.ready)
        self.ready = keep
        for gid in [gid for gid, g in self.open.items() if not self.usable(g, version)]:
            g = self.open.pop(gid)
            g.evicted = True
            evicted_any = True
            for t in g.members:
                if t.state is TrajState.RUNNING:
                    to_abort.append(t)
                if t.state in (TrajState.RUNNING, TrajState.SCORED):
                    t.state = TrajState.ABORTED_STALE
        if evicted_any:
            self.changed.fire()
        return to_abort

    # ---- batch formation ---------------------------------------------------------------

    def take_batch(self, version: int) -> list[Group] | None:
        """``groups_per_batch`` usable complete groups, oldest version first, or None."""
        usable = [g for g in self.ready if self.usable(g, version)]
        if len(usable) < self.groups_per_batch:
            return None
        usable.sort(key=lambda g: (g.version, g.completed_at, g.id))
        batch = usable[: self.groups_per_batch]
        taken = {g.id for g in batch}
        self.ready = [g for g in self.ready if g.id not in taken]
        for g in batch:
            g.consumed = True
            for t in g.scored:
                t.state = TrajState.USED
        self.consumed_groups += len(batch)
        self.changed.fire()
        return batch

    # ---- accounting -----------------------------------------------------------------------

    @property
    def pending_groups(self) -> int:
        return len(self.open) + len(self.ready)

    @property
    def pending_trajectories(self) -> int:
        return sum(len(g.running) + len(g.scored) for g in self.open.values()) + sum(
            len(g.scored) for g in self.ready)
