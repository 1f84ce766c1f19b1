"""RolloutScheduler: admits GRPO groups and launches (redundant) trajectories for them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generator

from rollart.core.effects import Spawn, Wait
from rollart.core.trajectory import Group
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
        self._wrr = [0.0] * len(tasks)
        self._batch_groups: dict[int, list[Group]] = {}

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

    def run(self, ctl: "Controller") -> Generator[Any, Any, None]:
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
                for _ in range(self.members_per_group):
                    traj = ctl.new_trajectory(group)
                    yield Spawn(ctl.trajectory_process(traj), key=traj.id)
            yield Wait(ctl.env_freed if envs_busy else buffer.changed)
