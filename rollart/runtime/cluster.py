"""Ray, pools as custom resources, and the ResourceManager that binds workers to pools.

Each logical pool of the plan (``h800``, ``h20``…) becomes a Ray custom resource
``rollart_pool_<name>`` with as many units as the runtime section gives it (real GPUs, or CPU
"virtual devices"), so a worker bound to a pool can only run where that pool's resource is.
Bindings are recorded in Redis: the live view the paper's resource manager keeps."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rollart.plan.schema import Plan


def resource_name(pool: str) -> str:
    return f"rollart_pool_{pool}"


def pool_capacities(plan: Plan) -> dict[str, int]:
    """Devices per logical pool for the real run: the runtime section, else one virtual
    device per generation worker placed on the pool (at least one)."""
    caps: dict[str, int] = {}
    for g in plan.placement.generation:
        caps[g.pool] = caps.get(g.pool, 0) + g.workers
    for name, rp in plan.runtime.pools.items():
        caps[name] = rp.count
    return {name: max(1, n) for name, n in caps.items()}


def start_ray(plan: Plan, address: str | None = None) -> None:
    """``ray.init`` locally with explicit CPUs, a small object store, no dashboard, and the
    pools as custom resources — or join an existing cluster at ``address``."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        return
    num_cpus = plan.runtime.num_cpus or max(2, os.cpu_count() or 2)
    resources = {resource_name(p): float(n) for p, n in pool_capacities(plan).items()}
    ray.init(num_cpus=num_cpus, resources=resources, object_store_memory=256 * 2**20,
             include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)


@dataclass
class ResourceManager:
    """Binds workers to pools by declared affinity, with fallback to a compatible pool when the
    preferred one is full or absent; every binding is written to Redis (when given)."""

    capacity: dict[str, int]
    redis: Any = None
    used: dict[str, int] = field(default_factory=dict)
    bindings: dict[str, str] = field(default_factory=dict)
    fallbacks: int = 0

    def bind(self, worker_id: str, preferred: str, compatible: list[str] | None = None) -> str:
        order = [preferred] + [p for p in (compatible or list(self.capacity)) if p != preferred]
        for pool in order:
            if pool in self.capacity and self.used.get(pool, 0) < self.capacity[pool]:
                self.used[pool] = self.used.get(pool, 0) + 1
                self.bindings[worker_id] = pool
                if pool != preferred:
                    self.fallbacks += 1
                self._record(worker_id, pool, preferred)
                return pool
        raise RuntimeError(f"no pool can host {worker_id}: preferred '{preferred}', capacities {self.capacity}, "
                           f"in use {self.used}")

    def release(self, worker_id: str) -> None:
        pool = self.bindings.pop(worker_id, None)
        if pool is not None:
            self.used[pool] -= 1
            if self.redis is not None:
                from rollart.runtime.redis_server import remove_binding

                remove_binding(self.redis, worker_id, reason="released")

    def ray_resources(self, pool: str) -> dict[str, float]:
        # Fractions let several workers share one virtual device's unit when asked to.
        return {resource_name(pool): 1.0}

    def _record(self, worker_id: str, pool: str, preferred: str) -> None:
        if self.redis is None:
            return
        from rollart.runtime.redis_server import record_binding, register_pool

        if not getattr(self, "_pools_registered", False):
            for name, cap in self.capacity.items():
                register_pool(self.redis, name, {"devices": cap}, resource=resource_name(name))
            self._pools_registered = True
        record_binding(self.redis, worker_id, pool, {"devices": 1}, preferred=preferred)
