"""Kernel-level cost models fitted to measured timings (one layer, seconds).

Each model is a closed form with a few parameters, fitted with ``scipy.optimize.least_squares``
on log-latency (so a 10 µs kernel and a 60 ms kernel weigh alike), and scored by the mean
absolute percentage error (MAPE) on rows held out of the fit.

* GEMM (m tokens × k → n):      t = t0 + max(2·max(m + m_half, M_TILE)·kn / (P·e_max),
                                              (b_a·mk + b_w·kn + b_o·mn) / (BW·e_mem)):
                                for m + m_half ≥ M_TILE the compute term is 2mkn / (P·e(m)) with
                                e(m) = e_max · m / (m + m_half); below, a 64-row tensor-core tile's
                                (see ``M_TILE``); b_a, b_w, b_o bytes per activation, weight and
                                output element (BF16: 2, 2, 2; DeepGEMM FP8: 1, 1, 2, at the FP8 peak
                                P = 2 × BF16)
* grouped GEMM (MoE experts):   the GEMM formula over G experts of m rows each, one launch, every
                                holding expert's k × n weight read (see ``grouped_gemm_time``)
* prefill attention (causal):   t = t0 + 4·H·d·(S²/2) / (P·e(S)),  e(S) = e_max · S / (S + S_half)
* decode attention (B seqs × L): t = t0 + t_seq·B
                                    + max(4·H·d·B·L / (P·e_c), B·L·2·H_kv·d·b_kv / (BW·e_bw)) / occ
                                (many query heads per KV head make it compute-bound on H20);
                                occ = 1 with split-KV, min(1, B·H_kv / n_SM) for a head geometry
                                whose timings show its kernel ran without it (see ``fit_decode_attention``)
* HBM streaming (long reads):    t = t0 + bytes / (BW·e_bw) over the decode-attention rows that read
                                at least ``min_bytes`` and are memory-bound under the decode fit: the
                                asymptotic byte rate of a long transfer (see ``fit_stream``)
* all-reduce / point-to-point:  t = α + c(n)·bytes / β,  c = 2(n−1)/n for a ring all-reduce, 1 for p2p
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

HOLDOUT_SHARE = 0.2
HOLDOUT_SEED = 7
ROBUST_SCALE = 0.1  # soft-L1 scale on log residuals: ~10 % off is where a row starts to count less


@dataclass(frozen=True)
class Fit:
    params: dict[str, float]
    rows: int
    heldout_rows: int
    mape_train: float
    mape_heldout: float


def mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - meas) / meas))


def split(n: int, share: float = HOLDOUT_SHARE, seed: int = HOLDOUT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic train / held-out row indices."""
    rng = np.random.default_rng(seed)
    idx = rng.permutation(n)
    k = max(1, int(round(n * share))) if n >= 5 else 0
    return np.sort(idx[k:]), np.sort(idx[:k])


def fit_model(predict: Callable[[np.ndarray, dict[str, float]], np.ndarray], X: np.ndarray, y: np.ndarray,
              names: Sequence[str], x0: Sequence[float], lower: Sequence[float], upper: Sequence[float],
              more_starts: Sequence[Sequence[float]] = ()) -> Fit:
    """Least squares on log(t) over the training rows; MAPE on both splits.

    ``more_starts``: further starting points; the solution with the lowest robust cost wins (the
    first start on a tie). A model with a ``max(compute, memory)`` has flat directions: where
    every row is on one side, the other side's parameter has a zero gradient, and whether the
    solver leaves it depends on the last bits of the arithmetic (the CPU's SIMD path)."""
    from scipy.optimize import least_squares  # here: the simulator imports this module's formulas, not fits

    train, held = split(len(y))

    def residual(theta: np.ndarray) -> np.ndarray:
        p = dict(zip(names, theta))
        return np.log(predict(X[train], p)) - np.log(y[train])

    # soft_l1 in log space: a few pathological kernel timings (e.g. a decode kernel that ran
    # without split-KV) must not drag the fit of every other row.
    sol = None
    for start in (x0, *more_starts):
        s = least_squares(residual, x0=np.asarray(start, float), bounds=(lower, upper), x_scale="jac",
                          max_nfev=20000, loss="soft_l1", f_scale=ROBUST_SCALE)
        if sol is None or s.cost < sol.cost:
            sol = s
    params = {n: float(v) for n, v in zip(names, sol.x)}
    held_mape = mape(predict(X[held], params), y[held]) if len(held) else float("nan")
    return Fit(params, len(train), len(held), mape(predict(X[train], params), y[train]), held_mape)


# ---------------------------------------------------------------- GEMM


