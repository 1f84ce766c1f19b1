"""Weight transfer through a Mooncake store over TCP (the paper's cross-cluster path).

* :func:`start_master` runs the ``mooncake_master`` binary shipped inside the ``mooncake``
  package (``mooncake-transfer-engine-non-cuda`` here) on free ports of 127.0.0.1: its RPC
  port and its metrics port. Its built-in HTTP metadata server is *not* started: it binds
  0.0.0.0 whatever ``--http_metadata_server_host`` says and accepts unauthenticated PUTs;
  clients use the transfer engine's own peer-to-peer handshake (``P2PHANDSHAKE``) instead.
  The master dies with the process that started it (``PR_SET_PDEATHSIG``);
  :class:`MooncakeMaster` stops it on ``close``.
* Security note: the transfer engine in each client (0.3.13) listens on all interfaces
  (its handshake and TCP data ports ignore the local host name and ``MC_TCP_BIND_ADDRESS``),
  without authentication. The runtime therefore uses this store only when the plan allows
  such listeners (``runtime.allow_external_listeners``); otherwise Ray's object store.
* Each process opens one client per store with :meth:`MooncakeStoreSpec.open`
  (``MooncakeDistributedStore().setup(...)``). The publisher (the trainer) contributes a
  ``segment_bytes`` CPU segment that holds the published buckets; pullers contribute none.
* ``publish(version, state, bucket_bytes)`` cuts the state into buckets (:mod:`.buckets`),
  registers their memory once and ``put_from``s each bucket once (zero-copy, hard-pinned so
  the master never evicts it), then the manifest last, under
  ``{prefix}/v{version}/b{i}`` and ``{prefix}/v{version}/manifest``; versions older than the
  newest ``keep`` are removed.
* ``pull(version)`` waits for the manifest, then ``get_into``s the buckets into one registered
  arena on a background thread while the calling thread copies finished buckets into the
  tensors; ``pull_async`` runs the whole pull on another thread (overlap with rollout).

Each call records timing figures (``last_publish``/``last_pull``: seconds, bytes, MiB/s).
:func:`available` says whether Mooncake can run here.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from rollart.runtime.procs import pdeathsig_preexec
from rollart.runtime.weights.buckets import AsyncPullMixin, Manifest, arena_of, cut, pipelined_reassemble

_APT_HINT = "apt-get install libibverbs1 libnl-3-200 libnl-route-3-200"


class MooncakeUnavailable(RuntimeError):
    """Mooncake cannot run on this machine (missing package, libraries or binary)."""


class MooncakeError(RuntimeError):
    """A Mooncake call failed (return code in the message)."""


def master_binary() -> Path | None:
    """The ``mooncake_master`` executable inside the installed ``mooncake`` package."""
    spec = importlib.util.find_spec("mooncake")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc) / "mooncake_master"
        if p.is_file():
            return p
    return None


_AVAILABLE: tuple[bool, str] | None = None


def available() -> tuple[bool, str]:
    """(True, "") when the client imports and the master binary runs, else (False, why)."""
    global _AVAILABLE
    if _AVAILABLE is not None:
        return _AVAILABLE
    try:
        import mooncake.store  # noqa: F401  (the import itself is the check)
    except Exception as exc:  # ImportError, or OSError for a missing shared library
        _AVAILABLE = (False, f"mooncake.store does not import ({exc}); install mooncake-transfer-engine-non-cuda "
                             f"(CPU) or mooncake-transfer-engine (CUDA) and `{_APT_HINT}`")
        return _AVAILABLE
    binary = master_binary()
    if binary is None:
        _AVAILABLE = (False, "the mooncake package ships no mooncake_master binary")
        return _AVAILABLE
    try:
        if not os.access(binary, os.X_OK):
            binary.chmod(binary.stat().st_mode | 0o111)
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=20)
        if out.returncode != 0:
            _AVAILABLE = (False, f"mooncake_master --version failed: {(out.stderr or out.stdout)[-300:]}")
            return _AVAILABLE
    except (OSError, subprocess.TimeoutExpired) as exc:
        _AVAILABLE = (False, f"mooncake_master does not run: {exc}")
        return _AVAILABLE
    _AVAILABLE = (True, "")
    return _AVAILABLE


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class MooncakeMaster:
    """A ``mooncake_master`` process on free ports of ``host`` (no HTTP metadata server)."""

    def __init__(self, host: str = "127.0.0.1", log_dir: str | Path | None = None, start_timeout: float = 30.0,
                 extra_args: tuple[str, ...] = ()):
        self.host = host
        self.start_timeout = start_timeout
        self.extra_args = tuple(extra_args)
        # without log_dir: a private folder, made by start() and removed by close(); None until then
        self._own_dir = log_dir is None
        self.dir: Path | None = Path(log_dir) if log_dir is not None else None
        self.proc: subprocess.Popen | None = None
        self.rpc_port = self.metrics_port = 0
        self.startup_s = 0.0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        return "P2PHANDSHAKE"  # peers exchange segment descriptors directly; no metadata service

    @property
    def log_path(self) -> Path | None:
        return self.dir / "mooncake_master.log" if self.dir is not None else None

    def log_tail(self, n: int = 2000) -> str:
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def spec(self, **kw: Any) -> "MooncakeStoreSpec":
        return MooncakeStoreSpec(master_server=self.address, metadata_server=self.metadata_server, host=self.host, **kw)

    def start(self) -> "MooncakeMaster":
        if self.proc is not None:
            return self
        ok, why = available()
        if not ok:
            raise MooncakeUnavailable(why)
        binary = master_binary()
        if self.dir is None:  # made here, not in __init__, so a master that never starts leaves no folder
            self.dir = Path(tempfile.mkdtemp(prefix="rollart-mooncake-"))
        else:
            self.dir.mkdir(parents=True, exist_ok=True)
        try:
            return self._launch(binary)
        except BaseException:
            self.close()
            raise

    def _launch(self, binary: Path) -> "MooncakeMaster":
        assert self.log_path is not None
        t0 = time.perf_counter()
        last = ""
        for _attempt in range(3):  # a free port can be taken between the probe and the bind
            self.rpc_port, self.metrics_port = (_free_port(self.host) for _ in range(2))
            args = [str(binary), f"--rpc_port={self.rpc_port}", f"--rpc_address={self.host}",
                    "--enable_http_metadata_server=false", f"--metrics_host={self.host}",
                    f"--metrics_port={self.metrics_port}", "--enable_metric_reporting=false", *self.extra_args]
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             cwd=self.dir, preexec_fn=pdeathsig_preexec())
            deadline = time.monotonic() + self.start_timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                if _port_open(self.host, self.rpc_port):
                    self.startup_s = time.perf_counter() - t0
                    atexit.register(self.close)
                    return self
                time.sleep(0.02)
            last = self.log_tail()
            self._stop_proc()
        raise MooncakeUnavailable(f"mooncake_master did not start on {self.host}: {last[-800:]}")

    def _stop_proc(self) -> None:
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)

    def close(self) -> None:
        self._stop_proc()
        if self._own_dir and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> "MooncakeMaster":
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def start_master(host: str = "127.0.0.1", **kw: Any) -> MooncakeMaster:
    """Start a ``mooncake_master`` on free ports of ``host`` (raises :class:`MooncakeUnavailable`)."""
    return MooncakeMaster(host, **kw).start()


@dataclass(frozen=True)
class MooncakeStoreSpec:
    """How to reach a Mooncake store; picklable, ``open()`` it in any process.

    ``segment_bytes`` is the CPU memory the opening process lends the store (the publisher's
    must hold ``keep`` versions); pullers open with ``segment_bytes=0``."""

    master_server: str
    metadata_server: str
    host: str = "127.0.0.1"
    prefix: str = "rollart/weights"
    segment_bytes: int = 512 << 20
    local_buffer_bytes: int = 16 << 20
    keep: int = 2
    protocol: str = "tcp"
    poll_s: float = 0.005

    def open(self, segment_bytes: int | None = None) -> "MooncakeStore":
        spec = self if segment_bytes is None else replace(self, segment_bytes=int(segment_bytes))
        return MooncakeStore(spec)

    def for_puller(self) -> "MooncakeStoreSpec":
        return replace(self, segment_bytes=0)


def _local_hostname(spec: MooncakeStoreSpec) -> str:
    """The address this client's transfer engine announces to its peers: the spec's host when
    the store is on this machine's loopback, else this node's address (multi-node)."""
    import ipaddress

    try:
        if ipaddress.ip_address(spec.host).is_loopback:
            return spec.host
    except ValueError:
        pass
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001
        pass
    return socket.gethostbyname(socket.gethostname())


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise MooncakeError(f"mooncake {what} failed (rc={rc})")


class MooncakeStore(AsyncPullMixin):
    """WeightStore over a Mooncake store (see the module docstring)."""

    name = "mooncake"

    def __init__(self, spec: MooncakeStoreSpec):
        ok, why = available()
        if not ok:
            raise MooncakeUnavailable(why)
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig

        self.spec = spec
        self.client = MooncakeDistributedStore()
        t0 = time.perf_counter()
        rc = self.client.setup(_local_hostname(spec), spec.metadata_server, int(spec.segment_bytes),
                               int(spec.local_buffer_bytes),
                               spec.protocol, "", spec.master_server)
        if rc != 0:
            raise MooncakeError(f"MooncakeDistributedStore.setup({spec.master_server}) failed (rc={rc})")
        self.setup_s = time.perf_counter() - t0
        self._cfg = ReplicateConfig()
        self._cfg.replica_num = 1
        self._cfg.with_hard_pin = True  # published weights are never evicted; we remove them ourselves
        self._published: list[int] = []
        self._lock = threading.Lock()
        self._master: MooncakeMaster | None = None
        self.last_publish: dict[str, float] = {}
        self.last_pull: dict[str, float] = {}
        self._closed = False

    @classmethod
    def start(cls, **spec_kw: Any) -> "MooncakeStore":
        """Start a master and open a publisher on it; ``close()`` stops both."""
        master = start_master()
        try:
            store = cls(master.spec(**spec_kw))
        except BaseException:
            master.close()
            raise
        store._master = master
        return store

    # -- keys

    def _key(self, version: int, what: str) -> str:
        return f"{self.spec.prefix}/v{int(version)}/{what}"

    def _remove_version(self, version: int, n_buckets: int | None = None) -> None:
        if n_buckets is None:
            n_buckets = 0
            try:
                n_buckets = self._read_manifest(version).num_buckets
            except Exception:
                pass
        for key in [self._key(version, "manifest")] + [self._key(version, f"b{i}") for i in range(n_buckets)]:
            if self.client.is_exist(key) == 1:
                self.client.remove(key, True)

    # -- register / transfer helpers

    def _put_from(self, key: str, t: Any) -> None:
        _check(self.client.put_from(key, t.data_ptr(), t.numel(), self._cfg), f"put_from({key}, {t.numel()} B)")

    def _read_manifest(self, version: int) -> Manifest:
        import torch

        key = self._key(version, "manifest")
        size = self.client.get_size(key)
        if size <= 0:
            raise MooncakeError(f"manifest {key} missing (rc={size})")
        buf = torch.empty(size, dtype=torch.uint8)
        _check(self.client.register_buffer(buf.data_ptr(), size), "register_buffer(manifest)")
        try:
            got = self.client.get_into(key, buf.data_ptr(), size)
        finally:
            self.client.unregister_buffer(buf.data_ptr())
        if got != size:
            raise MooncakeError(f"get_into({key}) returned {got}, expected {size}")
        return Manifest.from_json(buf.numpy().tobytes())

    # -- WeightStore

    def publish(self, version: int, state: Mapping[str, Any], bucket_bytes: int) -> dict[str, float]:
        import torch

        with self._lock:
            t0 = time.perf_counter()
            manifest, buckets = cut(state, bucket_bytes, version=version)
            t1 = time.perf_counter()
            if self.client.is_exist(self._key(version, "manifest")) == 1:  # republished (after a resume)
                self._remove_version(version)
            ptr, nbytes = arena_of(buckets)
            if nbytes:
                _check(self.client.register_buffer(ptr, nbytes), f"register_buffer({nbytes} B)")
            t2 = time.perf_counter()
            try:
                for i, b in enumerate(buckets):
                    self._put_from(self._key(version, f"b{i}"), b)
            except MooncakeError as exc:
                self._remove_version(version, len(buckets))
                raise MooncakeError(f"{exc}; the store may be full: segment_bytes={self.spec.segment_bytes} must "
                                    f"hold keep={self.spec.keep} versions of {nbytes} B") from exc
            finally:
                if nbytes:
                    self.client.unregister_buffer(ptr)
            t3 = time.perf_counter()
            mbytes = torch.frombuffer(bytearray(manifest.to_json().encode()), dtype=torch.uint8)
            _check(self.client.register_buffer(mbytes.data_ptr(), mbytes.numel()), "register_buffer(manifest)")
            try:
                self._put_from(self._key(version, "manifest"), mbytes)  # last: its presence means complete
            finally:
                self.client.unregister_buffer(mbytes.data_ptr())
            t4 = time.perf_counter()
            self._published = [v for v in self._published if v != int(version)] + [int(version)]
            for old in self._published[:-max(1, self.spec.keep)]:
                self._remove_version(old)
            self._published = self._published[-max(1, self.spec.keep):]
            self.last_publish = {
                "seconds": t4 - t0, "cut_s": t1 - t0, "register_s": t2 - t1, "put_s": t3 - t2, "manifest_s": t4 - t3,
                "bytes": float(nbytes), "buckets": float(len(buckets)),
                "mib_per_s": nbytes / (1 << 20) / (t4 - t0) if t4 > t0 else 0.0,
                "put_mib_per_s": nbytes / (1 << 20) / (t3 - t2) if t3 > t2 else 0.0,
            }
            return dict(self.last_publish)

    def wait_published(self, version: int, timeout: float | None = 120.0) -> float:
        """Block until ``version``'s manifest exists; returns the seconds waited."""
        key = self._key(version, "manifest")
        t0 = time.perf_counter()
        delay = self.spec.poll_s
        while self.client.is_exist(key) != 1:
            if timeout is not None and time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"weights version {version} not published within {timeout} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.05)
        return time.perf_counter() - t0

    def pull(self, version: int, timeout: float | None = 120.0) -> dict[str, Any]:
        """Reassemble ``version`` (blocks until it is published)."""
        import torch

        t0 = time.perf_counter()
        wait_s = self.wait_published(version, timeout)
        manifest = self._read_manifest(version)
        t1 = time.perf_counter()
        total = manifest.total_bytes
        arena = torch.empty(total, dtype=torch.uint8)
        offsets, off = [], 0
        for n in manifest.bucket_sizes:
            offsets.append(off)
            off += n
        if total:
            _check(self.client.register_buffer(arena.data_ptr(), total), f"register_buffer({total} B)")

        def fetch(i: int) -> Any:
            n = manifest.bucket_sizes[i]
            key = self._key(version, f"b{i}")
            got = self.client.get_into(key, arena.data_ptr() + offsets[i], n)
            if got != n:
                raise MooncakeError(f"get_into({key}) returned {got}, expected {n} (version {version} removed?)")
            return arena[offsets[i]:offsets[i] + n]

        try:
            state, timing = pipelined_reassemble(manifest, fetch)
        finally:
            if total:
                self.client.unregister_buffer(arena.data_ptr())
        timing["wait_s"] = wait_s
        timing["manifest_s"] = t1 - t0 - wait_s
        timing["seconds"] = time.perf_counter() - t0
        timing["fetch_mib_per_s"] = total / (1 << 20) / timing["fetch_s"] if timing["fetch_s"] > 0 else 0.0
        self.last_pull = timing
        return state

    def latest(self) -> int | None:
        return self._published[-1] if self._published else None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._shutdown_pulls()
        try:
            for v in list(self._published):
                self._remove_version(v)
            self._published = []
            self.client.close()
        finally:
            if self._master is not None:
                self._master.close()
                self._master = None

    def __enter__(self) -> "MooncakeStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
