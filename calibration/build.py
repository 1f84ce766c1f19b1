"""Fit the shipped kernel profiles from ``calibration/data`` and write ``calibration/profiles``.

    python -m rollart.calibration.build          # rewrites h800.yaml, h20.yaml, h100.yaml, h200.yaml, a100.yaml, links.yaml
    python -m rollart.calibration.build --check  # rebuilds and compares with the shipped profiles, writes nothing

Deterministic up to the fits' last digits: the same data gives the same parameters within 1e-4
(the YAML keeps six digits; the last ones of a least-squares fit depend on the CPU's arithmetic),
so a rebuild on another machine may rewrite a few last digits that change no predicted time."""

from __future__ import annotations

import functools

import numpy as np

from rollart.calibration import datasets as D
from rollart.calibration import kernels as K
from rollart.calibration.profiles import (GROUPED_PARAMS, PROFILE_DIR, ComponentFit, KernelProfile, PhaseError,
                                         load_profile, profile_differences, save_profile, shipped_profile_path)
from rollart.calibration.sustained import compute_share
from rollart.plan.presets import GPU_PRESETS, with_article

# Per engine step, outside the kernels (scheduling, input preparation, sampling, output processing,
# launch): ASSUMED, no timing of the paper's vLLM 0.8.4 (V1, no multi-step) is public here. What is
# public brackets it: vLLM's multi-step RFC (vllm-project/vllm#6854, V0) saw ~4 ms of GPU bubble per
# decode step; Vidur's cpu_overheads profile (A100, Llama-2-7B, V0) sums to ~2 ms at batch 8 and
# ~4.6 ms at batch 32 (medians); Lambda's vLLM 0.6 run with multi-step scheduling (H100, Llama-3-8B,
# 10 users) leaves ~1 ms after the kernels, amortised over the steps of a chunk.
ITERATION_OVERHEAD_S = 0.003
# FlashAttention-3 reports up to ~75 % of H100's BF16 peak (740 TFLOP/s) in the forward pass;
# H20 reaches more of its (much lower) peak, so H800 cannot reuse H20's efficiency as is.
FA3_H100_BF16_UTILISATION = 0.75
# A100 runs FlashAttention-2 (FA3 is Hopper-only): its paper reports 50-73 % of A100's peak in the
# forward pass (Dao 2023, arXiv 2307.08691)
FA2_A100_BF16_UTILISATION = 0.73
# Streaming multiprocessors (NVIDIA datasheets): how many CTAs a decode kernel without split-KV
# needs to keep the GPU busy (kernels.decode_attention_time)
SMS = {"H800": 132, "H20": 78, "H100": 132, "H200": 132, "A100": 108, "B200": 148, "GB200": 148}
KEYS = {"h800": "H800", "h20": "H20", "h100": "H100", "h200": "H200", "a100": "A100", "b200": "B200", "gb200": "GB200"}
# GPUs without public kernel timings of their own are fitted on a sibling's rows, in the sibling's
# datasheet units, so what carries over is each kernel's *efficiency* (fraction of peak FLOP/s or of
# HBM bandwidth), applied to this GPU's datasheet: H100 and H200 are the H800's GH100 die (989 TFLOP/s
# dense BF16); H200 differs by its 4.8 TB/s HBM3e (and 141 GB), so its memory-bound kernels scale.
# A100 has its own BF16 GEMM timings (Vidur); its attention, streaming and collectives take the H800's
# efficiencies on its datasheet, across an architecture (Ampere), so those terms are estimates.
# B200 and GB200 (Blackwell) have no public kernel timings here either: Hopper's fitted efficiencies on
# their datasheets, the compute side scaled by what Blackwell is measured to sustain of its peak against
# an H100 in the same benchmarks (rollart.calibration.sustained).
TIMINGS_OF = {"h100": "h800", "h200": "h800", "a100": "h800", "b200": "h800", "gb200": "h800"}
SIBLING = {"h100": "the same GH100 die", "h200": "the same GH100 die",
           "a100": "Hopper's efficiencies on an Ampere GA100, an estimate",
           "b200": "Hopper's efficiencies on Blackwell", "gb200": "Hopper's efficiencies on Blackwell"}
PREFILL_TOKENS = 512  # GEMM rows with at least this many tokens count as prefill-like, the rest decode-like

GEMM_FORMULA = "t0 + max(2·max(m+m_half, 64)·kn / (P·e_max), 2(mk+kn+mn) / (BW·e_mem))"
GEMM_FP8_FORMULA = "t0 + max(2·max(m+m_half, 64)·kn / (2P·e_max), (mk+kn+2mn) / (BW·e_mem))"
GEMM_GROUPED_FORMULA = ("t0 + max(2·G·max(m+m_half, 64)·kn / (2P·e_max), G·(mk+kn+2mn) / (BW·e_mem)) over G experts "
                        "of m rows each, one launch")
