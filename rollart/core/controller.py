"""The single controller: wires proxy, buffer, scheduler, env managers and trainer.

A backend creates one Controller per run, spawns :meth:`Controller.main` and executes the
effects its processes yield. Everything the controller decides is backend-neutral."""

from __future__ import annotations

from collections import Counter, deque
from typing import Any, Callable, Generator

from rollart.core.barrier import LockstepBarrier
from rollart.core.buffer import SampleBuffer
from rollart.core.effects import Spawn
from rollart.core.env_manager import run_trajectory
from rollart.core.modes import ModeConfig
from rollart.core.proxy import LLMProxy, WorkerInfo
from rollart.core.scheduler import RolloutScheduler
from rollart.core.signals import Signal
from rollart.core.stats import RunStats, StepRecord, awaited_on_path, critical_path_breakdown
from rollart.core.trainer import run_trainer
from rollart.core.trajectory import Group, Trajectory, TrajState
from rollart.plan.schema import Plan, TaskSpec
from rollart.trace import NullTracer, Tracer


def _gate_wait(traj: Trajectory) -> float:
    """Seconds ``traj`` spent in reward segments (its own call plus any wait at the reward gate)."""
    return sum(e - s for s, e, cat in traj.segments if cat == "reward")


def _breakdown(critical: Trajectory, batch: tuple[Trajectory, ...], start: float, end: float) -> dict[str, float]:
    """The critical path of [start, end]. Past Sync's reward gate it is the critical trajectory's
    own reward call; before the gate opened it is the member the gate waited for (the last to
    arrive), so a judge call that finished last does not turn the batch's rollout into *reward*."""
    gate = critical.reward_gate
    if gate is None or gate[1] <= start:
        return critical_path_breakdown(critical.segments, start, end)
    release = min(gate[1], end)
    arrived = [t for t in batch if t.reward_gate is not None and t.reward_gate[0] <= release]
    waited_for = max(arrived, key=lambda t: (t.reward_gate[0], t.id))  # type: ignore[index]
    out = critical_path_breakdown(waited_for.segments, start, release)
    for key, seconds in critical_path_breakdown(critical.segments, release, end).items():
        out[key] = out.get(key, 0.0) + seconds
    return out


def _move_to_weight_sync(breakdown: dict[str, float], segments: list[tuple[float, float, str]], start: float,
                         end: float, seconds: float) -> None:
    """Count up to ``seconds`` of the critical path's earliest time in [start, end] as weight sync: a
    trajectory whose admission waited that long for newer weights would have finished that much sooner."""
    left = seconds
    for s, e, kind in sorted(segments):
        s, e = max(s, start), min(e, end)
        if e <= s or kind not in breakdown:
            continue
        take = min(left, e - s, breakdown[kind])
        breakdown[kind] -= take
        breakdown["weight_sync"] += take
        left -= take
        if left <= 0:
            break


# a task owed ≥ 10 % of every batch that trains nothing this many steps in a row while its env fails stops the run
STARVED_STEPS = 3


class RunAborted(RuntimeError):
    """The run cannot make progress (e.g. every environment keeps failing)."""


def build_workers(plan: Plan) -> list[WorkerInfo]:
    """Inference workers in placement order; backends build their engines with the same ids."""
    workers: list[WorkerInfo] = []
    for g in plan.placement.generation:
        for _ in range(g.workers):
            workers.append(WorkerInfo(id=len(workers), pool=g.pool, role=g.role, tp=g.tp,
                                      max_num_seqs=g.max_num_seqs))
    return workers


