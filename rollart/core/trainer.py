"""The trainer loop: the six-step weight-sync protocol around each train step.

① get_batch  ② suspend the proxy  ③ update the workers' weights  ④ resume
⑤ recompute in-flight KV (inside ③'s engine update)  ⑥ train_step, overlapping rollout.

The paper lists get_batch first. With α = 0 the next batch can only start on the new
weights, so there the cycle is rotated to ②–⑤ → ① → ⑥ (same steps, no deadlock); AReaL and
ROLLART (as ROLL implements it) rotate too (``ModeConfig.sync_before_get_batch``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generator

from rollart.core.effects import Abort, BroadcastWeights, PublishWeights, Spawn, TrainStep, UpdateWeights, Wait
from rollart.core.trajectory import Group, Trajectory

if TYPE_CHECKING:
    from rollart.core.controller import Controller

Proc = Generator[Any, Any, Any]


def get_batch(ctl: "Controller", version: int) -> Proc:
    """Block until a full batch of whole, in-window groups is ready (step ①)."""
    while True:
        stale = ctl.buffer.evict_stale(version)
        if stale:
            yield Abort(tuple(stale), "stale")
        groups = ctl.buffer.take_batch(version)
        if groups is not None:
            return groups
        yield Wait(ctl.buffer.changed)


def sync_weights(ctl: "Controller", version: int) -> Proc:
    """Steps ②–⑤: bring every worker to ``version``. Returns the seconds the trainer waited.
    Updates run one at a time: a publish that lands while the previous update is still running
    waits for it (two interleaved suspend/resume pairs would resume the proxy mid-update)."""
    t0 = ctl.now()
    while True:  # re-checked after every wait: another update may have run meanwhile
        if ctl.updating_weights:
            yield Wait(ctl.weights_updated)
        elif ctl.proxy.version >= version:
            return ctl.now() - t0
        elif ctl.mode.async_weight_transfer and ctl.published_version < version:
            yield Wait(ctl.weights_published)  # pull still running in the background
        else:
            break
    if ctl.mode.async_weight_transfer:  # a queued update goes straight to the newest pulled version
        version = max(version, ctl.published_version)
    workers = ctl.proxy.worker_ids
    ctl.updating_weights = True
    try:
        ctl.proxy.suspend()
        if not ctl.mode.async_weight_transfer:
            yield BroadcastWeights(version, workers)
        yield UpdateWeights(version, workers, from_host=ctl.mode.async_weight_transfer)
        ctl.proxy.resume(version)
        ctl.weights_arrived()
    finally:
        ctl.updating_weights = False
    ctl.weights_updated.fire(version)
    ctl.buffer.changed.fire()  # the scheduler may admit on the new version
    ctl.tracer.trainer_span("weight sync", t0, ctl.now())
    return ctl.now() - t0


def publish(ctl: "Controller", version: int) -> Proc:
    """Asynchronous transfer: publish buckets once, workers pull them during rollout. Version v
    waits until the workers serve v − 1: the store keeps the two newest versions, and an update or
    a restarted worker must still find the version it pulls (publishes do not run ahead of updates)."""
    while ctl.proxy.version < version - 1:
        yield Wait(ctl.weights_updated)
    t0 = ctl.now()
    yield PublishWeights(version, ctl.proxy.worker_ids)
    ctl.published_version = max(ctl.published_version, version)
    ctl.tracer.transfer_span(f"publish+pull v{version}", t0, ctl.now())
    ctl.weights_published.fire(version)
    if ctl.mode.sync_before_get_batch:  # update as soon as the pull lands, in the background (ROLL's order)
        yield from sync_weights(ctl, version)


def run_trainer(ctl: "Controller") -> Proc:
    steps = ctl.plan.algorithm.steps
    rotate = ctl.mode.sync_before_get_batch
    step_start = ctl.now()
    for n in range(ctl.start_version, steps):
        sync_s = 0.0
        if rotate and not ctl.mode.async_weight_transfer:  # async: publish() updates when the pull lands
            sync_s += yield from sync_weights(ctl, n)
        pre_sync_s = sync_s  # the trainer's own sync before get_batch: [wait_start − pre_sync_s, wait_start]
        wait_start = ctl.now()
        groups: list[Group] = yield from get_batch(ctl, n)
        wait_end = ctl.now()
        ctl.tracer.trainer_span("get_batch (waiting)", wait_start, wait_end)
        if not rotate:
            sync_s += yield from sync_weights(ctl, n)
        batch: tuple[Trajectory, ...] = tuple(t for g in groups for t in g.scored)
        t_train = ctl.now()
        yield TrainStep(batch, n)
        ctl.version = n + 1
        # the window moved with the version: admission re-checks it now, so a rollout that must wait for the
        # new weights (α = 0) is seen waiting from here, not only once they arrive (helper-83: reported idle)
        ctl.buffer.changed.fire()
        ctl.tracer.trainer_span(f"train step {n}", t_train, ctl.now())
        stale = ctl.buffer.evict_stale(ctl.version)
        if stale:
            yield Abort(tuple(stale), "stale")
        if ctl.mode.async_weight_transfer:
            yield Spawn(publish(ctl, ctl.version))
        end = ctl.now()
        ctl.record_step(n, step_start, end, groups, batch, wait_start, wait_end, sync_s, end - t_train, pre_sync_s)
        step_start = end
