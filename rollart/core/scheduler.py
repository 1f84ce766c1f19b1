"""RolloutScheduler: admits GRPO groups and launches (redundant) trajectories for them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generator

from rollart.core.effects import Spawn, Wait
from rollart.core.trajectory import Group, Trajectory
from rollart.plan.schema import TaskSpec, env_managers_of, members_per_group

if TYPE_CHECKING:
    from rollart.core.controller import Controller
    from rollart.core.modes import ModeConfig


class RolloutScheduler:
    """Decides when a new group may start and which task it samples.

    * Every group launches ``ceil(group_size × (1 + redundancy))`` members; the surplus is
      aborted once ``group_size`` are scored (redundant env rollout masks stragglers).
    * Continuous modes keep ``consumed + pending ≤ (proxy_version + 1 + α) × groups_per_batch``,
      so at most (1 + α) batches are pending: the buffer bound is O(α·E). They roll out on E env
      managers (``algorithm.env_managers``, default one batch's members): a group starts only when
      its members find free ones, so α bounds staleness, not concurrency (ROLL runs num_env_groups ×
      group_size = rollout_batch_size env managers whatever its async ratio; AReaL's
      max_concurrent_rollouts defaults to the train batch size).
    * Batch-level modes open rollout batch k only when batch k − 1 is finished and
      ``k ≤ proxy_version + α``, then launch its groups together.
    * Tasks follow their shares by smooth weighted round-robin (exact, deterministic).
    * Env groups (``mode.env_groups``, as ROLL runs its rollout): the E env managers form
      E ÷ members env groups, each bound to one task by the same round-robin (ROLL's
      num_groups_partition; see ``slot_task``). Each env manager works on its own (``fill_slot``):
      when it frees it takes the oldest GRPO group of its env group still short of members, else
      a new group once its env group holds fewer than (1 + α)·q groups and its consumed + pending
      groups are fewer than (proxy_version + 1 + α)·q, q = ⌈groups per batch ÷ env groups⌉ (ROLL's
      GroupQueue creates q episodes a step, α steps' worth ahead at the start, and expires those
      more than α steps old), and, in a mode that evicts nothing (AReaL-style, whose admission is its
      only staleness bound), the whole window above is open (env groups × q exceeds a batch when
      they do not divide it or outnumber its groups); the buffer takes each env group's oldest
      finished one.
    """

    def __init__(self, tasks: list[TaskSpec], mode: "ModeConfig", groups_per_batch: int, group_size: int,
                 env_managers: int | None = None):
        self.tasks = tasks
        self.mode = mode
        self.groups_per_batch = groups_per_batch
        self.group_size = group_size
        self.members_per_group = members_per_group(group_size, mode.redundancy)
        # the continuous modes' bound; batch-level modes launch one whole batch at a time instead
        self.env_managers = env_managers_of(env_managers, groups_per_batch, group_size, mode.redundancy)
        self.batch_index = 0
        self.groups_launched = 0
        self._held_since: dict[int, float] = {}  # admission key → when it began waiting for newer weights
        self._held: dict[int, tuple[float, float]] = {}  # admission key → its last such wait, (from, to)
        self._wrr = [0.0] * len(tasks)
        self._batch_groups: dict[int, list[Group]] = {}
        self.env_groups = 0  # continuous modes with mode.env_groups: how many
        if mode.env_groups and not mode.batch_level_launch:
            self.env_groups = self.env_managers // self.members_per_group
            # groups each env group gives a batch: 1 with at least one batch of env managers (ROLL's
            # max_traj_per_env = 1); more when fewer env groups must fill a batch in rounds
            self.per_batch = -(-groups_per_batch // self.env_groups)
            self.slot_rolling = [0] * self.env_groups   # members of each env group on their env managers
            self.slot_episodes = [0] * self.env_groups  # groups each env group has started
            self._picks: dict[int, TaskSpec] = {}       # the round-robin's picks still ahead of some env group
            self._picked = 0

    def slot_task(self, slot: int) -> TaskSpec:
        """The task of env group ``slot``'s next group: pick k·S + slot of the round-robin for its
        k-th group (S env groups). When the shares divide the env groups (ROLL's num_groups_partition)
        every env group keeps one task; otherwise a task's groups rotate among them, so each task
        keeps its share even with fewer env groups than tasks."""
        i = self.slot_episodes[slot] * self.env_groups + slot
        while self._picked <= i:
            self._picks[self._picked] = self.next_task()
            self._picked += 1
        task = self._picks.pop(i)
        self.slot_episodes[slot] += 1
        return task

    def resume(self, version: int) -> None:
        """Continue after ``version`` batches (a checkpoint): batch-level modes at batch ``version``;
        each env group has given ``version`` groups, so the round-robin resumes past their picks."""
        self.batch_index = version
        if self.env_groups:
            for _ in range(version * self.env_groups):
                self.next_task()
            self._picked = version * self.env_groups
            self.slot_episodes = [version] * self.env_groups

    def on_spawned(self, group: Group) -> None:
        """A member of ``group`` (a first launch or a refill) took one of its env group's managers."""
        if group.slot is not None:
            self.slot_rolling[group.slot] += 1

    def on_closed(self, group: Group) -> None:
        """A member of ``group`` closed its env: its env manager is free."""
        if group.slot is not None:
            self.slot_rolling[group.slot] -= 1

    def fill_slot(self, ctl: "Controller", slot: int) -> list[Trajectory]:
        """Put env group ``slot``'s free env managers to work; returns the trajectories started.

        As each of ROLL's env managers asks its GroupQueue for the oldest episode with fewer than
        group_size + redundancy rollouts started (``get_episode_id``), a free manager first joins the
        oldest open group still short of members (one admitted while some managers were busy, or
        one that lost a member to a failure), and only then starts a new group, under the admission
        rules of the class docstring. A manager never waits for the rest of its env group: one that
        finishes early works on the next group while the others finish theirs."""
        members = self.members_per_group
        free = members - self.slot_rolling[slot]
        started: list[Trajectory] = []
        if free <= 0:
            return started
        buffer = ctl.buffer
        for group in buffer.by_slot.get(slot, ()):  # oldest first
            if group.complete or group.evicted or group.abandoned:
                continue
            room = members - len(group.scored) - len(group.running)
            for _ in range(min(room, free)):
                started.append(ctl.new_trajectory(group))
                free -= 1
            if free <= 0:
                return started
        alpha = self.mode.alpha
        # Until the workers serve a version the trainer's window still holds, a new group would be
        # stale on admission (ROLL creates a step's episodes once its weights are in).
        if ctl.proxy.version < ctl.version - alpha:
            self._hold(ctl, slot)
            return started
        limit, ahead = (ctl.proxy.version + 1 + alpha) * self.per_batch, (1 + alpha) * self.per_batch
        # Where nothing evicts stale groups (AReaL-style), the whole scheduler's window too: env groups
        # × q exceeds a batch when they do not divide it or outnumber its groups, and their quotas alone
        # would admit groups that no batch takes in time, trained ever staler. ROLL's queues keep their
        # own quotas and expire what no batch took within α (evict_stale), so ROLLART keeps them.
        window = self.admission_limit(ctl.proxy.version) if not self.mode.evict_stale else None
        while free > 0:
            pending = buffer.slot_pending(slot)
            if pending >= ahead:
                break
            if (buffer.slot_consumed.get(slot, 0) + pending >= limit
                    or (window is not None and buffer.consumed_groups + buffer.pending_groups >= window)):
                if ctl.proxy.version < ctl.version:  # newer weights would open the window
                    self._hold(ctl, slot)
                break
            group = ctl.new_group(self.slot_task(slot), self.batch_index, slot=slot)
            self.groups_launched += 1
            held = self._held.pop(slot, None)
            for _ in range(min(members, free)):
                started.append(ctl.new_trajectory(group, held))
                free -= 1
        return started

    def _hold(self, ctl: "Controller", key: int) -> None:
        """Admission for ``key`` (an env group's slot; -1: the whole scheduler) waits for newer weights: the
        controller marks the span, and the next group ``key`` starts learns when the wait began and ended."""
        ctl.admission_awaits_weights()
        self._held_since.setdefault(key, ctl.now())

    def weights_arrived(self, now: float) -> None:
        """The workers serve newer weights: every admission waiting for them may go on; each keeps the
        (from, to) of its wait for the next group it starts."""
        for key, since in self._held_since.items():
            if since < now:
                self._held[key] = (since, now)
        self._held_since.clear()

    def next_task(self) -> TaskSpec:
        total = sum(t.share for t in self.tasks)
        for i, t in enumerate(self.tasks):
            self._wrr[i] += t.share
        best = max(range(len(self.tasks)), key=lambda i: (self._wrr[i], -i))
        self._wrr[best] -= total
        return self.tasks[best]

    def admission_limit(self, proxy_version: int) -> int:
        if self.mode.batch_level_launch:
            return (self.batch_index + 1) * self.groups_per_batch
        return (proxy_version + 1 + self.mode.alpha) * self.groups_per_batch

    def _batch_finished(self, k: int) -> bool:
        groups = self._batch_groups.get(k, [])
        live_done = sum(1 for g in groups if g.complete and not g.evicted)
        return live_done >= self.groups_per_batch and not any(
            not (g.complete or g.abandoned or g.evicted) for g in groups)

    def maybe_open_next_batch(self, proxy_version: int) -> bool:
        """Open the next rollout batch(es) when allowed; True when one opened."""
        opened = False
        while (self.mode.batch_level_launch and self._batch_finished(self.batch_index)
               and self.batch_index + 1 <= proxy_version + self.mode.alpha):
            self._batch_groups.pop(self.batch_index, None)
            self.batch_index += 1
            opened = True
        return opened

    def _run_env_groups(self, ctl: "Controller") -> Generator[Any, Any, None]:
        # A manager that frees starts its next trajectory itself (run_trajectory → fill_slot); this
        # loop serves the managers left idle until the buffer or the weights change.
        while True:
            for slot in range(self.env_groups):
                for traj in self.fill_slot(ctl, slot):
                    yield Spawn(ctl.trajectory_process(traj), key=traj.id)
            yield Wait(ctl.buffer.changed)

    def run(self, ctl: "Controller") -> Generator[Any, Any, None]:
        if self.env_groups:
            yield from self._run_env_groups(ctl)
            return
        buffer = ctl.buffer
        while True:
            if self.maybe_open_next_batch(ctl.proxy.version):
                ctl.forget_gates(self.batch_index)  # the finished batches' barriers
            limit = self.admission_limit(ctl.proxy.version)
            envs_busy = False
            while buffer.consumed_groups + buffer.pending_groups < limit:
                if not self.mode.batch_level_launch and ctl.rolling + self.members_per_group > self.env_managers:
                    envs_busy = True  # the window is open, the env managers are not: wait for one to free
                    break
                group = ctl.new_group(self.next_task(), self.batch_index)
                if self.mode.batch_level_launch:  # only batch-level modes look back at a batch's groups
                    self._batch_groups.setdefault(self.batch_index, []).append(group)
                self.groups_launched += 1
                held = self._held.pop(-1, None)
                for _ in range(self.members_per_group):
                    traj = ctl.new_trajectory(group, held)
                    yield Spawn(ctl.trajectory_process(traj), key=traj.id)
            if not envs_busy and not self.mode.batch_level_launch and ctl.proxy.version < ctl.version:
                self._hold(ctl, -1)  # the window is shut until the workers serve newer weights
            yield Wait(ctl.env_freed if envs_busy else buffer.changed)
