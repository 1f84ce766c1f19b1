"""EnvManager: one trajectory's life — reset → (generate → step)* → reward → buffer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generator

from rollart.core.effects import (Abort, Aborted, AcquireEnv, ComputeReward, EnvClose, EnvOutcome, EnvReset,
                                  EnvStep, Generate, GenOutcome, Sleep, Spawn, Wait)
from rollart.core.barrier import LockstepBarrier
from rollart.core.signals import Signal
from rollart.core.trajectory import ENV_QUEUE, ENV_RESET, ENV_STEP, GEN, REWARD, WEIGHT_SYNC, Trajectory, TrajState

if TYPE_CHECKING:
    from rollart.core.controller import Controller

Proc = Generator[Any, Any, Any]


def _wait(ctl: "Controller", traj: Trajectory, signal: Signal, category: str) -> Proc:
    t0 = ctl.now()
    yield Wait(signal)
    traj.record(t0, ctl.now(), category)


def _env_call(ctl: "Controller", traj: Trajectory, effect_type: type, category: str) -> Proc:
    """Call the env with the task's retry policy; returns the last :class:`EnvOutcome`."""
    now = ctl.now
    t0 = now()
    outcome = yield effect_type(traj, 0)
    t1 = now()
    traj.record(t0, t1, category)
    if outcome.ok:  # the common case: no retry policy to read
        ctl.tracer.env_span(traj, category, t0, t1)
        return outcome
    return (yield from _env_retry(ctl, traj, effect_type, category, outcome, t0, t1))


def _env_retry(ctl: "Controller", traj: Trajectory, effect_type: type, category: str, outcome: EnvOutcome,
               t0: float, t1: float) -> Proc:
    """The first call (``t0``–``t1``) failed with ``outcome``: retry with the task's policy."""
    now = ctl.now
    ctl.tracer.env_span(traj, f"{category} ({outcome.error})", t0, t1)
    _count_error(ctl, traj, outcome)
    spec = ctl.plan.task(traj.task).env
    backoff = spec.retry_backoff_s
    if effect_type is EnvStep and spec.step_retry_backoff_s is not None:
        backoff = spec.step_retry_backoff_s
    for attempt in range(1, spec.max_retries + 1):
        t0 = now()
        yield Sleep(backoff * 2 ** (attempt - 1))
        traj.record(t0, now(), category)
        t0 = now()
        outcome = yield effect_type(traj, attempt)
        traj.record(t0, now(), category)
        ctl.tracer.env_span(traj, category if outcome.ok else f"{category} ({outcome.error})", t0, now())
        if outcome.ok:
            return outcome
        _count_error(ctl, traj, outcome)
    return outcome


def _count_error(ctl: "Controller", traj: Trajectory, outcome: EnvOutcome) -> None:
    stats = ctl.stats
    stats.env_errors += 1
    if is_timeout(outcome.error):
        stats.env_timeouts += 1
        stats.env_timeouts_by_task[traj.task] += 1


def is_timeout(error: str | None) -> bool:
    """An :class:`EnvOutcome` error that is a timeout: ``"timeout"`` from the simulator,
    ``"timeout: <detail>"`` from the real env workers."""
    return error is not None and (error == "timeout" or error.startswith("timeout:"))


def _count_wasted(ctl: "Controller", exc: Aborted) -> None:
    """A turn aborted mid-generation: the tokens its engine decoded are wasted work, counted apart
    from ``generated_tokens`` (which counts returned turns only); unknown where the backend cannot
    report them."""
    if exc.partial_tokens is None:
        ctl.stats.wasted_unreported += 1
    else:
        ctl.stats.wasted_tokens += exc.partial_tokens


