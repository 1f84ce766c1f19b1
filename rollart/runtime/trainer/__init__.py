"""Trainers: GRPO on torch (CPU), a Megatron adapter for GPUs."""
