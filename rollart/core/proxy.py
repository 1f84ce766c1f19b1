"""LLMProxy: the gateway between env managers and inference workers."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Optional

from rollart.core.signals import Signal

_ROUTING_FIELDS = frozenset({"load", "kv_tokens", "kv_capacity_tokens", "max_num_seqs"})


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

    _index = None  # the proxy's _LoadIndex once the worker is routed (a class default: not a field)

    def __setattr__(self, name: str, value: Any) -> None:
        # whoever changes what routing reads (the proxy, a backend, a test) keeps the index exact
        object.__setattr__(self, name, value)
        if name in _ROUTING_FIELDS and self._index is not None:
            self._index.touch(self)

    @property
    def saturated(self) -> bool:
        """No room for another request: its sequence slots or its KV cache are full."""
        return self.load >= self.max_num_seqs or (
            self.kv_capacity_tokens is not None and self.kv_tokens >= self.kv_capacity_tokens)


class _LoadIndex:
    """The unsaturated workers of each (pool, role) and of each role (pool None), least loaded
    first (ties: lowest id), so a route costs O(log n) instead of a scan of the pool.

    A heap per group with lazy invalidation: a worker whose load or KV changed gets a new stamp
    and (while unsaturated) a new entry; entries with an old stamp are dropped when they reach
    the top, and a heap that grew past a few entries per worker is rebuilt. A group's heap is
    built when it is first routed to (with affinity on, the all-pools groups never are)."""

    def __init__(self, workers: list[WorkerInfo]):
        self.stamp: dict[int, int] = {w.id: 0 for w in workers}
        self.groups: dict[tuple[Optional[str], str], list[WorkerInfo]] = {}
        for w in workers:
            self.groups.setdefault((w.pool, w.role), []).append(w)
            self.groups.setdefault((None, w.role), []).append(w)
        self.heaps: dict[tuple[Optional[str], str], list[tuple[int, int, int, WorkerInfo]]] = {}
        # each worker's built heaps, with the size that triggers a rebuild and the group's key
        self._heaps_of: dict[int, list[tuple[list[Any], int, tuple[Optional[str], str]]]] = {
            w.id: [] for w in workers}
        for w in workers:
            object.__setattr__(w, "_index", self)

    def _rebuild(self, heap: list[tuple[int, int, int, WorkerInfo]], key: tuple[Optional[str], str]) -> None:
        heap[:] = [(w.load, w.id, self.stamp[w.id], w) for w in self.groups[key] if not w.saturated]
        heapq.heapify(heap)

    def touch(self, w: WorkerInfo) -> None:
        wid = w.id
        stamp = self.stamp[wid] = self.stamp[wid] + 1
        heaps = self._heaps_of[wid]
        if not heaps or w.load >= w.max_num_seqs or (
                w.kv_capacity_tokens is not None and w.kv_tokens >= w.kv_capacity_tokens):
            return  # saturated (not routable), or in no built group
        entry = (w.load, wid, stamp, w)
        for heap, limit, key in heaps:
            heapq.heappush(heap, entry)
            if len(heap) > limit:
                self._rebuild(heap, key)

    def least_loaded(self, key: tuple[Optional[str], str]) -> WorkerInfo | None:
        """The least-loaded unsaturated worker of the group (ties: lowest id), or None."""
        heap = self.heaps.get(key)
        if heap is None:
            if key not in self.groups:
                return None
            heap = self.heaps[key] = []
            self._rebuild(heap, key)
            limit = 4 * len(self.groups[key]) + 16
            for w in self.groups[key]:
                self._heaps_of[w.id].append((heap, limit, key))
        stamp = self.stamp
        while heap:
            entry = heap[0]
            if entry[2] == stamp[entry[1]]:
                return entry[3]
            heapq.heappop(heap)
        return None


class LLMProxy:
    """Routes each generation request to a worker and gates admission during weight sync.

    Routing policy for a request of task tag ``t`` (and role r):

    1. the preferred pool is ``hw_affinity[t]``, else ``hw_affinity["default"]``, else every pool
       (also when affinity is off); every pool with workers of role r when the named one has none
       (PD disaggregation with prefill on H800 and decode on H20: the map names where a task's
       prefill runs, and its decode goes where decode workers are, which is not a spill);
    2. the trajectory's previous worker, if it is in that pool and not saturated (its prefix
       cache holds the conversation so far);
    3. otherwise the least-loaded unsaturated worker of the preferred pool (ties: lowest id);
    4. if the preferred pool is saturated (every worker's sequence slots or KV cache full), the
       trajectory's previous worker if it is in another pool and not saturated (a conversation that
       spilled keeps its cache while its pool is full), else the least-loaded unsaturated worker of
       any other pool (a compatible class: every worker serves the actor);
    5. if everything is saturated, the least-loaded worker of the preferred pool (it queues).
    """

    def __init__(self, workers: list[WorkerInfo], hw_affinity: dict[str, str] | None):
        self.workers = workers
        self.affinity = dict(hw_affinity) if hw_affinity else None
        self.version = 0          # weights the workers serve
        self.suspended = False
        self.resumed = Signal("proxy.resumed")
        self.routed_preferred = 0
        self.fallback_from: dict[str, int] = {}  # preferred pool -> requests it spilled (saturated)
        self._by_role: dict[str, list[WorkerInfo]] = {}
        self._by_pool_role: dict[tuple[str, str], list[WorkerInfo]] = {}
        for w in workers:
            self._by_role.setdefault(w.role, []).append(w)
            self._by_pool_role.setdefault((w.pool, w.role), []).append(w)
        self._by_id = {w.id: w for w in workers}
        self._index = _LoadIndex(workers)
        self._pools_of_role: dict[str, list[str]] = {}
        for pool, role in self._by_pool_role:
            self._pools_of_role.setdefault(role, []).append(pool)

    @property
    def routed_fallback(self) -> int:
        """Requests routed off their preferred pool (it was saturated), from every pool."""
        return sum(self.fallback_from.values())

    def pool_of(self, worker_id: int | None) -> str | None:
        """The pool a worker belongs to (None: no such worker)."""
        w = self._by_id.get(worker_id) if worker_id is not None else None
        return None if w is None else w.pool

    # ---- routing -------------------------------------------------------------------

    def preferred_pool(self, tag: str) -> str | None:
        if self.affinity is None:
            return None
        return self.affinity.get(tag, self.affinity.get("default"))

    def route(self, tag: str, last_worker: int | None = None, role: str = "both") -> WorkerInfo:
        affinity = self.affinity  # preferred_pool(tag), inlined: this runs at every turn
        pool = None if affinity is None else affinity.get(tag, affinity.get("default"))
        candidates = self._by_role.get(role)
        if not candidates:
            raise LookupError(f"no generation worker has role '{role}'")
        if pool is not None and (pool, role) not in self._by_pool_role:
            pool = None  # the pool named has no worker of this role: every pool with one is preferred
        index = self._index
        key = (pool, role)  # pool None: every pool
        heap = index.heaps.get(key)
        if heap and heap[0][2] == index.stamp[heap[0][1]]:  # least_loaded's answer when its top is current
            best: WorkerInfo | None = heap[0][3]
        else:
            best = index.least_loaded(key)
        last = self._by_id.get(last_worker) if last_worker is not None else None
        if last is not None and (last.role != role or last.load >= last.max_num_seqs or (
                last.kv_capacity_tokens is not None and last.kv_tokens >= last.kv_capacity_tokens)):
            last = None  # another role's, or saturated: the conversation moves
        if best is not None:
            self.routed_preferred += 1
            if last is not None and (pool is None or last.pool == pool):
                return last
            return best
        if pool is not None:
            others = [w for p in self._pools_of_role.get(role, ()) if p != pool
                      if (w := index.least_loaded((p, role))) is not None]
            if others:
                self.fallback_from[pool] = self.fallback_from.get(pool, 0) + 1
                if last is not None:  # spilled before and its worker there has room: its cache is there
                    return last
                return min(others, key=lambda w: (w.load, w.id))
        self.routed_preferred += 1
        preferred = candidates if pool is None else self._by_pool_role.get((pool, role), [])
        return min(preferred or candidates, key=lambda w: (w.load, w.id))

    def dispatch(self, worker: WorkerInfo, context_tokens: int = 0) -> None:
        """ADD: a request holding ``context_tokens`` of KV is on its way to ``worker``."""
        d = worker.__dict__  # past WorkerInfo.__setattr__: the index is touched once, below
        d["load"] += 1
        d["kv_tokens"] += context_tokens
        self._index.touch(worker)

    def release(self, worker: WorkerInfo, context_tokens: int = 0) -> None:
        """The request returned (completed or ABORTed)."""
        d = worker.__dict__
        d["load"] -= 1
        d["kv_tokens"] -= context_tokens
        self._index.touch(worker)

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
