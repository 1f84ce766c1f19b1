"""Time the kernels the cost model composes on this machine's device, fit them, and compare
them with the datasheet roofline the simulator used before.

``rollart calibrate profile --engine kernels --out DIR`` runs :func:`profile_kernels` and
writes one folder (the columns follow InferSim's ``bench_data`` files, which
``calibration/kernels.py`` fits, with the head geometry as columns instead of file names)::

    gemm.csv          model,op,dtype,m,k,n,latency_us,mfu
    attn_prefill.csv  dtype,backend,q_heads,kv_heads,head_dim,seq_len,latency_us,mfu
    attn_decode.csv   dtype,kv_dtype,backend,q_heads,kv_heads,head_dim,batch_size,kv_len,latency_us,mfu
    copy.csv          bytes,latency_us,tbps
    provenance.json   date, device, driver, torch/CUDA versions, method, measured peak and copy rate

* GEMM: ``x[m, k] @ W[n, k]ᵀ`` (``torch.nn.Linear``'s layout) for each linear layer of the
  models' layers (QKV, O, gate+up, down) and their LM head, over token counts ``m``.
* prefill attention: one causal sequence of ``seq_len`` tokens through
  ``torch.nn.functional.scaled_dot_product_attention`` (GQA), the first backend that runs in
  the order flash, cuDNN, memory-efficient, math (the ``backend`` column says which).
* decode attention: one new token for each of ``batch_size`` sequences holding ``kv_len``
  cached tokens, same SDPA call.
* copy: ``dst.copy_(src)`` of ``bytes`` bytes; ``tbps`` counts the bytes read and written.

Timing: ``warmup`` untimed calls, then the median of ``repeats`` timed blocks; a block is one
call, or several back-to-back calls when one is shorter than ``min_block_s`` (the time per
call is the block's over its calls). On CUDA a block is a CUDA graph replayed between two
CUDA events (no launch gaps; eager calls when a kernel cannot be captured) and the weight or
KV operands rotate over enough copies to exceed 4 × the L2 cache, so a layer's weights are
read from HBM as in a real forward; on CPU, ``time.perf_counter`` and one copy.

:func:`fit_profile` fits the folder with ``calibration/kernels.py`` into a kernel profile
(``rollart calibrate fit DIR --gpu H200``) and :func:`compare_roofline` tabulates, per kernel
family, the error of the simulator's datasheet roofline (``sim.costs.gpu.RooflineGeneration``
with its default efficiencies, what a pool with ``profile: datasheet`` gets) against the measurements.
torch is imported lazily: reading, fitting and comparing need numpy and scipy only.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from rollart.plan.schema import ModelSpec

FILES = {"gemm": "gemm.csv", "attn_prefill": "attn_prefill.csv", "attn_decode": "attn_decode.csv", "copy": "copy.csv"}
PROVENANCE = "provenance.json"
COLUMNS = {
    "gemm": ("model", "op", "dtype", "m", "k", "n", "latency_us", "mfu"),
    "attn_prefill": ("dtype", "backend", "q_heads", "kv_heads", "head_dim", "seq_len", "latency_us", "mfu"),
    "attn_decode": ("dtype", "kv_dtype", "backend", "q_heads", "kv_heads", "head_dim", "batch_size", "kv_len",
                    "latency_us", "mfu"),
    "copy": ("bytes", "latency_us", "tbps"),
}
SDPA_ORDER = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
L2_ROTATION = 4      # rotate operands over copies totalling this many L2 caches
MAX_COPIES = 8
Progress = Callable[[int, int], None]


# ---------------------------------------------------------------- what to measure


@dataclass(frozen=True)
class KernelGrid:
    """The shapes to time. Decode points with ``batch × kv_len > max_decode_tokens`` are skipped."""

    models: tuple[str, ...]
    gemm_tokens: tuple[int, ...]
    prefill_lens: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_lens: tuple[int, ...]
    max_decode_tokens: int
    copy_bytes: tuple[int, ...]

    def specs(self) -> list[ModelSpec]:
        return [ModelSpec.model_validate(m) for m in self.models]

    def gemm_shapes(self) -> list[tuple[str, str, int, int]]:
        """``(model, op, k, n)`` of every distinct linear layer (the first model naming a shape keeps it)."""
        seen, out = set(), []
        for s in self.specs():
            q, kv, d, h, i = s.heads, s.kv_heads, s.head_dim, s.hidden, s.intermediate
            for op, k, n in (("qkv", h, (q + 2 * kv) * d), ("o", q * d, h), ("gate_up", h, 2 * i), ("down", i, h),
                             ("lm_head", h, s.vocab)):
                if (k, n) not in seen:
                    seen.add((k, n))
                    out.append((s.name, op, k, n))
        return out

    def geometries(self) -> list[tuple[int, int, int]]:
        """Distinct ``(q_heads, kv_heads, head_dim)`` of the models."""
        return sorted({(s.heads, s.kv_heads, s.head_dim) for s in self.specs()})

    def decode_points(self) -> list[tuple[int, int]]:
        return [(b, length) for b in self.decode_batches for length in self.decode_lens
                if b * length <= self.max_decode_tokens]

    def __len__(self) -> int:
        return (len(self.gemm_shapes()) * len(self.gemm_tokens)
                + len(self.geometries()) * (len(self.prefill_lens) + len(self.decode_points())) + len(self.copy_bytes))


# The Qwen3 dense models the simulator's scenarios use, on one GPU (TP 1).
FULL = KernelGrid(models=("Qwen3-8B", "Qwen3-14B", "Qwen3-32B"),
                  gemm_tokens=tuple(2 ** p for p in range(15)),            # 1 … 16384
                  prefill_lens=(256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
                  decode_batches=(1, 4, 16, 64, 256), decode_lens=(512, 2048, 8192, 32768),
                  max_decode_tokens=2 ** 20, copy_bytes=(2 ** 26, 2 ** 28, 2 ** 30, 2 ** 32))
# Seconds on a CPU: the tiny model's shapes (the code path, not a meaningful profile).
TINY = KernelGrid(models=("Qwen3-tiny",), gemm_tokens=(1, 4, 16, 64, 256),
                  prefill_lens=(8, 16, 32, 64, 128, 256, 512), decode_batches=(1, 2, 4, 8), decode_lens=(16, 64, 256),
                  max_decode_tokens=2048, copy_bytes=(2 ** 20, 2 ** 22, 2 ** 24))
GRIDS = {"full": FULL, "tiny": TINY}


# ---------------------------------------------------------------- timing


def _cuda(device: str) -> bool:
    return str(device).startswith("cuda")


def _sync(device: str) -> None:
    if _cuda(device):
        import torch

        torch.cuda.synchronize(device)


@dataclass
class Timer:
    """Median seconds per call of a kernel (see the module docstring for the method)."""

    device: str = "cpu"
    warmup: int = 2
    repeats: int = 5
    min_block_s: float = 1e-3
    graphs: bool = True
    max_inner: int = 256
    stats: dict[str, int] = field(default_factory=lambda: {"graph": 0, "eager": 0})

    def time(self, calls: Sequence[Callable[[], Any]], out_bytes: int = 0) -> float:
        """``calls`` are the same kernel on rotating operand copies; call ``j`` of a block is
        ``calls[j % len(calls)]``. ``out_bytes``: what one call allocates (bounds a graph's block)."""
        n = len(calls)
        est = math.inf
        for j in range(max(1, self.warmup)):  # the fastest warm-up call sizes the block (the first pays set-up)
            t0 = time.perf_counter()
            calls[j % n]()
            _sync(self.device)
            est = min(est, time.perf_counter() - t0)
        est = max(est, 1e-9)
        inner = int(min(self.max_inner, max(1, math.ceil(self.min_block_s / est))))
        if out_bytes:
            inner = max(1, min(inner, (1 << 30) // max(1, out_bytes)))
        if _cuda(self.device):
            return self._time_cuda(calls, inner)
        times = []
        for _ in range(self.repeats):
            t0 = time.perf_counter()
            for j in range(inner):
                calls[j % n]()
            times.append((time.perf_counter() - t0) / inner)
        self.stats["eager"] += 1
        return statistics.median(times)

    def _time_cuda(self, calls: Sequence[Callable[[], Any]], inner: int) -> float:
        import torch

        n = len(calls)

        def block() -> None:
            for j in range(inner):
                calls[j % n]()

        run = block
        if self.graphs:
            try:
                graph = torch.cuda.CUDAGraph()
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    block()  # warm the side stream before capture, as torch's docs ask
                torch.cuda.current_stream().wait_stream(stream)
                with torch.cuda.graph(graph):
                    block()
                graph.replay()
                run = graph.replay
                self.stats["graph"] += 1
            except Exception:  # noqa: BLE001 - a kernel that cannot be captured is timed eagerly
                torch.cuda.synchronize()
                run = block
                self.stats["eager"] += 1
        else:
            self.stats["eager"] += 1
        times = []
        for _ in range(self.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3 / inner)
        return statistics.median(times)


def l2_bytes(device: str) -> int:
    if not _cuda(device):
        return 0
    import torch

    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20))


def copies_for(nbytes: int, device: str) -> int:
    """Operand copies to rotate over so they exceed ``L2_ROTATION`` L2 caches (1 on CPU)."""
    l2 = l2_bytes(device)
    return 1 if not l2 else int(min(MAX_COPIES, max(1, math.ceil(L2_ROTATION * l2 / max(1, nbytes)))))


# ---------------------------------------------------------------- the kernels


def _randn(shape: Sequence[int], dtype: Any, device: str, gen: Any) -> Any:
    """Random operands drawn on the device itself (``gen`` lives there): gigabytes of weights
    would take seconds to draw on the host."""
    import torch

    return torch.randn(*shape, generator=gen, device=device, dtype=dtype)


def gemm_weights(timer: Timer, k: int, n: int, dtype: Any, gen: Any) -> list[Any]:
    """``W[n, k]`` copies to rotate over (drawn once per shape, reused for every token count)."""
    return [_randn((n, k), dtype, timer.device, gen) for _ in range(copies_for(2 * k * n, timer.device))]


def time_gemm(timer: Timer, m: int, weights: Sequence[Any], gen: Any) -> float:
    import torch

    n, k = weights[0].shape
    x = _randn((m, k), weights[0].dtype, timer.device, gen)
    out = torch.empty((m, n), dtype=weights[0].dtype, device=timer.device)
    calls = [lambda w=w: torch.mm(x, w.t(), out=out) for w in weights]
    return timer.time(calls)


def _sdpa_backends(device: str) -> list[tuple[str, Any]]:
    from torch.nn.attention import SDPBackend

    if not _cuda(device):
        return [("default", None)]
    return [(name.lower().removesuffix("_attention"), getattr(SDPBackend, name)) for name in SDPA_ORDER
            if hasattr(SDPBackend, name)]


def time_attention(timer: Timer, batch: int, q_len: int, kv_len: int, heads: int, kv_heads: int, head_dim: int,
                   dtype: Any, gen: Any, causal: bool) -> tuple[float, str]:
    """Seconds of one SDPA call and the backend that ran it."""
    import contextlib

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    q = _randn((batch, heads, q_len, head_dim), dtype, timer.device, gen)
    kv_bytes = 2 * batch * kv_heads * kv_len * head_dim * torch.finfo(dtype).bits // 8
    kvs = [(_randn((batch, kv_heads, kv_len, head_dim), dtype, timer.device, gen),
            _randn((batch, kv_heads, kv_len, head_dim), dtype, timer.device, gen))
           for _ in range(copies_for(kv_bytes, timer.device))]
    calls = [lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=kv_heads != heads)
             for k, v in kvs]
    out_bytes = q.numel() * q.element_size()
    last: Optional[Exception] = None
    # the math backend materialises the [B, H, q, kv] scores (fp32 softmax): skip it when huge
    math_bytes = 3 * batch * heads * q_len * kv_len * 4
    for name, backend in _sdpa_backends(timer.device):
        if name == "math" and _cuda(timer.device) and math_bytes > 8 << 30:
            break
        ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
        try:
            with ctx:
                calls[0]()
                _sync(timer.device)
                return timer.time(calls, out_bytes), name
        except RuntimeError as exc:  # this backend does not support the shape/dtype/device
            last = exc
            _sync(timer.device)
    raise RuntimeError(f"no SDPA backend ran batch {batch} q {q_len} kv {kv_len} heads {heads}/{kv_heads}: {last}")


