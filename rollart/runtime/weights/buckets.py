"""Cut a state dict into byte buckets and put it back together, exactly.

A bucket is a flat ``uint8`` tensor of at most ``bucket_bytes``. Tensors are packed whole, in
state-dict order, into the current bucket while they fit; a tensor that does not fit the space
left starts a new bucket; a tensor larger than a bucket is split along dim 0 (whole rows; a
single row larger than a bucket is split at element boundaries), its first piece filling what
is left of the current bucket. Tensors that alias one another (a tied embedding and LM head)
are stored once and restored as the same tensor.

The :class:`Manifest` (JSON-serialisable) lists every tensor's name, shape and dtype and every
piece's bucket and byte offsets, so a reader needs nothing but the manifest and the buckets::

    manifest, buckets = cut(state, bucket_bytes=64 << 20)
    state2 = reassemble(manifest, buckets)          # bit-identical to ``state``

:func:`pipelined_reassemble` overlaps fetching bucket ``i+1`` (in a background thread) with
copying bucket ``i`` into place; the stores use it for ``pull``.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from concurrent.futures import Future

    import torch

MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str                 # torch dtype name without the "torch." prefix: "float32", "bfloat16"
    nbytes: int
    alias_of: str | None = None  # restored as the same tensor as ``alias_of`` (tied weights)


@dataclass(frozen=True)
class Piece:
    """``nbytes`` bytes of tensor ``name`` starting at byte ``start`` of the tensor (row-major),
    stored at byte ``offset`` of bucket ``bucket``."""

    name: str
    bucket: int
    offset: int
    start: int
    nbytes: int


@dataclass
class Manifest:
    tensors: list[TensorEntry]
    pieces: list[Piece]
    bucket_sizes: list[int]
    bucket_bytes: int
    version: int | None = None
    format: int = MANIFEST_FORMAT
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_sizes)

    @property
    def num_buckets(self) -> int:
        return len(self.bucket_sizes)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> "Manifest":
        d = json.loads(text)
        if d.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"unsupported manifest format {d.get('format')!r} (expected {MANIFEST_FORMAT})")
        return cls(
            tensors=[TensorEntry(t["name"], tuple(t["shape"]), t["dtype"], t["nbytes"], t.get("alias_of"))
                     for t in d["tensors"]],
            pieces=[Piece(**p) for p in d["pieces"]],
            bucket_sizes=list(d["bucket_sizes"]), bucket_bytes=int(d["bucket_bytes"]),
            version=d.get("version"), format=d["format"], meta=dict(d.get("meta") or {}),
        )


def _dtype_name(dtype: "torch.dtype") -> str:
    return str(dtype).removeprefix("torch.")


def _torch_dtype(name: str) -> "torch.dtype":
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype '{name}' in manifest")
    return dt


def _as_tensor(value: Any) -> "torch.Tensor":
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    raise TypeError(f"state values must be tensors or numpy arrays, got {type(value).__name__}")


def _byte_view(t: "torch.Tensor") -> "torch.Tensor":
    """The tensor's bytes as a flat uint8 tensor (a view when already contiguous on the CPU)."""
    import torch

    t = t.detach().to("cpu").contiguous().reshape(-1)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return t.view(torch.uint8)


def plan_pieces(entries: Sequence[TensorEntry], bucket_bytes: int) -> tuple[list[Piece], list[int]]:
    """Where each tensor's bytes go (see the module docstring); returns pieces and bucket sizes."""
    if bucket_bytes <= 0:
        raise ValueError("bucket_bytes must be positive")
    pieces: list[Piece] = []
    sizes: list[int] = []
    used = bucket_bytes  # forces a first bucket on the first tensor with bytes

    def new_bucket() -> None:
        nonlocal used
        sizes.append(0)
        used = 0

    for e in entries:
        if e.alias_of is not None or e.nbytes == 0:
            continue
        if e.nbytes <= bucket_bytes:  # whole tensor, tensor-granular
            if used + e.nbytes > bucket_bytes:
                new_bucket()
            pieces.append(Piece(e.name, len(sizes) - 1, used, 0, e.nbytes))
            used += e.nbytes
            sizes[-1] = used
            continue
        # Larger than a bucket: split along dim 0 at row boundaries (element boundaries if a
        # single row does not fit).
        numel = 1
        for s in e.shape:
            numel *= s
        itemsize = e.nbytes // max(numel, 1)
        row = e.nbytes // e.shape[0] if e.shape else e.nbytes
        unit = row if row <= bucket_bytes else itemsize
        if unit > bucket_bytes:
            raise ValueError(f"bucket_bytes={bucket_bytes} is smaller than one element of '{e.name}' ({unit} bytes)")
        start = 0
        while start < e.nbytes:
            room = (bucket_bytes - used) // unit * unit
            if room == 0:
                new_bucket()
                continue
            n = min(room, e.nbytes - start)
            pieces.append(Piece(e.name, len(sizes) - 1, used, start, n))
            used += n
            sizes[-1] = used
            start += n
    return pieces, sizes