BF16_BYTES = (2.0, 2.0, 2.0)  # bytes per activation, weight, output element
FP8_BYTES = (1.0, 1.0, 2.0)   # DeepGEMM: FP8 activations and weights, BF16 output
# Hopper's tensor cores multiply in warpgroup tiles of 64 rows (PTX ``wgmma.mma_async`` shapes are
# m64nNk16 for BF16, m64nNk32 for FP8): a GEMM of fewer token rows still computes a 64-row tile.
# Where a GPU's ridge (peak FLOP/s ÷ HBM bytes/s) is below the tile's 64 FLOP per BF16 weight byte
# (128 per FP8 byte), that padded compute outlasts the weight read: H20 (148 TFLOP/s, 4.0 TB/s,
# ridge 37) decodes small batches compute-floored; H800/H100/H200 (ridge 295/295/206) never.
M_TILE = 64.0


def gemm_time(X: np.ndarray, p: dict[str, float], peak_flops: float, bw: float,
              nbytes: tuple[float, float, float] = BF16_BYTES) -> np.ndarray:
    """X columns: m, k, n; ``nbytes`` the operands' bytes per element (activation, weight, output)
    and ``peak_flops`` the datasheet peak of that dtype."""
    m, k, n = X[:, 0], X[:, 1], X[:, 2]
    compute = 2 * np.maximum(m + p["m_half"], M_TILE) * k * n / (peak_flops * p["e_max"])
    memory = (nbytes[0] * m * k + nbytes[1] * k * n + nbytes[2] * m * n) / (bw * p["e_mem"])
    return p["t0"] + np.maximum(compute, memory)


def gemm_on_datasheet(params: dict[str, float], peak_ratio: float) -> dict[str, float]:
    """A GEMM fit carried to a GPU whose peak (of the dtype the GEMM computes in) is ``peak_ratio`` times
    that of the GPU it was fitted on: t0, e_max and e_mem as fitted, the knee m_half × min(1, ``peak_ratio``).

    m_half is the fitted knee: what a kernel loses between memory- and compute-bound (few output tiles
    for the SMs, a weight stream the math does not fully hide), 2·m_half·kn / (P·e_max) of time, which
    the fit counts in rows at its own peak. On a GPU that computes slower that loss is kept as the same
    time per weight element (m_half × the peak ratio): carried as rows instead, a fit from a fast GPU
    prices a slow one's small GEMMs as compute it does not do — an H100 fit (knee 185 rows) made a type
    with H20's datasheet decode 2.4-5× slower than H20's own kernels. Checked on the two GPUs measured on
    both sides (calibration/CHANGES.md): H100's BF16 fit on A100's datasheet, 34 % → 15 % off A100's own
    timings below 64 rows; H800's FP8 DeepGEMM fit on H20's, 105 % → 57 %. On a GPU that computes as
    fast (H200: the H800's die) the knee stays as fitted, and on a faster one (no timings above the H100's
    peak to check) it stays in rows: a fixed time there would outlast a faster GPU's whole weight read."""
    return {**params, "m_half": float(f"{params['m_half'] * min(1.0, peak_ratio):.6g}")}


def _fit_gemm_model(predict: Callable[[np.ndarray, dict[str, float]], np.ndarray], X: np.ndarray, y: np.ndarray,
                    e_mem: float | None, x0: Sequence[float]) -> Fit:
    """Fit t0, e_max, m_half and, unless ``e_mem`` is given (the GPU's memory-system rate, pinned),
    e_mem. Pinned, what a kernel loses below that rate at small m must come from its compute side."""
    names, lower, upper = ["t0", "e_max", "m_half", "e_mem"], [0, 0.05, 1, 0.05], [1e-3, 1, 1e5, 1]
    if e_mem is None:
        return fit_model(predict, X, y, names, x0, lower, upper)
    fit = fit_model(lambda x, p: predict(x, {**p, "e_mem": e_mem}), X, y, names[:3], x0[:3], lower[:3], upper[:3])
    fit.params["e_mem"] = e_mem
    return fit


def fit_gemm(X: np.ndarray, y: np.ndarray, peak_flops: float, bw: float,
             nbytes: tuple[float, float, float] = BF16_BYTES, e_mem: float | None = None) -> Fit:
    return _fit_gemm_model(lambda x, p: gemm_time(x, p, peak_flops, bw, nbytes), X, y, e_mem, [5e-6, 0.7, 64, 0.7])


# ---------------------------------------------------------------- grouped GEMM (MoE experts)


