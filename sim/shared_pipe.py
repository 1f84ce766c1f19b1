"""Transfers that share one pipe fairly (processor sharing): n in flight each move at rate / n.

Used for env image pulls: a CPU pool's nodes pull container images through one registry path, so
a burst of resets (Sync launches a whole batch at once) slows every pull in it — the paper's
"concurrent image pulls saturate the network".

Virtual time keeps each event O(log n): V(t) = ∫ rate / n(t) dt is the bytes every transfer in
flight has moved since V = 0, so a transfer of b bytes admitted at V₀ ends when V reaches V₀ + b,
whatever arrives or leaves meanwhile. Between events n is constant and V grows linearly.
"""

from __future__ import annotations

import heapq
from typing import Any, Generator

import simpy

_EPS_BYTES = 1e-6  # a transfer this close to done is done (floating-point residue of V)


class SharedPipe:
    """A pipe of ``bytes_per_s`` shared equally by the transfers in flight."""

    def __init__(self, env: simpy.Environment, bytes_per_s: float):
        if bytes_per_s <= 0:
            raise ValueError("a shared pipe needs a positive rate")
        self.env, self.rate = env, bytes_per_s
        self._v = 0.0                      # virtual bytes per transfer so far
        self._t = env.now                  # when _v was last brought up to date
        self._heap: list[tuple[float, int]] = []  # (V at which it ends, id); cancelled ids skipped
        self._events: dict[int, simpy.Event] = {}
        self._next_id = 0
        self._epoch = 0                    # the wake-up scheduled last; older ones do nothing
        self.peak = 0                      # most transfers in flight at once
        self.admitted_bytes = 0.0          # bytes of every transfer started (an aborted one's whole size)

    def _advance(self) -> None:
        now = self.env.now
        if self._events:
            self._v += (now - self._t) * self.rate / len(self._events)
        self._t = now

    def _settle(self) -> None:
        """Finish every transfer V has reached, then schedule a wake-up for the next one."""
        heap = self._heap
        while True:
            while heap and (heap[0][1] not in self._events or heap[0][0] <= self._v + _EPS_BYTES):
                _, k = heapq.heappop(heap)
                ev = self._events.pop(k, None)
                if ev is not None:
                    ev.succeed()
            if not self._events:
                break
            target = heap[0][0]
            dt = max(0.0, (target - self._v) * len(self._events) / self.rate)
            if self.env.now + dt > self.env.now:
                break
            # V's rounding residue (V grows to ~1e9 over GB-sized pulls) is too small to move the clock:
            # the transfer is done now, or the wake-up would fire at the same instant forever
            self._v = target
        self._epoch += 1
        if self._events:
            self.env.process(self._wake(self._epoch, dt, target))

    def _wake(self, epoch: int, dt: float, target: float) -> Generator[Any, Any, None]:
        yield self.env.timeout(dt)
        if epoch == self._epoch:  # nothing arrived or left since it was scheduled
            self._advance()
            self._v = max(self._v, target)  # the transfer it was scheduled for is through, whatever the rounding
            self._settle()

    def transfer(self, nbytes: float, moved: list[float] | None = None) -> Generator[Any, Any, None]:
        """Move ``nbytes`` through the pipe; returns when they are through (0 bytes: at once). Interrupted,
        it leaves the bytes it had moved in ``moved[0]`` (where given) and re-raises."""
        if nbytes <= 0:
            return
        self._advance()
        v0 = self._v
        k = self._next_id
        self._next_id += 1
        done = self.env.event()
        self._events[k] = done
        self.admitted_bytes += nbytes
        heapq.heappush(self._heap, (self._v + nbytes, k))
        self.peak = max(self.peak, len(self._events))
        self._settle()
        try:
            yield done
        except simpy.Interrupt:  # the trajectory was aborted mid-pull: the others speed up
            if k in self._events:
                self._advance()
                del self._events[k]
                self._settle()
            if moved is not None:
                moved[0] = min(nbytes, max(0.0, self._v - v0))
            raise
