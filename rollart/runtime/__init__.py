"""The real runtime: the same core, with effects executed on Ray actors.

Layout: ``driver`` runs core generators on asyncio; ``backend`` maps each effect to a Ray
call; ``cluster`` starts Ray/Redis and binds workers to pools; ``engines``, ``envs``,
``reward``, ``trainer`` and ``weights`` are the components behind small interfaces, each with
a CPU implementation (tested here) and a GPU one (vLLM, Megatron, NCCL; skipped without GPU)."""
