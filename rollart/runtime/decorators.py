"""The paper's Worker / Cluster programming model on Ray.

A :class:`Worker` is a plain class whose methods are tagged with how a :class:`Cluster` of
them exposes the method to the single controller::

    class ActorGen(Worker):
        @register(mode="execute_all")           # broadcast to every worker, gather results
        def set_version(self, v): ...

        @hw_mapping(hw_affinity={"FrozenLake": "h800", "default": "h20"})
        def generate(self, prompt, tag_name): ...   # routed by tag_name to a worker of that pool

    @register_serverless(attribute="score", serverless_url="http://127.0.0.1:8000/reward")
    class Reward(Worker):
        def score(self, record): ...            # replaced by a call to the endpoint

    gen = Cluster(ActorGen, {"h800": 2, "h20": 2}, resources)   # Ray actors bound to pools
    gen.set_version(3)                 # -> [None, None, None, None]
    gen.generate("...", tag_name="FrozenLake")   # -> runs on an h800 worker

Routing of ``hw_mapping`` calls falls back to a worker of another pool when the preferred
pool has none (a compatible class), and balances by outstanding calls within a pool.
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_DISPATCH = "__rollart_dispatch__"


def register(mode: str = "execute_all") -> Callable[[F], F]:
    """``execute_all``: the Cluster calls every worker and returns the list of results;
    ``execute_one``: one worker (round robin) and its result."""
    if mode not in ("execute_all", "execute_one"):
        raise ValueError(f"register(mode=...): unknown mode '{mode}'; modes are: execute_all, execute_one")

    def mark(fn: F) -> F:
        setattr(fn, _DISPATCH, ("register", mode))
        return fn

    return mark


def hw_mapping(hw_affinity: dict[str, str]) -> Callable[[F], F]:
    """Route each call by its ``tag_name`` keyword to a worker of ``hw_affinity[tag]``
    (or ``hw_affinity["default"]``)."""
    affinity = dict(hw_affinity)

    def mark(fn: F) -> F:
        setattr(fn, _DISPATCH, ("hw_mapping", affinity))
        return fn

    return mark


def register_serverless(attribute: str, serverless_url: str, timeout_s: float = 30.0, retries: int = 2):
    """Class decorator: ``attribute`` becomes a call to the serverless endpoint (POST JSON of
    the first argument); failures return ``None`` after the retries instead of raising."""

    def wrap(cls: type) -> type:
        if not hasattr(cls, attribute):
            raise AttributeError(f"register_serverless: {cls.__name__} has no attribute '{attribute}'")

        def call(self: Any, payload: Any, *args: Any, **kwargs: Any) -> Any:
            from rollart.runtime.reward.serverless import HttpReward

            client = getattr(self, "_serverless_client", None)
            if client is None:
                client = HttpReward(serverless_url, timeout_s=timeout_s, retries=retries)
                self._serverless_client = client
            score, _attempts, _error = client.score(payload)
            return score

        functools.update_wrapper(call, getattr(cls, attribute))
        setattr(cls, attribute, call)
        cls.__rollart_serverless__ = {"attribute": attribute, "url": serverless_url}
        return cls

    return wrap


class Worker:
    """Base class of cluster members. ``pool`` is set when the Cluster creates the worker."""

    def __init__(self, pool: str = "default", rank: int = 0):
        self.pool = pool
        self.rank = rank

    def ping(self) -> tuple[str, int]:
        return self.pool, self.rank


class Cluster:
    """Ray actors of one Worker class, bound to pools, with the decorated methods installed.

    ``pools`` maps pool name → number of workers; ``resources`` (a ResourceManager or None)
    decides which Ray resources each worker asks for and falls back when a pool is full."""

    def __init__(self, worker_cls: type, pools: dict[str, int], resources: Any = None,
                 actor_options: dict[str, Any] | None = None, **init_kwargs: Any):
        import ray

        if not ray.is_initialized() and resources is not None:
            # Used on its own (the README's Listing 1): a local Ray whose custom resources are the
            # ResourceManager's pools, and workers that hold a pool's device, not a CPU each
            # (else the fourth worker on a 2-core machine waits forever).
            from rollart.runtime import cluster as _cluster

            pools_as_resources = {_cluster.resource_name(p): float(n) for p, n in resources.capacity.items()}
            start = getattr(_cluster, "init_local_ray", None)
            if start is not None:
                start(max(2, os.cpu_count() or 2), pools_as_resources)
            else:  # pragma: no cover - older runtime
                ray.init(num_cpus=max(2, os.cpu_count() or 2), resources=pools_as_resources, include_dashboard=False,
                         log_to_driver=False)
            actor_options = {"num_cpus": 0, **(actor_options or {})}
        self.worker_cls = worker_cls
        remote_cls = ray.remote(worker_cls)
        self.workers: list[Any] = []
        self.pools: list[str] = []
        rank = itertools.count()
        for pool, count in pools.items():
            for _ in range(count):
                r = next(rank)
                bound = resources.bind(f"{worker_cls.__name__}-{r}", pool) if resources is not None else pool
                options = dict(actor_options or {})
                if resources is not None:
                    options["resources"] = resources.ray_resources(bound)
                self.workers.append(remote_cls.options(**options).remote(pool=bound, rank=r, **init_kwargs))
                self.pools.append(bound)
        self._outstanding = [0] * len(self.workers)
        self._round_robin = itertools.count()
        for name in dir(worker_cls):
            fn = getattr(worker_cls, name, None)
            tag = getattr(fn, _DISPATCH, None)
            if tag is not None:
                setattr(self, name, self._dispatcher(name, tag))

    def _dispatcher(self, name: str, tag: tuple[str, Any]) -> Callable[..., Any]:
        import ray

        kind, arg = tag
        if kind == "register" and arg == "execute_all":
            def execute_all(*args: Any, **kwargs: Any) -> list[Any]:
                return ray.get([getattr(w, name).remote(*args, **kwargs) for w in self.workers])
            return execute_all
        if kind == "register":
            def execute_one(*args: Any, **kwargs: Any) -> Any:
                w = self.workers[next(self._round_robin) % len(self.workers)]
                return ray.get(getattr(w, name).remote(*args, **kwargs))
            return execute_one

        affinity: dict[str, str] = arg

        def routed(*args: Any, tag_name: str, **kwargs: Any) -> Any:
            i = self.route(tag_name, affinity)
            self._outstanding[i] += 1
            try:
                return ray.get(getattr(self.workers[i], name).remote(*args, tag_name=tag_name, **kwargs))
            finally:
                self._outstanding[i] -= 1
        return routed

    def route(self, tag_name: str, affinity: dict[str, str]) -> int:
        """Index of the worker for ``tag_name``: the preferred pool's least-busy worker, else
        (no worker there) the least-busy worker of any pool."""
        pool = affinity.get(tag_name, affinity.get("default"))
        candidates = [i for i, p in enumerate(self.pools) if p == pool] or list(range(len(self.workers)))
        return min(candidates, key=lambda i: (self._outstanding[i], i))
