"""Ray, pools as custom resources, and the ResourceManager that binds workers to pools.

Each logical pool of the plan (``h800``, ``h20``…) becomes a Ray custom resource
``rollart_pool_<name>`` with as many units as the runtime section gives it (real GPUs, or CPU
"virtual devices"), so a worker bound to a pool can only run where that pool's resource is.
Bindings are recorded in Redis: the live view the paper's resource manager keeps."""

from __future__ import annotations

import contextlib
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


LOOPBACK = "127.0.0.1"


def require_token_auth() -> None:
    """Ray's token authentication on for this process and the Ray processes it starts (Ray
    2.60 turns it on by default for a new local cluster; an inherited ``RAY_AUTH_MODE=disabled``
    would leave the GCS, raylets, actor ports and the dashboard agent's job API open to anyone
    who reaches them, i.e. remote code execution as this user)."""
    os.environ["RAY_AUTH_MODE"] = "token"
    try:  # refresh Ray's cached config when Ray was imported (and configured) before
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()
    except Exception:  # noqa: BLE001 - an older/newer Ray without it reads the variable itself
        pass


@contextlib.contextmanager
def _loopback_addresses():  # noqa: ANN202
    """Ray turns a loopback node or GCS address into the host's address unless it believes it
    runs single-node (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``): while this is active a
    loopback address stays loopback, so a node started here binds 127.0.0.1. Set only while a
    node starts (its processes inherit it), so the rest of this process is unaffected."""
    from ray._private import ray_constants

    key = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    old_env, old_const = os.environ.get(key), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[key] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_const
        if old_env is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old_env


def init_local_ray(num_cpus: int, resources: dict[str, float] | None = None,
                   object_store_memory: int = 256 * 2**20) -> None:
    """A local Ray whose every process listens on 127.0.0.1 only, with token auth and no
    dashboard (node address 127.0.0.1, kept loopback: :func:`_loopback_addresses`)."""
    import ray

    require_token_auth()
    with _loopback_addresses():
        # address="local": always a new instance, never a `ray start` cluster found on this machine
        ray.init(address="local", num_cpus=num_cpus, resources=resources or {},
                 object_store_memory=object_store_memory, include_dashboard=False, ignore_reinit_error=True,
                 log_to_driver=False, _node_ip_address=LOOPBACK)


def _is_loopback_address(address: str) -> bool:
    from rollart.runtime.sockets import is_loopback_host

    return is_loopback_host(address.rsplit(":", 1)[0].strip("[]"))


_DEATH_MARKERS = ("OOM killer", "worker died or was killed", "Worker unexpectedly exits")


def quiet_worker_death_messages() -> None:
    """Ray's driver prints every worker death it hears of with a paragraph that suggests the
    OOM killer, also when a worker was killed on purpose or crashed. The runtime restarts such
    workers and counts what they lost, so one line says it instead (once per message)."""
    import sys

    from ray._private import worker as ray_worker

    original = getattr(ray_worker.print_to_stdstream, "__wrapped__", ray_worker.print_to_stdstream)

    def printer(data: dict, ignore_prefix: bool) -> None:
        lines = data.get("lines") or []
        if data.get("pid") == "raylet" and any(m in line for line in lines for m in _DEATH_MARKERS):
            print("rollart: a Ray worker process died (killed, crashed or out of memory); the run restarts "
                  "it and counts the work it lost", file=sys.stderr)
            return
        original(data, ignore_prefix)

    printer.__wrapped__ = original  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = printer


def start_ray(plan: Plan, address: str | None = None) -> None:
    """A local Ray on loopback (explicit CPUs, a small object store, no dashboard, token auth,
    the pools as custom resources) — or join an existing cluster at ``address`` (``HOST:PORT``
    of its GCS), authenticating with its token (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
    ``~/.ray/auth_token``). A joined cluster must offer each pool's custom resource."""
    import ray

    quiet_worker_death_messages()
    if ray.is_initialized():
        return
    if address:
        require_token_auth()
        local = _is_loopback_address(address)  # a cluster on this machine's loopback (tests)
        try:
            with _loopback_addresses() if local else contextlib.nullcontext():
                ray.init(address=address, ignore_reinit_error=True, log_to_driver=False,
                         _node_ip_address=LOOPBACK if local else None)
        except Exception as exc:  # noqa: BLE001 - one line for the user, not Ray's traceback
            raise ClusterError(f"--address {address}: cannot join the Ray cluster ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''}); is it running, and is its token "
                               "in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token?") from None
        missing = check_cluster_pools(plan)
        if missing:
            ray.shutdown()
            raise ClusterError(missing)
        return
    num_cpus = plan.runtime.num_cpus or max(2, os.cpu_count() or 2)
    resources = {resource_name(p): float(n) for p, n in pool_capacities(plan).items()}
    init_local_ray(num_cpus, resources)


class ClusterError(RuntimeError):
    """The Ray cluster cannot host the plan (unreachable, or a pool's resource is missing)."""


def check_cluster_pools(plan: Plan) -> str | None:
    """None when the running cluster offers every pool's custom resource in the units the
    plan needs, else a one-line message naming what is missing (the plan stays the same on
    one machine and many: a node offers a pool with ``ray start --resources``)."""
    import ray

    have = ray.cluster_resources()
    short = [f"{resource_name(p)} (need {n}, cluster has {have.get(resource_name(p), 0):g})"
             for p, n in pool_capacities(plan).items() if have.get(resource_name(p), 0) < n]
    if not short:
        return None
    return ("the Ray cluster lacks pool resources: " + ", ".join(short) +
            "; start a node for each pool with e.g. `ray start --address HOST:PORT --resources "
            f"'{{\"{resource_name(next(iter(pool_capacities(plan))))}\": N}}'`")


def head_node_resource() -> dict[str, float]:
    """Ray options that place an actor on the head node (Ray gives the head
    ``node:__internal_head__``): the run's Redis and weight store live there."""
    return {"node:__internal_head__": 0.001}


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
