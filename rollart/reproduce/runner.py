"""Run an experiment's variants through the same code path as ``rollart simulate``.

Each variant is loaded with :func:`rollart.plan.load_plan` (``--set`` overrides, ``extends``),
configured with :func:`rollart.core.mode_config` and simulated with
:func:`rollart.sim.simulate_plan`; nothing here changes a cost model or a plan behind the
user's back. Identical variants (same scenario, overrides, mode, steps) run once.

Reduced runs (CI): ``batch_cap`` lowers every plan's ``algorithm.batch_size`` to at most that
many trajectories (a multiple of the group size); the environment variable
``ROLLART_REPRODUCE_BATCH`` sets it for ``rollart reproduce``. ``--steps`` sets the steps.

A watchdog stops a variant whose simulation uses more than ``variant_timeout_s`` seconds of
its process's CPU time (``ROLLART_REPRODUCE_VARIANT_TIMEOUT``, default 90 s; a paper-scale step
costs about a second, a 10-step paper variant 25-45 s) and keeps the steps it finished, so one
stalled simulation cannot eat the budget of the whole reproduction. CPU time, not wall time: on
a loaded machine a worker waits for a core, and a wall-clock limit then stopped healthy variants
(3 of 12 α variants on a busy 2-core box at 50-90 s wall for 30-33 s of CPU). A simulation that
stalls by looping (zero-time events, a slow path) burns CPU and meets the limit as before; one
blocked without computing (a lock, a sleep) is stopped when its process gains under
``STALL_CPU_FRACTION`` of a core over ``stall_s`` wall seconds (default 60 s), which no runnable
process on a loaded machine falls to. It needs the main thread (SIGALRM); elsewhere it is off.

Distinct simulations run on ``ROLLART_REPRODUCE_JOBS`` worker processes (default: one per
CPU, at most 8); each is seeded by its plan, so the results do not depend on the order or
the number of processes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from rollart.core.modes import mode_config
from rollart.core.stats import StepRecord
from rollart.plan import PlanError, load_plan
from rollart.report import RunResult, summary_from_steps
from rollart.reproduce.model import Outcome, Variant
from rollart.scenarios_catalog import resolve
from rollart.trace import NullTracer

BATCH_ENV = "ROLLART_REPRODUCE_BATCH"
JOBS_ENV = "ROLLART_REPRODUCE_JOBS"
TIMEOUT_ENV = "ROLLART_REPRODUCE_VARIANT_TIMEOUT"
DEFAULT_VARIANT_TIMEOUT_S = 90.0


class EnvErrorProbe(NullTracer):
    """A tracer that keeps only failed env calls: (task, call, error, start, end). Passed to
    ``simulate_plan`` like ``rollart simulate --trace`` passes its tracer; it records nothing else,
    so it costs no more than the null tracer."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str, str, float, float]] = []

    def env_span(self, traj: Any, name: str, t0: float, t1: float) -> None:
        if name.endswith(")") and " (" in name:
            call, _, error = name[:-1].partition(" (")
            self.errors.append((traj.task, call, error, t0, t1))


class _WallLimit(BaseException):
    """Raised by :func:`_watchdog`. A BaseException, so that no ``except Exception`` on the way up
    swallows it. ``reason`` says which limit: ``"cpu"`` (the CPU budget is spent) or ``"blocked"``
    (no CPU progress for ``stall_s`` wall seconds); ``cpu_s`` and ``wall_s`` are the process CPU
    time and wall time since the watchdog started."""

    def __init__(self, reason: str = "cpu", cpu_s: float = 0.0, wall_s: float = 0.0) -> None:
        super().__init__(reason, cpu_s, wall_s)
        self.reason, self.cpu_s, self.wall_s = reason, cpu_s, wall_s


DEFAULT_STALL_S = 60.0
STALL_CPU_FRACTION = 0.01  # a blocked process: under 1 % of a core over stall_s wall seconds