def time_copy(timer: Timer, nbytes: int) -> float:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=timer.device)
    src.fill_(1)
    dst = torch.empty_like(src)
    return timer.time([lambda: dst.copy_(src)])


# ---------------------------------------------------------------- provenance


def _driver_version() -> str:
    try:
        import pynvml  # nvidia-ml-py, on the GPU image

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # noqa: BLE001
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(device: str) -> dict[str, Any]:
    """What ran the measurements: device, driver, library versions."""
    import torch

    info: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": str(device), "torch": torch.__version__, "python": platform.python_version(),
        "host_cpu": _cpu_name(), "cpu_count": os.cpu_count(),
    }
    try:
        from importlib.metadata import version

        info["rollart"] = version("rollart")
    except Exception:  # noqa: BLE001
        info["rollart"] = "unknown"
    if _cuda(device):
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=torch.cuda.get_device_name(device), driver=_driver_version(), cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version(), sm_count=int(props.multi_processor_count),
                    l2_bytes=l2_bytes(device), memory_bytes=int(props.total_memory),
                    capability=".".join(map(str, torch.cuda.get_device_capability(device))))
    else:
        info.update(gpu=f"cpu ({_cpu_name()})", driver="none", cuda=None, cudnn=None,
                    sm_count=int(torch.get_num_threads()), l2_bytes=0, memory_bytes=None, capability=None)
    return info


