"""Serverless reward: a Ray Serve deployment that scales to zero, and a robust HTTP client.

Wire format (any endpoint that speaks it works with :class:`HttpReward`)::

    POST <url>   {"task": "GEM-Math", "record": {...trajectory record, see rules.py...}}
    200          {"score": 1.0}
    400          {"error": "..."}        (a record no rule can score: not retried)

(a) :func:`deploy_reward` runs :class:`RewardScorer` (the rule functions of
:mod:`rollart.runtime.reward.rules`) as the Serve deployment ``RewardDeployment`` with
``min_replicas=0`` autoscaling, HTTP on 127.0.0.1, and returns its URL;
:func:`shutdown_reward` stops Serve. Ray and Serve are imported only when deploying, so the
client side needs neither.

(b) :class:`HttpReward` is the client: standard library only (``urllib``), a per-attempt
timeout, retries with exponential backoff, and counters. It never raises: each call returns
``(score | None, attempts, error)``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from typing import Any

from rollart.runtime.reward import rules
from rollart.runtime.sockets import is_loopback_host

DEPLOYMENT_NAME = "RewardDeployment"

# ---------------------------------------------------------------- (a) the deployment


def bind_replica_grpc_to_node_address() -> None:
    """Ray Serve 2.60's replica starts an inter-deployment gRPC server on ``[::]:0``, every interface,
    with no setting to change it (``ray/serve/_private/replica.py``, ``_on_initialized``). Called from
    the replica's callable, which is built before that server binds, this rewrites a wildcard host to
    the node's own Ray address: 127.0.0.1 on a local run, the node's private address in a cluster.
    Outside a Serve replica it does nothing."""
    import sys

    replica = sys.modules.get("ray.serve._private.replica")
    bind = getattr(replica, "add_port_to_grpc_server", None)
    if bind is None or getattr(bind, "rollart_node_address", False):
        return
    import ray

    node = ray.util.get_node_ip_address()
    host = f"[{node}]" if ":" in node else node

    def bind_on_node(server: Any, address: str) -> int:
        wildcard, _, port = address.rpartition(":")
        return bind(server, f"{host}:{port}" if wildcard in ("[::]", "0.0.0.0", "") else address)

    bind_on_node.rollart_node_address = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = bind_on_node  # type: ignore[union-attr]


class RewardScorer:
    """The replica's callable: a JSON request → ``{"score": float}`` (or a 400)."""

    def __init__(self) -> None:
        bind_replica_grpc_to_node_address()

    def score(self, payload: dict) -> float:
        record = payload.get("record", payload)
        return rules.score(payload.get("task"), record)

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        try:
            payload = await request.json()
            if not isinstance(payload, dict):
                raise ValueError("the body must be a JSON object")
            return JSONResponse({"score": self.score(payload)})
        except (ValueError, TypeError) as exc:
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=400)


