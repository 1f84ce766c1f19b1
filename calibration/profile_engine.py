"""Whole-model prefill and decode latency of a real inference engine on the local machine.

``rollart calibrate profile`` runs an :class:`EngineProfiler` over a :class:`Grid` and writes
one CSV for both phases (the columns follow InferSim's ``bench_data`` files, with the phase
and the shape of the step added)::

    phase,dtype,kv_dtype,batch_size,kv_len,new_tokens,latency_us,mfu
    prefill,fp32,fp32,4,128,64,2315.113,0.01873
    decode,fp32,fp32,8,512,1,1577.402,0.000912

* ``phase=prefill``: one forward of ``batch_size`` prompts of ``new_tokens`` tokens each, every
  sequence already holding ``kv_len`` cached tokens (``kv_len=0``: a plain prefill).
* ``phase=decode``: one decode step — one new token for each of ``batch_size`` sequences that
  each hold ``kv_len`` cached tokens (``new_tokens`` is always 1).
* ``dtype`` / ``kv_dtype``: short names as InferSim writes them (``bf16``, ``fp16``, ``fp32``).
* ``latency_us``: the median of ``repeats`` timed steps after ``warmup`` untimed ones.
* ``mfu``: achieved FLOP/s over the peak, where the peak is given by the caller or measured
  once with a large matmul on the device in the profiled dtype (so CPU numbers mean
  something), and FLOPs follow the simulator's roofline (``rollart.sim.costs.gpu``)::

      FLOPs = 2·(active_params − embeddings)·tokens + 2·vocab·hidden·batch + 4·layers·heads·head_dim·pairs
      tokens = batch·new_tokens
      pairs  = batch·(new_tokens·kv_len + new_tokens·(new_tokens+1)/2)   (causal attention)

  The input embedding is a lookup (no FLOPs) and the LM head runs for the last position of each
  sequence only, as an engine computes it.

Two engines: :class:`TorchProfiler` (a random-init Qwen3 of :mod:`rollart.runtime.qwen3`, eager,
runs on CPU) and :class:`VllmProfiler` (vLLM's offline ``LLM`` API with dummy weights, CUDA only).
torch and vLLM are imported lazily: the grid, the rows and the CSV helpers work
without them (the fitting code reads profiles in a simulator-only install).
"""

from __future__ import annotations

import csv
import gc
import json
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Optional, Protocol, runtime_checkable

from rollart.plan.schema import ModelSpec

if TYPE_CHECKING:  # pragma: no cover
    import torch

Phase = Literal["prefill", "decode"]
Progress = Callable[[int, int], None]

COLUMNS = ("phase", "dtype", "kv_dtype", "batch_size", "kv_len", "new_tokens", "latency_us", "mfu")

_SHORT_DTYPES = {
    "float32": "fp32", "fp32": "fp32", "float": "fp32",
    "bfloat16": "bf16", "bf16": "bf16",
    "float16": "fp16", "fp16": "fp16", "half": "fp16",
}
_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def short_dtype(dtype: Any) -> str:
    """``torch.bfloat16`` / ``"bfloat16"`` / ``"bf16"`` → ``"bf16"`` (InferSim's spelling)."""
    name = str(dtype).removeprefix("torch.").lower()
    if name not in _SHORT_DTYPES:
        raise ValueError(f"unsupported dtype '{dtype}'; use one of fp32, bf16, fp16")
    return _SHORT_DTYPES[name]


def dtype_bytes(dtype: Any) -> int:
    return _DTYPE_BYTES[short_dtype(dtype)]


def torch_dtype(dtype: Any) -> "torch.dtype":
    import torch

    return getattr(torch, _TORCH_DTYPES[short_dtype(dtype)])


# ---------------------------------------------------------------- rows and the CSV


@dataclass(frozen=True)
class Row:
    """One measured grid point (see the module docstring for the meaning of each column)."""

    phase: Phase
    dtype: str
    kv_dtype: str
    batch_size: int
    kv_len: int
    new_tokens: int
    latency_us: float
    mfu: float

    @property
    def tokens(self) -> int:
        return self.batch_size * self.new_tokens


