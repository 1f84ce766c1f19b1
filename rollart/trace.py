"""Chrome/Perfetto trace of a run, the same tracks for simulated and real runs.

Tracks (processes in Perfetto): ``trainer``, ``generation/<pool>`` with a thread per
worker, ``env managers/<task>`` with a lane per concurrently-running trajectory,
``reward``, and ``weight transfer``. Timestamps are seconds since the run started."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollart.files import write_text_atomic

if TYPE_CHECKING:
    from rollart.core.trajectory import Trajectory


class NullTracer:
    """Records nothing (the default: tracing a paper-scale run costs memory)."""

    def env_span(self, traj: "Trajectory", name: str, t0: float, t1: float) -> None: ...
    def reward_span(self, traj: "Trajectory", t0: float, t1: float) -> None: ...
    def trainer_span(self, name: str, t0: float, t1: float) -> None: ...
    def transfer_span(self, name: str, t0: float, t1: float) -> None: ...
    def worker_span(self, pool: str, worker: int, name: str, t0: float, t1: float) -> None: ...
    def release(self, traj: "Trajectory") -> None: ...


_HEAD, _SEP, _TAIL = '{"traceEvents": [', ", ", '], "displayTimeUnit": "ms"}'
FLUSH_EVERY = 20_000  # events held in memory between two writes of a streamed trace


class Tracer(NullTracer):
    """Records the spans of a run. With ``stream_to`` the events go to ``<path>.part`` as they
    come (every ``FLUSH_EVERY``), so a long traced run holds only the last few thousand in memory;
    :meth:`write` to that path finishes the file (the same bytes as an in-memory trace)."""

    def __init__(self, stream_to: str | Path | None = None) -> None:
        self._events: list[dict[str, Any]] = []
        self._stream_path = Path(stream_to) if stream_to is not None else None
        self._stream: Any = None
        self._streamed = 0  # events already written to the stream
        self._pids: dict[str, int] = {}
        self._threads: set[tuple[int, int]] = set()
        self._lanes: dict[str, dict[int, int]] = {}   # track -> traj id -> lane
        self._free: dict[str, list[int]] = {}

    def _pid(self, track: str) -> int:
        if track not in self._pids:
            pid = self._pids[track] = len(self._pids) + 1
            self._events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": track}})
            self._events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                                 "args": {"sort_index": pid}})
        return self._pids[track]

    def _span(self, track: str, tid: int, thread: str, name: str, t0: float, t1: float,
              args: dict[str, Any] | None = None) -> None:
        pid = self._pid(track)
        if (pid, tid) not in self._threads:
            self._threads.add((pid, tid))
            self._events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}})
        ev: dict[str, Any] = {"ph": "X", "name": name, "pid": pid, "tid": tid,
                              "ts": round(t0 * 1e6, 3), "dur": round(max(0.0, t1 - t0) * 1e6, 3)}
        if args:
            ev["args"] = args
        self._events.append(ev)
        if self._stream_path is not None and len(self._events) >= FLUSH_EVERY:
            self._flush()

    def _flush(self) -> None:
        if self._stream is None:
            self._stream = open(self._stream_path.with_name(self._stream_path.name + ".part"), "w")
            self._stream.write(_HEAD)
        for ev in self._events:
            if self._streamed:
                self._stream.write(_SEP)
            self._stream.write(json.dumps(ev))
            self._streamed += 1
        self._events.clear()

    def _lane(self, track: str, traj_id: int) -> int:
        lanes = self._lanes.setdefault(track, {})
        if traj_id not in lanes:
            free = self._free.setdefault(track, [])
            lanes[traj_id] = min(free) if free else len(lanes) + len(free)
            if free:
                free.remove(lanes[traj_id])
        return lanes[traj_id]

    def env_span(self, traj: "Trajectory", name: str, t0: float, t1: float) -> None:
        track = f"env managers/{traj.task}"
        lane = self._lane(track, traj.id)
        self._span(track, lane, f"env {lane}", name, t0, t1, {"trajectory": traj.id, "turn": traj.turns})

    def reward_span(self, traj: "Trajectory", t0: float, t1: float) -> None:
        lane = self._lane("reward", traj.id)
        self._span("reward", lane, f"call {lane}", f"reward {traj.task}", t0, t1, {"trajectory": traj.id})
        self._release("reward", traj.id)

    def trainer_span(self, name: str, t0: float, t1: float) -> None:
        self._span("trainer", 0, "trainer", name, t0, t1)

    def transfer_span(self, name: str, t0: float, t1: float) -> None:
        self._span("weight transfer", 0, "store", name, t0, t1)

    def worker_span(self, pool: str, worker: int, name: str, t0: float, t1: float) -> None:
        self._span(f"generation/{pool}", worker, f"worker {worker}", name, t0, t1)

    def release(self, traj: "Trajectory") -> None:
        self._release(f"env managers/{traj.task}", traj.id)

    def _release(self, track: str, traj_id: int) -> None:
        lane = self._lanes.get(track, {}).pop(traj_id, None)
        if lane is not None:
            self._free.setdefault(track, []).append(lane)

    @property
    def events(self) -> list[dict[str, Any]]:
        """The events held in memory (all of them unless streamed)."""
        return self._events

    def write(self, path: str | Path) -> None:
        path = Path(path)
        if self._stream_path is not None and path == self._stream_path:
            self._flush()
            self._stream.write(_TAIL)
            self._stream.close()
            self._stream = None
            self._stream_path.with_name(path.name + ".part").replace(path)
            self._stream_path = None  # finished: later events stay in memory
            return
        write_text_atomic(path, json.dumps({"traceEvents": self._events, "displayTimeUnit": "ms"}))
