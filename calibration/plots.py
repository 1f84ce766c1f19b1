"""Measured vs fitted plots of a profile (matplotlib, PNG)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rollart.calibration import datasets as D  # noqa: E402
from rollart.calibration import kernels as K  # noqa: E402
from rollart.calibration.profiles import EngineProfile, KernelProfile, Profile, TrainProfile  # noqa: E402


def _panels(profile: Profile) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(title, measured seconds, fitted seconds) per measured component."""
    if isinstance(profile, EngineProfile):
        from rollart.calibration.engine_fit import _features, csv

        path = Path(profile.prefill.data[0])
        rows = list(csv.DictReader(path.open())) if path.is_file() else []
        out = []
        for phase, fit in (("prefill", profile.prefill), ("decode", profile.decode)):
            X, y = _features(rows, phase)
            if len(y):
                p = fit.params
                out.append((phase, y, X @ np.array([p["a"], p["b"], p["c"]])))
        return out
    if not isinstance(profile, KernelProfile):  # a train profile keeps no measured rows
        return []
    gpu = profile.gpu.lower()
    peak, bw = profile.peak_tflops_bf16 * 1e12, profile.hbm_tbps * 1e12
    if gpu == "h20" and profile.gemm_fp8 is not None:  # no BF16 GEMM timings: the FP8 ones it derives from
        X, y, _ = D.infersim_gemm("h20")
        y = y / D.FP8_TO_BF16
        panels = [("GEMM (DeepGEMM FP8)", y, K.gemm_time(X, profile.gemm_fp8.params, (profile.peak_tflops_fp8 or 0) * 1e12,
                                                         bw, K.FP8_BYTES))]
    elif profile.gemm.derived is None or gpu == "h800":
        # the rows this profile's GEMM fit read: A100's own, else the H100's (the H800's datasheet)
        X, y, _ = D.vidur_gemm("a100" if gpu == "a100" else "h100")
        panels = [(f"GEMM ({'A100' if gpu == 'a100' else 'H100'} BF16)", y, K.gemm_time(X, profile.gemm.params, peak, bw))]
    else:  # fitted efficiencies on another datasheet (H200): no rows of this GPU to plot
        panels = []
    if profile.attn_prefill.derived is None:
        X, y, _ = D.infersim_prefill_attention(gpu)
        panels.append(("prefill attention", y, K.prefill_attention_time(X, profile.attn_prefill.params, peak)))
    rows = {"h800": "h800", "h100": "h800", "h20": "h20"}.get(gpu)  # decode-attention rows in this datasheet
    if rows is not None:
        X, y, _ = D.infersim_decode_attention(rows)
        panels.append(("decode attention", y, K.decode_attention_time(X, profile.attn_decode.params, peak, bw)))
    X, y, _ = D.vidur_collective("all_reduce", intra_node=True)
    panels.append(("all-reduce (H100 NVLink data)", y, K.collective_time(X, profile.allreduce.params)))
    if profile.allreduce_custom is not None:
        X, y, _ = D.custom_allreduce()
        panels.append(("custom all-reduce (H100, vLLM)", y, K.collective_time(X, profile.allreduce_custom.params)))
    return panels


def plot_profile(profile: Profile, path: str | Path) -> None:
    panels = _panels(profile)
    if not panels:
        data = profile.step.data if isinstance(profile, TrainProfile) else profile.prefill.data
        raise ValueError(f"no measured rows to plot for this {profile.kind} profile (data: {', '.join(data)})")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
    for ax, (title, meas, fit) in zip(axes[0], panels):
        ax.loglog(meas * 1e6, fit * 1e6, ".", alpha=0.5, ms=4)
        lo, hi = min(meas.min(), fit.min()) * 1e6, max(meas.max(), fit.max()) * 1e6
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_title(f"{title}\nMAPE {np.mean(np.abs(fit - meas) / meas):.1%} (all rows)", fontsize=9)
        ax.set_xlabel("measured µs")
        ax.set_ylabel("fitted µs")
    name = profile.gpu if isinstance(profile, KernelProfile) else f"{profile.gpu} / {profile.model}"
    fig.suptitle(f"{name} {profile.kind} profile: measured vs fitted")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
