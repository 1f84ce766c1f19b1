"""Hardware, model and link presets with their sources.

GPU numbers are vendor datasheet figures (dense BF16, no sparsity). Model geometry is
copied from each model's published `config.json`. Nothing here is a fitted value: fitted
efficiencies live in calibration profiles.
"""

from __future__ import annotations

GPU_PRESETS: dict[str, dict[str, float]] = {
    # name: dense BF16 TFLOP/s, HBM TB/s, memory GB (GiB in practice), NVLink GB/s
    # (datasheet total of both directions, per GPU), dense FP8 TFLOP/s where the tensor cores
    # compute FP8 (Hopper: 2 × BF16; A100 has none)
    "H800": {"tflops_bf16": 989.0, "hbm_tbps": 3.35, "memory_gb": 80.0, "nvlink_gbps": 400.0, "tflops_fp8": 1978.0},
    "H20": {"tflops_bf16": 148.0, "hbm_tbps": 4.0, "memory_gb": 96.0, "nvlink_gbps": 900.0, "tflops_fp8": 296.0},
    "H100": {"tflops_bf16": 989.0, "hbm_tbps": 3.35, "memory_gb": 80.0, "nvlink_gbps": 900.0, "tflops_fp8": 1978.0},
    "H200": {"tflops_bf16": 989.0, "hbm_tbps": 4.8, "memory_gb": 141.0, "nvlink_gbps": 900.0, "tflops_fp8": 1978.0},
    "A100": {"tflops_bf16": 312.0, "hbm_tbps": 2.039, "memory_gb": 80.0, "nvlink_gbps": 600.0},
}

MODEL_PRESETS: dict[str, dict[str, int]] = {
    # Qwen3 configs from the Qwen3 model cards (config.json); Qwen2.5-7B-Instruct likewise.
    "Qwen3-8B": dict(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                     intermediate=12288, vocab=151936, tied_embeddings=0),
    "Qwen3-14B": dict(layers=40, hidden=5120, heads=40, kv_heads=8, head_dim=128,
                      intermediate=17408, vocab=151936, tied_embeddings=0),
    "Qwen3-32B": dict(layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128,
                      intermediate=25600, vocab=151936, tied_embeddings=0),
    "Qwen2.5-7B": dict(layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128,
                       intermediate=18944, vocab=152064, tied_embeddings=0),
    # Qwen3-30B-A3B (config.json, shipped in calibration/data/infersim/hf_configs/): 128 experts of
    # width 768, 8 routed per token; ~30.5 B parameters, ~3.3 B active
    "Qwen3-30B-A3B": dict(layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, intermediate=768,
                          vocab=151936, tied_embeddings=0, moe_experts=128, moe_active_experts=8),
    # Not a released model: a random-init Qwen3-shaped network small enough to run on a CPU,
    # used to profile and run the real engine on machines without a GPU.
    "Qwen3-tiny": dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16,
                       intermediate=128, vocab=1024, tied_embeddings=1),
}

LINK_PRESETS: dict[str, dict[str, float]] = {
    # kind: bandwidth Gbit/s, one-way latency µs (typical published figures)
    "tcp": {"bandwidth_gbps": 200.0, "latency_us": 50.0},
    "rdma": {"bandwidth_gbps": 400.0, "latency_us": 5.0},
    "ib": {"bandwidth_gbps": 400.0, "latency_us": 5.0},
    "nvlink": {"bandwidth_gbps": 3200.0, "latency_us": 2.0},
    "pcie": {"bandwidth_gbps": 400.0, "latency_us": 2.0},
}


def canonical_gpu(name: str) -> str | None:
    """Case-insensitive lookup of a preset GPU name."""
    for key in GPU_PRESETS:
        if key.lower() == name.lower():
            return key
    return None


def canonical_model(name: str) -> str | None:
    for key in MODEL_PRESETS:
        if key.lower() == name.lower():
            return key
    return None
