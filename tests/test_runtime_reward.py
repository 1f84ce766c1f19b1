"""Reward over HTTP: the stdlib client against local stub servers (fast), and the Ray Serve
deployment that scales from zero (slow: starts a local Ray)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollart.runtime.reward.serverless import HttpReward, free_port

MATH_RIGHT = {"steps": [{"action": "so \\boxed{42}", "info": {"reference": "42"}}]}
MATH_WRONG = {"steps": [{"action": "\\boxed{41}", "info": {"reference": "42"}}]}


class _Stub:
    """A tiny HTTP endpoint: ``behaviour(call_index) -> (status, body, delay_s)``."""

    def __init__(self, behaviour):
        self.calls = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                stub.calls += 1
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, body, delay = behaviour(stub.calls)
                time.sleep(delay)
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/reward"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_client_against_a_dead_port_fails_cleanly_after_retries():
    client = HttpReward(f"http://127.0.0.1:{free_port()}/reward", timeout_s=1.0, retries=3, backoff_s=0.05)
    t0 = time.monotonic()
    score, attempts, error = client.score("GEM-Math", MATH_RIGHT)
    elapsed = time.monotonic() - t0
    assert score is None and attempts == 4 and error.startswith("unreachable")
    assert elapsed < 0.05 + 0.1 + 0.2 + 1.0  # the three backoffs plus slack; a refused connect is instant
    assert client.stats()["failures"] == 1 and client.stats()["retries_used"] == 3


def test_client_times_out_a_slow_endpoint_per_call():
    with _Stub(lambda i: (200, {"score": 1.0}, 1.5)) as stub:
        client = HttpReward(stub.url, timeout_s=0.2, retries=1, backoff_s=0.05)
        t0 = time.monotonic()
        score, attempts, error = client("GEM-Math", MATH_RIGHT)
        elapsed = time.monotonic() - t0
    assert score is None and attempts == 2 and "timeout" in error
    assert elapsed < 2 * 0.2 + 0.05 + 0.5
    assert client.timeouts == 2 and client.failures == 1


def test_client_retries_server_errors_but_not_bad_requests():
    with _Stub(lambda i: (503, {"error": "warming up"}, 0) if i < 3 else (200, {"score": 0.5}, 0)) as stub:
        client = HttpReward(stub.url, timeout_s=2.0, retries=3, backoff_s=0.01)
        assert client("GEM-Math", MATH_RIGHT) == (0.5, 3, None)
        assert client.successes == 1 and client.retries_used == 2
        assert client.score({"task": "GEM-Math", **MATH_RIGHT}) == (0.5, 1, None)  # one-argument form
    with _Stub(lambda i: (400, {"error": "no rule"}, 0)) as stub:
        client = HttpReward(stub.url, timeout_s=2.0, retries=3, backoff_s=0.01)
        score, attempts, error = client("WebShop", {})
        assert score is None and attempts == 1 and error.startswith("HTTP 400") and stub.calls == 1
    with _Stub(lambda i: (200, {"nothing": 1}, 0)) as stub:
        score, attempts, error = HttpReward(stub.url, retries=2)("GEM-Math", MATH_RIGHT)
        assert score is None and attempts == 1 and "no 'score'" in error
    # Never raises, even for a record that is not JSON.
    score, attempts, error = HttpReward("http://127.0.0.1:9/x", retries=0)("GEM-Math", {"x": object()})
    assert score is None and attempts == 0 and error.startswith("client error")


# ---------------------------------------------------------------- Ray Serve (slow)


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.serve")
    from rollart.runtime.cluster import init_local_ray

    init_local_ray(2, object_store_memory=200_000_000)  # loopback only, token auth on
    try:
        yield ray
    finally:
        from rollart.runtime.reward.serverless import shutdown_reward

        try:
            shutdown_reward()
        finally:
            ray.shutdown()


@pytest.mark.slow
def test_serve_reward_scales_from_zero_and_scores_over_http(local_ray):
    from rollart.runtime.reward.serverless import deploy_reward, replica_count

    url = deploy_reward("reward_test", max_replicas=2, initial_replicas=0, downscale_delay_s=2.0)
    assert url.startswith("http://127.0.0.1:") and url.endswith("/reward_test")
    assert replica_count("reward_test") == 0
    client = HttpReward(url, timeout_s=60.0, retries=2, backoff_s=0.5)  # generous: a cold start on a busy CI box
    t0 = time.monotonic()
    score, attempts, error = client.score("GEM-Math", MATH_RIGHT)
    cold = time.monotonic() - t0
    assert (score, error) == (1.0, None), error
    assert replica_count("reward_test") >= 1
    t0 = time.monotonic()
    assert client.score("GEM-Math", MATH_WRONG)[0] == 0.0
    warm = time.monotonic() - t0
    assert client.score("CodeExec", {"steps": [{"info": {"passed": True}}]})[0] == 1.0
    # every port a replica opens is on the loopback address: its inter-deployment gRPC server too,
    # which Ray Serve binds to [::] unless told otherwise (serverless.bind_replica_grpc_to_node_address)
    from rollart.runtime.sockets import is_loopback_host, listening

    replica_ports = [(s.address, s.port) for s in listening() if any(n.startswith("ray::ServeRepli") for n in s.names)]
    assert replica_ports and all(is_loopback_host(a) for a, _ in replica_ports), replica_ports
    score, attempts, error = client.score("WebShop", {"steps": []})
    assert score is None and attempts == 1 and "HTTP 400" in error  # a 400 is not retried
    print(f"serve reward: cold start {cold:.2f} s, warm call {warm * 1000:.1f} ms")


@pytest.mark.slow
def test_env_worker_runs_as_a_ray_actor(local_ray):
    from rollart.runtime.envs.worker import remote_env_worker

    ray = local_ray
    worker = remote_env_worker(num_cpus=0, max_concurrency=8)
    assert ray.get(worker.reset.remote("t1", "FrozenLake", 0), timeout=60)["ok"]
    from rollart.runtime.envs.gem_envs import load_math_rows

    r = ray.get(worker.reset.remote("m", "GEM-Math", 2), timeout=60)
    assert r["ok"], r
    answer = load_math_rows()[2]["answer"]
    r = ray.get(worker.step.remote("m", f"\\boxed{{{answer}}}"), timeout=60)  # graded off the main thread
    assert r["ok"] and r["reward"] == 1.0 and r["done"], r
    res = ray.get([worker.step.remote("t1", "DOWN"), worker.step.remote("nope", "x")], timeout=60)
    assert res[0]["ok"] and res[0]["info"]["position"] == [1, 0]
    assert not res[1]["ok"]
    assert ray.get(worker.close.remote("t1")) is True
    ray.kill(worker)