@contextmanager
def _watchdog(seconds: float | None, stall_s: float | None = DEFAULT_STALL_S,
              tick_s: float = 1.0) -> Iterator[None]:
    """Raise :class:`_WallLimit` in the main thread once this process has used ``seconds`` of CPU
    time since entering (machine load does not move it), or once it gained less than
    ``STALL_CPU_FRACTION`` of a core over the last ``stall_s`` wall seconds (blocked, not computing;
    ``None`` or 0 turns that check off). Checked on a wall-clock tick of ``tick_s`` (at most
    ``seconds``)."""
    if not seconds or seconds <= 0 or threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "setitimer"):
        yield
        return

    cpu0, wall0 = time.process_time(), time.monotonic()
    window: list[tuple[float, float]] = [(wall0, cpu0)]  # (wall, cpu) samples, oldest first

    def _fire(signum: int, frame: object) -> None:
        cpu, wall = time.process_time(), time.monotonic()
        if cpu - cpu0 >= seconds:
            raise _WallLimit("cpu", cpu - cpu0, wall - wall0)
        if stall_s and stall_s > 0:
            window.append((wall, cpu))
            while len(window) > 2 and window[1][0] <= wall - stall_s:
                window.pop(0)  # keep the newest sample at least stall_s old
            w_old, c_old = window[0]
            if wall - w_old >= stall_s and cpu - c_old < STALL_CPU_FRACTION * (wall - w_old):
                raise _WallLimit("blocked", cpu - cpu0, wall - wall0)

    previous = signal.signal(signal.SIGALRM, _fire)
    tick = max(0.01, min(tick_s, seconds))
    # A periodic tick, re-checked every time: a raise that lands in a gc callback (hypothesis installs
    # one) is reported as unraisable and dropped, and the next tick raises again.
    signal.setitimer(signal.ITIMER_REAL, tick, tick)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def env_batch_cap() -> int | None:
    raw = os.environ.get(BATCH_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise PlanError([f"{BATCH_ENV}: expected a whole number of trajectories, got {raw!r}"]) from None
    if value <= 0:
        raise PlanError([f"{BATCH_ENV}: must be positive, got {value}"])
    return value


def env_jobs() -> int:
    """Worker processes: ``ROLLART_REPRODUCE_JOBS``, else one per CPU (at most 8)."""
    raw = os.environ.get(JOBS_ENV, "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return max(1, min(8, os.cpu_count() or 1))


def _run_in_worker(batch_cap: int | None, timeout_s: float, variant: Variant, steps: int) -> Outcome:
    """One variant in a pool process (its main thread, so the watchdog works there too)."""
    return Runner(batch_cap, timeout_s)._timed(variant, steps)


def env_variant_timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        return float(raw) if raw else DEFAULT_VARIANT_TIMEOUT_S
    except ValueError:
        return DEFAULT_VARIANT_TIMEOUT_S


class Runner:
    """Runs variants, caching identical ones."""

    def __init__(self, batch_cap: int | None = None, variant_timeout_s: float | None = None):
        self.batch_cap = batch_cap
        self.variant_timeout_s = env_variant_timeout() if variant_timeout_s is None else variant_timeout_s
        self._cache: dict[tuple, Outcome] = {}

    def _overrides(self, variant: Variant, steps: int) -> list[str]:
        return [*variant.overrides, f"algorithm.steps={steps}"]

    def key(self, variant: Variant, steps: int) -> tuple:
        """Variants with equal keys simulate the same thing (labels and params aside)."""
        path = resolve(variant.scenario)
        return (str(path.resolve()), tuple(self._overrides(variant, steps)), variant.mode, self.batch_cap,
                variant.probe_env_errors)

    @staticmethod
    def _reuse(hit: Outcome, variant: Variant, steps: int) -> Outcome:
        return Outcome(variant, hit.plan, hit.result, hit.error, 0.0, steps, cached=True,
                       extra_overrides=hit.extra_overrides, env_errors=hit.env_errors)

    def run(self, variant: Variant, steps: int,
            on_step: Callable[[StepRecord], None] | None = None) -> Outcome:
        key = self.key(variant, steps)
        hit = self._cache.get(key)
        if hit is not None:
            return self._reuse(hit, variant, steps)
        out = self._timed(variant, steps, on_step)
        self._cache[key] = out
        return out

    def _timed(self, variant: Variant, steps: int, on_step: Callable[[StepRecord], None] | None = None) -> Outcome:
        cpu0 = time.process_time()
        out = self._run(variant, resolve(variant.scenario), self._overrides(variant, steps), steps, on_step)
        out.cpu_s = time.process_time() - cpu0
        return out

    def run_many(self, items: list[tuple[Variant, int]], jobs: int = 1,
                 on_done: Callable[[int], None] | None = None,
                 on_start: Callable[[], None] | None = None) -> list[Outcome]:
        """Run ``(variant, steps)`` items, each distinct simulation once, on ``jobs`` processes.
        ``on_start()`` is called once the worker processes exist (start threads, e.g. a progress
        bar, only then: forking a process with threads running is unsafe); ``on_done(n)``
        reports that n more items are finished. Results keep the items' order."""
        keys = [self.key(v, n) for v, n in items]
        todo: dict[tuple, tuple[Variant, int]] = {}
        for k, item in zip(keys, items):
            if k not in self._cache:
                todo.setdefault(k, item)
        waiting = {k: keys.count(k) for k in todo}
        done_now = len(items) - sum(waiting.values())

        def started() -> None:
            if on_start is not None:
                on_start()
            if done_now and on_done is not None:
                on_done(done_now)

        if jobs > 1 and len(todo) > 1:
            self._run_pool(todo, jobs, started, lambda k: on_done(waiting[k]) if on_done else None)
        else:
            started()
            for k, (v, n) in todo.items():
                self._cache[k] = self._timed(v, n)
                if on_done is not None:
                    on_done(waiting[k])
        out, first = [], set()
        for k, (v, n) in zip(keys, items):
            hit = self._cache[k]
            if k in todo and k not in first and todo[k][0] is v:
                first.add(k)
                out.append(hit)
            else:
                out.append(self._reuse(hit, v, n))
        return out

    def _run_pool(self, todo: dict[tuple, tuple[Variant, int]], jobs: int, started: Callable[[], None],
                  done: Callable[[tuple], None]) -> None:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx) as pool:
            futures = {pool.submit(_run_in_worker, self.batch_cap, self.variant_timeout_s, v, n): k
                       for k, (v, n) in todo.items()}  # the first submit forks every worker
            started()
            for fut in as_completed(futures):
                k = futures[fut]
                self._cache[k] = fut.result()
                done(k)

    def _run(self, variant: Variant, path: Path, overrides: list[str], steps: int,
             on_step: Callable[[StepRecord], None] | None) -> Outcome:
        from rollart.sim import simulate_plan

        t0 = time.perf_counter()
        extra: tuple[str, ...] = ()
        try:
            plan = load_plan(path, overrides)
            cap = self.batch_cap
            if cap is not None and plan.algorithm.batch_size > cap:
                g = plan.algorithm.group_size
                extra = (f"algorithm.batch_size={max(g, cap // g * g)}",)
                plan = load_plan(path, [*overrides, *extra])
            cfg = mode_config(plan, variant.mode)
        except (PlanError, ValueError) as exc:
            problems = exc.problems if isinstance(exc, PlanError) else [str(exc)]
            return Outcome(variant, None, None, "; ".join(problems), time.perf_counter() - t0, steps,
                           extra_overrides=extra)

        records: list[StepRecord] = []

        def _step(rec: StepRecord) -> None:
            records.append(rec)
            if on_step is not None:
                on_step(rec)

        probe = EnvErrorProbe() if variant.probe_env_errors else None
        try:
            with _watchdog(self.variant_timeout_s):
                outcome = simulate_plan(plan, cfg, plan.algorithm.seed, probe, on_step=_step)
                result = outcome.to_result()
        except _WallLimit as stop:
            if stop.reason == "blocked":
                why = (f"after {stop.wall_s:.0f} s of wall time, blocked: under {STALL_CPU_FRACTION:.0%} of a core for "
                       f"{DEFAULT_STALL_S:g} s ({stop.cpu_s:.1f} s of CPU time in all)")
            else:
                why = (f"after {self.variant_timeout_s:g} s of CPU time ({stop.wall_s:.0f} s of wall time), with no end "
                       "in sight: the simulation stalled in a loop or is far slower than a paper-scale step")
            error = f"stopped by the reproduce watchdog {why}; {len(records)} of {steps} steps done"
            summary = summary_from_steps(records, cfg.alpha) if records else {}
            result = RunResult(plan.name, cfg.name, plan.algorithm.seed, "sim", records, summary, {}, error) \
                if records else None
            return Outcome(variant, plan, result, error, time.perf_counter() - t0, steps, extra_overrides=extra,
                           env_errors=probe.errors if probe else [])
        except PlanError as exc:
            return Outcome(variant, plan, None, "; ".join(exc.problems), time.perf_counter() - t0, steps,
                           extra_overrides=extra)
        return Outcome(variant, plan, result, result.error, time.perf_counter() - t0, steps, extra_overrides=extra,
                       env_errors=probe.errors if probe else [])
