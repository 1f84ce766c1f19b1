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

    Groups of env groups (``Group.slot`` set: ROLLART, as ROLL's GroupQueue) are taken per env group
    in admission order, as ROLL's get_batch does: a round offers each env group's oldest pending
    group and takes the finished ones in the order they finished; the next round (each env group's
    second oldest) only once every group offered in this one has been taken. With as many env groups
    as groups per batch (the default) a batch is one episode of each, so the tasks keep their shares.
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
        self.by_slot: dict[int, list[Group]] = {}  # env groups: their pending groups, oldest first
        self.slot_consumed: dict[int, int] = {}    # env groups: their groups trained on

    # ---- admission & scoring -------------------------------------------------------------

    def add_group(self, group: Group) -> None:
        self.open[group.id] = group
        if group.slot is not None:
            self.by_slot.setdefault(group.slot, []).append(group)
        self.pending_high_water = max(self.pending_high_water, self.pending_groups)

    def slot_pending(self, slot: int) -> int:
        """Groups of env group ``slot`` admitted and not yet consumed, evicted or abandoned."""
        return len(self.by_slot.get(slot, ()))

    def _unslot(self, group: Group) -> None:
        if group.slot is not None:
            pending = self.by_slot[group.slot]
            pending.remove(group)  # at most 1 + α long

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
        group.failed_paths.clear()  # a refill still pending (an env group's slot) will not start
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
        group.failed_paths.clear()
        if self.open.pop(group.id, None) is not None:
            self._unslot(group)
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
                g.failed_paths.clear()
                self._unslot(g)
                for t in g.scored:
                    t.state = TrajState.ABORTED_STALE
        evicted_any = len(keep) != len(self.ready)
        self.ready = keep
        for gid in [gid for gid, g in self.open.items() if not self.usable(g, version)]:
            g = self.open.pop(gid)
            g.evicted = True
            self._unslot(g)
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
        """``groups_per_batch`` usable complete groups, oldest version first (env groups: by rounds,
        see the class docstring), or None."""
        if self.by_slot:
            batch = self._batch_by_rounds(version)
            if batch is None:
                return None
        else:
            usable = [g for g in self.ready if self.usable(g, version)]
            if len(usable) < self.groups_per_batch:
                return None
            usable.sort(key=lambda g: (g.version, g.completed_at, g.id))
            batch = usable[: self.groups_per_batch]
        taken = {g.id for g in batch}
        self.ready = [g for g in self.ready if g.id not in taken]
        for g in batch:
            if g.slot is not None:
                self._unslot(g)
                self.slot_consumed[g.slot] = self.slot_consumed.get(g.slot, 0) + 1
            g.consumed = True
            for t in g.scored:
                t.state = TrajState.USED
        self.consumed_groups += len(batch)
        self.changed.fire()
        return batch

    def _batch_by_rounds(self, version: int) -> list[Group] | None:
        batch: list[Group] = []
        need = self.groups_per_batch
        rnd = 0
        while True:
            offered = [pending[rnd] for pending in self.by_slot.values() if len(pending) > rnd]
            if not offered:
                return None  # too few groups admitted yet
            done = [g for g in offered if g.complete and self.usable(g, version)]
            if len(done) >= need - len(batch):
                done.sort(key=lambda g: (g.completed_at, g.id))
                return batch + done[: need - len(batch)]
            if len(done) < len(offered):
                return None  # an env group's oldest episode is still rolling: wait for it
            batch += done
            rnd += 1

    # ---- accounting -----------------------------------------------------------------------

    @property
    def pending_groups(self) -> int:
        return len(self.open) + len(self.ready)

    @property
    def pending_trajectories(self) -> int:
        return sum(len(g.running) + len(g.scored) for g in self.open.values()) + sum(
            len(g.scored) for g in self.ready)
