"""How well a GEMM fit carries to another GPU's datasheet, on the GPUs measured on both sides (prints the
tables of calibration/CHANGES.md, "A GEMM fit carried to another datasheet keeps its knee ...").

    python scripts/gemm_transfer.py

For each held-out pair — H100's BF16 fit on A100's datasheet against Vidur's A100 timings, H800's FP8
DeepGEMM fit on H20's against InferSim's H20 timings — the median of predicted ÷ measured and the MAPE per
band of token rows: with the knee kept as rows, as the transfer (kernels.gemm_on_datasheet) keeps it, and
with the GPU's own fit. Then H800 ÷ H200 decode and prefill times per GPU from the shipped profiles."""

from __future__ import annotations

import numpy as np

from rollart.calibration import datasets as D
from rollart.calibration import generation_cost
from rollart.calibration import kernels as K
from rollart.calibration.build import _fp8_rows
from rollart.calibration.profiles import load_profile, shipped_profile_path
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
        ridge = (t[peak_key] / t["hbm_tbps"]) / (f[peak_key] / f["hbm_tbps"])
        print(_row(f"{name}: knee as rows", X, y, fit, peak, bw, nbytes))
        print(_row(f"{name}: knee × ridge ratio {ridge:.2f}", X, y, K.gemm_on_datasheet(fit, ridge), peak, bw, nbytes))
        print(_row(f"{name}: {to}'s own fit", X, y, own, peak, bw, nbytes))
    print("\nH800 ÷ H200 time per GPU (tp 1; decode: one iteration, 2,048 cached tokens a sequence)")
    for model in ("Qwen3-8B", "Qwen3-32B", "Qwen3-30B-A3B"):
        m = ModelSpec.model_validate(model)
        a, b = (generation_cost(m, g, GpuType(**GPU_PRESETS[g]), 1) for g in ("H800", "H200"))
        cells = [f"B {n}: {a.decode_line(n).total(n * 2048, n, 1) / b.decode_line(n).total(n * 2048, n, 1):.2f}"
                 for n in (1, 16, 64, 256)]
        pre = a.prefill_time(8192, 8192 ** 2 / 2) / b.prefill_time(8192, 8192 ** 2 / 2)
        print(f"  {model}: " + ", ".join(cells) + f", prefill 8,192: {pre:.2f}")


if __name__ == "__main__":
    main()