# ---------------------------------------------------------------- the profile run


def _short(dtype: Any) -> str:
    from rollart.calibration.profile_engine import short_dtype

    return short_dtype(dtype)


def profile_kernels(out_dir: str | Path, device: str = "cpu", grid: KernelGrid = TINY, dtype: Any = None,
                    warmup: Optional[int] = None, repeats: Optional[int] = None, peak_tflops: Optional[float] = None,
                    seed: int = 0, progress: Optional[Progress] = None, command: str = "") -> dict[str, Any]:
    """Time every kernel of ``grid`` on ``device`` and write the folder; returns the provenance."""
    import torch

    from rollart.calibration.profile_engine import torch_dtype

    cuda = _cuda(device)
    if cuda:  # an index, as torch.cuda.set_device needs one ("cuda" alone raises there)
        index = torch.device(device).index
        device = f"cuda:{torch.cuda.current_device() if index is None else index}"
        torch.cuda.set_device(device)
    dt = torch_dtype(dtype or ("bf16" if cuda else "fp32"))
    short = _short(dt)
    timer = Timer(device=device, warmup=warmup if warmup is not None else (3 if cuda else 2),
                  repeats=repeats if repeats is not None else (7 if cuda else 5), min_block_s=1e-3 if cuda else 2e-3)
    gen = torch.Generator(device=device).manual_seed(seed)
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)  # tiny CPU kernels: intra-op hand-offs on a shared host cost more than they save
    try:
        return _profile(out_dir, device, grid, dt, short, timer, gen, peak_tflops, progress, command, seed)
    finally:
        torch.set_num_threads(threads)


