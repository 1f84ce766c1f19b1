"""Child processes that die with their parent, and a watchdog that cleans up after a driver
killed with SIGKILL (which runs no ``finally``, no ``atexit``).

* :func:`die_with_parent` is a ``preexec_fn``: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` in the
  child, so the kernel kills it when the thread that forked it ends (Linux; a no-op
  elsewhere). Used for ``redis-server``, ``mooncake_master`` and every code sandbox.
* :class:`Watchdog` is a separate small process started by the driver before Ray: it
  records the driver's descendants every ``poll_s`` and, once the driver is gone without
  having said goodbye (:meth:`Watchdog.stop`), SIGKILLs every recorded process still alive
  (Ray's GCS, raylet, agents and workers, and their children). :meth:`Watchdog.kill` does the
  same on request, for a tear-down that is stuck.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38


def _prctl(option: int, arg: int) -> int:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0))
    except (OSError, AttributeError):  # not Linux
        return -1


def die_with_parent(parent_pid: int | None = None) -> None:
    """In a freshly forked child: SIGKILL me when my parent dies. ``parent_pid`` (the pid
    that forked; read before the fork) closes the race where the parent died already."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def pdeathsig_preexec():  # noqa: ANN201 - returns a preexec_fn
    """A ``preexec_fn`` for :class:`subprocess.Popen` that applies :func:`die_with_parent`."""
    parent = os.getpid()
    return lambda: die_with_parent(parent)


# ---------------------------------------------------------------- the watchdog


def pids() -> list[tuple[int, str]]:
    """(pid, /proc/PID path) of every process listed now; one may be gone by the time its files
    are read, so callers catch OSError per process."""
    return [(int(e.name), e.path) for e in os.scandir("/proc") if e.name.isdigit()]


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for pid, path in pids():
        try:
            stat = Path(path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(pid)
    return kids


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


def descendants(pid: int) -> dict[int, str]:
    """pid → start time of every live descendant of ``pid`` (Linux /proc)."""
    kids = _children_map()
    out: dict[int, str] = {}
    todo = list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        if p in out:
            continue
        st = _start_time(p)
        if st is not None:
            out[p] = st
        todo.extend(kids.get(p, []))
    return out


def _watch(driver: int, poll_s: float) -> None:
    """The watchdog's loop (runs in its own process): stdin closes when the driver dies."""
    import select

    seen: dict[int, str] = {}
    me = os.getpid()
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], poll_s)
        if ready:
            if sys.stdin.buffer.read(1) == b"q":  # a clean stop: the driver tore down itself
                return
            break  # EOF: the driver is gone
        if os.getppid() != driver:
            break
        seen.update({p: t for p, t in descendants(driver).items() if p != me})
    seen.update({p: t for p, t in descendants(driver).items() if p != me})
    for pid, start in seen.items():
        if _start_time(pid) == start:  # the same process, not a reused pid
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


class Watchdog:
    """Kills the driver's process tree after the driver dies abruptly (see the module doc)."""

    def __init__(self, poll_s: float = 0.5):
        self.proc: subprocess.Popen | None = None
        if not sys.platform.startswith("linux"):
            return
        code = f"from rollart.runtime.procs import _watch; _watch({os.getpid()}, {poll_s!r})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        """The driver's goodbye: the watchdog exits and kills nothing."""
        self._end(b"q", timeout_s=5.0)

    def kill(self, timeout_s: float = 10.0) -> None:
        """Kill the driver's process tree now, as if the driver had died (its stdin closes
        without the goodbye): for a tear-down that is stuck. Waits for the watchdog to finish."""
        self._end(b"", timeout_s)

    def _end(self, goodbye: bytes, timeout_s: float) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            if goodbye:
                p.stdin.write(goodbye)  # type: ignore[union-attr]
            p.stdin.close()  # type: ignore[union-attr]
            p.wait(timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            p.kill()