def _generate(ctl: "Controller", traj: Trajectory, max_new_tokens: int) -> Proc:
    while ctl.proxy.suspended:  # step ②: no new requests while weights are swapped
        yield from _wait(ctl, traj, ctl.proxy.resumed, WEIGHT_SYNC)
    proxy = ctl.proxy
    if not ctl.plan.placement.pd_disaggregation:  # the common case: one worker does prefill and decode
        worker = proxy.route(traj.tag, traj.last_worker)
        kv = traj.context_tokens
        proxy.dispatch(worker, kv)
        t0 = ctl.now()
        try:
            out: GenOutcome = yield Generate(traj, worker.id, kv, max_new_tokens, None)
        except Aborted as exc:
            _count_wasted(ctl, exc)
            raise
        finally:
            proxy.release(worker, kv)
        traj.record(t0, ctl.now(), GEN)
        traj.last_worker = worker.id
        tokens = out.tokens
        traj.context_tokens += tokens
        traj.generated_tokens += tokens
        traj.turns += 1
        ctl.stats.generated_tokens += tokens
        return
    # PD disaggregation. Cache-aware, as PD routers are: the prefill worker that served this
    # trajectory's last turn holds its conversation in its prefix cache (another would recompute it).
    prefill = proxy.route(traj.tag, traj.last_prefill_worker, role="prefill")
    worker = proxy.route(traj.tag, traj.last_worker, role="decode")
    kv = traj.context_tokens
    proxy.dispatch(worker, kv)
    # A prefill worker hands the request's KV to the decode worker: it holds none of it while the
    # request decodes (what it keeps is evictable prefix cache).
    proxy.dispatch(prefill, 0)
    t0 = ctl.now()
    try:
        out: GenOutcome = yield Generate(traj, worker.id, traj.context_tokens, max_new_tokens, prefill.id)
    except Aborted as exc:
        _count_wasted(ctl, exc)
        raise
    finally:
        proxy.release(worker, kv)
        proxy.release(prefill, 0)
    traj.record(t0, ctl.now(), GEN)
    traj.last_worker = worker.id
    traj.last_prefill_worker = prefill.id
    traj.context_tokens += out.tokens
    traj.generated_tokens += out.tokens
    traj.turns += 1
    ctl.stats.generated_tokens += out.tokens


def run_trajectory(ctl: "Controller", traj: Trajectory) -> Proc:
    """The EnvManager process of one trajectory: its rollout, then always ``EnvClose``."""
    barrier = ctl.lockstep_barrier(traj.group.batch_index)
    reward_gate = ctl.reward_barrier(traj.group.batch_index)
    try:
        yield from _rollout(ctl, traj, barrier, reward_gate)
    except Aborted:
        if traj.state is TrajState.RUNNING:  # the aborting side normally sets the reason
            traj.state = TrajState.FAILED
    finally:
        # Leaving is idempotent; a trajectory that stops early must not hold the others.
        for gate in (barrier, reward_gate):
            if gate is not None:
                gate.leave(traj.id)
    try:
        yield EnvClose(traj)
    except Aborted:
        pass  # an abort that reaches a closing env changes nothing: it closes, and its manager frees
    ctl.tracer.release(traj)
    ctl.trajectory_closed(traj)
    if traj.group.slot is not None and not ctl.finished:  # its env manager goes on to its next one (ROLL's loop)
        for nxt in ctl.scheduler.fill_slot(ctl, traj.group.slot):
            yield Spawn(ctl.trajectory_process(nxt), key=nxt.id)


