"""The backend's speed shortcuts keep SimPy's semantics: its inlined run loop (``_run_until``)
steps the same events in the same order as ``Environment.run(until=...)`` and fails the same way,
and a bare ``_Wake`` behaves for a waiting process like a ``Timeout`` (value, interrupt)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import simpy

from rollart.sim.backend import _run_until, _Wake


def _model(env: simpy.Environment, log: list[tuple[float, str]], wake: Callable[[float], Any]) -> simpy.Event:
    """Processes on timeouts, zero delays, interrupts and shared events; returns the 'until' event."""
    gate = env.event()

    def sleeper(i: int):
        try:
            for k in range(4):
                yield wake(0.5 * (i % 3) + 0.25 * k)
                log.append((env.now, f"s{i}.{k}"))
                if k == 1 and i % 2:
                    yield gate
                    log.append((env.now, f"s{i} gate"))
        except simpy.Interrupt as intr:
            log.append((env.now, f"s{i} interrupted {intr.cause}"))

    procs = [env.process(sleeper(i)) for i in range(6)]

    def boss():
        yield wake(0.8)
        procs[2].interrupt("stop")
        yield wake(0)
        gate.succeed("open")
        log.append((env.now, "boss opened"))
        yield env.all_of(procs)
        log.append((env.now, "all done"))

    return env.process(boss())


def _trace(runner: Callable[[simpy.Environment, simpy.Event], None], wake_kind: str) -> tuple[list, float]:
    env = simpy.Environment()
    log: list[tuple[float, str]] = []
    wake = env.timeout if wake_kind == "timeout" else (lambda d: _Wake(env, d))
    main = _model(env, log, wake)
    runner(env, simpy.AnyOf(env, [main, env.timeout(100.0)]))
    return log, env.now


def _simpy_run(env: simpy.Environment, until: simpy.Event) -> None:
    env.run(until=until)


@pytest.mark.parametrize("wake_kind", ["timeout", "wake"])
def test_run_until_steps_as_simpy_run(wake_kind: str) -> None:
    want = _trace(_simpy_run, wake_kind)
    assert _trace(_run_until, wake_kind) == want
    log = want[0]
    assert len(log) > 20 and any("interrupted stop" in name for _, name in log) and log[-1][1] == "all done"


def test_wake_is_a_timeout_for_a_process() -> None:
    assert _trace(_simpy_run, "wake") == _trace(_simpy_run, "timeout")


def test_run_until_raises_a_failed_process_as_simpy() -> None:
    def fail_with(runner: Callable[[simpy.Environment, simpy.Event], None]) -> str:
        env = simpy.Environment()

        def bad():
            yield env.timeout(1.0)
            raise ValueError("boom")

        env.process(bad())
        with pytest.raises(ValueError) as info:
            runner(env, env.timeout(10.0))
        return f"{info.value} at {env.now}"

    assert fail_with(_run_until) == fail_with(lambda env, until: env.run(until=until)) == "boom at 1.0"


def test_wake_rejects_a_negative_delay() -> None:
    with pytest.raises(ValueError, match="negative delay"):
        _Wake(simpy.Environment(), -1.0)