def _profile(out_dir: str | Path, device: str, grid: KernelGrid, dt: Any, short: str, timer: Timer, gen: Any,
             peak_tflops: Optional[float], progress: Optional[Progress], command: str, seed: int) -> dict[str, Any]:
    import torch

    from rollart.calibration.profile_engine import measure_peak_tflops

    cuda = _cuda(device)
    info = device_info(device)
    peak_measured = peak_tflops is None
    peak = float(peak_tflops) if peak_tflops else measure_peak_tflops(device, short, min_s=0.5, max_s=2.0)
    total, done = len(grid), 0
    rows: dict[str, list[list[Any]]] = {k: [] for k in FILES}
    t_start = time.perf_counter()

    def tick() -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total)

    bytes_el = torch.finfo(dt).bits // 8
    with torch.inference_mode():
        for model, op, k, n in grid.gemm_shapes():
            weights = gemm_weights(timer, k, n, dt, gen)
            for m in grid.gemm_tokens:
                t = time_gemm(timer, m, weights, gen)
                rows["gemm"].append([model, op, short, m, k, n, _us(t), _mfu(2.0 * m * k * n, t, peak)])
                tick()
            del weights
        for h, hkv, d in grid.geometries():
            for s in grid.prefill_lens:
                t, backend = time_attention(timer, 1, s, s, h, hkv, d, dt, gen, causal=True)
                rows["attn_prefill"].append([short, backend, h, hkv, d, s, _us(t), _mfu(4.0 * h * d * s * s / 2, t, peak)])
                tick()
            for b, length in grid.decode_points():
                t, backend = time_attention(timer, b, 1, length, h, hkv, d, dt, gen, causal=False)
                rows["attn_decode"].append([short, short, backend, h, hkv, d, b, length, _us(t),
                                            _mfu(4.0 * h * d * b * length, t, peak)])
                tick()
        for nbytes in grid.copy_bytes:
            t = time_copy(timer, nbytes)
            rows["copy"].append([nbytes, _us(t), float(f"{2 * nbytes / t / 1e12:.5g}")])
            tick()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for kind, name in FILES.items():
        with (out / name).open("w", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(COLUMNS[kind])
            w.writerows(rows[kind])
    copy_tbps = max((r[2] for r in rows["copy"]), default=0.0)
    info.update(
        command=command, dtype=short, kv_dtype=short, kv_bytes=bytes_el, seed=seed,
        grid=asdict(grid), peak_tflops=round(peak, 4),
        peak_source="measured (best large square matmul, profile_engine.measure_peak_tflops)" if peak_measured
        else "given", copy_tbps=copy_tbps,
        method=(f"{timer.warmup} warm-up calls, median of {timer.repeats} timed blocks of back-to-back calls "
                f"(a block lasts at least {timer.min_block_s * 1e3:g} ms); "
                + ("CUDA events around CUDA-graph replays (eager where capture failed); operands rotate over "
                   f"copies exceeding {L2_ROTATION} x L2" if cuda else "time.perf_counter, one operand copy")),
        timing_blocks=dict(timer.stats), rows={k: len(v) for k, v in rows.items()},
        wall_s=round(time.perf_counter() - t_start, 2))
    (out / PROVENANCE).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    return info


def _us(t: float) -> float:
    return round(t * 1e6, 3)


def _mfu(flops: float, t: float, peak_tflops: float) -> float:
    return float(f"{flops / (t * peak_tflops * 1e12):.4g}") if t > 0 and peak_tflops > 0 else 0.0


# ---------------------------------------------------------------- reading the folder


class KernelDataError(ValueError):
    """A kernel folder that cannot be read or fitted (one line, names the file)."""


@dataclass
class KernelData:
    """The folder as (X, y-seconds) arrays in ``calibration/kernels.py``'s column order."""

    root: Path
    provenance: dict[str, Any]
    gemm: tuple[np.ndarray, np.ndarray]           # X = m, k, n
    prefill: tuple[np.ndarray, np.ndarray]        # X = seq_len, q_heads, head_dim
    decode: tuple[np.ndarray, np.ndarray]         # X = batch, kv_len, q_heads, kv_heads, head_dim, bytes/element
    copy: tuple[np.ndarray, np.ndarray]           # X = bytes

    def files(self, kind: str) -> list[str]:
        path = self.root / FILES[kind]
        for base in (Path(__file__).parent / "data", Path.cwd()):
            try:
                return [str(path.resolve().relative_to(base.resolve()))]
            except ValueError:
                continue
        return [str(path)]


_KV_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}


