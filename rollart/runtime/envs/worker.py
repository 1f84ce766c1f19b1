"""EnvWorker: many environments, keyed by trajectory id, on one process of the CPU pool.

Every call returns a plain dict and never raises for an env's sake: an exception from an env
(or from building it), an injected failure or a timeout becomes ``ok=False`` with the error
text. ``error`` reads ``"timeout: ..."`` or ``"error: <Type>: <message>"`` (the prefixes of the
core's ``EnvOutcome.error``); ``error_kind`` is ``"timeout"`` or ``"error"``.

* ``reset(traj_id, task, seed) -> {ok, observation, error, error_kind, elapsed_s, injected_s}`` builds a
  fresh env for the trajectory (replacing one it had) and resets it. Injected latency and
  failures draw from one stream per trajectory id (seeded by the worker's seed, the first
  reset's seed and the id), kept across re-resets until ``close``: a retried reset draws anew, and members of a
  GRPO group (same env seed) get different latencies.
* ``step(traj_id, action) -> {ok, observation, reward, done, info, error, error_kind, elapsed_s,
  injected_s}`` (``injected_s``: the latency the wrapper slept, 0 without injection).
  After a failed step the env stays (the core retries the same step per ``max_retries``).
* ``close(traj_id) -> bool``; ``close_all()``; ``stats()``; ``active()``; ``warmup()`` (pay
  first-use import costs, ~3 s for gem-llm, before the first timed reset).

Per-call timeout: each call runs on a daemon thread and the caller waits at most
``call_timeout_s`` (default: the task's ``env.timeout_s`` × ``scale`` + ``timeout_grace_s``, so
the latency wrapper's own EnvTimeout surfaces first; 60 s for a task without a spec). Python
cannot kill a thread: a call that overran keeps running in the background, its env is marked
busy (further calls on it fail at once with "busy") and is closed when the call finally
returns, if it was closed or replaced meanwhile. ``stats()["abandoned_calls"]`` counts them.
An env that kills the process itself (``os._exit``, a segfault in C code) is beyond this
guard; the code-execution env runs candidate code in a subprocess for that reason.

``remote_env_worker(...)`` starts it as a Ray actor (Ray imported lazily), threaded
(``max_concurrency``) so trajectories on one worker advance independently.
"""

from __future__ import annotations

import math
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Mapping

import numpy as np

from rollart.runtime.envs.latency import EnvTimeout, make_env
from rollart.runtime.heap import SettlesHeap
from rollart.runtime.reward.rules import kind_of

EnvFactory = Callable[..., Any]  # (task_name, task_spec, seed, inject, *, scale, options) -> TextEnv


class _CallTimeout(Exception):
    pass


class _EnvExit(Exception):
    """An env raised a BaseException that is not an Exception (SystemExit, KeyboardInterrupt):
    carried as an ordinary error so the caller's own interrupts are never swallowed."""

    def __init__(self, exc: BaseException):
        super().__init__(str(exc))
        self.original = exc


@dataclass
class _Slot:
    env: Any
    task: str
    busy: bool = False
    closed: bool = False
    steps: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _jsonable(info: Any) -> dict:
    if not isinstance(info, Mapping):
        return {}
    out: dict[str, Any] = {}
    for k, v in info.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[str(k)] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (str, int, float, bool)) or x is None for x in v):
            out[str(k)] = list(v)
        else:
            out[str(k)] = repr(v)
    return out


def _error_text(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, _EnvExit):
        exc = exc.original
    if isinstance(exc, (EnvTimeout, _CallTimeout)):
        return f"timeout: {exc}", "timeout"
    return f"error: {type(exc).__name__}: {exc}", "error"


