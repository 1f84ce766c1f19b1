"""Backend-neutral wake-ups: a process yields ``Wait(signal)``; whoever changes the state
the process waits on calls ``signal.fire()``. Backends register one callback per waiter."""

from __future__ import annotations

from typing import Any, Callable


class Signal:
    __slots__ = ("name", "_waiters")

    def __init__(self, name: str = "signal"):
        self.name = name
        self._waiters: list[Callable[[Any], None]] = []

    def add_waiter(self, wake: Callable[[Any], None]) -> None:
        self._waiters.append(wake)

    def fire(self, value: Any = None) -> None:
        waiters, self._waiters = self._waiters, []
        for wake in waiters:
            wake(value)

    def __repr__(self) -> str:
        return f"Signal({self.name!r}, waiters={len(self._waiters)})"
