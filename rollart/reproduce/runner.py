"""Run an experiment's variants through the same code path as ``rollart simulate``.

Each variant is loaded with :func:`rollart.plan.load_plan` (``--set`` overrides, ``extends``),
configured with :func:`rollart.core.mode_config` and simulated with
:func:`rollart.sim.simulate_plan`; nothing here changes a cost model or a plan behind the
user's back. Identical variants (same scenario, overrides, mode, steps) run once.

Reduced runs (CI): ``batch_cap`` lowers every plan's ``algorithm.batch_size`` to at most that
many trajectories (a multiple of the group size); the environment variable
``ROLLART_REPRODUCE_BATCH`` sets it for ``rollart reproduce``. ``--steps`` sets the steps.

A watchdog stops a variant whose simulation runs longer than ``variant_timeout_s`` of wall
time (``ROLLART_REPRODUCE_VARIANT_TIMEOUT``, default 90 s; a paper-scale step costs about a
second) and keeps the steps it finished, so one stalled simulation cannot eat the budget of
the whole reproduction. It needs the main thread (SIGALRM); elsewhere it is off.

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
    """A BaseException, so that no ``except Exception`` on the way up swallows it."""


@contextmanager
def _watchdog(seconds: float | None) -> Iterator[None]:
    """Raise :class:`_WallLimit` in the main thread after ``seconds`` of wall time."""
    if not seconds or seconds <= 0 or threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "setitimer"):
        yield
        return

    def _fire(signum: int, frame: object) -> None:
        raise _WallLimit()

    previous = signal.signal(signal.SIGALRM, _fire)
    # Re-armed every second: a raise that lands in a gc callback (hypothesis installs one) is
    # reported as unraisable and dropped, and a one-shot timer would then never stop the run.
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
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
        except _WallLimit:
            error = (f"stopped by the reproduce watchdog after {self.variant_timeout_s:g} s of wall time with "
                     f"{len(records)} of {steps} steps done (the simulation stalled or is far slower than a "
                     "paper-scale step)")
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
