"""Worker/Cluster decorators and the ResourceManager on a local Ray (pools as custom resources)."""

from __future__ import annotations

from pathlib import Path


import pytest

ray = pytest.importorskip("ray")

from rollart.runtime.cluster import ResourceManager, resource_name  # noqa: E402
from rollart.runtime.decorators import Cluster, Worker, hw_mapping, register, register_serverless  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    from rollart.runtime.cluster import init_local_ray

    init_local_ray(2, {resource_name("h800"): 2, resource_name("h20"): 2}, object_store_memory=200_000_000)
    yield
    ray.shutdown()


class Gen(Worker):
    def __init__(self, pool: str = "default", rank: int = 0, scale: int = 1):
        super().__init__(pool, rank)
        self.scale = scale
        self.version = 0

    @register(mode="execute_all")
    def set_version(self, v: int) -> tuple[int, int]:
        self.version = v
        return self.rank, v

    @hw_mapping(hw_affinity={"FrozenLake": "h800", "default": "h20"})
    def generate(self, prompt: str, tag_name: str) -> tuple[str, str]:
        return self.pool, prompt * self.scale

    @register(mode="execute_one")
    def where(self) -> str:
        return self.pool


def test_execute_all_broadcasts_and_gathers(local_ray) -> None:
    cluster = Cluster(Gen, {"h800": 1, "h20": 2}, ResourceManager({"h800": 2, "h20": 2}), actor_options={"num_cpus": 0})
    assert sorted(cluster.set_version(7)) == [(0, 7), (1, 7), (2, 7)]
    assert cluster.where() in ("h800", "h20")


def test_hw_mapping_routes_by_tag_with_default(local_ray) -> None:
    cluster = Cluster(Gen, {"h800": 1, "h20": 1}, ResourceManager({"h800": 2, "h20": 2}),
                      actor_options={"num_cpus": 0}, scale=2)
    assert cluster.generate("ab", tag_name="FrozenLake") == ("h800", "abab")
    assert cluster.generate("ab", tag_name="GEM-Math") == ("h20", "abab")


def test_hw_mapping_falls_back_when_the_pool_has_no_worker(local_ray) -> None:
    cluster = Cluster(Gen, {"h20": 1}, ResourceManager({"h800": 2, "h20": 2}), actor_options={"num_cpus": 0})
    assert cluster.generate("x", tag_name="FrozenLake")[0] == "h20"


def test_resource_manager_binds_with_fallback_and_records_in_redis() -> None:
    from rollart.runtime.redis_server import RedisServer, bindings

    import redis

    with RedisServer() as server:
        with pytest.raises(redis.exceptions.AuthenticationError):  # a generated password guards it
            redis.Redis(host="127.0.0.1", port=server.port).ping()
        assert server.password not in " ".join(Path(f"/proc/{server.proc.pid}/cmdline").read_text().split("\0"))
        r = server.client(decode_responses=False)
        rm = ResourceManager({"h800": 1, "h20": 2}, r)
        assert rm.bind("w0", "h800") == "h800"
        assert rm.bind("w1", "h800") == "h20"  # h800 full: compatible pool
        assert rm.fallbacks == 1
        recorded = bindings(r)
        assert set(recorded) == {"w0", "w1"}
        rm.release("w0")
        assert rm.bind("w2", "h800") == "h800"
        with pytest.raises(RuntimeError, match="no pool can host"):
            rm.bind("w3", "h20") and rm.bind("w4", "h20")


def test_register_serverless_replaces_the_attribute() -> None:
    @register_serverless(attribute="score", serverless_url="http://127.0.0.1:9/none")
    class Reward(Worker):
        def score(self, record: dict) -> float:
            raise AssertionError("replaced by the endpoint call")

    assert Reward.__rollart_serverless__["attribute"] == "score"
    assert Reward().score({"task": "x"}) is None  # endpoint down: None after retries, never raises