def cut(state: Mapping[str, Any], bucket_bytes: int, version: int | None = None,
        meta: Mapping[str, Any] | None = None) -> tuple[Manifest, list["torch.Tensor"]]:
    """Cut ``state`` into buckets: flat uint8 CPU tensors of at most ``bucket_bytes``, consecutive
    views of one contiguous arena (see :func:`arena_of`)."""
    import torch

    tensors: dict[str, torch.Tensor] = {}
    entries: list[TensorEntry] = []
    seen: dict[tuple[int, tuple[int, ...], tuple[int, ...], str], str] = {}
    for name, value in state.items():
        t = _as_tensor(value)
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), _dtype_name(t.dtype))
        alias = seen.get(key) if t.numel() and t.device.type == "cpu" else None
        nbytes = t.numel() * t.element_size()
        entries.append(TensorEntry(name, tuple(t.shape), _dtype_name(t.dtype), nbytes, alias))
        if alias is None:
            if t.numel() and t.device.type == "cpu":
                seen[key] = name
            tensors[name] = t
    pieces, sizes = plan_pieces(entries, bucket_bytes)
    # One arena, buckets are views of it: a transport can register the memory once.
    arena = torch.empty(sum(sizes), dtype=torch.uint8)
    buckets, off = [], 0
    for n in sizes:
        buckets.append(arena[off:off + n])
        off += n
    views: dict[str, torch.Tensor] = {}
    for p in pieces:
        src = views.get(p.name)
        if src is None:
            src = views[p.name] = _byte_view(tensors[p.name])
        buckets[p.bucket][p.offset:p.offset + p.nbytes].copy_(src[p.start:p.start + p.nbytes])
    return Manifest(entries, pieces, sizes, bucket_bytes, version, meta=dict(meta or {})), buckets


def arena_of(buckets: Sequence["torch.Tensor"]) -> tuple[int, int]:
    """(address, bytes) of the memory under buckets made by :func:`cut` (for registration)."""
    if not buckets:
        return 0, 0
    storage = buckets[0].untyped_storage()
    return storage.data_ptr(), storage.nbytes()


class Assembler:
    """Receives buckets in any order and copies their pieces into freshly allocated tensors."""

    def __init__(self, manifest: Manifest):
        import torch

        self.manifest = manifest
        self._by_bucket: dict[int, list[Piece]] = {}
        for p in manifest.pieces:
            self._by_bucket.setdefault(p.bucket, []).append(p)
        self.state: dict[str, torch.Tensor] = {}
        self._bytes: dict[str, Any] = {}  # name -> writable numpy uint8 view of the new tensor
        for e in manifest.tensors:
            if e.alias_of is not None:
                continue
            t = torch.empty(e.shape, dtype=_torch_dtype(e.dtype))
            self.state[e.name] = t
            self._bytes[e.name] = _byte_view(t).numpy()
        self._done: set[int] = set()

    def add(self, index: int, data: Any) -> None:
        """Copy bucket ``index`` (bytes, memoryview, numpy array or uint8 tensor) into place."""
        import numpy as np
        import torch

        if index in self._done:
            raise ValueError(f"bucket {index} added twice")
        if isinstance(data, torch.Tensor):
            buf = data.detach().cpu().contiguous().view(torch.uint8).reshape(-1).numpy()
        elif isinstance(data, np.ndarray):
            buf = data.reshape(-1).view(np.uint8)
        else:
            buf = np.frombuffer(data, dtype=np.uint8)
        expected = self.manifest.bucket_sizes[index]
        if buf.nbytes != expected:
            raise ValueError(f"bucket {index}: {buf.nbytes} bytes, the manifest says {expected}")
        for p in self._by_bucket.get(index, ()):
            self._bytes[p.name][p.start:p.start + p.nbytes] = buf[p.offset:p.offset + p.nbytes]
        self._done.add(index)

    def result(self) -> dict[str, "torch.Tensor"]:
        missing = set(range(self.manifest.num_buckets)) - self._done
        if missing:
            raise ValueError(f"buckets missing: {sorted(missing)[:8]}")
        out: dict[str, torch.Tensor] = {}
        for e in self.manifest.tensors:  # manifest order, aliases as the same tensor
            out[e.name] = self.state[e.alias_of] if e.alias_of is not None else self.state[e.name]
        return out


