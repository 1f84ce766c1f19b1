"""The inference worker: one engine behind a non-blocking command loop (the paper's LLMProxy
back end).

:class:`InferenceWorker` owns one :class:`~rollart.runtime.engines.base.Engine`. A background
thread runs the loop::

    forever:
        apply every queued command, in arrival order   (ADD, ABORT, SUSPEND, RESUME, UPDATE_WEIGHTS)
        if not suspended and the engine has work: engine.step(), resolve finished requests
        else: sleep until the next command

so commands only ever touch the engine between two steps. The public methods are coroutines:
on a Ray async actor (:data:`InferenceWorkerActor`, ``max_concurrency`` 1024) many
``generate`` calls wait at once, each on its own future, while the thread steps the engine.

* ``generate`` queues an ADD and returns the request's :class:`Completion` when it finishes,
  or when it is aborted (``finish_reason="abort"``, with the tokens it had so far). Cancelling
  the call (``ray.cancel``) aborts the request.
* ``abort`` / ``suspend`` / ``resume`` return once the loop has applied them: after
  ``await suspend()`` no engine step runs until ``resume``; requests added meanwhile (and those
  in flight) wait in the engine.
* ``update_weights(version, state)`` returns once the engine holds ``version``; in-flight
  requests recompute their KV under the new weights at the next step (the engine's
  ``load_weights`` contract). ``state`` may be a mapping, a Ray ``ObjectRef`` to one, or a
  zero-argument callable returning one (run on a thread pool, so a slow pull — e.g. from a
  weight store — overlaps with decoding; only the swap itself happens between steps).

Ray is imported only by :data:`InferenceWorkerActor`, built on first access, so this module
imports (and the plain class runs, e.g. in tests) without Ray.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any, Callable, Mapping, Optional

from rollart.plan.schema import ModelSpec
from rollart.runtime.engines.base import Completion, Engine
from rollart.runtime.heap import SettlesHeap

ADD, ABORT, SUSPEND, RESUME, UPDATE_WEIGHTS, STOP = "ADD", "ABORT", "SUSPEND", "RESUME", "UPDATE_WEIGHTS", "STOP"

_Ack = Optional[tuple[asyncio.AbstractEventLoop, asyncio.Future]]


def make_engine(model: str | ModelSpec = "Qwen3-tiny", engine: str = "torch", seed: int = 0,
                tokenizer_dir: Optional[str] = None, **engine_kwargs: Any) -> Engine:
    """An engine for ``model`` (a preset name or a :class:`ModelSpec`) with the offline
    tokenizer: ``engine="torch"`` (CPU by default; one torch thread unless ``threads`` says
    otherwise) or ``"vllm"`` (GPU)."""
    from rollart.runtime.engines.tokenizer import build_tokenizer

    spec = model if isinstance(model, ModelSpec) else ModelSpec.model_validate(str(model))
    tokenizer = build_tokenizer(spec.vocab, cache_dir=tokenizer_dir)
    if engine == "torch":
        from rollart.runtime.engines.torch_engine import TorchEngine

        engine_kwargs.setdefault("threads", 1 if str(engine_kwargs.get("device", "cpu")) == "cpu" else None)
        return TorchEngine(spec, tokenizer, seed=seed, **engine_kwargs)
    if engine == "vllm":
        from rollart.runtime.engines.vllm_engine import VllmEngine

        return VllmEngine(spec, tokenizer, seed=seed, **engine_kwargs)
    raise ValueError(f"unknown engine '{engine}' (torch or vllm)")


def _settle(fut: asyncio.Future, value: Any = None, error: Optional[BaseException] = None) -> None:
    if fut.done():  # cancelled by the caller meanwhile
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def _node_id() -> str | None:
    """The Ray node this process runs on (None outside Ray): where a pool's workers landed."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001
        return None


