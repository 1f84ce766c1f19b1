"""Decode attention of multi-head latent attention (MLA) on GPUs that run FlashMLA.

No MLA kernel is timed in the shipped data, and the GQA decode-attention fits (FlashInfer) undersell it:
with one GPU's 128 heads sharing one latent, MLA's absorbed decode is compute-bound, where FlashInfer's
fitted compute efficiency (H800: about a third of peak) is not FlashMLA's. FlashMLA publishes its rates on
H800 SXM5 (``data/public/flashmla_h800.yaml``): 660 TFLOP/s compute-bound, 3,000 GB/s memory-bound, i.e.
0.667 of the BF16 peak and 0.896 of the HBM datasheet. vLLM and SGLang run it as the MLA backend on Hopper,
so those fractions price MLA decode on a GPU with FP8 tensor cores (the datasheet's ``tflops_fp8``: the
H800, H100, H20 and H200 presets; a custom type with FP8 tensor cores, Blackwell or Ada, is priced the same
way, an assumption for Ada, which has no FlashMLA); elsewhere (A100: Triton's MLA kernel) the GQA fit
stays. FlashMLA tiles 64 query rows (heads × query tokens a step) per block and publishes its compute rate
for at least 64: a GPU holding fewer heads (tensor parallelism over the heads) pads the tile, so its
compute share scales by heads/64 (:func:`flashmla_row_use`; one query token a step, no multi-token
prediction)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

FLASHMLA_FILE = Path(__file__).parent / "data" / "public" / "flashmla_h800.yaml"
FLASHMLA_TILE_ROWS = 64  # query rows a FlashMLA block computes (its README: compute-bound from 64 rows)


def flashmla_row_use(heads: int, query_tokens: int = 1) -> float:
    """The share of FlashMLA's 64-row query tile a GPU's ``heads`` × ``query_tokens`` rows fill (1 from 64)."""
    return min(1.0, heads * query_tokens / FLASHMLA_TILE_ROWS)


@lru_cache(maxsize=1)
def flashmla_efficiency() -> tuple[float, float, str]:
    """(share of the BF16 peak, share of the HBM datasheet, source) FlashMLA's published H800 rates reach."""
    d = yaml.safe_load(FLASHMLA_FILE.read_text())
    return (float(d["compute_bound_tflops"]) / float(d["datasheet_tflops_bf16"]),
            float(d["memory_bound_gbps"]) / (1e3 * float(d["datasheet_hbm_tbps"])), str(d["source"]))


__all__ = ["flashmla_efficiency", "flashmla_row_use", "FLASHMLA_FILE", "FLASHMLA_TILE_ROWS"]
