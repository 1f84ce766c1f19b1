"""Decode attention of multi-head latent attention (MLA) on GPUs that run FlashMLA.

No MLA kernel is timed in the shipped data, and the GQA decode-attention fits (FlashInfer) undersell it:
with one GPU's 128 heads sharing one latent, MLA's absorbed decode is compute-bound, where FlashInfer's
fitted compute efficiency (H800: about a third of peak) is not FlashMLA's. FlashMLA publishes its rates on
H800 SXM5 (``data/public/flashmla_h800.yaml``): 660 TFLOP/s compute-bound, 3,000 GB/s memory-bound, i.e.
0.667 of the BF16 peak and 0.896 of the HBM datasheet. vLLM and SGLang run it as the MLA backend on Hopper,
so those fractions price MLA decode on a GPU with FP8 tensor cores (Hopper-class; the datasheet's
``tflops_fp8``); elsewhere (A100: Triton's MLA kernel) the GQA fit stays."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

FLASHMLA_FILE = Path(__file__).parent / "data" / "public" / "flashmla_h800.yaml"


@lru_cache(maxsize=1)
def flashmla_efficiency() -> tuple[float, float, str]:
    """(share of the BF16 peak, share of the HBM datasheet, source) FlashMLA's published H800 rates reach."""
    d = yaml.safe_load(FLASHMLA_FILE.read_text())
    return (float(d["compute_bound_tflops"]) / float(d["datasheet_tflops_bf16"]),
            float(d["memory_bound_gbps"]) / (1e3 * float(d["datasheet_hbm_tbps"])), str(d["source"]))


__all__ = ["flashmla_efficiency", "FLASHMLA_FILE"]