class InferenceWorker(SettlesHeap):
    """One engine and its command loop (see the module docstring).

    ``engine_factory``: a zero-argument callable building the engine in the worker's process
    (it wins over ``model`` / ``engine`` / ``engine_kwargs``)."""

    def __init__(self, model: str | ModelSpec = "Qwen3-tiny", engine: str = "torch", *, seed: int = 0,
                 version: int = 0, tokenizer_dir: Optional[str] = None,
                 engine_kwargs: Optional[dict[str, Any]] = None,
                 engine_factory: Optional[Callable[[], Engine]] = None, name: str = "inference"):
        self.name = name
        if engine_factory is not None:
            self._engine: Engine = engine_factory()
        else:
            self._engine = make_engine(model, engine, seed=seed, tokenizer_dir=tokenizer_dir,
                                       **dict(engine_kwargs or {}))
        self._version = int(version)
        self._prefetched: dict[int, Any] = {}
        self._suspended = False
        self._cmds: deque[tuple[str, Any, _Ack]] = deque()
        self._cv = threading.Condition()
        self._pending: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._stats = {"requests_added": 0, "requests_served": 0, "requests_aborted": 0, "tokens_generated": 0,
                       "steps": 0, "busy_seconds": 0.0, "weight_updates": 0, "commands": 0, "step_errors": 0}
        self._started = time.monotonic()
        self._error: Optional[BaseException] = None
        self._step_log: Optional[deque] = None
        self._request_log: Optional[deque] = None
        self._request_times: dict[str, dict[str, float]] = {}
        # generate calls arriving or returning on the actor's event loop: Python that competes with
        # the engine thread for the GIL, so each one lengthens the engine step it lands in
        self._call_events = 0
        self._thread = threading.Thread(target=self._run, name=f"{name}-loop", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API (coroutines)

    async def generate(self, request_id: str, prompt_ids: list[int], max_new_tokens: int,
                       temperature: float = 1.0, seed: Optional[int] = None) -> Completion:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        rid = str(request_id)
        called = time.monotonic()
        self._call_events += 1
        times: Optional[dict[str, float]] = None
        if self._request_log is not None and rid not in self._request_times:
            times = self._request_times[rid] = {}  # only this coroutine adds and removes it
        self._submit(ADD, (rid, list(prompt_ids), int(max_new_tokens), float(temperature), seed, loop, fut), None)
        try:
            out = await fut
        except asyncio.CancelledError:
            self._submit(ABORT, rid, None)
            raise
        finally:
            if times is not None:
                self._request_times.pop(rid, None)
        self._call_events += 1
        log = self._request_log
        if times is not None and log is not None:
            log.append({"request": rid, "finish_reason": out.finish_reason, "called": called,
                        "returned": time.monotonic(), **times})
        return out

    async def abort(self, request_id: str) -> bool:
        """True if the request was queued or running (its ``generate`` returns ``"abort"``)."""
        return await self._call(ABORT, str(request_id))

    async def suspend(self) -> None:
        await self._call(SUSPEND, None)

    async def resume(self) -> None:
        await self._call(RESUME, None)

    async def prefetch_weights(self, version: int, loader: Callable[[], Any]) -> int:
        """Pull ``version`` into host memory on a thread while the engine keeps decoding (the
        asynchronous half of the weight transfer); ``update_weights(version, None)`` swaps it in."""
        state = await asyncio.get_running_loop().run_in_executor(None, loader)
        self._prefetched[int(version)] = state
        return int(version)

    async def update_weights(self, version: int, state_or_ref: Any) -> int:
        state = state_or_ref
        if state is None:
            if int(version) not in self._prefetched:
                raise KeyError(f"update_weights: version {version} was not prefetched on '{self.name}'")
            state = self._prefetched.pop(int(version))
            for old in [v for v in self._prefetched if v < int(version)]:
                del self._prefetched[old]
        elif callable(state) and not isinstance(state, Mapping):
            state = await asyncio.get_running_loop().run_in_executor(None, state)
        elif _is_object_ref(state):
            state = await state
        return await self._call(UPDATE_WEIGHTS, (int(version), state))

    async def stats(self) -> dict[str, Any]:
        with self._cv:
            out = dict(self._stats)
            out.update(version=self._version, suspended=self._suspended, pending=len(self._pending),
                       queued_commands=len(self._cmds), engine=getattr(self._engine, "name", "?"),
                       uptime_seconds=time.monotonic() - self._started)
            engine_stats = getattr(self, "_engine_stats", None)
        if engine_stats:
            out["engine_stats"] = dict(engine_stats)
        out["node_id"] = _node_id()
        return out

    async def record_steps(self, on: bool = True) -> list[dict[str, float]]:
        """Start (``on``) or stop recording what each engine step computed and how long it took
        (engines that report ``last_step``), when it started (``time.monotonic``) and how many
        generate calls arrived or returned meanwhile (``call_events``); returns and clears what
        was recorded so far. Served requests are recorded too (:meth:`request_log`)."""
        with self._cv:
            log = list(self._step_log or [])
            self._step_log = deque(maxlen=100_000) if on else None
            self._request_log = deque(maxlen=100_000) if on else None
        return log

    async def request_log(self) -> list[dict[str, Any]]:
        """While recording: each request whose call returned, with its ``finish_reason`` and its
        times (``time.monotonic``): ``called`` (the ``generate`` call began), ``added`` (the loop
        put it in the engine), ``done`` (the engine finished or aborted it), ``returned`` (its
        call resumed)."""
        return list(self._request_log or [])

    async def version(self) -> int:
        return self._version

    async def ping(self) -> str:
        return self.name

    async def shutdown(self) -> None:
        """Stop the loop; waiting ``generate`` calls return ``"abort"``."""
        if self._thread.is_alive():
            await self._call(STOP, None)

    # ------------------------------------------------------------------ plumbing

    async def _call(self, kind: str, payload: Any) -> Any:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._submit(kind, payload, (loop, fut))
        return await fut

    def _submit(self, kind: str, payload: Any, ack: _Ack) -> None:
        with self._cv:
            if not self._thread.is_alive():
                err = RuntimeError(f"inference worker '{self.name}' is stopped")
                if ack is not None:
                    ack[1].set_exception(err)
                    return
                if kind == ADD:
                    payload[-1].set_exception(err)
                return
            self._cmds.append((kind, payload, ack))
            self._cv.notify()

    @staticmethod
    def _resolve(target: Optional[tuple[asyncio.AbstractEventLoop, asyncio.Future]], value: Any = None,
                 error: Optional[BaseException] = None) -> None:
        if target is None:
            return
        loop, fut = target
        try:
            loop.call_soon_threadsafe(_settle, fut, value, error)
        except RuntimeError:  # the event loop is closed (actor exiting)
            pass

    def _finish(self, completion: Completion) -> None:
        target = self._pending.pop(completion.request_id, None)
        times = self._request_times.get(completion.request_id)
        if times is not None:  # recording (the engine thread fills in, the call's coroutine owns it)
            times["done"] = time.monotonic()
        if completion.finish_reason == "abort":
            self._stats["requests_aborted"] += 1
        else:
            self._stats["requests_served"] += 1
        self._resolve(target, completion)

    def _abort_completion(self, rid: str) -> Completion:
        partial = getattr(self._engine, "partial", None)
        c = partial(rid) if partial is not None else None
        return c if c is not None else Completion(rid, [], "", [], "abort")

    def _apply(self, kind: str, payload: Any, ack: _Ack) -> bool:
        """Apply one command (on the loop thread); False for STOP."""
        self._stats["commands"] += 1
        try:
            if kind == ADD:
                rid, prompt, max_new, temp, seed, loop, fut = payload
                if rid in self._pending:
                    raise ValueError(f"request '{rid}' is already in flight on '{self.name}'")
                try:
                    self._engine.add(rid, prompt, max_new, temp, seed)
                except Exception as exc:  # a bad request fails its own call, nothing else
                    self._resolve((loop, fut), error=exc)
                    return True
                self._pending[rid] = (loop, fut)
                self._stats["requests_added"] += 1
                times = self._request_times.get(rid)
                if times is not None:
                    times["added"] = time.monotonic()
            elif kind == ABORT:
                rid = payload
                completion = self._abort_completion(rid)
                found = self._engine.abort(rid)
                if rid in self._pending:
                    completion.finish_reason = "abort"
                    self._finish(completion)
                    found = True
                self._resolve(ack, found)
            elif kind == SUSPEND:
                self._suspended = True
                self._resolve(ack, None)
            elif kind == RESUME:
                self._suspended = False
                self._resolve(ack, None)
            elif kind == UPDATE_WEIGHTS:
                version, state = payload
                self._engine.load_weights(state)
                self._version = version
                self._stats["weight_updates"] += 1
                self._resolve(ack, version)
            elif kind == STOP:
                for rid in list(self._pending):
                    self._engine.abort(rid)
                    self._finish(Completion(rid, [], "", [], "abort"))
                self._resolve(ack, None)
                return False
            else:  # pragma: no cover - internal
                raise ValueError(f"unknown command {kind}")
        except Exception as exc:
            if kind == ADD:
                self._resolve(payload[-2:], error=exc)
            self._resolve(ack, error=exc)
        return True

    def _run(self) -> None:
        engine = self._engine
        while True:
            with self._cv:
                while not self._cmds and (self._suspended or not engine.has_work()):
                    self._cv.wait()
                batch = list(self._cmds)
                self._cmds.clear()
            for kind, payload, ack in batch:
                if not self._apply(kind, payload, ack):
                    with self._cv:  # fail whatever arrived after STOP
                        rest = list(self._cmds)
                        self._cmds.clear()
                    err = RuntimeError(f"inference worker '{self.name}' is stopped")
                    for k, p, a in rest:
                        self._resolve(a, error=err)
                        if k == ADD:
                            self._resolve(p[-2:], error=err)
                    return
            if self._suspended or not engine.has_work():
                continue
            t0 = time.perf_counter()
            started, calls = time.monotonic(), self._call_events
            try:
                done = engine.step()
            except Exception as exc:  # the engine's state is suspect: fail everything in flight
                self._stats["step_errors"] += 1
                for rid in list(self._pending):
                    try:
                        engine.abort(rid)
                    except Exception:
                        pass
                    self._resolve(self._pending.pop(rid), error=exc)
                continue
            self._stats["busy_seconds"] += time.perf_counter() - t0
            self._stats["steps"] += 1
            last = getattr(engine, "last_step", None)
            if last and "decode_rows" in last:  # engines that say how many sequences a step decoded
                self._stats["decode_rows"] = self._stats.get("decode_rows", 0) + last["decode_rows"]
            log = self._step_log  # read once: record_steps may swap it from the event loop
            if last and log is not None:
                last["started"] = started
                last["call_events"] = self._call_events - calls
                log.append(last)  # a fresh dict every step
            for c in done:
                self._stats["tokens_generated"] += len(c.token_ids)
                self._finish(c)
            engine_stats = getattr(engine, "stats", None)
            if engine_stats is not None:
                self._engine_stats = engine_stats()


def _is_object_ref(x: Any) -> bool:
    cls = type(x)
    return cls.__name__ == "ObjectRef" and cls.__module__.startswith("ray")


_ACTOR_CLASSES: dict[int, Any] = {}


def actor_class(max_concurrency: int = 1024) -> Any:
    """``ray.remote(max_concurrency=...)(InferenceWorker)``, built once per concurrency on first
    use (so importing this module does not import Ray). Place it with ``.options(...)``
    (``num_cpus``, custom pool resources, ``max_restarts``)."""
    if max_concurrency not in _ACTOR_CLASSES:
        import ray

        _ACTOR_CLASSES[max_concurrency] = ray.remote(max_concurrency=max_concurrency)(InferenceWorker)
    return _ACTOR_CLASSES[max_concurrency]


def __getattr__(name: str) -> Any:
    if name == "InferenceWorkerActor":
        return actor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ABORT", "ADD", "InferenceWorker", "InferenceWorkerActor", "RESUME", "SUSPEND", "UPDATE_WEIGHTS",
           "actor_class", "make_engine"]
