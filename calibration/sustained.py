"""How much of its datasheet compute a GPU without kernel timings of its own sustains, relative to the
GPU whose timings it borrows (``data/public/blackwell_sustained.yaml``).

Blackwell's datasheet peaks are not reached in the same proportion as Hopper's: a GB200 sustains
2,868 TFLOP/s on large cuBLASLt FP8 GEMMs where an H100 sustains 1,324 in the same benchmark (Azure's,
mean of five shapes with every dimension ≥ 4096), 2.17× against datasheet peaks 2.53× apart. So the
Hopper kernels' fitted fractions of peak, carried to a Blackwell datasheet, overstate its compute by
that 1/0.859; the memory side (HBM streams) keeps its fraction (no same-benchmark measure here says
otherwise). The B200 (1,000 W against GB200's 1,200 W) is read from the same training recipe run on
both (Megatron-Bridge, Llama-3-8B FP8): 0.972× the GB200's tokens/s on 0.9× its datasheet, so it
sustains 0.972 / 0.9 of the GB200's share.

:func:`compute_share` is the factor the build multiplies the compute efficiencies (``e_max``) of a
profile's GEMM and prefill-attention fits by; 1.0 for every GPU with timings of its own."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

DATA = Path(__file__).resolve().parent / "data" / "public" / "blackwell_sustained.yaml"


@lru_cache(maxsize=1)
def _data() -> dict:
    return yaml.safe_load(DATA.read_text())


def gemm_ratio() -> tuple[float, float, float]:
    """(mean GB200 ÷ H100 sustained FP8 GEMM rate, mean H100 TFLOP/s, mean GB200 TFLOP/s) over the
    benchmark's compute-bound shapes."""
    rows = _data()["azure_cublaslt_fp8_gemm"]["rows"]
    ratio = sum(r[4] / r[3] for r in rows) / len(rows)
    return ratio, sum(r[3] for r in rows) / len(rows), sum(r[4] for r in rows) / len(rows)


@lru_cache(maxsize=None)
def compute_share(gpu: str) -> tuple[float, str]:
    """(factor on the borrowed fits' compute efficiencies, how it was measured) for the preset ``gpu``
    ("GB200", "B200"); (1.0, "") for any other."""
    data = _data()
    gemm = data["azure_cublaslt_fp8_gemm"]
    ratio, h100, gb200 = gemm_ratio()
    peaks = gemm["datasheet_tflops_fp8"]
    gb200_share = ratio / (peaks["GB200"] / peaks["H100"])
    gb200_note = (f"GB200 sustains {gb200:,.0f} TFLOP/s on large cuBLASLt FP8 GEMMs against H100's {h100:,.0f} in the "
                  f"same benchmark (Azure AI Benchmarking Guide): {ratio:.3g}× on datasheets "
                  f"{peaks['GB200'] / peaks['H100']:.3g}× apart, so {gb200_share:.3g} of Hopper's fraction of peak")
    if gpu == "GB200":
        return round(gb200_share, 4), gb200_note
    if gpu == "B200":
        mb = data["megatron_bridge_llama3_8b_fp8"]
        speed = mb["DGX-B200"] / mb["DGX-GB200"]
        sheet = mb["datasheet_tflops_fp8"]["B200"] / mb["datasheet_tflops_fp8"]["GB200"]
        share = gb200_share * speed / sheet
        return round(share, 4), (f"{gb200_note}; B200 trains Llama-3-8B FP8 at {speed:.3f}× the GB200's tokens/s in the "
                                 f"same Megatron-Bridge recipe on {sheet:.2g}× its datasheet: {share:.3g} of Hopper's")
    return 1.0, ""


__all__ = ["compute_share", "gemm_ratio"]