def _read(path: Path, columns: Sequence[str]) -> Iterator[dict[str, str]]:
    if not path.is_file():
        raise KernelDataError(f"{path}: no such file (write the folder with `rollart calibrate profile --engine kernels`)")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if tuple(reader.fieldnames or ()) != tuple(columns):
            raise KernelDataError(f"{path}: expected columns {','.join(columns)}, got {','.join(reader.fieldnames or ())}")
        for i, rec in enumerate(reader, start=2):
            try:
                lat = float(rec["latency_us"])
            except (TypeError, ValueError):
                raise KernelDataError(f"{path}:{i}: latency_us is not a number") from None
            if not math.isfinite(lat) or lat <= 0:
                raise KernelDataError(f"{path}:{i}: latency_us must be a positive number, got {rec['latency_us']}")
            yield rec


def _arrays(path: Path, columns: Sequence[str], x: Callable[[dict[str, str]], list[float]]) -> tuple[np.ndarray, np.ndarray]:
    X, y = [], []
    for rec in _read(path, columns):
        try:
            X.append(x(rec))
        except (KeyError, TypeError, ValueError):
            raise KernelDataError(f"{path}: a row has a non-numeric shape column") from None
        y.append(float(rec["latency_us"]) * 1e-6)
    return np.array(X, dtype=float).reshape(len(X), -1), np.array(y, dtype=float)


def load_dir(root: str | Path) -> KernelData:
    root = Path(root)
    if not root.is_dir():
        raise KernelDataError(f"{root}: not a folder of kernel timings")
    prov_path = root / PROVENANCE
    try:
        provenance = json.loads(prov_path.read_text()) if prov_path.is_file() else {}
    except json.JSONDecodeError as exc:
        raise KernelDataError(f"{prov_path}: not valid JSON ({exc.msg})") from None
    f = lambda kind: root / FILES[kind]  # noqa: E731
    return KernelData(
        root=root, provenance=provenance,
        gemm=_arrays(f("gemm"), COLUMNS["gemm"], lambda r: [float(r["m"]), float(r["k"]), float(r["n"])]),
        prefill=_arrays(f("attn_prefill"), COLUMNS["attn_prefill"],
                        lambda r: [float(r["seq_len"]), float(r["q_heads"]), float(r["head_dim"])]),
        decode=_arrays(f("attn_decode"), COLUMNS["attn_decode"],
                       lambda r: [float(r["batch_size"]), float(r["kv_len"]), float(r["q_heads"]),
                                  float(r["kv_heads"]), float(r["head_dim"]), _KV_BYTES[r["kv_dtype"]]]),
        copy=_arrays(f("copy"), COLUMNS["copy"], lambda r: [float(r["bytes"])]),
    )


# ---------------------------------------------------------------- fitting