def grouped_gemm_time(X: np.ndarray, p: dict[str, float], peak_flops: float, bw: float,
                      nbytes: tuple[float, float, float] = FP8_BYTES) -> np.ndarray:
    """One grouped GEMM over the experts that hold tokens (a MoE layer's up or down projection).

    X columns: groups G holding rows, rows per group m, k, n. Each group multiplies its m rows by
    its own k × n weight; one launch for all of them:

        t = t0 + max(2·G·max(m + m_half, M_TILE)·k·n / (P·e_max), G·(b_a·m·k + b_w·k·n + b_o·m·n) / (BW·e_mem))

    the dense GEMM's formula with the rows of each expert setting the tile efficiency (each
    expert's rows fill their own 64-row tiles) and every holding expert's weights read once."""
    g, m, k, n = (X[:, i] for i in range(4))
    compute = 2 * g * np.maximum(m + p["m_half"], M_TILE) * k * n / (peak_flops * p["e_max"])
    memory = g * (nbytes[0] * m * k + nbytes[1] * k * n + nbytes[2] * m * n) / (bw * p["e_mem"])
    return p["t0"] + np.maximum(compute, memory)


def fit_grouped_gemm(X: np.ndarray, y: np.ndarray, peak_flops: float, bw: float,
                     nbytes: tuple[float, float, float] = FP8_BYTES, e_mem: float | None = None) -> Fit:
    return _fit_gemm_model(lambda x, p: grouped_gemm_time(x, p, peak_flops, bw, nbytes), X, y, e_mem,
                           [5e-6, 0.7, 64, 0.5])


# ---------------------------------------------------------------- attention


def prefill_attention_time(X: np.ndarray, p: dict[str, float], peak_flops: float) -> np.ndarray:
    """X columns: seq_len S, query heads H, head_dim d (one causal sequence)."""
    s, h, d = X[:, 0], X[:, 1], X[:, 2]
    eff = p["e_max"] * s / (s + p["s_half"])
    return p["t0"] + 4 * h * d * (s * s / 2) / (peak_flops * eff)


def fit_prefill_attention(X: np.ndarray, y: np.ndarray, peak_flops: float) -> Fit:
    return fit_model(lambda x, p: prefill_attention_time(x, p, peak_flops), X, y,
                     ["t0", "e_max", "s_half"], [1e-5, 0.9, 500], [0, 0.05, 1], [1e-2, 1, 1e6])


UNSPLIT = "unsplit_"  # params key prefix marking a head geometry, "unsplit_<H>_<H_kv>_<d>": 1


def unsplit_key(h: float, hkv: float, d: float) -> str:
    return f"{UNSPLIT}{int(h)}_{int(hkv)}_{int(d)}"


def decode_attention_time(X: np.ndarray, p: dict[str, float], peak_flops: float, bw: float) -> np.ndarray:
    """X columns: batch B, kv_len L, query heads H, kv heads H_kv, head_dim d, bytes per KV element.

    ``occ`` is the share of the GPU the kernel keeps busy. FlashInfer normally splits each
    sequence's KV into chunks so the grid fills every SM (split-KV), and then occ = 1. Run without
    it, the kernel has one CTA per (sequence, KV head): with fewer than n_SM of them the idle SMs
    leave HBM partly unread, and time stops falling with the batch. InferSim's H20 64-2-128
    timings do this: the same time for B = 1, 16 and 32, twice it at B = 64, as B·H_kv crossing
    H20's 78 SMs predicts."""
    b, length, h, hkv, d, nbytes = (X[:, i] for i in range(6))
    compute = 4 * h * d * b * length / (peak_flops * p["e_c"])
    memory = b * length * 2 * hkv * d * nbytes / (bw * p["e_bw"])
    unsplit = np.zeros(len(b), bool)
    for key in (k for k, v in p.items() if k.startswith(UNSPLIT) and v):
        qh, kvh, hd = (float(x) for x in key[len(UNSPLIT):].split("_"))
        unsplit |= (h == qh) & (hkv == kvh) & (d == hd)
    occ = np.where(unsplit, np.minimum(1.0, b * hkv / p.get("n_sm", 1.0)), 1.0)
    return p["t0"] + p["t_seq"] * b + np.maximum(compute, memory) / occ


def _soft_l1(r: np.ndarray) -> float:
    """The fit's robust loss (``least_squares(loss="soft_l1")``) of log residuals ``r``."""
    return float(np.sum(2 * (np.sqrt(1 + (r / ROBUST_SCALE) ** 2) - 1)))


# Further starts of the decode fit's compute efficiency: from e_c 0.5 alone, every training row can
# sit on the memory side of the max(), and the solver then keeps e_c where it started on one CPU and
# finds the compute-bound rows' 0.33 on another (InferSim H800: soft-L1 cost 186 at 0.5, 126 at 0.334).
E_C_STARTS = (0.2, 0.35, 0.8)


