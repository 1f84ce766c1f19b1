"""How well a GEMM fit carries to another GPU's datasheet, on the GPUs measured on both sides (prints the
tables of calibration/CHANGES.md, "A GEMM fit carried to a slower GPU keeps its knee as time ...").

    python scripts/gemm_transfer.py

For each held-out pair — H100's BF16 fit on A100's datasheet against Vidur's A100 timings, H800's FP8
DeepGEMM fit on H20's against InferSim's H20 timings — the median of predicted ÷ measured and the MAPE per
band of token rows: with the knee kept as rows (before), moved with the peak as the transfer moves it
(kernels.gemm_on_datasheet), moved with the ridge (peak ÷ bandwidth, the alternative not taken), and the
GPU's own fit. Then H100 ÷ B200 times per GPU (the README's custom type) with the knee kept in rows above
the reference's peak, as the rule keeps it, and moved with the peak."""

from __future__ import annotations

import numpy as np

from rollart.calibration import datasets as D
from rollart.calibration import generation_cost
from rollart.calibration import kernels as K
from rollart.calibration.build import _fp8_rows
from rollart.calibration.cost import KernelProfileGeneration
from rollart.calibration.profiles import load_profile, shipped_profile_path, transferred_profile
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, ModelSpec

BANDS = ((1, 64), (64, 256), (256, 1024), (1024, None))


def _row(name: str, X: np.ndarray, y: np.ndarray, params: dict, peak: float, bw: float, nbytes: tuple) -> str:
    r = K.gemm_time(X, params, peak, bw, nbytes) / y
    cells = []
    for lo, hi in BANDS:
        s = (X[:, 0] >= lo) & (X[:, 0] < (hi or np.inf))
        cells.append(f"{np.median(r[s]):.2f} / {np.mean(np.abs(r[s] - 1)):.0%}")
    return f"| {name} | " + " | ".join(cells) + f" | {np.mean(np.abs(r - 1)):.1%} |"


def main() -> None:
    pairs = [("H100 BF16 → A100 (Vidur)", *D.vidur_gemm("a100")[:2], "H100", "A100", "gemm", "tflops_bf16",
              K.BF16_BYTES),
             ("H800 FP8 DeepGEMM → H20 (InferSim)", *_fp8_rows("h20")[:2], "H800", "H20", "gemm_fp8", "tflops_fp8",
              K.FP8_BYTES)]
    print("| fit → timings | " + " | ".join(f"m {lo}–{hi - 1 if hi else '…'}" for lo, hi in BANDS) + " | all |")
    print("|---" * (len(BANDS) + 2) + "|")
    for name, X, y, frm, to, term, peak_key, nbytes in pairs:
        fit = getattr(load_profile(shipped_profile_path(frm)), term).params
        own = getattr(load_profile(shipped_profile_path(to)), term).params
        t, f = GPU_PRESETS[to], GPU_PRESETS[frm]
        peak, bw = t[peak_key] * 1e12, t["hbm_tbps"] * 1e12
        ratio = t[peak_key] / f[peak_key]
        ridge = ratio * f["hbm_tbps"] / t["hbm_tbps"]
        print(_row(f"{name}: knee as rows", X, y, fit, peak, bw, nbytes))
        print(_row(f"{name}: knee × peak ratio {ratio:.2f} (the rule)", X, y, K.gemm_on_datasheet(fit, ratio), peak, bw,
                   nbytes))
        print(_row(f"{name}: knee × ridge ratio {ridge:.2f}", X, y, {**fit, "m_half": fit["m_half"] * ridge}, peak, bw,
                   nbytes))
        print(_row(f"{name}: {to}'s own fit", X, y, own, peak, bw, nbytes))
    # Above the reference's peak nothing was measured: the rule keeps the knee in rows there. Moved with the
    # peak instead (a fixed time per weight element), it would outlast a faster GPU's weight read.
    ref = load_profile(shipped_profile_path("H100"))
    b200 = dict(tflops_bf16=2250.0, hbm_tbps=8.0, memory_gb=180.0, nvlink_gbps=1800.0, tflops_fp8=4500.0)
    ours = transferred_profile(ref, "B200", 2250.0, 8.0, 1800.0, GPU_PRESETS["H100"]["nvlink_gbps"], 4500.0)
    uncapped = ours.model_copy(update={name: getattr(ours, name).model_copy(update={"params": {
        **getattr(ref, name).params, "m_half": getattr(ref, name).params["m_half"] * 2250.0 / ref.peak_tflops_bf16}})
        for name in ("gemm", "gemm_fp8", "gemm_grouped_fp8")})
    print("\nH100 ÷ B200 time per GPU (the README's custom B200; tp 1; decode: one iteration, 2,048 cached tokens a "
          "sequence)")
    for model in ("Qwen3-8B", "Qwen3-32B", "Qwen3-30B-A3B"):
        m = ModelSpec.model_validate(model)
        h100 = generation_cost(m, "H100", GpuType(**GPU_PRESETS["H100"]), 1)
        for label, prof in (("knee in rows (the rule)", ours), ("knee × peak ratio 2.27 (not taken)", uncapped)):
            b = KernelProfileGeneration(m, GpuType(**b200), 1, prof, "B200 datasheet")
            cells = [f"B {n}: {h100.decode_line(n).total(n * 2048, n, 1) / b.decode_line(n).total(n * 2048, n, 1):.2f}"
                     for n in (1, 16, 64, 256)]
            pre = h100.prefill_time(8192, 8192 ** 2 / 2) / b.prefill_time(8192, 8192 ** 2 / 2)
            print(f"  {model}, {label}: " + ", ".join(cells) + f", prefill 8,192: {pre:.2f}")


if __name__ == "__main__":
    main()