def reference_rates(data: KernelData, gpu: str) -> tuple[float, float, int, str]:
    """Peak FLOP/s, bandwidth B/s, SM count and where they come from: the datasheet of a GPU
    the presets know (as the shipped profiles are fitted), else what the run measured."""
    from rollart.plan.presets import GPU_PRESETS

    key = next((k for k in GPU_PRESETS if k.lower() == gpu.lower()), None)
    p = data.provenance
    n_sm = int(p.get("sm_count") or 1)
    if key is not None:
        sheet = GPU_PRESETS[key]
        return sheet["tflops_bf16"] * 1e12, sheet["hbm_tbps"] * 1e12, n_sm, f"{key} datasheet"
    peak, bw = float(p.get("peak_tflops") or 0.0), float(p.get("copy_tbps") or 0.0)
    if peak <= 0 or bw <= 0:
        raise KernelDataError(f"{data.root / PROVENANCE}: no measured peak_tflops / copy_tbps, and '{gpu}' is not a "
                              f"GPU preset ({', '.join(GPU_PRESETS)}) whose datasheet could stand in")
    return peak * 1e12, bw * 1e12, n_sm, "measured matmul peak and copy bandwidth"


def _need(n: int, rows: int, what: str, path: Path) -> None:
    if rows < n:
        raise KernelDataError(f"{path}: {rows} rows of {what}; the fit needs at least {n}")


def fit_profile(root: str | Path, gpu: str) -> Any:
    """A :class:`~rollart.calibration.profiles.KernelProfile` fitted to the folder."""
    from rollart.calibration import build as B
    from rollart.calibration import datasets as D
    from rollart.calibration import kernels as K
    from rollart.calibration.profiles import ComponentFit, KernelProfile, PhaseError

    data = load_dir(root)
    peak, bw, n_sm, basis = reference_rates(data, gpu)
    for kind, (X, _), n in (("gemm", data.gemm, 8), ("attn_prefill", data.prefill, 6), ("attn_decode", data.decode, 8)):
        _need(n, len(X), kind, data.root / FILES[kind])
    gx, gy = data.gemm
    px, py = data.prefill
    dx, dy = data.decode
    gemm_fit = K.fit_gemm(gx, gy, peak, bw)
    prefill_fit = K.fit_prefill_attention(px, py, peak)
    decode_fit = K.fit_decode_attention(dx, dy, peak, bw, n_sm)

    def component(fit: K.Fit, formula: str, kind: str, derived: Optional[str] = None) -> ComponentFit:
        for name, v in fit.params.items():
            if not math.isfinite(v):
                raise KernelDataError(f"{data.root / FILES[kind]}: the fit's {name} is not finite")
        return ComponentFit(formula=formula, params={k: float(f"{v:.6g}") for k, v in fit.params.items()},
                            data=data.files(kind), rows=fit.rows, heldout_rows=fit.heldout_rows,
                            mape_train=round(fit.mape_train, 4),
                            mape_heldout=None if math.isnan(fit.mape_heldout) else round(fit.mape_heldout, 4),
                            derived=derived)

    held = lambda predict, X, y, params, mask=None: _heldout_ape(predict, X, y, params, mask)  # noqa: E731
    gemm_pred = lambda x, p: K.gemm_time(x, p, peak, bw)  # noqa: E731
    prefill_ape = np.concatenate([held(gemm_pred, gx, gy, gemm_fit.params, gx[:, 0] >= B.PREFILL_TOKENS),
                                  held(lambda x, p: K.prefill_attention_time(x, p, peak), px, py, prefill_fit.params)])
    decode_ape = np.concatenate([held(gemm_pred, gx, gy, gemm_fit.params, gx[:, 0] < B.PREFILL_TOKENS),
                                 held(lambda x, p: K.decode_attention_time(x, p, peak, bw), dx, dy, decode_fit.params)])

    # All-reduce cannot be measured on one device: the H100 NVLink fit the shipped profiles use.
    ax, ay, afiles = D.vidur_collective("all_reduce", intra_node=True)
    allreduce = ComponentFit(**{**component(K.fit_collective(ax, ay), B.COLLECTIVE_FORMULA, "gemm").model_dump(),
                                "data": afiles,
                                "derived": "not measured (one device): the 8×H100 NVLink all-reduce fit"})
    allreduce_custom = B.custom_allreduce_component(
        derived="not measured (one device): vLLM's custom all-reduce on H100 (published timings, tp 2/4/8)")
    p = data.provenance
    copy_note = ""
    if len(data.copy[0]):
        copy_tbps = float(np.max(2 * data.copy[0][:, 0] / data.copy[1])) / 1e12
        copy_note = f"; device copy measured {copy_tbps:.3g} TB/s read+write ({copy_tbps * 1e12 / bw:.0%} of the reference)"
    assumptions = [
        f"iteration overhead {B.ITERATION_OVERHEAD_S * 1e3:.0f} ms per engine step (scheduling, sampling, launch) is "
        "assumed: kernel timings do not contain it",
        f"efficiencies are relative to {basis}: {peak / 1e12:g} TFLOP/s, {bw / 1e12:g} TB/s{copy_note}",
        f"{allreduce.derived}",
        f"{allreduce_custom.derived}",
    ]
    unsplit = sorted(k[len(K.UNSPLIT):].replace("_", "-") for k, v in decode_fit.params.items()
                     if k.startswith(K.UNSPLIT) and v)
    if unsplit:
        assumptions.append(f"decode attention of head geometry {', '.join(unsplit)} (q-kv-dim) fits a kernel without "
                           f"split-KV (flat in the batch until batch × KV heads fills the {n_sm} SMs)")
    note = (f"held-out rows: GEMMs with ≥ {B.PREFILL_TOKENS} tokens and prefill attention for prefill; GEMMs with "
            f"< {B.PREFILL_TOKENS} tokens and decode attention for decode")
    name = next((k for k in _presets() if k.lower() == gpu.lower()), gpu)
    return KernelProfile(
        gpu=name, peak_tflops_bf16=round(peak / 1e12, 6), hbm_tbps=round(bw / 1e12, 6),
        iteration_overhead_s=B.ITERATION_OVERHEAD_S,
        gemm=component(gemm_fit, B.GEMM_FORMULA, "gemm"),
        attn_prefill=component(prefill_fit, B.PREFILL_FORMULA, "attn_prefill"),
        attn_decode=component(decode_fit, B.DECODE_FORMULA, "attn_decode"),
        allreduce=allreduce, allreduce_custom=allreduce_custom,
        fit_error=PhaseError(prefill_mape_heldout=_mean(prefill_ape), decode_mape_heldout=_mean(decode_ape), note=note),
        assumptions=assumptions,
        source=(f"kernel timings measured on {p.get('gpu', 'an unknown device')} (driver {p.get('driver', '?')}, "
                f"torch {p.get('torch', '?')}, CUDA {p.get('cuda')}) on {p.get('date', '?')} by `rollart calibrate "
                f"profile --engine kernels`; {p.get('dtype', '?')} operands; see {PROVENANCE} beside the CSVs"),
    )