FP8_PEAK_RATIO = 2.0  # Hopper dense FP8 tensor-core peak = 2 × BF16 (H800 1979, H20 296 TFLOP/s)
PREFILL_FORMULA = "t0 + 4·H·d·(S²/2) / (P·e_max·S/(S+s_half))"
DECODE_FORMULA = ("t0 + t_seq·B + max(4·H·d·B·L / (P·e_c), 2·B·L·H_kv·d·2 / (BW·e_bw)) / occ; occ = 1 with "
                  "split-KV, min(1, B·H_kv / n_sm) for the geometries marked unsplit_<H>_<H_kv>_<d>")
DECODE_FP8_KV_FORMULA = ("the decode-attention formula with these t0 and e_bw, 1 byte per KV element "
                         "(other parameters: attn_decode's)")
COLLECTIVE_FORMULA = "alpha_s + 2(n−1)/n · bytes / (beta_gbps·1e9/8)"
CUSTOM_ALLREDUCE_FORMULA = (COLLECTIVE_FORMULA + " for bytes < max_bytes (vLLM's custom all-reduce; priced at "
                            "most the NCCL term)")
STREAM_FORMULA = ("t0 + bytes / (BW·e_bw) over the decode-attention rows reading ≥ 1 GB that the decode fit "
                  "puts on the memory side (split-KV geometries)")
# A long read: at ≥ 1 GB a transfer takes ≥ ~300 µs, so the ~20 µs launch cost is ≤ 7 % of it and
# the fit's t0 absorbs the rest; a decode step's weight read is 16–64 GB (8B–32B BF16).
STREAM_MIN_BYTES = 1e9


def _component(fit: K.Fit, formula: str, files: list[str], derived: str | None = None,
               dtype: str | None = None) -> ComponentFit:
    return ComponentFit(formula=formula, params={k: float(f"{v:.6g}") for k, v in fit.params.items()},
                        data=files, rows=fit.rows, heldout_rows=fit.heldout_rows,
                        mape_train=round(fit.mape_train, 4),
                        mape_heldout=None if np.isnan(fit.mape_heldout) else round(fit.mape_heldout, 4),
                        derived=derived, dtype=dtype)


def custom_allreduce_component(scale: float = 1.0, derived: str | None = None) -> ComponentFit:
    """vLLM's custom all-reduce, fitted to its published H100 timings (``D.custom_allreduce``), with the
    message limit it takes (``max_bytes``) and its bandwidth × ``scale`` (a GPU's NVLink ÷ H100's)."""
    X, y, files = D.custom_allreduce()
    fit = K.fit_collective(X, y)
    c = _component(fit, CUSTOM_ALLREDUCE_FORMULA, files, derived=derived, dtype="bf16 activations")
    c.params["beta_gbps"] = float(f"{fit.params['beta_gbps'] * scale:.6g}")
    c.params["max_bytes"] = float(K.CUSTOM_ALLREDUCE_MAX_BYTES)
    return c


