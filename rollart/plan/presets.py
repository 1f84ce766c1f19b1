"""Hardware, model and link presets with their sources.

GPU numbers are vendor datasheet figures (dense BF16, no sparsity). Model geometry is
copied from each model's published `config.json`. Nothing here is a fitted value: fitted
efficiencies live in calibration profiles.
"""

from __future__ import annotations

GPU_PRESETS: dict[str, dict[str, float]] = {
    # name: dense BF16 TFLOP/s, HBM TB/s, memory GB (GiB in practice), NVLink GB/s
    # (datasheet total of both directions, per GPU), dense FP8 TFLOP/s where the tensor cores
    # compute FP8 (Hopper and Blackwell: 2 × BF16; A100 has none), GPUs in one NVLink domain (HGX
    # 8-GPU boards: NVLink/NVSwitch inside the board, the cluster's network beyond; GB200: a 72-GPU rack).
    # memory_visible_gib: the total torch.cuda.get_device_properties(0) reports (what vLLM's
    # gpu_memory_utilization multiplies), from public printouts: H100 80GB HBM3 81,082-81,090 MiB
    # (81,089 taken; the H800 has the same memory system and no public printout: the H100's taken),
    # H20 97,285 MiB, H200 143,156 MiB; A100: no 80 GB printout found, so the A100-SXM4-40GB's share
    # (40,536 of 40,960 MiB) on 80 GiB. The driver keeps ~1 % of the 40/80/96/141 GiB (nvidia-smi:
    # 81,559 / 97,871 / 143,771 MiB total on Hopper, less again once CUDA starts).
    "H800": {"tflops_bf16": 989.0, "hbm_tbps": 3.35, "memory_gb": 80.0, "memory_visible_gib": 79.188,
             "nvlink_gbps": 400.0, "tflops_fp8": 1978.0, "nvlink_domain": 8},
    "H20": {"tflops_bf16": 148.0, "hbm_tbps": 4.0, "memory_gb": 96.0, "memory_visible_gib": 95.005,
            "nvlink_gbps": 900.0, "tflops_fp8": 296.0, "nvlink_domain": 8},
    "H100": {"tflops_bf16": 989.0, "hbm_tbps": 3.35, "memory_gb": 80.0, "memory_visible_gib": 79.188,
             "nvlink_gbps": 900.0, "tflops_fp8": 1978.0, "nvlink_domain": 8},
    "H200": {"tflops_bf16": 989.0, "hbm_tbps": 4.8, "memory_gb": 141.0, "memory_visible_gib": 139.801,
             "nvlink_gbps": 900.0, "tflops_fp8": 1978.0, "nvlink_domain": 8},
    "A100": {"tflops_bf16": 312.0, "hbm_tbps": 2.039, "memory_gb": 80.0, "memory_visible_gib": 79.172,
             "nvlink_gbps": 600.0, "nvlink_domain": 8},
    # Blackwell (NVIDIA's HGX B200 and GB200 NVL72 datasheets, per GPU, dense): B200 2.25 PFLOP/s BF16,
    # 4.5 FP8, 180 GB HBM3e at 7.7 TB/s (the HGX B200 table; some pages round it to 8), NVLink 5 1.8 TB/s,
    # an 8-GPU board; GB200 2.5 / 5 PFLOP/s, 186 GB at 8 TB/s, the same NVLink across a 72-GPU rack. No
    # public kernel timings: their profiles carry the H800's efficiencies at Blackwell's measured sustained
    # share of peak (rollart.calibration.sustained). memory_visible_gib: B200 178.36 GiB as torch reports it
    # on a DGX B200 (Together AI's published run); GB200 no printout found, so the B200's share of its total.
    "B200": {"tflops_bf16": 2250.0, "hbm_tbps": 7.7, "memory_gb": 180.0, "memory_visible_gib": 178.36,
             "nvlink_gbps": 1800.0, "tflops_fp8": 4500.0, "nvlink_domain": 8},
    "GB200": {"tflops_bf16": 2500.0, "hbm_tbps": 8.0, "memory_gb": 186.0, "memory_visible_gib": 184.3,
              "nvlink_gbps": 1800.0, "tflops_fp8": 5000.0, "nvlink_domain": 72},
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
    # Qwen3-235B-A22B (Qwen/Qwen3-235B-A22B config.json): num_hidden_layers 94, hidden_size 4096,
    # num_attention_heads 64, num_key_value_heads 4, head_dim 128, moe_intermediate_size 1536 (the
    # experts' width; its intermediate_size 12288 is unused, mlp_only_layers is empty), num_experts 128,
    # num_experts_per_tok 8, vocab_size 151936, tie_word_embeddings false; model card: 235 B total, 22 B
    # activated, 32,768 tokens native context
    "Qwen3-235B-A22B": dict(layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128, intermediate=1536,
                            vocab=151936, tied_embeddings=0, moe_experts=128, moe_active_experts=8),
    # DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json): num_hidden_layers 61, hidden_size 7168,
    # num_attention_heads 128 (num_key_value_heads 128: unused by MLA), q_lora_rank 1536, kv_lora_rank
    # 512, qk_nope_head_dim 128 (head_dim here), qk_rope_head_dim 64, v_head_dim 128, intermediate_size
    # 18432 (the first_k_dense_replace 3 dense layers), moe_intermediate_size 2048 (each expert; intermediate
    # here), n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1 (× 2048), vocab_size 129280,
    # tie_word_embeddings false. The model card: 671 B total, 37 B activated (the 14 B multi-token-prediction
    # module, not served for generation, apart). Its 128 K window is not preset: max_context_tokens is read
    # for a reward_model only (the judge's cut), and a plan sets it there.
    "DeepSeek-V3": dict(layers=61, hidden=7168, heads=128, kv_heads=128, head_dim=128, intermediate=2048,
                        vocab=129280, tied_embeddings=0, moe_experts=256, moe_active_experts=8,
                        dense_layers=3, dense_intermediate=18432, shared_expert_intermediate=2048,
                        q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128),
    # Not a released model: a random-init Qwen3-shaped network small enough to run on a CPU,
    # used to profile and run the real engine on machines without a GPU.
    "Qwen3-tiny": dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16,
                       intermediate=128, vocab=1024, tied_embeddings=1),
}

