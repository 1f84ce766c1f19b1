"""LLMProxy: the gateway between env managers and inference workers."""

from __future__ import annotations

from dataclasses import dataclass

from rollart.core.signals import Signal


@dataclass(eq=False)
class WorkerInfo:
    """What the proxy knows of one inference worker (a TP group of GPUs)."""

    id: int
    pool: str
    role: str  # "both" | "prefill" | "decode"
    tp: int
    max_num_seqs: int
    kv_capacity_tokens: int | None = None  # set by a backend that knows it
    load: int = 0       # requests dispatched and not yet returned
    kv_tokens: int = 0  # context tokens of those requests

    @property
    def saturated(self) -> bool:
        """No room for another request: its sequence slots or its KV cache are full."""
        return self.load >= self.max_num_seqs or (
            self.kv_capacity_tokens is not None and self.kv_tokens >= self.kv_capacity_tokens)


class LLMProxy:
    """Routes each generation request to a worker and gates admission during weight sync.

    Routing policy for a request of task tag ``t`` (and role r):

    1. the preferred pool is ``hw_affinity[t]``, else ``hw_affinity["default"]``, else every pool
       (also when affinity is off);
    2. the trajectory's previous worker, if it is in that pool and not saturated (its prefix
       cache holds the conversation so far);
    3. otherwise the least-loaded unsaturated worker of the preferred pool (ties: lowest id);
    4. if the preferred pool is saturated (every worker's sequence slots or KV cache full) or
       has no workers of role r, the least-loaded unsaturated worker of any other pool (a
       compatible class: every worker serves the actor);
    5. if everything is saturated, the least-loaded worker of the preferred pool (it queues).
    """

    def __init__(self, workers: list[WorkerInfo], hw_affinity: dict[str, str] | None):
        self.workers = workers
        self.affinity = dict(hw_affinity) if hw_affinity else None
        self.version = 0          # weights the workers serve
        self.suspended = False
        self.resumed = Signal("proxy.resumed")
        self.routed_preferred = 0
        self.routed_fallback = 0
        self._by_role: dict[str, list[WorkerInfo]] = {}
        self._by_pool_role: dict[tuple[str, str], list[WorkerInfo]] = {}
        for w in workers:
            self._by_role.setdefault(w.role, []).append(w)
            self._by_pool_role.setdefault((w.pool, w.role), []).append(w)

    # ---- routing -------------------------------------------------------------------

    def preferred_pool(self, tag: str) -> str | None:
        if self.affinity is None:
            return None
        return self.affinity.get(tag, self.affinity.get("default"))

    def route(self, tag: str, last_worker: int | None = None, role: str = "both") -> WorkerInfo:
        pool = self.preferred_pool(tag)
        candidates = self._by_role.get(role, [])
        if not candidates:
            raise LookupError(f"no generation worker has role '{role}'")
        preferred = candidates if pool is None else self._by_pool_role.get((pool, role), [])
        open_preferred = [w for w in preferred if not w.saturated]
        if open_preferred:
            self.routed_preferred += 1
            if last_worker is not None:
                for w in open_preferred:
                    if w.id == last_worker:
                        return w
            return min(open_preferred, key=lambda w: (w.load, w.id))
        others = [w for w in candidates if w not in preferred and not w.saturated]
        if others:
            self.routed_fallback += 1
            return min(others, key=lambda w: (w.load, w.id))
        self.routed_preferred += 1
        return min(preferred or candidates, key=lambda w: (w.load, w.id))

    def dispatch(self, worker: WorkerInfo, context_tokens: int = 0) -> None:
        """ADD: a request holding ``context_tokens`` of KV is on its way to ``worker``."""
        worker.load += 1
        worker.kv_tokens += context_tokens

    def release(self, worker: WorkerInfo, context_tokens: int = 0) -> None:
        """The request returned (completed or ABORTed)."""
        worker.load -= 1
        worker.kv_tokens -= context_tokens

    # ---- weight sync gate -----------------------------------------------------------

    def suspend(self) -> None:
        """Stop admitting new generation requests; in-flight ones keep running."""
        self.suspended = True

    def resume(self, version: int) -> None:
        self.version = version
        self.suspended = False
        self.resumed.fire(version)

    @property
    def worker_ids(self) -> tuple[int, ...]:
        return tuple(w.id for w in self.workers)
