"""A private ``redis-server`` for a run, and the resource-binding records kept in it.

:class:`RedisServer` starts ``redis-server`` on 127.0.0.1 on a free port, with no persistence
(``--save "" --appendonly no``), a generated password (``requirepass``, read from its stdin:
never on the command line where ``ps`` shows it, nor on disk) and ``PR_SET_PDEATHSIG`` (it dies
with the process that started it), waits until ``PING`` answers, and stops it on exit. Its log
goes to an unlinked temporary file and its working directory is removed once it answers, so a
run killed outright (SIGKILL, OOM) leaves nothing behind in ``/tmp``::

    with RedisServer() as srv:
        r = srv.client()
        register_pool(r, "h800", {"GPU": 8})
        record_binding(r, "actor-gen-0", "h800", {"GPU": 1})
        pool_view(r)["h800"]   # {'capacity': {'GPU': 8.0}, 'used': {'GPU': 1.0}, 'free': {'GPU': 7.0},
                               #  'workers': ['actor-gen-0']}

The ResourceManager records here which worker is bound to which pool with which resources
(for dispatch, fail-over and reconfiguration); the layout is :data:`RESOURCE_KEYS`:

* ``{prefix}:pools`` — hash pool → JSON ``{"capacity": {resource: amount}, ...meta}``
* ``{prefix}:bindings`` — hash worker → JSON ``{"pool", "resources", "time", ...meta}``
* ``{prefix}:pool:{pool}:workers`` — set of the workers bound to a pool (an index; the
  bindings hash is the truth)
* ``{prefix}:binding-events`` — newest-first list of JSON bind/unbind events (capped)

A worker is bound to one pool at a time: binding it again moves it, atomically.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Mapping

from rollart.runtime.procs import pdeathsig_preexec


class RedisUnavailable(RuntimeError):
    """No ``redis-server`` binary, or it would not start."""


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class RedisServer:
    """A throwaway ``redis-server`` (see the module docstring)."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, binary: str | None = None,
                 start_timeout: float = 10.0):
        self.host = host
        self.requested_port = port
        self.port = port or 0
        self.binary = binary or shutil.which("redis-server")
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self._log: Any = None  # redis-server's log: an unlinked temporary file
        self.startup_s = 0.0
        self.password = secrets.token_urlsafe(24)

    @staticmethod
    def available() -> tuple[bool, str]:
        if shutil.which("redis-server") is None:
            return False, "redis-server is not installed (apt-get install redis-server)"
        try:
            import redis  # noqa: F401
        except ImportError:
            return False, "the redis Python client is not installed (pip install redis)"
        return True, ""

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.host}:{self.port}/0"

    def client(self, decode_responses: bool = True, **kw: Any) -> Any:
        import redis

        return redis.Redis(host=self.host, port=self.port, password=self.password, decode_responses=decode_responses,
                           **kw)

    def _ping(self) -> bool:
        import redis

        try:
            with redis.Redis(host=self.host, port=self.port, password=self.password, socket_timeout=0.5,
                             socket_connect_timeout=0.5) as r:
                return bool(r.ping())
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            return False
        except redis.exceptions.ResponseError:  # LOADING etc.: up but not ready
            return False

    def start(self) -> "RedisServer":
        if self.proc is not None:
            return self
        if self.binary is None:
            raise RedisUnavailable("redis-server is not installed (apt-get install redis-server)")
        t0 = time.perf_counter()
        log = ""
        for _attempt in range(1 if self.requested_port else 3):
            self.port = self.requested_port or _free_port(self.host)
            workdir = tempfile.mkdtemp(prefix="rollart-redis-")  # mode 0700
            try:
                self.proc = self._spawn(workdir)
                deadline = time.monotonic() + self.start_timeout
                while time.monotonic() < deadline and self.proc.poll() is None:
                    if self._ping():
                        self.startup_s = time.perf_counter() - t0
                        return self
                    time.sleep(0.01)
            finally:  # once it answers it has changed into the folder, and writes nothing there
                shutil.rmtree(workdir, ignore_errors=True)
            log = self.log_tail(600)
            self._kill()
        self.stop()  # the log file too
        raise RedisUnavailable(f"redis-server did not start on {self.host}: {log}")

    def _spawn(self, workdir: str) -> subprocess.Popen:
        """redis-server in ``workdir``, reading its config (the password) from stdin and logging
        to an unlinked file."""
        if self._log is not None:
            self._log.close()
        self._log = tempfile.TemporaryFile()
        args = [self.binary, "-", "--port", str(self.port), "--bind", self.host, "--save", "", "--appendonly", "no",
                "--dir", workdir, "--dbfilename", "unused.rdb", "--daemonize", "no", "--protected-mode", "yes",
                "--logfile", ""]
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                                cwd=workdir, preexec_fn=pdeathsig_preexec(), bufsize=0)
        assert proc.stdin is not None
        try:  # redis reads its config to EOF before it starts
            proc.stdin.write(f"requirepass {self.password}\n".encode())
        except BrokenPipeError:
            pass  # it exited already: its log says why
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        return proc

    def log_tail(self, n: int = 2000) -> str:
        """The end of redis-server's log."""
        if self._log is None:
            return ""
        fd = self._log.fileno()  # pread: the file position is redis-server's too (its stdout), never moved
        size = os.fstat(fd).st_size
        return os.pread(fd, n, max(0, size - n)).decode(errors="replace")

    def _kill(self) -> None:
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)

    def stop(self) -> None:
        """SIGTERM (redis-server shuts down cleanly on it; nothing is saved), then close the log."""
        self._kill()
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ---------------------------------------------------------------- resource records


