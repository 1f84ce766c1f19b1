"""The fallback weight transport: buckets in Ray's object store.

``publish`` cuts the state into buckets (:mod:`.buckets`), ``ray.put``s each bucket once (as a
NumPy array, so readers on the same node map it without a copy) and hands the manifest and
the object refs to a small named registry actor; ``pull`` asks the registry for a version
(waiting until it is published), then fetches the buckets on a background thread while
copying the fetched ones into place. The registry keeps the newest ``keep`` versions (their
refs keep the objects alive); older ones are dropped.

The objects are owned by the publishing process (the trainer actor): they live as long as it
does. Open the store in the driver first so the registry's lifetime is the driver's::

    store = RayStoreSpec("weights").open()         # driver
    ray.get(trainer.publish.remote(store.spec, 1, 64 << 20))
    state = store.pull(1)                          # or store.pull_async(1).result()
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Mapping

from rollart.runtime.weights.buckets import AsyncPullMixin, Manifest, cut, pipelined_reassemble


class _Registry:
    """version → (manifest JSON, bucket refs); async so ``get`` can wait for a version."""

    def __init__(self, keep: int):
        self.keep = max(1, int(keep))
        self.versions: dict[int, tuple[str, list[Any]]] = {}
        self.events: dict[int, asyncio.Event] = {}

    def _event(self, version: int) -> asyncio.Event:
        if version not in self.events:
            self.events[version] = asyncio.Event()
        return self.events[version]

    async def put(self, version: int, manifest: str, refs: list[Any]) -> list[int]:
        self.versions[int(version)] = (manifest, list(refs))
        self._event(int(version)).set()
        dropped = sorted(self.versions)[:-self.keep]
        for v in dropped:
            del self.versions[v]
        for v in [v for v in self.events if v in dropped]:
            del self.events[v]
        return dropped

    async def get(self, version: int, timeout: float | None) -> tuple[str, list[Any]] | None:
        version = int(version)
        if version not in self.versions:
            if self.versions and version < min(self.versions):
                raise KeyError(f"weights version {version} was dropped (kept: {sorted(self.versions)})")
            try:
                await asyncio.wait_for(self._event(version).wait(), timeout)
            except asyncio.TimeoutError:
                return None
        return self.versions.get(version)

    async def latest(self) -> int | None:
        return max(self.versions) if self.versions else None

    async def versions_held(self) -> list[int]:
        return sorted(self.versions)


_REMOTE_REGISTRY: Any = None


def _registry_class() -> Any:
    global _REMOTE_REGISTRY
    if _REMOTE_REGISTRY is None:
        import ray

        _REMOTE_REGISTRY = ray.remote(num_cpus=0, max_restarts=0)(_Registry)
    return _REMOTE_REGISTRY


@dataclass(frozen=True)
class RayStoreSpec:
    """Where a :class:`RayObjectStore` lives; picklable, ``open()`` it in any Ray process."""

    name: str = "rollart-weights"
    namespace: str | None = None
    keep: int = 2

    def open(self) -> "RayObjectStore":
        return RayObjectStore(self.name, self.namespace, self.keep)


class RayObjectStore(AsyncPullMixin):
    """WeightStore over Ray's object store (needs ``ray.init`` in this process)."""

    name = "ray"

    def __init__(self, name: str = "rollart-weights", namespace: str | None = None, keep: int = 2):
        import ray

        if not ray.is_initialized():
            raise RuntimeError("RayObjectStore needs ray.init() first")
        self.spec = RayStoreSpec(name, namespace, keep)
        self._actor_name = f"{name}-registry"
        self.created = False
        try:
            self.registry = ray.get_actor(self._actor_name, namespace=namespace)
        except ValueError:
            self.registry = _registry_class().options(name=self._actor_name, namespace=namespace,
                                                      get_if_exists=True).remote(keep)
            self.created = True
        self.last_publish: dict[str, float] = {}
        self.last_pull: dict[str, float] = {}

    def publish(self, version: int, state: Mapping[str, Any], bucket_bytes: int) -> dict[str, float]:
        import ray

        t0 = time.perf_counter()
        manifest, buckets = cut(state, bucket_bytes, version=version)
        t1 = time.perf_counter()
        refs = [ray.put(b.numpy()) for b in buckets]
        t2 = time.perf_counter()
        ray.get(self.registry.put.remote(int(version), manifest.to_json(), refs))
        t3 = time.perf_counter()
        nbytes = manifest.total_bytes
        self.last_publish = {
            "seconds": t3 - t0, "cut_s": t1 - t0, "put_s": t2 - t1, "register_s": t3 - t2,
            "bytes": float(nbytes), "buckets": float(len(buckets)),
            "mib_per_s": nbytes / (1 << 20) / (t3 - t0) if t3 > t0 else 0.0,
        }
        return dict(self.last_publish)

    def pull(self, version: int, timeout: float | None = 120.0) -> dict[str, Any]:
        """Reassemble ``version``; blocks until it is published (``TimeoutError`` after ``timeout``)."""
        import ray

        t0 = time.perf_counter()
        got = ray.get(self.registry.get.remote(int(version), timeout))
        if got is None:
            raise TimeoutError(f"weights version {version} not published within {timeout} s")
        manifest_json, refs = got
        manifest = Manifest.from_json(manifest_json)
        wait_s = time.perf_counter() - t0
        state, timing = pipelined_reassemble(manifest, lambda i: ray.get(refs[i]))
        timing["wait_s"] = wait_s
        timing["seconds"] += wait_s
        self.last_pull = timing
        return state

    def latest(self) -> int | None:
        import ray

        return ray.get(self.registry.latest.remote())

    def close(self) -> None:
        self._shutdown_pulls()
        if self.created:
            import ray

            try:
                ray.kill(self.registry)
            except Exception:  # already gone with its owner
                pass
            self.created = False