def _rollout(ctl: "Controller", traj: Trajectory, barrier: LockstepBarrier | None,
             reward_gate: LockstepBarrier | None) -> Proc:
    """reset → (generate → step)* → reward → SampleBuffer."""
    task = ctl.plan.task(traj.task)
    now = ctl.now
    t0 = now()
    yield AcquireEnv(traj)
    traj.record(t0, ctl.now(), ENV_QUEUE)  # cores, not the env: a buyer's fix is a bigger pool
    # Join the batch's barriers once the env holds its slot and before its reset: a trajectory
    # still queued for a slot must not hold back the ones that could run, and one still
    # resetting must (else the first env to come up would pass the first barrier alone and
    # run a turn ahead of the batch from then on).
    for gate in (barrier, reward_gate):
        if gate is not None:
            gate.join(traj.id)
    reset = yield from _env_call(ctl, traj, EnvReset, ENV_RESET)
    if not reset.ok:
        yield from _on_failure(ctl, traj, f"env.reset {reset.error}")
        return
    traj.context_tokens = reset.obs_tokens
    while True:
        if barrier is not None and (sig := barrier.arrive(traj.id)) is not None:  # wait for the slowest env
            yield from _wait(ctl, traj, sig, ENV_RESET if traj.turns == 0 else ENV_STEP)
        yield from _generate(ctl, traj, max(1, task.max_context_tokens - traj.context_tokens))
        if barrier is not None and (sig := barrier.arrive(traj.id)) is not None:  # the slowest generation
            yield from _wait(ctl, traj, sig, GEN)
        # _env_call(ctl, traj, EnvStep, ENV_STEP), its first attempt inlined: this runs every turn
        t0 = now()
        step = yield EnvStep(traj, 0)
        t1 = now()
        traj.record(t0, t1, ENV_STEP)
        if step.ok:
            ctl.tracer.env_span(traj, ENV_STEP, t0, t1)
        else:
            step = yield from _env_retry(ctl, traj, EnvStep, ENV_STEP, step, t0, t1)
        if not step.ok:
            yield from _on_failure(ctl, traj, f"env.step {step.error}")
            return
        traj.context_tokens += step.obs_tokens
        if step.done or traj.context_tokens >= task.max_context_tokens:
            break
    if barrier is not None:
        barrier.leave(traj.id)
    if reward_gate is not None:  # Sync: score only once the whole batch finished its rollout
        arrived = ctl.now()
        if (sig := reward_gate.arrive(traj.id)) is not None:
            yield from _wait(ctl, traj, sig, REWARD)
        traj.reward_gate = (arrived, ctl.now())
        reward_gate.leave(traj.id)
    t0 = ctl.now()
    traj.reward = yield ComputeReward(traj, ctl.mode.serverless_reward)
    traj.record(t0, ctl.now(), REWARD)
    if traj.reward is None:  # the reward call failed (a real endpoint): fail, never score it 0
        yield from _on_failure(ctl, traj, "reward call failed")
        return
    ctl.tracer.reward_span(traj, t0, ctl.now())
    traj.finished_at = ctl.now()
    ctl.stats.consecutive_failures = 0
    surplus = ctl.buffer.submit(traj, ctl.now())
    if traj.group.complete:
        ctl.group_completed(traj.group)
    if surplus:
        yield Abort(tuple(surplus), "redundant")


def _on_failure(ctl: "Controller", traj: Trajectory, error: str) -> Proc:
    """Mark the trajectory failed; refill its group if it can no longer fill up."""
    traj.error = error
    ctl.record_failure(traj)
    group = traj.group
    if group.complete or group.evicted or group.abandoned or traj.state is not TrajState.RUNNING:
        return
    ctl.buffer.fail(traj)
    # Replace it at once while the group is short of its launch count: redundant rollout keeps its
    # spare members, so a failure costs a restart now rather than a late one after a second failure
    # (with redundancy 0 the launch count is the group size: every failure is replaced).
    if len(group.scored) + len(group.running) >= ctl.scheduler.members_per_group:
        return
    if group.refills < ctl.plan.algorithm.max_refills_per_group:
        group.refills += 1
        group.failed_paths.append(traj.segments)  # the refill's critical path starts with this attempt's
        if group.slot is not None:  # the env group's next free manager starts it (fill_slot: oldest group short first)
            return
        refill = ctl.new_trajectory(group)
        yield Spawn(ctl.trajectory_process(refill), key=refill.id)
    else:
        ctl.group_abandoned(group)
        running = ctl.buffer.abandon(group)
        if running:
            yield Abort(tuple(running), "group abandoned")