def _fp8_rows(gpu: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """DeepGEMM FP8 timings as measured (the reader returns them × FP8_TO_BF16, its BF16 estimate)."""
    X, y, files = D.infersim_gemm(gpu)
    return X, y / D.FP8_TO_BF16, files


def _heldout_ape(predict, X: np.ndarray, y: np.ndarray, params: dict[str, float],
                 mask: np.ndarray | None = None) -> np.ndarray:
    _, held = K.split(len(y))
    if mask is not None:
        held = held[mask[held]]
    return np.abs(predict(X[held], params) - y[held]) / y[held]


def _fp8_kv_rows(gpu: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """FlashInfer decode attention with an FP8 KV cache (BF16 queries): X as the BF16 reader's,
    1 byte per KV element. Only InferSim's H20 32-8-128 file has such rows."""
    X, y, files = [], [], []
    for path in sorted((D.INFERSIM / "mha" / "decode" / gpu).glob("*.csv")):
        q, kv, d = (int(x) for x in path.stem.split("-"))
        rows = [r for r in D._rows(path, D.DECODE_COLUMNS) if r["dtype"] == "bf16" and r["kv_dtype"] == "fp8"]
        if rows:
            files.append(D.rel(path))
        for r in rows:
            X.append([float(r["batch_size"]), float(r["kv_len"]), q, kv, d, 1.0])
            y.append(float(r["latency_us"]) * 1e-6)
    return np.array(X), np.array(y), files


def _both_ways() -> tuple[float, float, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray],
                         tuple[np.ndarray, np.ndarray], list[str]]:
    """H20's BF16 peak and HBM rate, its BF16-KV decode-attention rows (all; and those of the geometries it
    also measured with an FP8 KV cache), its FP8-KV rows and their files."""
    h20 = GPU_PRESETS["H20"]
    X, y = D.infersim_decode_attention("h20")[:2]
    Xf, yf, files = _fp8_kv_rows("h20")
    measured = {tuple(r[2:5]) for r in Xf}
    same = np.array([tuple(r[2:5]) in measured for r in X])
    return h20["tflops_bf16"] * 1e12, h20["hbm_tbps"] * 1e12, (X, y), (X[same], y[same]), (Xf, yf), files


@functools.lru_cache(maxsize=1)
def _fp8_kv_ratio() -> tuple[float, float, list[str]]:
    """FP8-KV ÷ BF16-KV of the decode kernel's KV byte rate e_bw, the held-out MAPE of the fit it comes from, and
    its data. FlashInfer dequantises FP8 KV on the SMs, so it reads 1 byte an element but not at the BF16 byte
    rate, and launches the same kernel: one fit over the rows of the one head geometry measured both ways
    (InferSim's H20 32-8-128), a fixed cost t0 shared by the two dtypes and an e_bw each, the rest of the model
    H20's shared BF16 fit. Read side by side, so what sets that file's runs apart from the other geometries'
    (its rows start at 10 µs, the others' at ~27 µs) cancels instead of becoming an FP8 advantage."""
    hp, hb, (X, y), (Xb, yb), (Xf, yf), files = _both_ways()
    base = K.fit_decode_attention(X, y, hp, hb, SMS["H20"]).params
    Xa, ya = np.vstack([Xb, Xf]), np.concatenate([yb, yf])

    def both(x: np.ndarray, p: dict[str, float]) -> np.ndarray:
        fp8 = x[:, 5] == 1
        return np.where(fp8, K.decode_attention_time(x, {**base, "t0": p["t0"], "e_bw": p["e8"]}, hp, hb),
                        K.decode_attention_time(x, {**base, "t0": p["t0"], "e_bw": p["e16"]}, hp, hb))

    fit = K.fit_model(both, Xa, ya, ["t0", "e16", "e8"], [base["t0"], 0.7, 0.5], [0, 0.05, 0.05], [1e-3, 1.2, 1.2])
    return fit.params["e8"] / fit.params["e16"], fit.mape_heldout, files


def fp8_kv_errors(bf16: dict[str, float], fp8: dict[str, float]) -> tuple[float, float]:
    """MAPE of H20's decode-attention terms on the one geometry measured both ways (32-8-128): the BF16-KV
    ``bf16`` params on its BF16 rows and the FP8-KV ``fp8`` (over ``bf16``) on its FP8 rows. Both err alike,
    since that file's runs start lower (~10 µs) than the other geometries' the shared fit follows."""
    hp, hb, _, (Xb, yb), (Xf, yf), _ = _both_ways()
    return tuple(float(np.mean(np.abs(K.decode_attention_time(x, p, hp, hb) / t - 1)))  # type: ignore[return-value]
                 for x, t, p in ((Xb, yb, bf16), (Xf, yf, {**bf16, **fp8})))


def _fp8_kv_decode(key: str, bf16: K.Fit) -> ComponentFit:
    """Decode attention over an FP8 KV cache: this GPU's BF16-KV fit with its e_bw times :func:`_fp8_kv_ratio`
    (on H20 too: its shared BF16 fit times its own side-by-side ratio)."""
    ratio, mape, files = _fp8_kv_ratio()
    params = {"t0": bf16.params["t0"], "e_bw": bf16.params["e_bw"] * ratio}
    note = ""
    if key == "H20":  # the composed term against the rows it comes from, beside the BF16 term on the same geometry
        e16, e8 = fp8_kv_errors(bf16.params, params)
        note = f"; on those rows this term errs {e8:.1%} and the BF16 term {e16:.1%} (that file's runs start lower)"
    return ComponentFit(formula=DECODE_FP8_KV_FORMULA, params={k: float(f"{v:.6g}") for k, v in params.items()},
                        data=files, dtype="fp8 KV cache (e4m3, BF16 queries)",
                        derived=f"{key} BF16-KV fit, e_bw × {ratio:.3g}: FP8-KV ÷ BF16-KV, fitted side by side on "
                                f"H20's one geometry measured both ways (32-8-128; shared launch cost, the ratio's "
                                f"fit held-out MAPE {mape:.1%}){note}")


def _stream(gpu: str) -> tuple[K.Fit, list[str]]:
    """The HBM streaming fit (``kernels.fit_stream``) of ``gpu``'s decode-attention rows (H100, H200: H800's)."""
    source = TIMINGS_OF.get(gpu, gpu)
    key = KEYS[source]
    sheet = GPU_PRESETS[key]
    peak, bw = sheet["tflops_bf16"] * 1e12, sheet["hbm_tbps"] * 1e12
    X, y, files = D.infersim_decode_attention(source)
    decode = K.fit_decode_attention(X, y, peak, bw, SMS[key])
    return K.fit_stream(X, y, decode.params, peak, bw, STREAM_MIN_BYTES), files


def _rescaled(gpu: str) -> bool:
    """``gpu`` borrows its timings from a sibling with other HBM (H200 from H800): the fitted
    efficiencies are applied to its own datasheet, not taken as the sibling's times."""
    source = TIMINGS_OF.get(gpu, gpu)
    return GPU_PRESETS[KEYS[source]]["hbm_tbps"] != GPU_PRESETS[KEYS[gpu]]["hbm_tbps"]


def _borrowed(gpu: str, timings: str, same: str) -> str | None:
    """How a term of ``gpu`` fitted on its sibling's ``timings`` is derived (None: its own timings)."""
    if gpu not in TIMINGS_OF:
        return None
    if not _rescaled(gpu):
        return f"H800 {timings} ({same})"
    sheet = GPU_PRESETS[KEYS[gpu]]
    return (f"H800 {timings}: the fitted efficiencies on {KEYS[gpu]}'s datasheet ({SIBLING[gpu]}, "
            f"{sheet['hbm_tbps']:g} TB/s); no {KEYS[gpu]} timings of this kernel are public here")


def build(gpu: str) -> KernelProfile:
    key = KEYS[gpu]
    sheet = GPU_PRESETS[key]
    peak, bw = sheet["tflops_bf16"] * 1e12, sheet["hbm_tbps"] * 1e12
    # fits and their held-out errors in the units of the GPU whose timings they read
    source = TIMINGS_OF.get(gpu, gpu)
    src_sheet = GPU_PRESETS[KEYS[source]]
    src_peak, src_bw = src_sheet["tflops_bf16"] * 1e12, src_sheet["hbm_tbps"] * 1e12
    assumptions = [f"iteration overhead {ITERATION_OVERHEAD_S * 1e3:.0f} ms per engine step (scheduling, sampling, "
                   "launch) is assumed: kernel timings do not contain it"]
    rescaled = _rescaled(gpu)
    share, share_note = compute_share(key)  # < 1 on Blackwell: what it sustains of its peak (calibration.sustained)
    if gpu == "a100":
        assumptions.append(f"no public A100 kernel timings but its BF16 GEMMs (fitted as measured): attention, long "
                           f"streams and FP8 terms take the H800's fitted efficiencies ({SIBLING[gpu]}) on A100's "
                           f"datasheet ({sheet['tflops_bf16']:g} TFLOP/s, {sheet['hbm_tbps']:g} TB/s); measure them "
                           "with `rollart calibrate profile` + `fit` on an A100")
    elif share < 1.0:
        assumptions.append(f"no public {key} kernel timings: every kernel's efficiency fitted on the {KEYS[source]}'s "
                           f"({SIBLING[gpu]}) applies to {key}'s datasheet ({sheet['tflops_bf16']:g} TFLOP/s BF16, "
                           f"{sheet['hbm_tbps']:g} TB/s): KV reads and long streams at the H800's fraction of HBM, "
                           f"compute-bound kernels (GEMMs, prefill attention) at {share:g} of the H800's fraction of "
                           f"peak: {share_note}; measure it with `rollart calibrate fit` on {with_article(key)}")
    elif rescaled:
        assumptions.append(f"no public {key} kernel timings: every kernel's efficiency fitted on the {KEYS[source]}'s "
                           f"({SIBLING[gpu]}, {src_sheet['tflops_bf16']:g} TFLOP/s BF16) applies to {key}'s "
                           f"datasheet: KV reads and long streams run {sheet['hbm_tbps']:g} ÷ {src_sheet['hbm_tbps']:g} "
                           f"= {sheet['hbm_tbps'] / src_sheet['hbm_tbps']:.2f}× faster, compute-bound kernels as on "
                           f"the {KEYS[source]}; a GEMM keeps its fitted small-batch compute ramp "
                           "(e_max·m/(m+m_half), from timings where HBM bound it first), which on the faster HBM "
                           "binds first (weight reads at ~4.1 TB/s at one row), so weight-bound decode gains "
                           f"1.1–1.25×, not {sheet['hbm_tbps'] / src_sheet['hbm_tbps']:.2f}×; measure it with "
                           f"`rollart calibrate fit` on {with_article(key)}")
    prefill_ape: list[np.ndarray] = []
    decode_ape: list[np.ndarray] = []

    # Decode attention first: its bandwidth term is this GPU's measured streaming rate --------
    X, y, files = D.infersim_decode_attention(source)
    fit = K.fit_decode_attention(X, y, src_peak, src_bw, SMS[key])
    attn_decode = _component(fit, DECODE_FORMULA, files, dtype="bf16 KV cache",
                             derived=_borrowed(gpu, "FlashInfer timings", "same HBM3 bandwidth"))
    decode_ape.append(_heldout_ape(lambda x, p: K.decode_attention_time(x, p, src_peak, src_bw), X, y, fit.params))
    unsplit = sorted(k[len(K.UNSPLIT):].replace("_", "-") for k, v in fit.params.items()
                     if k.startswith(K.UNSPLIT) and v)
    if unsplit:
        assumptions.append(f"decode attention timings of head geometry {', '.join(unsplit)} (q-kv-dim) fit a kernel "
                           f"without split-KV (flat in the batch until batch × KV heads fills the {SMS[key]} SMs); "
                           "the composition applies that occupancy to this geometry only, all others split")

    stream_fit = K.fit_stream(X, y, fit.params, src_peak, src_bw, STREAM_MIN_BYTES)
    stream = _component(stream_fit, STREAM_FORMULA, files, dtype="bf16 KV cache reads",
                        derived=_borrowed(gpu, "FlashInfer timings", "same HBM3 bandwidth"))

    attn_decode_fp8_kv = _fp8_kv_decode(key, fit)
    if attn_decode_fp8_kv.derived:
        assumptions.append(attn_decode_fp8_kv.derived)

    # GEMM ---------------------------------------------------------------------------
    # A GEMM reads its weights at the rate the memory system sustains. What a kernel loses below
    # that at small m is its compute side: the ramp e_max·m/(m+m_half) and, under 64 rows, the
    # tensor cores' 64-row tile (kernels.M_TILE). On H20 that tile outlasts the weight read, which is
    # why DeepGEMM's small-m timings there run at ~1.5–2 TB/s: its GEMMs are fitted with the weight
    # reads pinned at the memory-system rate (long streams), so the tile, not a slow HBM, explains them.
    h800_peak, h800_bw = GPU_PRESETS["H800"]["tflops_bf16"] * 1e12, GPU_PRESETS["H800"]["hbm_tbps"] * 1e12
    hx, hy, vidur_files = D.vidur_gemm()
    h100 = K.fit_gemm(hx, hy, h800_peak, h800_bw)  # measured BF16 GEMMs (H100 silicon = H800's)
    e_mem_pin = None
    if gpu == "h20":
        # the same streaming rule on both GPUs: long (≥ 1 GB) memory-bound reads' asymptotic rate
        h20_e, h800_e = stream_fit.params["e_bw"], _stream("h800")[0].params["e_bw"]
        stream_ratio = round(h20_e / h800_e, 4)
        e_mem_pin = float(f"{min(1.0, h100.params['e_mem'] * stream_ratio):.6g}")
    fx, fy, fp8_files = _fp8_rows(source)
    fp8 = K.fit_gemm(fx, fy, FP8_PEAK_RATIO * src_peak, src_bw, K.FP8_BYTES, e_mem=e_mem_pin)
    pinned = (f"; weight reads pinned at the memory-system rate (e_mem {e_mem_pin:g}), the small-m cost on "
              "the compute side (64-row tile)") if e_mem_pin else ""
    gemm_fp8 = _component(fp8, GEMM_FP8_FORMULA, fp8_files, dtype="fp8 (DeepGEMM, FP8 peak = 2 × BF16)" + pinned,
                          derived=_borrowed(gpu, "DeepGEMM timings", "same Hopper compute silicon"))
    gx, gy, grouped_files = D.infersim_grouped_gemm(source)
    grouped = K.fit_grouped_gemm(gx, gy, FP8_PEAK_RATIO * src_peak, src_bw, K.FP8_BYTES, e_mem=e_mem_pin)
    gemm_grouped_fp8 = _component(grouped, GEMM_GROUPED_FORMULA, grouped_files,
                                  dtype="fp8 (DeepGEMM grouped GEMM: masked layout in decode, contiguous in prefill)"
                                  + pinned,
                                  derived=_borrowed(gpu, "DeepGEMM grouped timings", "same Hopper compute silicon"))
    gemm_predict = lambda x, p: K.gemm_time(x, p, src_peak, src_bw)  # noqa: E731
    if gpu == "h20":
        # no BF16 GEMM timings for H20: compute from the FP8 fit times the BF16/FP8 efficiency ratio
        # measured on H800 (both kinds exist there), weight reads at H20's memory-system rate
        ix, iy, _ = _fp8_rows("h800")
        h800_fp8 = K.fit_gemm(ix, iy, FP8_PEAK_RATIO * h800_peak, h800_bw, K.FP8_BYTES)
        e_max_ratio = round(h100.params["e_max"] / h800_fp8.params["e_max"], 4)
        params = {"t0": fp8.params["t0"], "e_max": min(1.0, fp8.params["e_max"] * e_max_ratio),
                  "m_half": fp8.params["m_half"], "e_mem": e_mem_pin}
        gemm = ComponentFit(formula=GEMM_FORMULA, params={k: float(f"{v:.6g}") for k, v in params.items()},
                            data=fp8_files + vidur_files + files, dtype="bf16",
                            derived=(f"compute: H20 DeepGEMM FP8 fit (t0, m_half) with e_max × {e_max_ratio:g} (H800 "
                                     f"BF16 ÷ FP8 fitted e_max); weight reads: H800 BF16 GEMM e_mem × {stream_ratio:g} "
                                     f"(H20 ÷ H800 HBM streaming efficiency of long reads, {h20_e:.3f} ÷ {h800_e:.3f}: "
                                     f"{h20_e * bw / 1e12:.2f} vs {h800_e * h800_bw / 1e12:.2f} TB/s, the `stream` fits)"))
        assumptions.append(gemm.derived or "")
        # held-out GEMM error: the measured FP8 rows the BF16 model derives from, as the FP8 fit predicts them
        X, y, held_fit = fx, fy, fp8
        gemm_predict = lambda x, p: K.gemm_time(x, p, FP8_PEAK_RATIO * peak, bw, K.FP8_BYTES)  # noqa: E731
    elif gpu == "a100":
        # its own BF16 GEMM timings (Vidur, Llama-3-8B shapes, tp 1-8) on its own datasheet
        X, y, a100_files = D.vidur_gemm("a100")
        held_fit = K.fit_gemm(X, y, peak, bw)
        gemm = _component(held_fit, GEMM_FORMULA, a100_files, dtype="bf16")
        gemm_predict = lambda x, p: K.gemm_time(x, p, peak, bw)  # noqa: E731
        # no A100 kernel streams HBM faster than its measured GEMM weight reads: the H800's KV and
        # long-stream efficiencies (~0.95-0.97 of the datasheet) are capped at A100's own e_mem
        cap = gemm.params["e_mem"]
        scale = min(1.0, cap / attn_decode.params["e_bw"])
        for comp, factor in ((attn_decode, scale), (stream, min(1.0, cap / stream.params["e_bw"])),
                             (attn_decode_fp8_kv, scale)):
            if factor < 1.0:
                was = comp.derived
                comp.params["e_bw"] = float(f"{comp.params['e_bw'] * factor:.6g}")
                comp.derived = (was or "") + (f"; e_bw × {factor:.3g}: capped at A100's measured GEMM weight-read "
                                              f"efficiency {cap:.3g}")
                assumptions = [comp.derived if a == was else a for a in assumptions]
    else:
        X, y, held_fit = hx, hy, h100
        if gpu == "h100":
            derived = None
        elif share < 1.0:
            derived = f"H100 BF16 timings: the fitted efficiencies on {key}'s datasheet ({SIBLING[gpu]})"
        elif rescaled:
            derived = (f"H100 BF16 timings: the fitted efficiencies on {key}'s datasheet (same Hopper compute "
                       f"silicon, {sheet['hbm_tbps']:g} TB/s HBM3e)")
        else:
            derived = "H100 BF16 timings (same Hopper compute silicon and 3.35 TB/s HBM3 as H800)"
        gemm = _component(h100, GEMM_FORMULA, vidur_files, dtype="bf16", derived=derived)
    if peak < src_peak:  # fitted on a faster sibling's datasheet: the knee moves with the peak (kernels.gemm_on_datasheet)
        knee = peak / src_peak
        for comp in ((gemm_fp8, gemm_grouped_fp8) if gpu == "a100" else (gemm, gemm_fp8, gemm_grouped_fp8)):
            comp.params = K.gemm_on_datasheet(comp.params, knee)
            comp.derived = (comp.derived or "") + f"; knee m_half × {knee:.3g} ({key}'s peak ÷ the H800's)"
    if share < 1.0:  # a GPU that sustains less of its peak than the one whose timings it borrows (Blackwell)
        for comp, key_ in ((gemm, "e_max"), (gemm_fp8, "e_max"), (gemm_grouped_fp8, "e_max"), (attn_decode, "e_c")):
            comp.params[key_] = float(f"{comp.params[key_] * share:.6g}")
            comp.derived = (comp.derived or "") + f"; {key_} × {share:g} (its measured sustained share)"
    fp8_peak = sheet.get("tflops_fp8")  # None: no FP8 tensor cores (the datasheet preset says)
    if fp8_peak is not None:  # else: weight-only FP8, said below
        assumptions.append(f"FP8 weights: the DeepGEMM FP8 fit as fitted, at {FP8_PEAK_RATIO:g} × the BF16 peak, 1 "
                           f"byte per weight at e_mem {fp8.params['e_mem']:.3g}"
                           + (" (pinned at the memory-system rate: its small-m time is the 64-row tile's compute)"
                              if e_mem_pin else " (DeepGEMM's own small-m rate, below the BF16 GEMMs' "
                              f"{gemm.params['e_mem']:.3g})"))
    if gpu == "h20":
        assumptions.append("BF16 weights below 64 rows: the 64-row tile measured for DeepGEMM FP8 (tokens on the "
                           "MMA's 64-row side) is assumed for the BF16 GEMMs too (no H20 BF16 GEMM timings; a kernel "
                           "that swaps operands could use 8-row tiles). Qwen's public H20 benchmark (batch 1, "
                           "SGLang) reads BF16 weights at ~1.4 TB/s, slower still than this floor")
    assumptions.append("MoE expert layers: the linear-layer terms of the served dtype times the FP8 grouped ÷ "
                       "dense fit of each parameter (" + ", ".join(
                           f"{k} ×{grouped.params[k] / fp8.params[k]:.3g}" for k in GROUPED_PARAMS)
                       + "): a grouped GEMM departs from a dense one by its schedule over many small weights, taken "
                       "to be the same for BF16 (no BF16 grouped timings)")
    prefill_ape.append(_heldout_ape(gemm_predict, X, y, held_fit.params, X[:, 0] >= PREFILL_TOKENS))
    decode_ape.append(_heldout_ape(gemm_predict, X, y, held_fit.params, X[:, 0] < PREFILL_TOKENS))

    # Prefill attention -----------------------------------------------------------------
    X, y, files = D.infersim_prefill_attention("h20")
    h20_peak = GPU_PRESETS["H20"]["tflops_bf16"] * 1e12
    fit = K.fit_prefill_attention(X, y, h20_peak)
    if gpu == "h20":
        attn_prefill = _component(fit, PREFILL_FORMULA, files, dtype="bf16")
        prefill_ape.append(_heldout_ape(lambda x, p: K.prefill_attention_time(x, p, peak), X, y, fit.params))
    else:
        cap, kernel, where = ((FA2_A100_BF16_UTILISATION, "FlashAttention-2", "A100") if gpu == "a100"
                              else (FA3_H100_BF16_UTILISATION, "FlashAttention-3", "H100"))
        params = dict(fit.params, e_max=min(fit.params["e_max"], cap) * share)
        attn_prefill = ComponentFit(formula=PREFILL_FORMULA, params={k: float(f"{v:.6g}") for k, v in params.items()},
                                    data=files, dtype="bf16", derived=f"no {key} prefill timings: H20's FlashAttention-3 efficiency "
                                    f"curve with e_max capped at {cap} ({kernel}'s reported BF16 utilisation on {where})"
                                    + (f", × {share:g} (its measured sustained share)" if share < 1.0 else ""))
        assumptions.append(attn_prefill.derived or "")

    # All-reduce (tensor parallel), from 8×H100 NVLink ------------------------------------
    X, y, files = D.vidur_collective("all_reduce", intra_node=True)
    fit = K.fit_collective(X, y)
    scale = sheet["nvlink_gbps"] / GPU_PRESETS["H100"]["nvlink_gbps"]
    allreduce = _component(fit, COLLECTIVE_FORMULA, files, dtype="bf16 activations")
    if scale != 1.0:
        allreduce.params["beta_gbps"] = float(f"{fit.params['beta_gbps'] * scale:.6g}")
        allreduce.derived = f"H100 NVLink fit with bandwidth × {scale:.3g} ({key} NVLink {sheet['nvlink_gbps']:.0f} GB/s)"
        assumptions.append(allreduce.derived)
    elif gpu != "h100":
        allreduce.derived = f"H100 NVLink fit as is ({key} NVLink {sheet['nvlink_gbps']:.0f} GB/s, the same as H100's)"
    # The engine's own all-reduce for small (decode-sized) messages, from vLLM's custom kernel on H100
    if scale != 1.0:
        allreduce_custom = custom_allreduce_component(
            scale, f"H100 timings (vLLM custom all-reduce, tp 2/4/8) with bandwidth × {scale:.3g} "
                   f"({key} NVLink {sheet['nvlink_gbps']:.0f} GB/s); latency as measured")
        assumptions.append(allreduce_custom.derived or "")
    else:
        allreduce_custom = custom_allreduce_component(derived=None if gpu == "h100" else (
            f"H100 timings (vLLM custom all-reduce, tp 2/4/8) as they are ({key} NVLink "
            f"{sheet['nvlink_gbps']:.0f} GB/s, the same as H100's)"))

    prefill = np.concatenate(prefill_ape)
    decode = np.concatenate(decode_ape)
    note = (f"held-out rows: GEMMs with ≥ {PREFILL_TOKENS} tokens"
            + (" and prefill attention" if gpu == "h20" else " (prefill attention is derived, not held-out)")
            + f" for prefill; GEMMs with < {PREFILL_TOKENS} tokens and decode attention for decode")
    if gpu == "a100":
        note += "; the GEMM rows are A100's own, the decode-attention rows the H800's"
    elif rescaled:
        note += f", all of them H100/H800 timings (none measured on {with_article(key)})"
    if fp8_peak is None:
        assumptions.append(f"{key} has no FP8 tensor cores: FP8 weights are read as 1 byte and computed in BF16 "
                           "(weight-only); the FP8 GEMM fits stay for the MoE grouped ÷ dense factors")
    return KernelProfile(
        gpu=key, peak_tflops_bf16=sheet["tflops_bf16"], hbm_tbps=sheet["hbm_tbps"],
        peak_tflops_fp8=fp8_peak,
        iteration_overhead_s=ITERATION_OVERHEAD_S, gemm=gemm, gemm_fp8=gemm_fp8, gemm_grouped_fp8=gemm_grouped_fp8,
        attn_prefill=attn_prefill, attn_decode=attn_decode, attn_decode_fp8_kv=attn_decode_fp8_kv,
        stream=stream, allreduce=allreduce, allreduce_custom=allreduce_custom,
        fit_error=PhaseError(prefill_mape_heldout=round(float(prefill.mean()), 4),
                             decode_mape_heldout=round(float(decode.mean()), 4), note=note),
        assumptions=[a for a in assumptions if a],
        source="InferSim (alibaba/InferSim f2293da, Apache-2.0) and Vidur (microsoft/vidur 7d47513, MIT) "
               "kernel timings; see calibration/data/PROVENANCE.md",
    )


GPUS = ("h800", "h20", "h100", "h200", "a100", "b200", "gb200")


def check() -> int:
    """Rebuild every shipped profile and print where it differs from the shipped one; 1 if any does."""
    bad = 0
    for gpu in GPUS:
        diffs = profile_differences(load_profile(shipped_profile_path(gpu)).model_dump(), build(gpu).model_dump())
        print(f"{gpu}: " + ("as shipped" if not diffs else f"{len(diffs)} field(s) differ"))
        for d in diffs:
            print(f"  {d}")
        bad |= bool(diffs)
    return int(bad)


def main(argv: list[str] | None = None) -> int:
    import argparse

    import yaml

    from rollart.calibration.links import LINKS_FILE, fit_links

    ap = argparse.ArgumentParser(prog="python -m rollart.calibration.build",
                                 description="Fit the shipped kernel profiles and link models from calibration/data.")
    ap.add_argument("--check", action="store_true",
                    help="rebuild and compare with the shipped profiles (within 1e-4); write nothing")
    if ap.parse_args(argv).check:
        return check()
    PROFILE_DIR.mkdir(exist_ok=True)
    links = fit_links()
    LINKS_FILE.write_text("# Link models (latency + bandwidth). Generated by `python -m rollart.calibration.build`.\n"
                          + yaml.safe_dump(links, sort_keys=False, allow_unicode=True, width=100))
    print("links: " + ", ".join(f"{k} {v['bandwidth_gbps']:g} Gbps" for k, v in links.items() if "bandwidth_gbps" in v))
    for gpu in GPUS:
        profile = build(gpu)
        save_profile(profile, PROFILE_DIR / f"{gpu}.yaml",
                     header=f"{profile.gpu} kernel profile. Generated by `python -m rollart.calibration.build`;\n"
                            "do not edit by hand.")
        print(f"{gpu}: prefill MAPE {profile.fit_error.prefill_mape_heldout:.1%}, "
              f"decode MAPE {profile.fit_error.decode_mape_heldout:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