class Controller:
    def __init__(self, plan: Plan, mode: ModeConfig, clock: Callable[[], float],
                 tracer: Tracer | None = None, on_step: Callable[[StepRecord], None] | None = None,
                 keep_history: bool = True):
        self.plan = plan
        self.mode = mode
        self.now = clock
        self.tracer: Tracer = tracer or NullTracer()
        self.on_step = on_step
        affinity = plan.placement.hw_affinity if mode.hw_affinity else None
        self.proxy = LLMProxy(build_workers(plan), affinity)
        self.buffer = SampleBuffer(plan.algorithm.group_size, plan.groups_per_batch, mode.alpha, mode.evict_stale)
        self.scheduler = RolloutScheduler(plan.tasks, mode, plan.groups_per_batch, plan.algorithm.group_size,
                                          plan.algorithm.env_managers)
        self.stats = RunStats()
        # keep_history: every trajectory, group and batch stays listed (tests, the real runtime);
        # without it, memory follows what is in flight: a trajectory is counted and forgotten once
        # its state is terminal (swept at each step), and batches are not listed.
        self.keep_history = keep_history
        self.trajectories: list[Trajectory] = []
        self.groups: list[Group] = []
        self._n_trajectories = 0
        self._n_groups = 0
        self._live: dict[int, Trajectory] = {}             # without history: not yet counted
        self._counted = {s.value: 0 for s in TrajState}  # without history: terminal, forgotten
        self._discarded_tokens = 0  # without history: generated tokens of the forgotten ones never trained
        self.version = 0                 # trainer's policy version (train steps done)
        self.start_version = 0           # > 0 when resumed from a checkpoint
        self.published_version = 0       # newest version every worker has pulled
        self.weights_published = Signal("weights.published")
        self.updating_weights = False    # a suspend → update → resume is running (one at a time)
        self.weights_updated = Signal("weights.updated")
        # [start, end] spans in which admission held new rollouts back until the workers served newer
        # weights (end None while open): a slow publish shows as weight sync on the critical path
        self.weights_awaited: list[list[float | None]] = []
        # the trainer's own blocking syncs of the last few steps, (start, end): seconds already in a step's
        # weight_sync, which a trajectory held for the weights meanwhile must not count again
        # (a hold lasts at most the α + 1 versions a trajectory may wait for: 32 spans cover any α the plans use)
        self.trainer_syncs: deque[tuple[float, float]] = deque(maxlen=32)
        self.rolling = 0                 # trajectories on an env manager (spawned, not yet closed)
        self.env_freed = Signal("env.freed")
        self.finished = False            # the trainer is done, or the backend is stopping the run
        self.batches: list[tuple[int, ...]] = []  # trajectory ids of each training batch
        self._lockstep: dict[int, LockstepBarrier] = {}
        self._reward_gate: dict[int, LockstepBarrier] = {}
        self._failure_limit = 20 * plan.algorithm.batch_size
        # groups of a task abandoned (refills exhausted) since one of that task's groups last completed:
        # successes of other tasks do not help a batch that needs this task's groups
        self._abandoned_in_a_row: dict[str, int] = {}
        self._abandon_limit = 20 * plan.groups_per_batch
        self._timeouts_recorded = 0      # stats.env_timeouts already attributed to a step
        # tasks the starvation stop watches (see _check_starved_tasks): planned share ≥ 10 % and ≥ 1
        # group a batch; per task, steps in a row that trained none of it; the per-task counters at
        # the end of the last STARVED_STEPS + 1 steps (the first: before any)
        total = sum(t.share for t in plan.tasks)
        self._watched_tasks = {t.name: t.share / total for t in plan.tasks
                               if t.share / total >= 0.10 and t.share / total * plan.groups_per_batch >= 1}
        self._starved_streak = dict.fromkeys(self._watched_tasks, 0)
        # per task, at each step: groups completed, groups abandoned, trajectories failed, env calls timed out
        self._task_snapshots: deque[tuple[dict[str, int], ...]] = deque([({}, {}, {}, {})], maxlen=STARVED_STEPS + 1)

    def admission_awaits_weights(self) -> None:
        """The scheduler held a new rollout back because the workers serve too old a version."""
        if not self.weights_awaited or self.weights_awaited[-1][1] is not None:
            self.weights_awaited.append([self.now(), None])

    def weights_arrived(self) -> None:
        """The workers were updated: an admission that awaited them may go on."""
        if self.weights_awaited and self.weights_awaited[-1][1] is None:
            self.weights_awaited[-1][1] = self.now()
        self.scheduler.weights_arrived(self.now())

    def resume_from(self, version: int) -> None:
        """Continue a run whose trainer checkpoint holds ``version``: training resumes at step
        ``version``, the workers serve it, and admission counts the batches already consumed, so
        the α window holds across the restart."""
        self.version = self.start_version = self.published_version = self.proxy.version = version
        self.buffer.consumed_groups = version * self.plan.groups_per_batch
        if self.scheduler.env_groups:  # each env group gave one group a batch
            self.buffer.slot_consumed = {s: version for s in range(self.scheduler.env_groups)}
        self.scheduler.resume(version)

    # ---- processes ------------------------------------------------------------------------

    def main(self) -> Generator[Any, Any, None]:
        yield Spawn(self.scheduler.run(self))
        yield from run_trainer(self)
        self.finished = True

    def trajectory_process(self, traj: Trajectory) -> Generator[Any, Any, None]:
        return run_trajectory(self, traj)

    # ---- bookkeeping used by the processes --------------------------------------------

    def new_group(self, task: TaskSpec, batch_index: int, slot: int | None = None) -> Group:
        group = Group(id=self._n_groups, task=task.name, version=self.proxy.version,
                      size=self.plan.algorithm.group_size, batch_index=batch_index, slot=slot)
        self._n_groups += 1
        if self.keep_history:
            self.groups.append(group)
        self.buffer.add_group(group)
        return group

    def new_trajectory(self, group: Group, held: tuple[float, float] | None = None) -> Trajectory:
        """A new rollout of ``group``; ``held``: the (from, to) its admission waited for newer weights
        (the head start it lost, :func:`_move_to_weight_sync`)."""
        task = self.plan.task(group.task)
        traj = Trajectory(id=self._n_trajectories, group=group, task=task.name, tag=task.affinity_tag,
                          start_version=self.proxy.version, started_at=self.now(), held_for_weights=held)
        if group.failed_paths:  # a refill: the failed attempt it replaces is on its path (helper-95: Sync with
            traj.segments = list(group.failed_paths.pop(0))  # 20 % env failures read 433 s of a 531 s step idle)
        self._n_trajectories += 1
        self.rolling += 1
        if group.slot is not None:
            self.scheduler.on_spawned(group)
        group.members.append(traj)
        if self.keep_history:
            self.trajectories.append(traj)
        else:
            self._live[traj.id] = traj
        return traj

    def trajectory_closed(self, traj: Trajectory) -> None:
        """A trajectory's env closed: its env manager is free for the next group (an env group's
        manager takes it itself: :func:`run_trajectory` calls ``scheduler.fill_slot``)."""
        self.rolling -= 1
        self.env_freed.fire()
        self.scheduler.on_closed(traj.group)

    def group_abandoned(self, group: Group) -> None:
        """``group`` ran out of refills. Many of one task's in a row, none of its groups completing
        meanwhile, mean that task cannot fill a group (its env fails nearly every trajectory): stop
        with the fix rather than simulate on until ``max_sim_hours``."""
        n = self._abandoned_in_a_row[group.task] = self._abandoned_in_a_row.get(group.task, 0) + 1
        self.stats.groups_abandoned_by_task[group.task] += 1
        if n > self._abandon_limit:
            task = self.plan.task(group.task)
            raise RunAborted(f"tasks.{group.task}.env: {n} groups in a row abandoned (their members failed beyond "
                             f"algorithm.max_refills_per_group = {self.plan.algorithm.max_refills_per_group}) without "
                             f"one completing; check failure_prob ({task.env.failure_prob:g} per env call) and timeout_s")

    def group_completed(self, group: Group) -> None:
        self._abandoned_in_a_row[group.task] = 0
        self.stats.groups_completed_by_task[group.task] += 1

    def lockstep_barrier(self, batch_index: int) -> LockstepBarrier | None:
        if not self.mode.lockstep_env:
            return None
        return self._lockstep.setdefault(batch_index, LockstepBarrier(f"lockstep.{batch_index}"))

    def reward_barrier(self, batch_index: int) -> LockstepBarrier | None:
        if not self.mode.reward_after_batch:
            return None
        return self._reward_gate.setdefault(batch_index, LockstepBarrier(f"reward.{batch_index}"))

    def forget_gates(self, before: int) -> None:
        """Batches below ``before`` are finished (no member joins their gates again): drop them."""
        for gates in (self._lockstep, self._reward_gate):
            for k in [k for k in gates if k < before]:
                del gates[k]

    def record_failure(self, traj: Trajectory) -> None:
        self.stats.env_failures += 1
        self.stats.env_failures_by_task[traj.task] += 1
        self.stats.consecutive_failures += 1
        if self.stats.consecutive_failures > self._failure_limit:
            raise RunAborted(f"tasks.{traj.task}.env: {self.stats.consecutive_failures} trajectories failed in a row "
                             f"without one succeeding (last: {traj.error}); check failure_prob and timeout_s")

    def record_step(self, n: int, start: float, end: float, groups: list[Group], batch: tuple[Trajectory, ...],
                    wait_start: float, wait_end: float, sync_s: float, train_s: float, pre_sync_s: float = 0.0) -> None:
        # The critical trajectory finished last; among those a gate released together (Sync's reward
        # after the batch) it is the one that waited least at the gate, i.e. the one the gate waited for.
        critical = max(batch, key=lambda t: (round(t.finished_at or 0.0, 3), -_gate_wait(t), t.id))
        breakdown = _breakdown(critical, batch, wait_start, wait_end)
        if self.weights_awaited:  # the critical path's gaps while admission awaited newer weights
            awaited = awaited_on_path(critical.segments, wait_start, wait_end, self.weights_awaited, self.now())
            breakdown["idle"] -= awaited
            breakdown["weight_sync"] += awaited
            self.weights_awaited = [w for w in self.weights_awaited if w[1] is None or w[1] > wait_end]
        if pre_sync_s > 0:  # the trainer's blocking syncs: before get_batch (ROLL's order) or after it
            self.trainer_syncs.append((wait_start - pre_sync_s, wait_start))
        if sync_s - pre_sync_s > 0:
            self.trainer_syncs.append((wait_end, wait_end + sync_s - pre_sync_s))
        if critical.held_for_weights is not None:  # started late for the weights, held before this window
            held_from, held_to = critical.held_for_weights
            # its gaps inside the window are awaited_on_path's above; what it lost before it is not yet counted,
            # except while the trainer's own blocking sync ran (this step's or an earlier one's): those seconds
            # are a step's sync_s already (helper-88: a 21.9 s broadcast read as 43.8 s, in two steps' records)
            end_held = min(held_to, wait_start)
            before = max(0.0, end_held - held_from) - sum(max(0.0, min(end_held, b) - max(held_from, a))
                                                         for a, b in self.trainer_syncs)
            if before > 0:
                _move_to_weight_sync(breakdown, critical.segments, wait_start, wait_end, before)
        breakdown["weight_sync"] += sync_s
        breakdown["train"] += train_s
        breakdown["idle"] += max(0.0, (end - start) - sum(breakdown.values()))
        rewards = [t.reward for t in batch if t.reward is not None]
        per_task = Counter(t.task for t in batch)
        record = StepRecord(
            step=n, start_s=start, end_s=end, breakdown_s=breakdown, trajectories=len(batch),
            tokens=sum(t.context_tokens for t in batch),
            mean_staleness=sum(n - t.start_version for t in batch) / len(batch),
            mean_reward=sum(rewards) / len(rewards) if rewards else None,
            env_timeouts=self.stats.env_timeouts - self._timeouts_recorded,  # timed out since the last step
            response_tokens_max=max(t.generated_tokens for t in batch),
            response_tokens_mean=sum(t.generated_tokens for t in batch) / len(batch),
            task_trajectories=per_task,
        )
        self._timeouts_recorded = self.stats.env_timeouts
        self.stats.steps.append(record)
        if self.keep_history:
            self.batches.append(tuple(t.id for t in batch))
        for t in batch:
            t.segments = []  # consumed: free the per-turn spans
        if not self.keep_history:
            self._forget_finished()
        if self.on_step is not None:
            self.on_step(record)
        self._check_starved_tasks(n, per_task)

    def _check_starved_tasks(self, n: int, trained: dict[str, int]) -> None:
        """Stop when a task whose share owes each batch at least one group (and ≥ 10 % of it) trained
        nothing for ``STARVED_STEPS`` steps in a row while none of its groups completed and some were
        abandoned: its env keeps failing, and the run would go on training a different task mix
        (a task that is only slow completes groups, and is left to the report's share warning)."""
        stats = self.stats
        self._task_snapshots.append((dict(stats.groups_completed_by_task), dict(stats.groups_abandoned_by_task),
                                     dict(stats.env_failures_by_task), dict(stats.env_timeouts_by_task)))
        for name, planned in self._watched_tasks.items():
            streak = self._starved_streak[name] = 0 if trained.get(name) else self._starved_streak[name] + 1
            if streak < STARVED_STEPS or len(self._task_snapshots) <= STARVED_STEPS:
                continue
            completed0, abandoned0, failed0, timeouts0 = self._task_snapshots[-1 - STARVED_STEPS]
            completed = stats.groups_completed_by_task.get(name, 0) - completed0.get(name, 0)
            abandoned = stats.groups_abandoned_by_task.get(name, 0) - abandoned0.get(name, 0)
            if completed or not abandoned:
                continue
            failed = stats.env_failures_by_task.get(name, 0) - failed0.get(name, 0)
            timeouts = stats.env_timeouts_by_task.get(name, 0) - timeouts0.get(name, 0)
            env = self.plan.task(name).env
            timeout = f"tasks.{name}.env.timeout_s={env.timeout_s:g}"
            failure = [f"tasks.{name}.env.failure_prob={env.failure_prob:g}"] if env.failure_prob else []
            # the cause the run saw most: timed-out calls as many as half the failed trajectories name the timeout first
            knobs = (f"{timeouts:,} env calls timed out at {timeout}" + "".join(f"; also {f}" for f in failure)
                     if 2 * timeouts >= failed > 0 else ", ".join([*failure, timeout]))
            since = f" (steps {n - STARVED_STEPS + 1}–{n})" if streak > STARVED_STEPS else ""
            raise RunAborted(f"tasks.{name}: no trajectory trained in steps {n - streak + 1}–{n} (planned "
                             f"{planned:.0%} of each batch): {abandoned} of its groups abandoned, {failed:,} of its "
                             f"trajectories failed, none completed{since} ({knobs}); fix its env or remove the "
                             "task from tasks")

    # ---- end-of-run accounting ------------------------------------------------------------

    def _forget_finished(self) -> None:
        """Count and drop the trajectories whose state is terminal (a terminal state is final);
        their group, segments and env state go with them once nothing in flight refers to them."""
        done = [t for t in self._live.values() if t.state.terminal]
        for t in done:
            self._counted[t.state.value] += 1
            if t.state is not TrajState.USED:
                self._discarded_tokens += t.generated_tokens
            del self._live[t.id]

    def discarded_tokens(self) -> int:
        """Tokens generated for the finished turns of trajectories that ended without being trained
        (aborted redundant or stale, failed): decode work thrown away with them, beside the cut turns'
        (``stats.wasted_tokens``)."""
        live = self.trajectories if self.keep_history else self._live.values()
        return self._discarded_tokens + sum(t.generated_tokens for t in live
                                            if t.state.terminal and t.state is not TrajState.USED)

    def outcome_counts(self) -> dict[str, int]:
        counts = dict(self._counted)
        for t in (self.trajectories if self.keep_history else self._live.values()):
            counts[t.state.value] += 1
        return counts
