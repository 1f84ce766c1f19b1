"""`rollart run PLAN --address HOST:PORT` on a two-node Ray cluster built on this machine's
loopback (`ray start --head` + `ray start --address`, each node offering one pool as a custom
resource, token auth on): the same plan file as a one-machine run, each pool's workers on the
node that offers it, Redis on the head; a cluster that lacks a pool is a one-line error."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from rollart.runtime.cluster import resource_name  # noqa: E402

pytestmark = pytest.mark.slow
DIGITS = Path(__file__).parents[1] / "scenarios" / "local" / "digits.yaml"
ROLLART = str(Path(sys.executable).parent / "rollart")

# `ray start --node-ip-address 127.0.0.1` turns a loopback address into the host's address
# (Ray assumes a multi-node cluster spans hosts); two nodes on one machine's loopback need it kept
RAY_CLI = ("import sys; import ray._private.services as s; s.resolve_ip_for_localhost = lambda h: h; "
           "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()")


def _ray(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RAY_CLI, *args], env=env, capture_output=True, text=True,
                          timeout=180)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(temp_dir: str) -> None:
    """Stop this cluster's processes only (``ray stop`` would stop every Ray on the machine):
    each of them names the cluster's own temp dir on its command line."""
    from rollart.runtime.procs import descendants, pids

    mine = set()
    for pid, path in pids():
        try:
            if temp_dir.encode() in Path(path, "cmdline").read_bytes():
                mine.add(pid)
        except OSError:
            pass
    for pid in list(mine):
        mine |= set(descendants(pid))
    for pid in mine:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    token = tmp / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    temp_dir = tempfile.mkdtemp(prefix="rr-")  # short: Ray's Unix socket paths live under it
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    port = _free_port()
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--object-store-memory=150000000",
              "--disable-usage-stats"]
    try:
        head = _ray(env, "start", "--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp_dir}",
                    *common, f"--resources={json.dumps({resource_name('pool_a'): 2})}")
        assert head.returncode == 0, head.stderr[-3000:]
        worker = _ray(env, "start", f"--address=127.0.0.1:{port}", f"--temp-dir={temp_dir}", *common,
                      f"--resources={json.dumps({resource_name('pool_b'): 2})}")
        assert worker.returncode == 0, worker.stderr[-3000:]
        yield f"127.0.0.1:{port}", env
    finally:
        _stop(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_run_joins_a_two_node_cluster_with_the_same_plan(two_nodes, tmp_path: Path) -> None:
    address, env = two_nodes
    out = subprocess.run([ROLLART, "run", str(DIGITS), "--steps", "3", "--address", address, "-q", "--json", "r.json"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert summary["steps_done"] == 3
    nodes = summary["cluster_nodes"]
    assert len(nodes) == 2 and sum(n["head"] for n in nodes.values()) == 1
    assert nodes[summary["head_services_node"]]["head"]  # Redis on the head node
    for w in summary["engine_steps"]:  # each pool's worker on the node that offers the pool
        assert w["pool"] in nodes[w["node"]]["pools"], (w, nodes)
    assert {nodes[w["node"]]["head"] for w in summary["engine_steps"]} == {True, False}
    # Digits is routed to pool_b (hw_affinity): its worker, on the second node, did the generation
    busy = [w for w in summary["engine_steps"] if w["steps"] > 0]
    assert busy and all(w["pool"] == "pool_b" and not nodes[w["node"]]["head"] for w in busy)
    # the same file runs on one machine without --address (see test_runtime_run); nothing in it names nodes
    assert "127.0.0.1" not in DIGITS.read_text()


def test_a_cluster_without_the_plans_pool_is_a_one_line_error(two_nodes, tmp_path: Path) -> None:
    address, env = two_nodes
    t0 = time.monotonic()
    out = subprocess.run([ROLLART, "run", str(DIGITS), "--steps", "1", "--address", address, "-q",
                          "--set", "runtime.pools.pool_b.count=8"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "rollart_pool_pool_b (need 8, cluster has 2)" in out.stderr and "Traceback" not in out.stderr
    assert time.monotonic() - t0 < 120


def test_a_wrong_token_is_refused(two_nodes, tmp_path: Path) -> None:
    address, env = two_nodes
    bad = tmp_path / "bad-token"
    bad.write_text(secrets.token_hex(32))
    out = subprocess.run([ROLLART, "run", str(DIGITS), "--steps", "1", "--address", address, "-q"],
                         cwd=tmp_path, env={**env, "RAY_AUTH_TOKEN_PATH": str(bad)}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and "cannot join the Ray cluster" in out.stderr, out.stderr[-2000:]