def fit_decode_attention(X: np.ndarray, y: np.ndarray, peak_flops: float, bw: float, n_sm: int) -> Fit:
    """Shared t0, t_seq, e_c, e_bw over every head geometry, plus which geometries ran without
    split-KV. Whether a kernel splits is a launch choice the data does not state, so it is
    inferred: a geometry is marked unsplit when that explains its *training* rows better under
    the shared fit (soft-L1 on log time, the fit's own loss); then the shared parameters are
    refitted, until the marks settle. n_SM is the datasheet's, not fitted."""
    train, _ = split(len(y))
    names, x0 = ["t0", "t_seq", "e_c", "e_bw"], [1e-5, 1e-7, 0.5, 0.7]
    lower, upper = [0, 0, 0.01, 0.05], [1e-3, 1e-4, 1, 1.2]
    geometries = sorted({unsplit_key(*row[2:5]) for row in X[train]})
    marks: dict[str, float] = {}
    for _ in range(4):
        fixed = {"n_sm": float(n_sm), **marks}
        fit = fit_model(lambda x, p: decode_attention_time(x, {**p, **fixed}, peak_flops, bw), X, y,
                        names, x0, lower, upper, more_starts=[[*x0[:2], e_c, x0[3]] for e_c in E_C_STARTS])
        params = {**fit.params, **fixed}
        new: dict[str, float] = {}
        for key in geometries:
            rows = train[[unsplit_key(*X[i, 2:5]) == key for i in train]]
            loss = {flag: _soft_l1(np.log(decode_attention_time(X[rows], {**params, key: flag}, peak_flops, bw))
                                   - np.log(y[rows])) for flag in (0.0, 1.0)}
            if loss[1.0] < loss[0.0]:
                new[key] = 1.0
        if new == marks:
            break
        marks = new
    return Fit(params, fit.rows, fit.heldout_rows, fit.mape_train, fit.mape_heldout)


def stream_rows(X: np.ndarray, p: dict[str, float], peak_flops: float, bw: float,
                min_bytes: float) -> tuple[np.ndarray, np.ndarray]:
    """(row mask, KV bytes read) of the decode-attention rows that measure the memory system's
    streaming rate: at least ``min_bytes`` read, the memory term above the compute term under
    the GPU's own decode fit ``p``, and split-KV (a kernel that leaves SMs idle does not stream at
    the HBM's rate)."""
    b, length, h, hkv, d, nbytes = (X[:, i] for i in range(6))
    kv_bytes = b * length * 2 * hkv * d * nbytes
    compute = 4 * h * d * b * length / (peak_flops * p["e_c"])
    unsplit = np.array([bool(p.get(unsplit_key(*row[2:5]))) for row in X], bool)
    return (kv_bytes >= min_bytes) & (kv_bytes / (bw * p["e_bw"]) > compute) & ~unsplit, kv_bytes


def stream_time(X: np.ndarray, p: dict[str, float], bw: float) -> np.ndarray:
    """X column 0: bytes read."""
    return p["t0"] + X[:, 0] / (bw * p["e_bw"])


def fit_stream(X: np.ndarray, y: np.ndarray, decode: dict[str, float], peak_flops: float, bw: float,
               min_bytes: float) -> Fit:
    """The asymptotic byte rate of long reads on one GPU: ``t = t0 + bytes / (BW·e_bw)`` over the
    decode-attention rows ``stream_rows`` selects. One rule for every GPU, so the ratio of two
    GPUs' e_bw·BW is the ratio of what their memory systems sustain on a long stream (a weight
    read of GBs per decode step), free of the small rows' launch costs and of compute-bound
    head geometries."""
    mask, kv_bytes = stream_rows(X, decode, peak_flops, bw, min_bytes)
    return fit_model(lambda x, p: stream_time(x, p, bw), kv_bytes[mask][:, None], y[mask],
                     ["t0", "e_bw"], [1e-5, 0.8], [0, 0.05], [1e-3, 1.5])


# ---------------------------------------------------------------- collectives


# vLLM's custom all-reduce: the tensor-parallel sizes it runs at (``CustomAllreduce._SUPPORTED_WORLD_SIZES``)
# and the messages it takes, those smaller than its buffer (``max_size=8192 * 1024`` in vLLM 0.8, the
# paper's version; larger ones go to NCCL)
CUSTOM_ALLREDUCE_WORLD_SIZES = (2, 4, 6, 8)
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 2**20


def collective_time(X: np.ndarray, p: dict[str, float]) -> np.ndarray:
    """X columns: bytes, algorithm factor c (2(n−1)/n for all-reduce, 1 for p2p)."""
    return p["alpha_s"] + X[:, 1] * X[:, 0] / (p["beta_gbps"] * 1e9 / 8)


def fit_collective(X: np.ndarray, y: np.ndarray) -> Fit:
    return fit_model(collective_time, X, y, ["alpha_s", "beta_gbps"], [1e-5, 1000], [0, 1], [1e-2, 1e5])