def attention_pairs(batch: int, kv_len: int, new_tokens: int) -> float:
    """(query, key) pairs of one causal step: each new token sees the cache and the new tokens
    up to itself."""
    return batch * (new_tokens * kv_len + new_tokens * (new_tokens + 1) / 2)


def step_flops(spec: ModelSpec, batch: int, kv_len: int, new_tokens: int) -> float:
    """Model FLOPs of one step, the simulator's convention: 2·(P_active − embeddings) per token,
    the LM head (2·V·h) once per sequence, 4·L·H·d per attention pair."""
    from rollart.sim.costs.moe import embedding_params

    return (2.0 * (spec.active_params - embedding_params(spec)) * batch * new_tokens
            + 2.0 * spec.vocab * spec.hidden * batch
            + 4.0 * spec.layers * spec.heads * spec.head_dim * attention_pairs(batch, kv_len, new_tokens))


def make_row(spec: ModelSpec, phase: Phase, dtype: str, kv_dtype: str, batch: int, kv_len: int,
             new_tokens: int, latency_s: float, peak_flops: float) -> Row:
    """A row with values rounded as they are written, so write → read round-trips exactly."""
    mfu = step_flops(spec, batch, kv_len, new_tokens) / (latency_s * peak_flops) if latency_s > 0 else 0.0
    return Row(phase, dtype, kv_dtype, batch, kv_len, new_tokens,
               round(latency_s * 1e6, 3), float(f"{mfu:.4g}"))