class EnvWorker(SettlesHeap):
    """Hosts envs by trajectory id. ``tasks``: TaskSpecs (a list, a name → spec mapping or a
    Plan); a task passed by name that is not among them gets an env without a spec (no
    latency injection, the default call timeout). ``seed`` is mixed into every trajectory's
    latency stream; ``inject`` wraps envs of known tasks in :class:`InjectedLatency`."""

    def __init__(self, tasks: Any = None, seed: int = 0, inject: bool = False, *, scale: float = 1.0,
                 call_timeout_s: float | None = None, timeout_grace_s: float = 1.0, default_timeout_s: float = 60.0,
                 env_options: Mapping[str, dict] | None = None, env_factory: EnvFactory | None = None):
        self.tasks: dict[str, Any] = {}
        if tasks is not None:
            if hasattr(tasks, "tasks"):  # a Plan
                tasks = tasks.tasks
            items: Iterable[Any] = tasks.values() if isinstance(tasks, Mapping) else tasks
            for spec in items:
                self.tasks[spec.name] = spec
        self.seed = int(seed)
        self.inject = inject
        self.scale = scale
        self.call_timeout_s = call_timeout_s
        self.timeout_grace_s = timeout_grace_s
        self.default_timeout_s = default_timeout_s
        self.env_options = dict(env_options or {})
        self.env_factory = env_factory or make_env
        self._slots: dict[Hashable, _Slot] = {}
        self._rngs: dict[Hashable, np.random.Generator] = {}
        self._lock = threading.Lock()
        self._stats = {"resets": 0, "steps": 0, "errors": 0, "timeouts": 0, "abandoned_calls": 0, "closed": 0}

    # ----------------------------------------------------------------- plumbing

    def _timeout_for(self, task: str) -> float:
        if self.call_timeout_s is not None:
            return self.call_timeout_s
        spec = self.tasks.get(task)
        env = getattr(spec, "env", None)
        if env is not None:
            return env.timeout_s * self.scale + self.timeout_grace_s
        return self.default_timeout_s

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def _run(self, slot: _Slot, fn: Callable[[], Any], timeout: float) -> Any:
        """Run ``fn`` on a daemon thread; raise its exception, or _CallTimeout after ``timeout``."""
        box: dict[str, Any] = {}
        finished = threading.Event()

        def target() -> None:
            try:
                box["value"] = fn()
            except Exception as exc:  # noqa: BLE001
                box["error"] = exc
            except BaseException as exc:  # noqa: BLE001 — SystemExit from env code must not escape either
                box["error"] = _EnvExit(exc)
            finally:
                with slot.lock:
                    slot.busy = False
                    close_now = slot.closed
                finished.set()
                if close_now:  # dropped while this call ran: _drop left the closing to us
                    self._close_env(slot)

        with slot.lock:
            if slot.busy:
                raise RuntimeError("env busy: a previous call on this trajectory is still running")
            slot.busy = True
        thread = threading.Thread(target=target, daemon=True, name=f"env-{slot.task}")
        thread.start()
        if not finished.wait(None if math.isinf(timeout) else timeout):
            self._count("abandoned_calls")
            raise _CallTimeout(f"env call on {slot.task} exceeded {timeout:g} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    @staticmethod
    def _close_env(slot: _Slot) -> None:
        try:
            if slot.env is not None:
                slot.env.close()
        except Exception:  # noqa: BLE001 — closing is best effort
            pass

    def _drop(self, traj_id: Hashable, forget: bool = True) -> bool:
        with self._lock:
            slot = self._slots.pop(traj_id, None)
            if forget:
                self._rngs.pop(traj_id, None)
        if slot is None:
            return False
        with slot.lock:
            slot.closed = True
            busy = slot.busy
        if not busy:
            self._close_env(slot)
        self._count("closed")
        return True

    # ----------------------------------------------------------------- API

    def reset(self, traj_id: Hashable, task: Any, seed: int) -> dict:
        """Build the trajectory's env (``task``: a task name or a TaskSpec) and reset it."""
        t0 = time.monotonic()
        self._count("resets")
        spec = None
        if not isinstance(task, str):
            spec, task = task, task.name
            self.tasks.setdefault(task, spec)
        else:
            spec = self.tasks.get(task)
        self._drop(traj_id, forget=False)
        slot = _Slot(env=None, task=task)
        with self._lock:
            self._slots[traj_id] = slot
        with self._lock:  # one latency stream per trajectory, kept across re-resets (retries) until close
            rng = self._rngs.get(traj_id)
            if rng is None:
                rng = self._rngs[traj_id] = np.random.default_rng(
                    [self.seed & 0xFFFFFFFF, int(seed) & 0xFFFFFFFF, zlib.crc32(repr(traj_id).encode())])

        def build_and_reset() -> str:
            env = self.env_factory(task, spec, rng, self.inject and spec is not None, scale=self.scale,
                                   options=self.env_options.get(kind_of(task, getattr(spec, "tag", None)) or task))
            slot.env = env
            return env.reset(seed)

        try:
            obs = self._run(slot, build_and_reset, self._timeout_for(task))
        except Exception as exc:  # noqa: BLE001
            return self._fail(exc, t0, observation=None)
        return {"ok": True, "observation": str(obs), "error": None, "error_kind": None,
                "elapsed_s": time.monotonic() - t0, "injected_s": getattr(slot.env, "last_latency_s", 0.0)}

    def step(self, traj_id: Hashable, action: str) -> dict:
        t0 = time.monotonic()
        self._count("steps")
        with self._lock:
            slot = self._slots.get(traj_id)
        if slot is None or slot.env is None:
            return self._fail(KeyError(f"no env for trajectory {traj_id!r} (reset it first)"), t0,
                              observation=None, reward=0.0, done=False, info={})
        try:
            res = self._run(slot, lambda: slot.env.step(action), self._timeout_for(slot.task))
            slot.steps += 1
            return {"ok": True, "observation": str(res.observation), "reward": float(res.reward),
                    "done": bool(res.done), "info": _jsonable(res.info), "error": None, "error_kind": None,
                    "elapsed_s": time.monotonic() - t0, "injected_s": getattr(slot.env, "last_latency_s", 0.0)}
        except Exception as exc:  # noqa: BLE001
            return self._fail(exc, t0, observation=None, reward=0.0, done=False, info={})

    def _fail(self, exc: BaseException, t0: float, **fields: Any) -> dict:
        text, kind = _error_text(exc)
        self._count("timeouts" if kind == "timeout" else "errors")
        return {"ok": False, **fields, "error": text, "error_kind": kind, "elapsed_s": time.monotonic() - t0}

    def close(self, traj_id: Hashable) -> bool:
        """Release the trajectory's env; False when it had none."""
        return self._drop(traj_id)

    def close_all(self) -> int:
        with self._lock:
            ids = list(self._slots)
        return sum(self._drop(i) for i in ids)

    def active(self) -> list:
        with self._lock:
            return list(self._slots)

    def stats(self) -> dict:
        with self._lock:
            return {**self._stats, "active": len(self._slots)}

    def cpu_seconds(self) -> float:
        """CPU time this process has used (all its threads)."""
        return time.process_time()

    def ping(self) -> bool:
        return True

    def sandbox_check(self) -> str | None:
        """None when the code sandbox runs in this process's place, else why it cannot."""
        from rollart.runtime.envs.code_exec import sandbox_available

        ok, why = sandbox_available()
        return None if ok else why

    def pid(self) -> int:
        import os

        return os.getpid()

    def warmup(self, tasks: Iterable[str] | None = None) -> dict[str, float]:
        """Build and close one env per task (default: every known task) to pay first-use
        import costs (gem-llm: ~3 s) before the first timed reset; seconds per task, or the
        error text for a task that failed."""
        out: dict[str, Any] = {}
        for task in list(tasks if tasks is not None else self.tasks):
            t0 = time.monotonic()
            try:
                env = self.env_factory(task, self.tasks.get(task), 0, False, scale=self.scale,
                                       options=self.env_options.get(kind_of(task) or task))
                env.close()
                out[task] = time.monotonic() - t0
            except Exception as exc:  # noqa: BLE001
                out[task] = f"error: {type(exc).__name__}: {exc}"
        return out


# ---------------------------------------------------------------- Ray actor

_ACTOR_CLS = None


def env_worker_actor_class():
    """``ray.remote(EnvWorker)``, built on first use (Ray is imported only here)."""
    global _ACTOR_CLS
    if _ACTOR_CLS is None:
        import ray

        _ACTOR_CLS = ray.remote(EnvWorker)
    return _ACTOR_CLS


def remote_env_worker(*, num_cpus: float = 1.0, resources: dict[str, float] | None = None,
                      max_concurrency: int = 256, name: str | None = None, max_restarts: int = 0,
                      **worker_kwargs: Any):
    """Start an EnvWorker actor (threaded, so its trajectories advance independently).
    ``resources`` pins it to a pool (e.g. ``{"pool_env": 0.01}``)."""
    opts: dict[str, Any] = {"num_cpus": num_cpus, "max_concurrency": max_concurrency, "max_restarts": max_restarts}
    if resources:
        opts["resources"] = resources
    if name:
        opts["name"] = name
    return env_worker_actor_class().options(**opts).remote(**worker_kwargs)