# The context window each released preset was trained for (its model card): past it the model needs rope
# scaling (Qwen: YaRN, up to 131,072 tokens at factor 4, applied statically by vLLM, which the cards note may
# cost quality on short texts). A model a plan describes has no card here (Plan.context_notes says nothing).
NATIVE_CONTEXT_TOKENS: dict[str, int] = {
    "Qwen3-8B": 32768, "Qwen3-14B": 32768, "Qwen3-32B": 32768, "Qwen3-30B-A3B": 32768, "Qwen3-235B-A22B": 32768,
    "Qwen2.5-7B": 32768, "DeepSeek-V3": 131072,
}

LINK_PRESETS: dict[str, dict[str, float]] = {
    # kind: bandwidth Gbit/s, one-way latency µs (typical published figures)
    "tcp": {"bandwidth_gbps": 200.0, "latency_us": 50.0},
    "rdma": {"bandwidth_gbps": 400.0, "latency_us": 5.0},
    "ib": {"bandwidth_gbps": 400.0, "latency_us": 5.0},
    "nvlink": {"bandwidth_gbps": 3200.0, "latency_us": 2.0},
    "pcie": {"bandwidth_gbps": 400.0, "latency_us": 2.0},
}


def with_article(name: str) -> str:
    """"an H200", "a B200": the article as the name's first letter is spoken."""
    return ("an " if name[:1].upper() in "AEFHILMNORSX" else "a ") + name


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