@dataclass(frozen=True)
class ResourceKeys:
    prefix: str = "rollart"
    max_events: int = 1000

    @property
    def pools(self) -> str:
        return f"{self.prefix}:pools"

    @property
    def bindings(self) -> str:
        return f"{self.prefix}:bindings"

    def pool_workers(self, pool: str) -> str:
        return f"{self.prefix}:pool:{pool}:workers"

    @property
    def events(self) -> str:
        return f"{self.prefix}:binding-events"


RESOURCE_KEYS = ResourceKeys()


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, (bytes, bytearray)) else str(x)


def _amounts(m: Mapping[str, Any] | None) -> dict[str, float]:
    return {str(k): float(v) for k, v in (m or {}).items()}


def _split(resources: Mapping[str, Any] | None) -> tuple[dict[str, float], dict[str, Any]]:
    """Numeric entries are resource amounts; anything else (a preferred pool, a Ray resource
    name) is kept as metadata of the binding."""
    amounts: dict[str, float] = {}
    meta: dict[str, Any] = {}
    for k, v in (resources or {}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            amounts[str(k)] = float(v)
        else:
            meta[str(k)] = v
    return amounts, meta


def register_pool(r: Any, pool: str, capacity: Mapping[str, float], keys: ResourceKeys = RESOURCE_KEYS,
                  **meta: Any) -> None:
    """Declare (or update) a pool and its capacity, e.g. ``{"GPU": 8}`` or ``{"CPU": 64}``."""
    r.hset(keys.pools, pool, json.dumps({**meta, "capacity": _amounts(capacity)}, sort_keys=True))


def record_binding(r: Any, worker_id: str, pool: str, resources: Mapping[str, float],
                   keys: ResourceKeys = RESOURCE_KEYS, **meta: Any) -> dict[str, Any] | None:
    """Bind ``worker_id`` to ``pool`` holding ``resources`` (``{"GPU": 1}``; non-numeric entries
    are stored as metadata fields); a worker bound elsewhere moves (atomically). Returns the
    previous binding, if any."""
    amounts, extra = _split(resources)
    record = {**extra, **meta, "pool": pool, "resources": amounts, "time": time.time()}
    previous: dict[str, Any] | None = None

    def txn(pipe: Any) -> None:
        nonlocal previous
        old = pipe.hget(keys.bindings, worker_id)
        previous = json.loads(_s(old)) if old is not None else None
        pipe.multi()
        if previous is not None and previous.get("pool") != pool:
            pipe.srem(keys.pool_workers(previous["pool"]), worker_id)
        pipe.hset(keys.bindings, worker_id, json.dumps(record, sort_keys=True))
        pipe.sadd(keys.pool_workers(pool), worker_id)
        pipe.lpush(keys.events, json.dumps({"event": "bind", "worker": worker_id, "pool": pool,
                                            "from": previous.get("pool") if previous else None,
                                            "time": record["time"]}))
        pipe.ltrim(keys.events, 0, keys.max_events - 1)

    r.transaction(txn, keys.bindings)
    return previous


def remove_binding(r: Any, worker_id: str, keys: ResourceKeys = RESOURCE_KEYS, reason: str = "") -> dict[str, Any] | None:
    """Unbind ``worker_id`` (it died, or was released); returns the binding it had."""
    previous: dict[str, Any] | None = None

    def txn(pipe: Any) -> None:
        nonlocal previous
        old = pipe.hget(keys.bindings, worker_id)
        previous = json.loads(_s(old)) if old is not None else None
        pipe.multi()
        if previous is not None:
            pipe.hdel(keys.bindings, worker_id)
            pipe.srem(keys.pool_workers(previous["pool"]), worker_id)
            pipe.lpush(keys.events, json.dumps({"event": "unbind", "worker": worker_id, "pool": previous["pool"],
                                                "reason": reason, "time": time.time()}))
            pipe.ltrim(keys.events, 0, keys.max_events - 1)

    r.transaction(txn, keys.bindings)
    return previous


def bindings(r: Any, keys: ResourceKeys = RESOURCE_KEYS) -> dict[str, dict[str, Any]]:
    """worker → its binding record (``pool``, ``resources``, ``time`` and any metadata)."""
    return {_s(k): json.loads(_s(v)) for k, v in sorted(r.hgetall(keys.bindings).items(), key=lambda kv: _s(kv[0]))}


def binding_events(r: Any, keys: ResourceKeys = RESOURCE_KEYS, limit: int = 100) -> list[dict[str, Any]]:
    """The newest bind/unbind events, newest first."""
    return [json.loads(_s(e)) for e in r.lrange(keys.events, 0, max(0, limit - 1))]


def pool_view(r: Any, keys: ResourceKeys = RESOURCE_KEYS) -> dict[str, dict[str, Any]]:
    """A live view of every pool: ``capacity``, ``used`` (sum of its workers' resources),
    ``free`` (capacity − used, per resource of the capacity) and ``workers`` (sorted). The
    bindings hash is the source of truth (a pool's worker set is an index of it)."""
    pools = {_s(k): json.loads(_s(v)) for k, v in r.hgetall(keys.pools).items()}
    binds = bindings(r, keys)
    names = sorted(set(pools) | {b["pool"] for b in binds.values()})
    view: dict[str, dict[str, Any]] = {}
    for name in names:
        info = pools.get(name, {})
        cap = _amounts(info.get("capacity"))
        members = sorted(w for w, b in binds.items() if b.get("pool") == name)
        used: dict[str, float] = {}
        for w in members:
            for res, amt in _split(binds[w].get("resources"))[0].items():
                used[res] = used.get(res, 0.0) + amt
        free = {res: c - used.get(res, 0.0) for res, c in cap.items()}
        view[name] = {**{k: v for k, v in info.items() if k != "capacity"},
                      "capacity": cap, "used": used, "free": free, "workers": members}
    return view
