"""Readers for the shipped measurements (``calibration/data``), as (X, y-seconds) arrays.

See ``data/PROVENANCE.md`` for where each file comes from and its licence."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data"
INFERSIM = DATA / "infersim"
VIDUR = DATA / "vidur"
VIDUR_MLP = {"h100": VIDUR / "compute" / "h100" / "Llama-2-7b-hf" / "mlp.csv",  # per-layer op times, BF16
             "a100": VIDUR / "compute" / "a100" / "Meta-Llama-3-8B" / "mlp.csv"}
CUSTOM_ALLREDUCE_H100 = DATA / "public" / "custom_allreduce_h100.csv"
QWEN3_SPEED_H20 = DATA / "public" / "qwen3_speed_h20.csv"  # a hold-out check (tests/test_serving.py), not fitted

# DeepGEMM FP8 → BF16: the compute peak halves and every operand byte doubles, so in both the
# compute-bound and the bandwidth-bound regime a BF16 GEMM takes twice the FP8 time. This is an
# assumption; the H800 profile measures how well it holds against H100 BF16 timings.
FP8_TO_BF16 = 2.0


DECODE_COLUMNS = ["dtype", "kv_dtype", "batch_size", "kv_len", "latency_us", "mfu"]


def _rows(path: Path, columns: list[str] | None = None) -> list[dict[str, str]]:
    """CSV rows as dicts; ``columns`` names a file's columns when it ships without a header
    (InferSim's h20 decode 64-2-128.csv does: the data is kept unchanged)."""
    with path.open() as f:
        first = f.readline()
        f.seek(0)
        if columns is not None and not first.startswith(columns[0]):
            return list(csv.DictReader(f, fieldnames=columns))
        return list(csv.DictReader(f))


def rel(path: Path) -> str:
    return str(path.relative_to(DATA))


def infersim_gemm(gpu: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """FP8 GEMM timings converted to BF16 (× FP8_TO_BF16). X = (m, k, n)."""
    path = INFERSIM / "gemm" / gpu / "data.csv"
    rows = _rows(path)
    X = np.array([[float(r["m"]), float(r["k"]), float(r["n"])] for r in rows])
    y = np.array([float(r["latency_us"]) * 1e-6 * FP8_TO_BF16 for r in rows])
    return X, y, [rel(path)]


def vidur_gemm(gpu: str = "h100") -> tuple[np.ndarray, np.ndarray, list[str]]:
    """BF16 per-layer linear ops Vidur timed (median ms; Llama-2-7B on H100, Llama-3-8B on A100),
    split by tensor parallelism: QKV (h → (H_q + 2·H_kv)·d/tp), O (h/tp → h), gate+up (h → 2i/tp),
    down (i/tp → h)."""
    X, y = [], []
    for r in _rows(VIDUR_MLP[gpu]):
        m, tp = float(r["num_tokens"]), float(r["num_tensor_parallel_workers"])
        h, inter = float(r["n_embd"]), float(r["n_expanded_embd"])
        heads, kv = float(r["n_head"]), float(r["n_kv_head"])
        d = h / heads
        shapes = {"attn_pre_proj": (h, (heads + 2 * kv) * d / tp), "attn_post_proj": (h / tp, h),
                  "mlp_up_proj": (h, 2 * inter / tp), "mlp_down_proj": (inter / tp, h)}
        for op, (k, n) in shapes.items():
            X.append([m, k, n])
            y.append(float(r[f"time_stats.{op}.median"]) * 1e-3)
    return np.array(X), np.array(y), [rel(VIDUR_MLP[gpu])]


GROUPED_PHASES = ("decode", "prefill")  # InferSim's masked-layout and contiguous-layout timings


def grouped_rows(expected_m: float, samples: int = 4000) -> tuple[float, float]:
    """(share of groups holding rows, their mean rows) as InferSim's benchmark ran: each group
    gets int(m·U) rows, U uniform in [0.7, 1.3] (``generate_m_grouped_*`` in its
    kernel_benchmark/). At m = 1 half the groups get none, and their weights are not read.
    (The contiguous layout's alignment padding does not show in the timings: the recorded MFU
    counts the unpadded rows, and rows of ~40 tokens per group run at that MFU, not at the
    ≥ 3× the time padding to 128 would take.)"""
    u = 0.7 + 0.6 * (np.arange(samples) + 0.5) / samples
    rows = np.floor(expected_m * u)
    held = rows >= 1
    share = float(held.mean())
    return (share, float(rows[held].mean())) if share else (0.0, 0.0)


def infersim_grouped_gemm(gpu: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """DeepGEMM FP8 grouped GEMMs of MoE layers (masked layout for decode, contiguous for prefill),
    the up (gate+up: k = hidden, n = 2·intermediate) and down (k = intermediate, n = hidden)
    projections of each row. X = (groups holding rows, rows per group, k, n), see
    ``kernels.grouped_gemm_time``."""
    X, y, files = [], [], []
    for phase in GROUPED_PHASES:
        path = INFERSIM / "grouped_gemm" / phase / gpu / "data.csv"
        files.append(rel(path))
        for r in _rows(path):
            groups, h, inter = float(r["num_local_experts"]), float(r["hidden_size"]), float(r["intermediate_size"])
            share, m = grouped_rows(float(r["tokens_per_expert"]))
            if not share:
                continue
            for k, n, col in ((h, 2 * inter, "up_proj_us"), (inter, h, "down_proj_us")):
                X.append([groups * share, m, k, n])
                y.append(float(r[col]) * 1e-6)
    return np.array(X), np.array(y), files


def _geometry(name: str) -> tuple[int, int, int]:
    q, kv, d = (int(x) for x in name.split("-"))
    return q, kv, d


def infersim_prefill_attention(gpu: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """FlashAttention-3 causal prefill. X = (seq_len, q_heads, head_dim)."""
    X, y, files = [], [], []
    for path in sorted((INFERSIM / "mha" / "prefill" / gpu).glob("*.csv")):
        q, _, d = _geometry(path.stem)
        files.append(rel(path))
        for r in _rows(path):
            if r["dtype"] == "bf16":
                X.append([float(r["seq_len"]), q, d])
                y.append(float(r["latency_us"]) * 1e-6)
    return np.array(X), np.array(y), files


def infersim_decode_attention(gpu: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """FlashInfer decode attention with a BF16 KV cache (the simulator's; FP8-KV rows are skipped).
    X = (batch, kv_len, q_heads, kv_heads, head_dim, bytes per KV element)."""
    X, y, files = [], [], []
    for path in sorted((INFERSIM / "mha" / "decode" / gpu).glob("*.csv")):
        q, kv, d = _geometry(path.stem)
        files.append(rel(path))
        for r in _rows(path, DECODE_COLUMNS):
            if r["dtype"] == "bf16" and r["kv_dtype"] == "bf16":
                X.append([float(r["batch_size"]), float(r["kv_len"]), q, kv, d, 2.0])
                y.append(float(r["latency_us"]) * 1e-6)
    return np.array(X), np.array(y), files


def custom_allreduce() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """vLLM's custom (in-engine, NVLink peer-to-peer) all-reduce on H100, tp 2/4/8, as published
    (``public/custom_allreduce_h100.csv``). X = (bytes, 2(n−1)/n), the collective fit's columns."""
    X, y = [], []
    for r in _rows(CUSTOM_ALLREDUCE_H100):
        n = int(r["tp"])
        X.append([float(r["bytes"]), 2 * (n - 1) / n])
        y.append(float(r["latency_us"]) * 1e-6)
    return np.array(X), np.array(y), [rel(CUSTOM_ALLREDUCE_H100)]


def vidur_collective(name: str, intra_node: bool) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """NCCL on an 8×H100 DGX. ``all_reduce`` rows inside one node; ``send_recv`` rows within a
    node (NVLink) or across nodes (one device per node: the inter-node network). X = (bytes, c)."""
    path = VIDUR / "network" / "h100_dgx" / f"{name}.csv"
    X, y = [], []
    for r in _rows(path):
        n, per_node = int(r["num_workers"]), int(r["devices_per_node"])
        if intra_node != (per_node == n):
            continue
        c = 2 * (n - 1) / n if name == "all_reduce" else 1.0
        X.append([float(r["size"]), c])
        y.append(float(r[f"time_stats.{name}.median"]) * 1e-3)
    return np.array(X), np.array(y), [rel(path)]