def _presets() -> list[str]:
    from rollart.plan.presets import GPU_PRESETS

    return list(GPU_PRESETS)


def _mean(a: np.ndarray) -> Optional[float]:
    return round(float(a.mean()), 4) if a.size else None


def _heldout_ape(predict: Callable[[np.ndarray, dict[str, float]], np.ndarray], X: np.ndarray, y: np.ndarray,
                 params: dict[str, float], mask: Optional[np.ndarray] = None) -> np.ndarray:
    """|pred − meas| / meas on the fit's held-out rows (``kernels.split``), optionally masked."""
    from rollart.calibration.kernels import split

    _, held = split(len(y))
    if mask is not None:
        held = held[mask[held]]
    return np.abs(predict(X[held], params) - y[held]) / y[held] if held.size else np.zeros(0)


# ---------------------------------------------------------------- roofline vs measured


@dataclass(frozen=True)
class FamilyError:
    """One row of the comparison: errors are (predicted − measured) / measured."""

    family: str
    rows: int
    roofline_mape: float
    roofline_median_error: float
    roofline_min_error: float
    roofline_max_error: float
    fitted_mape_heldout: Optional[float]


def roofline_predictions(data: KernelData, peak: float, bw: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The simulator's previous per-kernel model (``RooflineGeneration`` with its default
    ``RooflineEfficiency``): compute at ``prefill_compute`` (GEMMs of ≥ 512 tokens, prefill
    attention) or ``decode_compute`` of the peak, bytes at ``decode_bandwidth`` of the HBM rate,
    the larger of the two; bytes are what that model counts — a GEMM's weights (not its
    activations), decode attention's KV cache, a copy's read and write. Its per-step overhead
    is left out: kernel timings do not contain it. Returns ``family → (predicted, measured)``."""
    from rollart.calibration.build import PREFILL_TOKENS
    from rollart.sim.costs.gpu import RooflineEfficiency

    e = RooflineEfficiency()
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    gx, gy = data.gemm
    if len(gy):
        m, k, n = gx[:, 0], gx[:, 1], gx[:, 2]
        big = m >= PREFILL_TOKENS
        eff = np.where(big, e.prefill_compute, e.decode_compute)
        pred = np.maximum(2 * m * k * n / (peak * eff), 2 * k * n / (bw * e.decode_bandwidth))
        out[f"gemm, ≥ {PREFILL_TOKENS} tokens"] = (pred[big], gy[big])
        out[f"gemm, < {PREFILL_TOKENS} tokens"] = (pred[~big], gy[~big])
    px, py = data.prefill
    if len(py):
        s, h, d = px[:, 0], px[:, 1], px[:, 2]
        out["attention prefill"] = (4 * h * d * s * s / 2 / (peak * e.prefill_compute), py)
    dx, dy = data.decode
    if len(dy):
        b, length, h, hkv, d, nb = (dx[:, i] for i in range(6))
        out["attention decode"] = (np.maximum(4 * h * d * b * length / (peak * e.decode_compute),
                                              b * length * 2 * hkv * d * nb / (bw * e.decode_bandwidth)), dy)
    cx, cy = data.copy
    if len(cy):
        out["device copy"] = (2 * cx[:, 0] / (bw * e.decode_bandwidth), cy)
    return {k: v for k, v in out.items() if len(v[1])}


def compare_roofline(root: str | Path, gpu: str, profile: Any = None) -> list[FamilyError]:
    """Per kernel family: the datasheet roofline's error against the measurements, and the
    fitted profile's held-out MAPE beside it (``profile``: a fitted KernelProfile, or None)."""
    from rollart.calibration import kernels as K
    from rollart.calibration.build import PREFILL_TOKENS

    data = load_dir(root)
    peak, bw, _, _ = reference_rates(data, gpu)
    fitted: dict[str, Optional[float]] = {}
    if profile is not None:
        ppeak, pbw = profile.peak_tflops_bf16 * 1e12, profile.hbm_tbps * 1e12
        gx, gy = data.gemm
        g = profile.gemm.params
        pred = lambda x, p: K.gemm_time(x, p, ppeak, pbw)  # noqa: E731
        fitted[f"gemm, ≥ {PREFILL_TOKENS} tokens"] = _mean(_heldout_ape(pred, gx, gy, g, gx[:, 0] >= PREFILL_TOKENS))
        fitted[f"gemm, < {PREFILL_TOKENS} tokens"] = _mean(_heldout_ape(pred, gx, gy, g, gx[:, 0] < PREFILL_TOKENS))
        fitted["attention prefill"] = profile.attn_prefill.mape_heldout
        fitted["attention decode"] = profile.attn_decode.mape_heldout
    rows = []
    for family, (pred, meas) in roofline_predictions(data, peak, bw).items():
        err = (pred - meas) / meas
        rows.append(FamilyError(family, len(meas), round(float(np.mean(np.abs(err))), 4),
                                round(float(np.median(err)), 4), round(float(err.min()), 4),
                                round(float(err.max()), 4), fitted.get(family)))
    return rows


