"""The run's shared services on the Ray head node: the resource-binding Redis and, when the
plan asks for it and it may listen, the Mooncake master.

:class:`HeadServices` is a Ray actor pinned to the head (``node:__internal_head__``), so on a
multi-node cluster they live with the GCS whatever machine the driver runs on; on one machine
it is the same machine. Its children (``redis-server``, ``mooncake_master``) carry
``PR_SET_PDEATHSIG``: they die with the actor, which dies with its owner, the driver.

Binding: ``host`` is 127.0.0.1 for a local run (and whenever the driver runs on the head);
otherwise the head's node address, where Redis is still password-protected.
"""

from __future__ import annotations

from typing import Any


class HeadServices:
    def __init__(self, host: str = "127.0.0.1"):
        from rollart.runtime.redis_server import RedisServer

        self.host = host
        self.redis = RedisServer(host=host).start()
        self.master: Any = None

    def redis_address(self) -> tuple[str, int, str]:
        """(host, port, password) of the run's Redis."""
        return self.redis.host, self.redis.port, self.redis.password

    def start_mooncake(self, host: str | None = None) -> Any:
        """Start the Mooncake master here on ``host`` (default: where Redis listens; on a
        multi-node cluster the head's address, which every node's clients must reach); its
        picklable store spec."""
        from rollart.runtime.weights import mooncake_store

        if self.master is None:
            self.master = mooncake_store.start_master(host or self.host)
        return self.master.spec()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def pids(self) -> dict[str, int]:
        """The children's pids (tests check they die with the driver)."""
        out = {"actor": __import__("os").getpid()}
        if self.redis.proc is not None:
            out["redis"] = self.redis.proc.pid
        if self.master is not None and self.master.proc is not None:
            out["mooncake_master"] = self.master.proc.pid
        return out

    def close(self) -> None:
        if self.master is not None:
            self.master.close()
            self.master = None
        self.redis.stop()


def start_head_services(host: str) -> Any:
    """The HeadServices actor on the head node (sync actor: its methods run on the actor's
    main thread, which lives as long as the actor, so PDEATHSIG fires only when it dies)."""
    import ray

    from rollart.runtime.cluster import head_node_resource

    cls = ray.remote(HeadServices)
    return cls.options(num_cpus=0, resources=head_node_resource(), max_restarts=0).remote(host)