def write_rows(rows: list[Row], path: str | Path) -> None:
    """Write rows (prefill first, then decode, each by batch, kv_len, new_tokens)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.phase, r.dtype, r.kv_dtype, r.batch_size, r.kv_len, r.new_tokens,
                        repr(float(r.latency_us)), repr(float(r.mfu))])


def read_rows(path: str | Path) -> list[Row]:
    """Read a profile written by :func:`write_rows`; a wrong header or phase raises ValueError."""
    with Path(path).open(newline="") as fh:
        reader = csv.DictReader(fh)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: expected columns {','.join(COLUMNS)}, got {','.join(reader.fieldnames or ())}")
        out = []
        for i, rec in enumerate(reader, start=2):
            if rec["phase"] not in ("prefill", "decode"):
                raise ValueError(f"{path}:{i}: phase must be prefill or decode, got '{rec['phase']}'")
            out.append(Row(rec["phase"], rec["dtype"], rec["kv_dtype"], int(rec["batch_size"]),  # type: ignore[arg-type]
                           int(rec["kv_len"]), int(rec["new_tokens"]), float(rec["latency_us"]), float(rec["mfu"])))
        return out


def sort_rows(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r.phase != "prefill", r.batch_size, r.kv_len, r.new_tokens))


# ---------------------------------------------------------------- the grid


@dataclass(frozen=True)
class Grid:
    """The shapes to measure.

    Prefill points: every ``batch_sizes × kv_lens × prefill_lens``; decode points: every
    ``batch_sizes × kv_lens``. Points whose batch holds more than ``max_batch_tokens`` new
    tokens (prefill) or more than ``max_kv_tokens`` tokens of KV after the step are skipped."""

    batch_sizes: tuple[int, ...]
    kv_lens: tuple[int, ...]
    prefill_lens: tuple[int, ...]
    max_batch_tokens: Optional[int] = None
    max_kv_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "kv_lens", "prefill_lens"):
            values = tuple(sorted(set(int(v) for v in getattr(self, name))))
            low = 0 if name == "kv_lens" else 1
            if not values or values[0] < low:
                raise ValueError(f"Grid.{name}: needs at least one value, all ≥ {low}; got {getattr(self, name)}")
            object.__setattr__(self, name, values)

    def _fits(self, batch: int, kv_len: int, new_tokens: int, phase: Phase) -> bool:
        if phase == "prefill" and self.max_batch_tokens is not None and batch * new_tokens > self.max_batch_tokens:
            return False
        return self.max_kv_tokens is None or batch * (kv_len + new_tokens) <= self.max_kv_tokens

    def points(self) -> Iterator[tuple[Phase, int, int, int]]:
        """``(phase, batch, kv_len, new_tokens)`` in measuring order: for each (batch, kv_len)
        the prefills, then the decode step (they share one prefix cache)."""
        for b in self.batch_sizes:
            for kv in self.kv_lens:
                for n in self.prefill_lens:
                    if self._fits(b, kv, n, "prefill"):
                        yield "prefill", b, kv, n
                if self._fits(b, kv, 1, "decode"):
                    yield "decode", b, kv, 1

    def __len__(self) -> int:
        return sum(1 for _ in self.points())

    @property
    def max_context(self) -> int:
        """Longest sequence any point builds (positions the model must support)."""
        return max(kv + n for _, _, kv, n in self.points()) if len(self) else 0

    @property
    def peak_kv_tokens(self) -> int:
        return max((b * (kv + n) for _, b, kv, n in self.points()), default=0)


def device_memory_bytes(device: str) -> int:
    """Memory the profile can use: free memory of a CUDA device, physical memory on CPU."""
    if str(device).startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    import os

    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def default_grid(spec: ModelSpec, device: str = "cpu", memory_bytes: Optional[int] = None) -> Grid:
    """A grid sized for the device: small on CPU (a whole Qwen3-tiny profile takes seconds),
    engine-like on a GPU with prefill capped at 16 k tokens a step and KV capped by memory."""
    if not str(device).startswith("cuda"):
        return Grid(batch_sizes=(1, 2, 4, 8), kv_lens=(0, 64, 128, 256, 512), prefill_lens=(16, 64, 128, 256))
    if memory_bytes is None:
        memory_bytes = device_memory_bytes(device)
    # A third of what is left after the weights: the KV cache grows by concatenation (two copies
    # live for a moment) and activations need room too.
    kv_room = max(0, int(memory_bytes * 0.9) - spec.weight_bytes) // 3
    max_kv = max(1, kv_room // spec.kv_bytes_per_token)
    return Grid(batch_sizes=(1, 4, 16, 64, 256), kv_lens=(0, 1024, 4096, 16384),
                prefill_lens=(128, 512, 2048, 8192), max_batch_tokens=16384, max_kv_tokens=max_kv)


# ---------------------------------------------------------------- the model


def model_config(spec: ModelSpec, max_positions: int = 32768) -> Any:
    """The :class:`rollart.runtime.qwen3.Qwen3Config` of ``spec`` (dense models only)."""
    from rollart.runtime.qwen3 import Qwen3Config

    return Qwen3Config.from_spec(spec, max_positions)


def build_model(spec: ModelSpec, dtype: Any = "fp32", device: str = "cpu", seed: int = 0,
                max_positions: int = 32768) -> Any:
    """A random-init Qwen3 (:mod:`rollart.runtime.qwen3`) in eval mode (nothing is downloaded)."""
    from rollart.runtime.qwen3 import build

    return build(spec, max_positions, seed).to(device=device, dtype=torch_dtype(dtype)).eval()


def matmul_params(model: Any) -> int:
    """Parameters of the matrices (norm scales excluded; a tied table counted once)."""
    return sum(p.numel() for p in model.parameters() if p.dim() >= 2)


_PEAK_CACHE: dict[tuple[str, str], float] = {}


def measure_peak_tflops(device: str = "cpu", dtype: Any = "fp32", min_s: float = 1.0, max_s: float = 3.0) -> float:
    """Best TFLOP/s of a large square matmul on ``device`` in ``dtype`` (cached per both)."""
    import torch

    key = (str(device), short_dtype(dtype))
    if key in _PEAK_CACHE:
        return _PEAK_CACHE[key]
    cuda = str(device).startswith("cuda")
    n = 8192 if cuda else 1024
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=torch_dtype(dtype))
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=torch_dtype(dtype))
    # The best of many runs over at least min_s (at most max_s): on a shared machine a burst of
    # contention can last longer than a handful of matmuls.
    best, reps, start = math.inf, 0, time.perf_counter()
    with torch.inference_mode():
        for _ in range(2):
            torch.mm(a, b)
        while reps < 10 or (time.perf_counter() - start < min_s and reps < 10_000):
            _sync(device)
            t0 = time.perf_counter()
            torch.mm(a, b)
            _sync(device)
            best = min(best, time.perf_counter() - t0)
            reps += 1
            if time.perf_counter() - start > max_s:
                break
    _PEAK_CACHE[key] = 2.0 * n ** 3 / best / 1e12
    return _PEAK_CACHE[key]


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- engines


@runtime_checkable
class EngineProfiler(Protocol):
    """Measures a model's prefill and decode step latencies on one engine."""

    name: str

    def available(self) -> tuple[bool, str]:
        """``(True, "")`` when the engine can run here, else ``(False, reason)``."""
        ...

    def profile(self, grid: Grid, progress: Optional[Progress] = None) -> list[Row]:
        """Measure every grid point; ``progress(done, total)`` after each one."""
        ...


