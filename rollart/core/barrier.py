"""LockstepBarrier: batch-synchronous env interaction (the Sync baseline).

Every active trajectory of a batch arrives before the barrier opens, so a turn's
generation starts only when the slowest env step is done, and vice versa."""

from __future__ import annotations

from typing import Hashable

from rollart.core.signals import Signal


class LockstepBarrier:
    def __init__(self, name: str):
        self.name = name
        self.active: set[Hashable] = set()
        self.arrived: set[Hashable] = set()
        self._signal = Signal(name)

    def join(self, key: Hashable) -> None:
        self.active.add(key)

    def leave(self, key: Hashable) -> None:
        """A participant finished, failed or was aborted: it no longer holds the others."""
        self.active.discard(key)
        self.arrived.discard(key)
        if self.arrived and self.arrived >= self.active:
            self._open()

    def arrive(self, key: Hashable) -> Signal | None:
        """Returns the signal to wait on, or None when this arrival opened the barrier."""
        self.arrived.add(key)
        if self.arrived >= self.active:
            self._open()
            return None
        return self._signal

    def _open(self) -> None:
        signal, self._signal = self._signal, Signal(self.name)
        self.arrived = set()
        signal.fire()