def reassemble(manifest: Manifest, buckets: Iterable[Any]) -> dict[str, "torch.Tensor"]:
    asm = Assembler(manifest)
    for i, b in enumerate(buckets):
        asm.add(i, b)
    return asm.result()


def pipelined_reassemble(manifest: Manifest, fetch: Callable[[int], Any],
                         prefetch: int = 2) -> tuple[dict[str, "torch.Tensor"], dict[str, float]]:
    """Fetch buckets with ``fetch(i)`` in a background thread (up to ``prefetch`` ahead) while
    this thread copies the ones already fetched into place. Returns the state and timings:
    ``fetch_s`` (sum of fetch calls), ``assemble_s`` (sum of copies), ``seconds`` (wall)."""
    t0 = time.perf_counter()
    q: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
    stop = threading.Event()
    fetch_s = [0.0]

    def worker() -> None:
        try:
            for i in range(manifest.num_buckets):
                if stop.is_set():
                    return
                t = time.perf_counter()
                data = fetch(i)
                fetch_s[0] += time.perf_counter() - t
                q.put((i, data, None))
        except BaseException as exc:  # re-raised in the caller
            q.put((-1, None, exc))

    th = threading.Thread(target=worker, name="bucket-fetch", daemon=True)
    th.start()
    asm = Assembler(manifest)
    assemble_s = 0.0
    try:
        for _ in range(manifest.num_buckets):
            i, data, exc = q.get()
            if exc is not None:
                raise exc
            t = time.perf_counter()
            asm.add(i, data)
            assemble_s += time.perf_counter() - t
    finally:
        stop.set()
        th.join(timeout=5.0)
    state = asm.result()
    wall = time.perf_counter() - t0
    return state, {"seconds": wall, "fetch_s": fetch_s[0], "assemble_s": assemble_s,
                   "bytes": float(manifest.total_bytes), "buckets": float(manifest.num_buckets),
                   "mib_per_s": manifest.total_bytes / (1 << 20) / wall if wall > 0 else 0.0}


def state_bytes(state: Mapping[str, Any]) -> int:
    """Bytes of ``state`` with aliased tensors counted once (what a store holds)."""
    total, seen = 0, set()
    for v in state.values():
        t = _as_tensor(v)
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key in seen and t.numel():
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def states_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Same keys, shapes, dtypes and bits."""
    import torch

    if list(a) != list(b):
        return False
    for k in a:
        x, y = _as_tensor(a[k]), _as_tensor(b[k])
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not torch.equal(_byte_view(x), _byte_view(y)):
            return False
    return True


class AsyncPullMixin:
    """``pull_async(version)``: run the store's ``pull`` on a background thread and return a
    :class:`concurrent.futures.Future`, so a worker keeps generating while the next version
    arrives (the stores' ``pull`` already overlaps fetching with reassembly)."""

    _pull_executor: Any = None

    def pull_async(self, version: int, timeout: float | None = None) -> "Future[dict[str, Any]]":
        from concurrent.futures import ThreadPoolExecutor

        if self._pull_executor is None:
            self._pull_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-pull")
        return self._pull_executor.submit(self.pull, version, timeout)  # type: ignore[attr-defined]

    def _shutdown_pulls(self) -> None:
        if self._pull_executor is not None:
            self._pull_executor.shutdown(wait=True)
            self._pull_executor = None
