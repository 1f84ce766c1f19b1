"""Tear-down cannot hold finished work hostage: ``ray.shutdown()`` is bounded (a stuck one
is reaped by the watchdog), a second signal skips the graceful steps instead of raising
inside Ray, and the CLI writes its outputs before any of it starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from rollart.core import mode_config  # noqa: E402
from rollart.plan import load_plan  # noqa: E402
from rollart.runtime import backend as backend_mod  # noqa: E402
from rollart.runtime.backend import RuntimeBackend  # noqa: E402

DIGITS = Path(__file__).parents[1] / "scenarios" / "local" / "digits.yaml"


class FakeWatchdog:
    def __init__(self) -> None:
        self.killed = 0

    def kill(self) -> None:
        self.killed += 1


def _backend() -> RuntimeBackend:
    plan = load_plan(DIGITS)
    b = RuntimeBackend(plan, mode_config(plan), 0)
    b._watchdog = FakeWatchdog()
    return b


def test_a_stuck_ray_shutdown_is_given_up_on_and_ray_is_killed(monkeypatch) -> None:
    release = threading.Event()
    monkeypatch.setattr(ray, "shutdown", lambda *a, **k: release.wait(60))
    monkeypatch.setattr(backend_mod, "RAY_SHUTDOWN_S", 0.5)
    b = _backend()
    after: list[str] = []
    b._closers = [("head services", lambda: after.append("head")), ("ray", b._shutdown_ray),
                  ("heap", lambda: after.append("heap"))]
    t0 = time.monotonic()
    b.close()
    release.set()
    assert time.monotonic() - t0 < 5
    assert b._watchdog.killed == 1 and "did not return within" in (b.teardown_stuck or "")
    assert after == ["head", "heap"]  # the steps after the stuck one still ran


def test_a_ray_shutdown_that_returns_kills_nothing(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(ray, "shutdown", lambda *a, **k: calls.append(1))
    b = _backend()
    b._closers = [("ray", b._shutdown_ray)]
    b.close()
    assert calls == [1] and b._watchdog.killed == 0 and b.teardown_stuck is None


def test_a_second_signal_skips_the_graceful_tear_down(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(ray, "shutdown", lambda *a, **k: calls.append(1))
    b = _backend()
    handler_calls: list[str] = []
    b._closers = [("head services", lambda: handler_calls.append("head")),
                  ("reward endpoint", lambda: handler_calls.append("reward")),
                  ("ray", b._shutdown_ray), ("heap", lambda: handler_calls.append("heap"))]
    previous = b._catch_signals()
    try:
        os.kill(os.getpid(), signal.SIGINT)   # first: stop at the next poll
        os.kill(os.getpid(), signal.SIGINT)   # second: hurry, no exception
        assert b.interrupted == signal.SIGINT and b.hurry
        with pytest.raises(KeyboardInterrupt):  # the third still gets out at once
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
    b.close()
    assert handler_calls == ["heap"] and calls == [] and b._watchdog.killed == 1
    assert "second signal" in (b.teardown_stuck or "")


def test_watchdog_kill_reaps_the_drivers_tree(tmp_path: Path) -> None:
    # in a child process of its own: the watchdog kills every descendant of its driver
    script = textwrap.dedent("""
        import os, subprocess, sys, time
        from rollart.runtime.procs import Watchdog
        dog = Watchdog(poll_s=0.1)
        child = subprocess.Popen(["sleep", "60"])
        time.sleep(0.6)  # seen by at least one poll
        dog.kill()
        deadline = time.monotonic() + 5
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        print("killed" if child.returncode is not None else "alive")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "killed", out.stderr[-2000:]
