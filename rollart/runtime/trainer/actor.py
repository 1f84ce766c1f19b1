"""The trainer as a Ray actor.

:class:`TrainerWorker` is a plain class holding a :class:`~.grpo.GRPOTrainer` (``backend=
"torch"``) or a :class:`~.megatron.MegatronTrainer` (``backend="megatron"``); ``TrainerActor``
is the same class made a Ray actor on first use (Ray is imported only then)::

    trainer = TrainerActor.options(num_cpus=1, resources={"h800": 1}).remote("Qwen3-tiny", lr=1e-4, seed=0)
    metrics = ray.get(trainer.train_step.remote(samples, 1))
    timing = ray.get(trainer.publish.remote(store.spec, 1, 64 << 20))

``publish(store_spec, version, bucket_bytes)`` opens the store from its picklable spec
(:class:`~rollart.runtime.weights.ray_store.RayStoreSpec`,
:class:`~rollart.runtime.weights.mooncake_store.MooncakeStoreSpec`, anything with ``open()``)
inside the actor, once per spec, and publishes the trainer's current weights through it; the
store stays open (the Mooncake publisher's segment holds the published buckets, Ray objects
are owned by this actor), so the actor must outlive the pulls of what it published.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from rollart.runtime.heap import SettlesHeap
from rollart.runtime.trainer.grpo import Sample


class TrainerWorker(SettlesHeap):
    def __init__(self, spec: Any, lr: float, seed: int, backend: str = "torch", **kwargs: Any):
        if backend == "torch":
            from rollart.runtime.trainer.grpo import GRPOTrainer

            self.trainer: Any = GRPOTrainer(spec, lr, seed, **kwargs)
        elif backend == "megatron":
            from rollart.runtime.trainer.megatron import MegatronTrainer

            self.trainer = MegatronTrainer(spec, lr, seed, **kwargs)
        else:
            raise ValueError(f"unknown trainer backend '{backend}' (torch or megatron)")
        self.backend = backend
        self._stores: dict[Any, Any] = {}

    def info(self) -> dict[str, Any]:
        return {"backend": self.backend, "step": self.trainer.step, "version": self.trainer.version,
                "model": self.trainer.spec.name, "pid": os.getpid()}

    def train_step(self, samples: Sequence[Sample], version: int | None = None) -> dict[str, float]:
        return self.trainer.train_step(list(samples), version)

    def logprobs(self, samples: Sequence[Sample]) -> list[list[float]]:
        return self.trainer.logprobs(list(samples))

    def state_dict(self, dtype: str | None = None) -> dict[str, Any]:
        return self.trainer.state_dict(dtype)

    def publish(self, store_spec: Any, version: int | None, bucket_bytes: int) -> dict[str, float]:
        """Publish the current weights as ``version`` (default: the trainer's version)."""
        store = self._stores.get(store_spec)
        if store is None:
            store = self._stores[store_spec] = store_spec.open()
        v = self.trainer.version if version is None else int(version)
        timing = dict(store.publish(v, self.trainer.state_dict(), int(bucket_bytes)))
        timing["version"] = float(v)
        return timing

    def save_checkpoint(self, directory: str, step: int | None = None, version: int | None = None) -> str:
        return str(self.trainer.save_checkpoint(Path(directory), step, version))

    def load_checkpoint(self, directory: str) -> tuple[int, int]:
        return self.trainer.load_checkpoint(Path(directory))

    def close_stores(self) -> None:
        stores, self._stores = self._stores, {}
        for s in stores.values():
            try:
                s.close()
            except Exception:
                pass


class _LazyActor:
    """``ray.remote(cls)`` made on first use, so importing this module does not import Ray."""

    def __init__(self, cls: type):
        self._cls = cls
        self._remote: Any = None

    def _actor_class(self) -> Any:
        if self._remote is None:
            import ray

            self._remote = ray.remote(self._cls)
        return self._remote

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._actor_class().remote(*args, **kwargs)

    def options(self, **options: Any) -> Any:
        return self._actor_class().options(**options)


TrainerActor = _LazyActor(TrainerWorker)


def samples_from(records: Sequence[Mapping[str, Any]]) -> list[Sample]:
    """Samples from plain dicts (e.g. trajectories serialised by another process)."""
    return [Sample(**dict(r)) for r in records]