def _median_timed(run: Callable[[], None], reset: Callable[[], None], device: str,
                  warmup: int, repeats: int) -> float:
    """Median seconds of ``run`` over ``repeats`` after ``warmup``; ``reset`` (untimed) after each."""
    times = []
    for i in range(warmup + repeats):
        _sync(device)
        t0 = time.perf_counter()
        run()
        _sync(device)
        dt = time.perf_counter() - t0
        reset()
        if i >= warmup:
            times.append(dt)
    return statistics.median(times)


class TorchProfiler:
    """Eager forward passes of the torch Qwen3 (:mod:`rollart.runtime.qwen3`) with its ``KVCache``.

    For each (batch, kv_len) a prefix cache of ``kv_len`` random tokens is built once, outside
    the timed region (in chunks of at most ``prefix_chunk_tokens`` tokens a forward); each
    timed prefill or decode forward appends to it and is cropped back after timing (cropping
    slices, it does not copy). Logits are computed for the last position only, as an engine
    does. ``torch.set_num_threads`` is left as it is."""

    name = "torch"

    def __init__(self, spec: ModelSpec, device: str = "cpu", dtype: Any = None, warmup: int = 2,
                 repeats: int = 5, seed: int = 0, peak_tflops: Optional[float] = None,
                 prefix_chunk_tokens: int = 16384):
        if repeats < 1 or warmup < 0:
            raise ValueError("repeats must be ≥ 1 and warmup ≥ 0")
        self.spec, self.device = spec, str(device)
        self.dtype = short_dtype(dtype) if dtype is not None else ("bf16" if self.device.startswith("cuda") else "fp32")
        self.warmup, self.repeats, self.seed = warmup, repeats, seed
        self.peak_tflops = peak_tflops
        self.prefix_chunk_tokens = prefix_chunk_tokens
        self._model: Any = None

    def available(self) -> tuple[bool, str]:
        try:
            import torch
        except ImportError as exc:
            return False, f"the torch engine needs torch ({exc.name} is not installed: pip install 'rollart[runtime]')"
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            return False, f"no CUDA device (torch {torch.__version__} sees none)"
        if self.spec.moe_experts:
            return False, "the torch engine builds dense Qwen3 models only; this model is a mixture of experts"
        return True, ""

    def peak(self) -> float:
        """Peak FLOP/s used for MFU: the caller's, else a measured matmul."""
        if self.peak_tflops is None:
            self.peak_tflops = measure_peak_tflops(self.device, self.dtype)
        return self.peak_tflops * 1e12

    def _forward(self, ids: Any, cache: Any) -> Any:
        return self._model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)

    def _prefix_cache(self, batch: int, kv_len: int, gen: Any) -> Any:
        import torch

        from rollart.runtime.qwen3 import KVCache

        cache = KVCache()
        chunk = max(1, self.prefix_chunk_tokens // batch)
        for start in range(0, kv_len, chunk):
            n = min(chunk, kv_len - start)
            ids = torch.randint(0, self.spec.vocab, (batch, n), generator=gen).to(self.device)
            self._forward(ids, cache)
        return cache

    def profile(self, grid: Grid, progress: Optional[Progress] = None) -> list[Row]:
        import torch

        ok, why = self.available()
        if not ok:
            raise RuntimeError(why)
        peak = self.peak()
        if self._model is None:
            self._model = build_model(self.spec, self.dtype, self.device, self.seed,
                                      max_positions=max(32768, grid.max_context + 1))
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        total, done, rows = len(grid), 0, []
        if progress:
            progress(0, total)
        by_prefix: dict[tuple[int, int], list[tuple[Phase, int]]] = {}
        for phase, b, kv, n in grid.points():
            by_prefix.setdefault((b, kv), []).append((phase, n))
        with torch.inference_mode():
            for (b, kv), todo in by_prefix.items():
                cache = self._prefix_cache(b, kv, gen)
                for phase, n in todo:
                    ids = torch.randint(0, self.spec.vocab, (b, n), generator=gen).to(self.device)
                    seconds = _median_timed(lambda: self._forward(ids, cache), lambda: cache.crop(-n),
                                            self.device, self.warmup, self.repeats)
                    if cache.get_seq_length() != kv:  # pragma: no cover - a cropping bug
                        raise RuntimeError(f"cache holds {cache.get_seq_length()} tokens after crop, expected {kv}")
                    rows.append(make_row(self.spec, phase, self.dtype, self.dtype, b, kv, n, seconds, peak))
                    done += 1
                    if progress:
                        progress(done, total)
                del cache
        return sort_rows(rows)

    def close(self) -> None:
        self._model = None
        gc.collect()


def hf_config_dict(spec: ModelSpec, max_positions: int) -> dict[str, Any]:
    """A Qwen3 ``config.json`` for ``spec`` (what vLLM loads with ``load_format="dummy"``)."""
    from rollart.runtime.qwen3 import RMS_NORM_EPS, ROPE_THETA  # the CPU model's values: one model

    if spec.moe_experts:
        return {
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "vocab_size": spec.vocab, "hidden_size": spec.hidden, "num_hidden_layers": spec.layers,
            "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim,
            "intermediate_size": spec.intermediate, "moe_intermediate_size": spec.intermediate,
            "num_experts": spec.moe_experts, "num_experts_per_tok": spec.moe_active_experts,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
            "tie_word_embeddings": bool(spec.tied_embeddings), "max_position_embeddings": max_positions,
            "rms_norm_eps": RMS_NORM_EPS, "rope_theta": ROPE_THETA, "hidden_act": "silu", "torch_dtype": "bfloat16",
            "attention_bias": False, "use_sliding_window": False,
        }
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": spec.vocab, "hidden_size": spec.hidden, "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate, "tie_word_embeddings": bool(spec.tied_embeddings),
        "max_position_embeddings": max_positions, "max_window_layers": spec.layers, "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA, "hidden_act": "silu", "torch_dtype": "bfloat16", "attention_bias": False,
        "use_sliding_window": False, "sliding_window": None,
    }


