"""Running simulations as Ray tasks (or in-process), one task per point.

:func:`evaluate_point` is the unit of work: scenario data + overrides → a JSON-able record with
the run's summary or its error. :class:`ProcessPool` runs them on local processes;
:class:`RayPool` runs many of them as ``@ray.remote(num_cpus=1)`` tasks on a local Ray (``num_cpus`` = workers, a small object store, no dashboard) or on an
existing cluster (``address``); :class:`SerialPool` runs them here. Ray is imported only when a
:class:`RayPool` starts."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable, Iterator

RAY_EXTRA_HINT = ("rollart sweep runs its points as Ray tasks, and Ray is not installed: "
                  "pip install 'rollart[runtime]' (or just 'ray[default]==2.60.0')")
OBJECT_STORE_BYTES = 200 * 1024 * 1024

Job = tuple[str, dict[str, Any], list[str], "int | None", "str | None"]  # key, data, overrides, seed, mode


def evaluate_point(data: dict[str, Any], overrides: list[str], seed: int | None = None,
                   mode: str | None = None, scale_approx: bool = False) -> dict[str, Any]:
    """Simulate one point. Never raises for a bad plan or a failed run: the record says why
    (``error``), so one point cannot stop a sweep. ``scale_approx``: simulate a representative 1/m
    of a large plan as ``rollart simulate --scale-approx`` does (``sim.scale.approximation_factor``; m = 1
    for a small plan or a batch-level mode), recorded as ``scale_factor``."""
    import math

    from rollart.core.modes import mode_config
    from rollart.plan.loader import PlanError, plan_from_dict
    from rollart.plan.schema import sim_request_scale
    from rollart.sim import simulate_plan
    from rollart.sim.costs.price import gpus_placed
    from rollart.sim.scale import approximation_factor

    t0 = time.perf_counter()
    record: dict[str, Any] = {"overrides": list(overrides), "seed": seed, "mode": mode, "summary": None,
                              "error": None, "placed_gpus": None}
    try:
        with sim_request_scale(math.inf if scale_approx else 1.0):  # the subset's own share is checked below
            plan = plan_from_dict(data, overrides)
        cfg = mode_config(plan, mode)
        factor = approximation_factor(plan, cfg.batch_level_launch) if scale_approx else 1
        record["mode"] = cfg.name
        record["seed"] = plan.algorithm.seed if seed is None else seed
        record["placed_gpus"] = gpus_placed(plan, cfg)  # reward GPUs only where this mode uses them
        record["scale_factor"] = factor
        result = simulate_plan(plan, cfg, record["seed"], scale_approx=factor).to_result()
        record["summary"] = result.summary
        record["steps"] = [{"step": s.step, "time_s": s.time_s, "trajectories": s.trajectories}
                           for s in result.steps]
        record["error"] = result.error
    except PlanError as exc:
        record["error"] = "; ".join(exc.problems)
    except Exception as exc:  # a bug in the simulator: keep the sweep going, report it
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["wall_s"] = time.perf_counter() - t0
    return record


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


class SerialPool:
    """Runs jobs one after the other in this process (no Ray). Every pool takes ``scale_approx``
    (:func:`evaluate_point`) for all its jobs."""

    workers = 1

    def __init__(self, scale_approx: bool = False):
        self.scale_approx = scale_approx

    def __enter__(self) -> "SerialPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def imap_unordered(self, jobs: Iterable[Job]) -> Iterator[tuple[str, dict[str, Any]]]:
        for key, data, overrides, seed, mode in jobs:
            yield key, evaluate_point(data, overrides, seed, mode, self.scale_approx)


class ProcessPool:
    """Jobs on ``workers`` local processes (default: every core), no Ray: what ``rollart plan``
    uses by default. A worker process that dies takes only its job with it (a ``lost`` record)."""

    def __init__(self, workers: int | None = None, scale_approx: bool = False):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.scale_approx = scale_approx
        self._ex: Any = None

    def __enter__(self) -> "ProcessPool":
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # fork: the children start with the simulator already imported (spawn re-imports it)
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        self._ex = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context(method))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=True, cancel_futures=True)
            self._ex = None

    def imap_unordered(self, jobs: Iterable[Job]) -> Iterator[tuple[str, dict[str, Any]]]:
        from concurrent.futures import FIRST_COMPLETED, wait

        todo = iter(jobs)
        inflight: dict[Any, str] = {}

        def submit() -> bool:
            job = next(todo, None)
            if job is None:
                return False
            key, data, overrides, seed, mode = job
            inflight[self._ex.submit(evaluate_point, data, overrides, seed, mode, self.scale_approx)] = key
            return True

        while len(inflight) < 2 * self.workers and submit():
            pass
        while inflight:
            done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            for fut in done:
                key = inflight.pop(fut)
                try:
                    record = fut.result()
                except Exception as exc:  # BrokenProcessPool: a worker died
                    record = {"error": f"worker process: {type(exc).__name__}: {exc}", "summary": None, "lost": True}
                yield key, record
                submit()


_REMOTE: Any = None


def _remote_evaluate() -> Any:
    global _REMOTE
    if _REMOTE is None:
        import ray

        _REMOTE = ray.remote(num_cpus=1)(evaluate_point)
    return _REMOTE


class RayPool:
    """Ray tasks, one per job, at most ``workers`` running at once on a local Ray.

    A local Ray is started with ``num_cpus=workers`` (default: every core), a 200 MB object
    store, no dashboard, every process on 127.0.0.1 and Ray's token auth on (the runtime's
    :func:`~rollart.runtime.cluster.init_local_ray`), and shut down on exit. With ``address`` the pool joins that cluster instead (its
    CPUs set the parallelism). When Ray is already initialised in this process it is reused and
    left running."""

    def __init__(self, workers: int | None = None, address: str | None = None, scale_approx: bool = False):
        self.workers = workers or os.cpu_count() or 1
        self.address = address
        self.scale_approx = scale_approx
        self._owned = False

    def __enter__(self) -> "RayPool":
        import ray

        if not ray.is_initialized():
            if self.address is None:
                from rollart.runtime.cluster import init_local_ray

                init_local_ray(self.workers, object_store_memory=OBJECT_STORE_BYTES)
            else:
                ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
                self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
            self._owned = True
        else:
            self.workers = max(1, int(ray.cluster_resources().get("CPU", self.workers)))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._owned:
            import ray

            ray.shutdown()
            self._owned = False

    def imap_unordered(self, jobs: Iterable[Job]) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yield (key, record) as tasks finish. At most ``2 × workers`` tasks are queued at once,
        so a huge sweep does not flood the scheduler; a task that Ray itself loses (a worker
        killed) comes back as a record with ``error`` and ``lost: true`` (not kept on disk)."""
        import ray

        remote = _remote_evaluate()
        todo = iter(jobs)
        inflight: dict[Any, str] = {}
        window = 2 * self.workers
        refs: dict[int, tuple[Any, Any]] = {}  # id(data) → (data, its object ref): put each scenario once

        def submit() -> bool:
            job = next(todo, None)
            if job is None:
                return False
            key, data, overrides, seed, mode = job
            if id(data) not in refs:
                refs[id(data)] = (data, ray.put(data))
            inflight[remote.remote(refs[id(data)][1], overrides, seed, mode, self.scale_approx)] = key
            return True

        while len(inflight) < window and submit():
            pass
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1)
            for ref in ready:
                key = inflight.pop(ref)
                try:
                    record = ray.get(ref)
                except Exception as exc:  # RayTaskError, WorkerCrashedError, ...
                    record = {"error": f"ray: {type(exc).__name__}: {str(exc).splitlines()[0]}",
                              "summary": None, "lost": True}
                yield key, record
                submit()


def make_pool(workers: int | None, address: str | None, use_ray: bool = True,
              scale_approx: bool = False) -> RayPool | SerialPool:
    return RayPool(workers, address, scale_approx) if use_ray else SerialPool(scale_approx)


def run_jobs(pool: RayPool | SerialPool, jobs: list[Job],
             on_done: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, record in pool.imap_unordered(jobs):
        out[key] = record
        if on_done is not None:
            on_done(key, record)
    return out