_state: dict[str, Any] = {"port": None, "host": None, "apps": set()}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (a race remains until someone binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def deploy_reward(name: str = "reward", port: int | None = None, *, host: str = "127.0.0.1",
                  max_replicas: int = 2, initial_replicas: int = 0, downscale_delay_s: float = 2.0,
                  look_back_period_s: float = 2.0, metrics_interval_s: float = 0.5,
                  target_ongoing_requests: float = 2.0,
                  num_cpus: float = 0.1) -> str:
    """Deploy the rule reward as a scale-to-zero Serve application; returns its URL.

    Ray must be initialised by the caller (``ray.init(...)`` with the runtime's options); if it
    is not, a small local Ray is started. The HTTP proxy binds ``host:port`` (a free port when
    None) the first time Serve starts in this Ray cluster; later deployments reuse it.

    Autoscaling: between 0 and ``max_replicas`` replicas (``num_cpus`` each), starting with
    ``initial_replicas``; aims at ``target_ongoing_requests`` per replica; scales up at once
    and down (to zero too) after ``downscale_delay_s`` of low load, averaged over
    ``look_back_period_s``; the router reports its queue every ``metrics_interval_s``.
    Measured here (2 cores): cold start from zero ~2.2–3.5 s, warm call ~10 ms, back to zero
    ~4 s after the last call."""
    import ray
    from ray import serve

    if not 0 <= initial_replicas <= max_replicas:
        raise ValueError(f"initial_replicas must be in [0, max_replicas={max_replicas}], got {initial_replicas}")
    if not ray.is_initialized():  # loopback only, token auth on
        from rollart.runtime.cluster import init_local_ray

        init_local_ray(2, object_store_memory=200_000_000)
    if _state["port"] is None:
        port = port or free_port(host)
        serve.start(http_options={"host": host, "port": port})
        _state["port"], _state["host"] = port, host
    elif port is not None and port != _state["port"]:
        raise ValueError(f"Serve already listens on {_state['host']}:{_state['port']}; "
                         f"shut it down (shutdown_reward) to use port {port}")
    # ``metrics_interval_s`` is the handle's metrics push period: Ray 2.60 marks the field
    # deprecated (in favour of RAY_SERVE_*_AUTOSCALING_METRIC_PUSH_INTERVAL_S, which must be in
    # the environment before Ray starts) but still honours it; left at its 10 s default, a
    # request to a scaled-to-zero deployment waits ~9 s before a replica is even started.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*metrics_interval_s.*")
        _run_deployment(serve, name, num_cpus, {
            "min_replicas": 0,
            "initial_replicas": initial_replicas,
            "max_replicas": max_replicas,
            "target_ongoing_requests": target_ongoing_requests,
            "upscale_delay_s": 0.0,
            "downscale_delay_s": downscale_delay_s,
            "downscale_to_zero_delay_s": downscale_delay_s,
            "look_back_period_s": look_back_period_s,
            "metrics_interval_s": metrics_interval_s,
        })
    _state["apps"].add(name)
    return f"http://{_state['host']}:{_state['port']}/{name}"


def _run_deployment(serve: Any, name: str, num_cpus: float, autoscaling: dict) -> None:
    deployment = serve.deployment(
        RewardScorer,
        name=DEPLOYMENT_NAME,
        ray_actor_options={"num_cpus": num_cpus},
        autoscaling_config=autoscaling,
    )
    serve.run(deployment.bind(), name=name, route_prefix=f"/{name}", blocking=False)


def replica_count(name: str = "reward") -> int:
    """Running replicas of the reward deployment of application ``name`` (0 when scaled to zero)."""
    from ray import serve

    with warnings.catch_warnings():  # status() re-validates the config (see deploy_reward)
        warnings.filterwarnings("ignore", message=".*metrics_interval_s.*")
        app = serve.status().applications.get(name)
    if app is None:
        return 0
    dep = app.deployments.get(DEPLOYMENT_NAME)
    if dep is None:
        return 0
    return int(sum(n for state, n in dep.replica_states.items() if str(getattr(state, "value", state)) == "RUNNING"))


def shutdown_reward() -> None:
    """Stop Serve (all its applications and the HTTP proxy). Leaves Ray running."""
    try:
        from ray import serve

        serve.shutdown()
    finally:
        _state.update(port=None, host=None, apps=set())


# ---------------------------------------------------------------- (b) the client

_RETRYABLE_STATUS = {408, 425, 429, 500, 502, 503, 504}


def _is_loopback(url: str) -> bool:
    return is_loopback_host(urllib.parse.urlsplit(url).hostname or "")


class HttpReward:
    """Score trajectory records at ``url``; ``retries`` more attempts after the first, waiting
    ``backoff_s · 2^(k−1)`` (capped at ``max_backoff_s``) before retry k.

    ``timeout_s`` bounds each attempt's connect and each socket read (urllib semantics: an
    endpoint that trickles bytes can stretch an attempt). A call therefore ends within about
    ``(retries + 1) · timeout_s + Σ backoff``. Counters: ``calls``, ``successes``,
    ``failures`` (calls that returned None), ``attempts``, ``retries_used``, ``timeouts``;
    ``stats()`` returns them. Loopback URLs bypass any HTTP proxy from the environment."""

    def __init__(self, url: str, timeout_s: float = 5.0, retries: int = 2, backoff_s: float = 0.2,
                 max_backoff_s: float = 5.0):
        if retries < 0 or timeout_s <= 0 or backoff_s < 0:
            raise ValueError("need retries >= 0, timeout_s > 0, backoff_s >= 0")
        self.url = url
        self.timeout_s, self.retries, self.backoff_s, self.max_backoff_s = timeout_s, retries, backoff_s, max_backoff_s
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(url) else []
        self._opener = urllib.request.build_opener(*handlers)
        self._lock = threading.Lock()
        self.calls = self.successes = self.failures = self.attempts = self.retries_used = self.timeouts = 0
        self.last_error: str | None = None

    def _attempt(self, body: bytes) -> tuple[float | None, str | None, bool]:
        """One POST → (score, error, retryable)."""
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                data = json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            detail = ""
            try:
                detail = exc.read().decode("utf-8", "replace")[:300]
            except Exception:  # noqa: BLE001
                pass
            return None, f"HTTP {exc.code}: {detail or exc.reason}", exc.code in _RETRYABLE_STATUS
        except (TimeoutError, socket.timeout) as exc:
            with self._lock:
                self.timeouts += 1
            return None, f"timeout after {self.timeout_s:g} s ({exc})", True
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (TimeoutError, socket.timeout)):
                with self._lock:
                    self.timeouts += 1
                return None, f"timeout after {self.timeout_s:g} s ({exc.reason})", True
            return None, f"unreachable: {exc.reason}", True
        except (ConnectionError, OSError) as exc:
            return None, f"connection: {type(exc).__name__}: {exc}", True
        except ValueError as exc:  # not JSON
            return None, f"bad response: {exc}", True
        if not isinstance(data, dict) or "score" not in data:
            return None, f"bad response: no 'score' in {str(data)[:200]}", False
        try:
            return float(data["score"]), None, False
        except (TypeError, ValueError):
            return None, f"bad response: score {data['score']!r} is not a number", False

    def score(self, task: Any, record: dict | None = None) -> tuple[float | None, int, str | None]:
        """``(score, attempts, None)`` on success, ``(None, attempts, last error)`` otherwise.

        ``score(task, record)``, or ``score(record)`` with the task in ``record["task"]``."""
        with self._lock:
            self.calls += 1
        attempts, error = 0, None
        try:
            if record is None and isinstance(task, dict):
                task, record = task.get("task"), task
            task_name = task if isinstance(task, str) or task is None else getattr(task, "name", str(task))
            body = json.dumps({"task": task_name, "record": record}).encode("utf-8")
            for k in range(self.retries + 1):
                if k:
                    time.sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (k - 1)))
                attempts += 1
                value, error, retryable = self._attempt(body)
                if error is None:
                    with self._lock:
                        self.successes += 1
                        self.attempts += attempts
                        self.retries_used += attempts - 1
                    return value, attempts, None
                if not retryable:
                    break
        except Exception as exc:  # noqa: BLE001 — never raise to the caller (e.g. a record that is not JSON)
            error = f"client error: {type(exc).__name__}: {exc}"
        with self._lock:
            self.failures += 1
            self.attempts += attempts
            self.retries_used += max(0, attempts - 1)
            self.last_error = error
        return None, attempts, error

    __call__ = score

    def stats(self) -> dict:
        with self._lock:
            return {"calls": self.calls, "successes": self.successes, "failures": self.failures,
                    "attempts": self.attempts, "retries_used": self.retries_used, "timeouts": self.timeouts,
                    "last_error": self.last_error}
