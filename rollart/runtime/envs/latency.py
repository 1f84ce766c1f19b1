"""The scenario's env latency and failures, injected around a real env; and the env registry.

:class:`InjectedLatency` follows the simulator's ``EnvModel`` (``sim/costs/env.py``) call by
call: draw the latency from the task's distribution; if it exceeds ``timeout_s``, sleep
``timeout_s`` and raise :class:`EnvTimeout`; otherwise sleep it, then fail with probability
``failure_prob`` (:class:`EnvFailure`, the inner env untouched, so a retry of the same step is
meaningful); otherwise delegate. Both ``reset`` and ``step`` are wrapped; ``close`` is not.

:func:`make_env` picks the env kind from the task name (or its tag): FrozenLake*,
GEM-Game*/Guess*, GEM-Math*/Math*, Code*/SWE* (the code-execution env stands in for SWE),
Digits* (the CPU learning task of ``toy.py``).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable

import numpy as np

from rollart.runtime.envs.base import StepResult, TextEnv
from rollart.runtime.reward.rules import KIND_PREFIXES, kind_of


class EnvError(RuntimeError):
    """An env call that did not succeed (base of the injected kinds)."""


class EnvFailure(EnvError):
    """The env call failed (injected, or a wrapped crash)."""


class EnvTimeout(EnvError, TimeoutError):
    """The env call took longer than its timeout."""


class InjectedLatency:
    """Wrap a :class:`TextEnv` with the scenario's reset/step latency and failures.

    ``scale`` multiplies every draw and ``timeout_s`` (e.g. 0.01 to replay a scenario 100×
    faster); ``sleep`` is replaceable for tests. Draws come from one ``numpy`` Generator
    (``seed``: an int, or a Generator used as is): the latency first, then (only when it did
    not time out) the failure draw — the simulator's order."""

    def __init__(self, env: TextEnv, reset_dist: Any, step_dist: Any, failure_prob: float = 0.0,
                 timeout_s: float = math.inf, seed: int | np.random.Generator = 0, *, scale: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep):
        if not 0.0 <= failure_prob <= 1.0:
            raise ValueError(f"failure_prob must be in [0, 1], got {failure_prob}")
        self.env = env
        self.name = getattr(env, "name", type(env).__name__)
        self.reset_dist, self.step_dist = reset_dist, step_dist
        self.failure_prob = float(failure_prob)
        self.timeout_s = float(timeout_s)
        self.scale = float(scale)
        self._sleep = sleep
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self.calls = self.failures = self.timeouts = 0
        self.slept_s = 0.0
        self.last_latency_s = 0.0

    def _inject(self, dist: Any, what: str) -> None:
        with self._lock:  # draws in call order even if two threads share the wrapper
            latency = float(dist.sample(self._rng)) * self.scale
            timeout = self.timeout_s * self.scale
            timed_out = latency > timeout
            fail = (not timed_out and self.failure_prob > 0 and self._rng.random() < self.failure_prob)
            wait = timeout if timed_out else latency
            self.calls += 1
            self.timeouts += timed_out
            self.failures += fail
            self.slept_s += wait
            self.last_latency_s = wait
        if wait > 0:
            self._sleep(wait)
        if timed_out:
            raise EnvTimeout(f"{self.name}: env.{what} timed out after {timeout:g} s (drew {latency:.3g} s)")
        if fail:
            raise EnvFailure("injected failure")

    def reset(self, seed: int) -> str:
        self._inject(self.reset_dist, "reset")
        return self.env.reset(seed)

    def step(self, action: str) -> StepResult:
        self._inject(self.step_dist, "step")
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()

    def __getattr__(self, item: str) -> Any:  # helpers of the inner env (e.g. shortest_path)
        if item == "env":
            raise AttributeError(item)
        return getattr(self.env, item)


# ---------------------------------------------------------------- registry

ENV_KINDS = ("frozenlake", "game", "math", "code", "digits")


def _build(kind: str, name: str, options: dict) -> TextEnv:
    if kind == "frozenlake":
        from rollart.runtime.envs.frozenlake import FrozenLakeTextEnv
        return FrozenLakeTextEnv(name, **options)
    if kind == "game":
        from rollart.runtime.envs.gem_envs import GemGameTextEnv
        return GemGameTextEnv(name, **options)
    if kind == "math":
        from rollart.runtime.envs.gem_envs import GemMathTextEnv
        return GemMathTextEnv(name, **options)
    if kind == "code":
        from rollart.runtime.envs.code_exec import CodeExecTextEnv
        return CodeExecTextEnv(name, **options)
    if kind == "digits":
        from rollart.runtime.envs.toy import DigitsEnv
        return DigitsEnv(**options)
    raise AssertionError(kind)


def env_kind(task_name: str, task_spec: Any = None) -> str:
    """The env kind of a task (by name, then tag); ValueError listing the known kinds."""
    kind = kind_of(task_name, getattr(task_spec, "tag", None))
    if kind is None:
        known = ", ".join(f"{p}*" for p, _ in KIND_PREFIXES)
        raise ValueError(f"no environment for task {task_name!r}"
                         + (f" (tag {task_spec.tag!r})" if getattr(task_spec, "tag", None) else "")
                         + f"; known kinds: {', '.join(ENV_KINDS)} — task names (or tags) starting with "
                         f"{known} (case-insensitive)")
    return kind


def make_env(task_name: str, task_spec: Any = None, seed: int | np.random.Generator = 0, inject: bool = False, *,
             scale: float = 1.0, options: dict | None = None) -> TextEnv:
    """A fresh env for one trajectory of ``task_name``.

    With ``inject`` the env is wrapped in :class:`InjectedLatency` with ``task_spec.env``'s
    reset/step distributions, ``failure_prob`` and ``timeout_s``; its draws come from ``seed``
    when that is a ``numpy`` Generator (shared, e.g. across retries of one trajectory), else
    from a stream derived from the int ``seed``. ``options`` go to the env's constructor (e.g. ``{"max_steps": 30}``)."""
    kind = env_kind(task_name, task_spec)
    options = dict(options or {})
    turns = getattr(task_spec, "turns", None)
    if kind == "digits" and "turns" not in options and getattr(turns, "kind", None) == "constant":
        options["turns"] = int(turns.value)  # Digits runs the episode length the plan declares
    env = _build(kind, task_name, options)
    if not inject:
        return env
    spec = getattr(task_spec, "env", None)
    if spec is None:
        raise ValueError(f"make_env({task_name!r}, inject=True) needs a TaskSpec with an env section")
    if isinstance(seed, np.random.Generator):  # a caller-owned stream (the EnvWorker's, per trajectory)
        rng: Any = seed
    else:  # a separate stream from the env's own seed, so latency draws don't correlate with episodes
        rng = int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 0x1A7E]).generate_state(1)[0])
    return InjectedLatency(env, spec.reset, spec.step, spec.failure_prob, spec.timeout_s, rng, scale=scale)