def format_table(rows: Sequence[FamilyError], title: str = "") -> str:
    """A Markdown table of :func:`compare_roofline`'s rows (percentages)."""
    pct = lambda x: "-" if x is None else f"{x * 100:+.1f} %"  # noqa: E731
    ape = lambda x: "-" if x is None else f"{x * 100:.1f} %"  # noqa: E731
    lines = [title, ""] if title else []
    lines += ["| kernel family | rows | roofline MAPE | roofline median error | roofline error range | "
              "fitted profile held-out MAPE |",
              "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.family} | {r.rows} | {ape(r.roofline_mape)} | {pct(r.roofline_median_error)} | "
                     f"{pct(r.roofline_min_error)} … {pct(r.roofline_max_error)} | {ape(r.fitted_mape_heldout)} |")
    lines.append("")
    lines.append("error = (predicted − measured) / measured; roofline = the simulator's datasheet model (a pool's "
                 "`profile: datasheet`; sim.costs.gpu.RooflineEfficiency defaults), kernel time only")
    return "\n".join(lines) + "\n"


def preset_name(device: str) -> str:
    """The GPU preset this device is (``NVIDIA H200`` → ``H200``), else a file-safe form of its
    name; ``cpu-local`` for the CPU."""
    if not _cuda(device):
        return "cpu-local"
    import torch

    return preset_for_name(torch.cuda.get_device_name(device))


def preset_for_name(name: str) -> str:
    """``NVIDIA H200`` → ``H200``, ``NVIDIA H100 80GB HBM3`` → ``H100`` (whole words, so an
    H200 is not an H20); a name no preset matches, made file-safe."""
    import re

    for key in sorted(_presets(), key=len, reverse=True):
        if re.search(rf"\b{re.escape(key)}\b", name, re.IGNORECASE):
            return key
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "gpu"