class VllmProfiler:
    """vLLM's offline ``LLM`` engine with random (``load_format="dummy"``) weights.

    * ``model``: a preset name, a :class:`ModelSpec` (a ``config.json`` is written to a
      temporary folder), or a folder / ``config.json`` path of a Hugging Face model (only the
      config is read).
    * prefill (batch, kv_len, n): ``batch`` distinct random prefixes of ``kv_len`` tokens are
      generated once untimed (``max_tokens=1``) so the prefix cache holds them, then the timed
      call generates one token for prompts prefix + ``n`` fresh tokens: only the new tokens are
      computed (prefix caching works on whole blocks: a ``kv_len`` that is not a multiple of
      the block size, 16, recomputes the tail). Includes sampling one token and the call's
      host overhead, as a real engine step does.
    * decode (batch, kv_len): ``(T(1 + N) − T(1)) / N`` with fresh prompts of
      ``max(1, kv_len − N/2)`` tokens, ``ignore_eos=True``, so the mean cached context over
      the N steps is ``kv_len``.
    """

    name = "vllm"

    def __init__(self, model: str | Path | ModelSpec, tp: int = 1, warmup: int = 1, repeats: int = 3,
                 decode_steps: int = 32, seed: int = 0, peak_tflops: Optional[float] = None,
                 gpu_memory_utilization: float = 0.85, dtype: str = "bf16"):
        self.model, self.tp = model, int(tp)
        self.warmup, self.repeats, self.decode_steps, self.seed = warmup, repeats, decode_steps, seed
        self.peak_tflops, self.gpu_memory_utilization = peak_tflops, gpu_memory_utilization
        self.dtype = short_dtype(dtype)
        self._tmp: Optional[tempfile.TemporaryDirectory] = None

    def available(self) -> tuple[bool, str]:
        from rollart.runtime.engines.vllm_engine import available as vllm_available

        ok, why = vllm_available()  # vLLM installed and a CUDA device visible
        if not ok:
            return ok, why
        import torch

        if torch.cuda.device_count() < self.tp:
            return False, f"tensor parallel size {self.tp} needs {self.tp} CUDA devices; {torch.cuda.device_count()} visible"
        return True, ""

    def spec(self) -> ModelSpec:
        """The geometry used for FLOPs."""
        if isinstance(self.model, ModelSpec):
            return self.model
        path = Path(self.model)
        if path.exists():
            cfg = path / "config.json" if path.is_dir() else path
            return spec_from_hf_config(json.loads(cfg.read_text()), name=cfg.parent.name or "custom")
        return ModelSpec.model_validate(str(self.model))

    def _model_dir(self, spec: ModelSpec, max_positions: int) -> str:
        if not isinstance(self.model, ModelSpec):
            path = Path(self.model)
            if path.exists():
                return str(path if path.is_dir() else path.parent)
        self._tmp = tempfile.TemporaryDirectory(prefix="rollart-vllm-")
        (Path(self._tmp.name) / "config.json").write_text(json.dumps(hf_config_dict(spec, max_positions), indent=2))
        return self._tmp.name

    def profile(self, grid: Grid, progress: Optional[Progress] = None) -> list[Row]:
        import random

        ok, why = self.available()
        if not ok:
            raise RuntimeError(why)
        from vllm import LLM, SamplingParams

        spec = self.spec()
        if self.peak_tflops is None:
            self.peak_tflops = measure_peak_tflops("cuda", self.dtype)
        peak = self.peak_tflops * 1e12
        max_len = grid.max_context + self.decode_steps + 16
        max_batch = max(grid.batch_sizes)
        step_tokens = max([b * n for ph, b, _, n in grid.points() if ph == "prefill"] + [max_batch, 8192])
        llm = LLM(model=self._model_dir(spec, max(max_len, 32768)), tensor_parallel_size=self.tp,
                  load_format="dummy", dtype=_TORCH_DTYPES[self.dtype], skip_tokenizer_init=True,
                  enable_prefix_caching=True, max_model_len=max_len, max_num_seqs=max(max_batch, 1),
                  max_num_batched_tokens=step_tokens, gpu_memory_utilization=self.gpu_memory_utilization,
                  seed=self.seed)
        rng = random.Random(self.seed)

        def fresh(batch: int, length: int) -> list[list[int]]:
            return [[rng.randrange(spec.vocab) for _ in range(length)] for _ in range(batch)]

        def gen(prompts: list[list[int]], max_tokens: int) -> float:
            params = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, temperature=0.0,
                                    ignore_eos=True, detokenize=False)
            t0 = time.perf_counter()
            llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            return time.perf_counter() - t0

        def reset_prefix_cache() -> None:
            if hasattr(llm, "reset_prefix_cache"):
                llm.reset_prefix_cache()

        total, done, rows = len(grid), 0, []
        if progress:
            progress(0, total)
        try:
            gen(fresh(1, 16), 2)  # engine warm-up (first-call compilation, CUDA graphs)
            for phase, b, kv, n in grid.points():
                times = []
                if phase == "prefill":
                    reset_prefix_cache()
                    prefixes = fresh(b, kv)
                    if kv:
                        gen(prefixes, 1)  # fill the prefix cache, untimed
                    for i in range(self.warmup + self.repeats):
                        dt = gen([p + s for p, s in zip(prefixes, fresh(b, n))], 1)
                        if i >= self.warmup:
                            times.append(dt)
                    seconds = statistics.median(times)
                else:
                    steps = self.decode_steps
                    length = max(1, kv - steps // 2)
                    for i in range(self.warmup + self.repeats):
                        reset_prefix_cache()
                        t1 = gen(fresh(b, length), 1)
                        reset_prefix_cache()
                        tn = gen(fresh(b, length), 1 + steps)
                        if i >= self.warmup:
                            times.append(max(tn - t1, 0.0) / steps)
                    seconds = statistics.median(times)
                rows.append(make_row(spec, phase, self.dtype, self.dtype, b, kv, n, seconds, peak))
                done += 1
                if progress:
                    progress(done, total)
        finally:
            del llm
            gc.collect()
            try:
                import torch

                torch.cuda.empty_cache()
            except Exception:  # pragma: no cover
                pass
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None
        return sort_rows(rows)


# ---------------------------------------------------------------- model resolution


def spec_from_hf_config(cfg: dict[str, Any], name: str = "custom") -> ModelSpec:
    """A Hugging Face ``config.json`` (dense or Qwen-style MoE) as a :class:`ModelSpec`."""
    cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in need if k not in cfg]
    if missing:
        raise ValueError(f"not a decoder config.json: missing {', '.join(missing)}")
    heads = int(cfg["num_attention_heads"])
    experts = int(cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0)
    expert_width = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    extra: dict[str, Any] = {}
    if experts:
        # DeepSeek-V2/V3 style: dense first layers (intermediate_size), shared experts beside the routed ones
        if int(cfg.get("first_k_dense_replace") or 0):
            extra.update(dense_layers=int(cfg["first_k_dense_replace"]), dense_intermediate=int(cfg["intermediate_size"]))
        shared = int(cfg.get("n_shared_experts") or 0) * expert_width or int(cfg.get("shared_expert_intermediate_size") or 0)
        if shared:
            extra["shared_expert_intermediate"] = shared
    mla = int(cfg.get("kv_lora_rank") or 0)
    if mla:  # multi-head latent attention: head_dim is the q/k "nope" part
        extra.update(kv_lora_rank=mla, q_lora_rank=int(cfg.get("q_lora_rank") or 0),
                     qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
                     v_head_dim=int(cfg.get("v_head_dim") or cfg.get("qk_nope_head_dim") or 0) or None)
    return ModelSpec(
        name=str(name), layers=int(cfg["num_hidden_layers"]), hidden=int(cfg["hidden_size"]), heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int((cfg.get("qk_nope_head_dim") if mla else None) or cfg.get("head_dim")
                     or cfg["hidden_size"] // heads),
        intermediate=expert_width if experts else int(cfg["intermediate_size"]),
        vocab=int(cfg["vocab_size"]), tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        moe_experts=experts,
        moe_active_experts=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
        **extra,
    )


__all__ = [
    "COLUMNS", "EngineProfiler", "Grid", "Row", "TorchProfiler", "VllmProfiler", "attention_pairs",
    "build_model", "default_grid", "device_memory_bytes", "dtype_bytes", "hf_config_dict", "make_row",
    "matmul_params", "measure_peak_tflops", "model_config", "read_rows", "short_dtype", "sort_rows",
    "spec_from_hf_config", "step_flops", "write_rows",
]
