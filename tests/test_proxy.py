"""LLMProxy routing: hardware affinity, least-loaded, sticky, fallback, suspend/resume."""

from __future__ import annotations

import pytest

from rollart.core.proxy import LLMProxy, WorkerInfo


def workers(spec: list[tuple[str, str]], cap: int = 2) -> list[WorkerInfo]:
    return [WorkerInfo(id=i, pool=pool, role=role, tp=1, max_num_seqs=cap) for i, (pool, role) in enumerate(spec)]


AFF = {"FrozenLake": "h800", "default": "h20"}


def test_routes_by_affinity_tag_and_default() -> None:
    proxy = LLMProxy(workers([("h800", "both"), ("h20", "both"), ("h20", "both")]), AFF)
    assert proxy.route("FrozenLake").pool == "h800"
    assert proxy.route("GEM-Math").pool == "h20"  # not in the map: default


def test_least_loaded_within_pool_with_lowest_id_on_ties() -> None:
    ws = workers([("h20", "both")] * 3, cap=10)
    proxy = LLMProxy(ws, AFF)
    ws[0].load, ws[1].load, ws[2].load = 3, 1, 1
    assert proxy.route("x").id == 1


def test_sticky_to_previous_worker_for_prefix_cache() -> None:
    ws = workers([("h20", "both")] * 3, cap=10)
    proxy = LLMProxy(ws, AFF)
    ws[2].load = 5
    assert proxy.route("x", last_worker=2).id == 2
    ws[2].load = 10  # saturated: no longer sticky
    assert proxy.route("x", last_worker=2).id == 0


def test_falls_back_to_other_pool_when_preferred_saturated() -> None:
    ws = workers([("h800", "both"), ("h20", "both")], cap=1)
    proxy = LLMProxy(ws, AFF)
    ws[0].load = 1
    assert proxy.route("FrozenLake").pool == "h20"
    assert proxy.routed_fallback == 1 and proxy.fallback_from == {"h800": 1}


def test_everything_saturated_queues_on_preferred_pool() -> None:
    ws = workers([("h800", "both"), ("h20", "both")], cap=1)
    proxy = LLMProxy(ws, AFF)
    ws[0].load = ws[1].load = 1
    assert proxy.route("FrozenLake").pool == "h800"


def test_preferred_pool_without_workers_falls_back() -> None:
    proxy = LLMProxy(workers([("h20", "both")]), {"FrozenLake": "h800", "default": "h20"})
    assert proxy.route("FrozenLake").pool == "h20"


def test_pd_decode_stays_on_its_worker_when_the_affinity_pool_has_no_decode_workers() -> None:
    """PD with prefill on H800 and decode on H20 under the paper's map (FrozenLake → h800): the map names
    where FrozenLake prefills; its decode runs where decode workers are, sticky to the worker holding the
    conversation, and is not counted as a spill (helper-84: every turn moved to the least-loaded H20,
    handing the whole context's KV over again, and the report blamed a full h800)."""
    ws = workers([("h800", "prefill"), ("h800", "prefill"), ("h20", "decode"), ("h20", "decode")], cap=10)
    proxy = LLMProxy(ws, AFF)
    ws[3].load = 4
    assert proxy.route("FrozenLake", last_worker=3, role="decode").id == 3  # its cache, not the idler worker 2
    assert proxy.route("FrozenLake", role="decode").id == 2
    assert proxy.route("FrozenLake", last_worker=1, role="prefill").id == 1
    assert proxy.routed_fallback == 0 and proxy.fallback_from == {}


def test_a_spilled_conversation_keeps_its_worker_while_its_pool_is_full() -> None:
    ws = workers([("h800", "both"), ("h20", "both"), ("h20", "both")], cap=4)
    proxy = LLMProxy(ws, AFF)
    ws[0].load, ws[2].load = 4, 2  # h800 full
    assert proxy.route("FrozenLake", last_worker=2).id == 2  # its cache is on worker 2, not the idle 1
    assert proxy.routed_fallback == 1
    ws[0].load = 3  # h800 has room again: back to the preferred pool
    assert proxy.route("FrozenLake", last_worker=2).id == 0


def test_no_affinity_balances_over_all_pools() -> None:
    ws = workers([("h800", "both"), ("h20", "both")], cap=10)
    proxy = LLMProxy(ws, None)
    ws[0].load = 2
    assert proxy.route("FrozenLake").pool == "h20"


def test_roles_for_pd_disaggregation() -> None:
    proxy = LLMProxy(workers([("h800", "prefill"), ("h20", "decode")]), None)
    assert proxy.route("x", role="prefill").role == "prefill"
    assert proxy.route("x", role="decode").role == "decode"
    with pytest.raises(LookupError):
        proxy.route("x", role="both")


def test_dispatch_release_and_suspend_resume() -> None:
    ws = workers([("h20", "both")])
    proxy = LLMProxy(ws, None)
    proxy.dispatch(ws[0])
    assert ws[0].load == 1
    proxy.release(ws[0])
    assert ws[0].load == 0
    woken = []
    proxy.resumed.add_waiter(woken.append)
    proxy.suspend()
    assert proxy.suspended
    proxy.resume(3)
    assert not proxy.suspended and proxy.version == 3 and woken == [3]


def test_full_kv_cache_counts_as_saturated_and_triggers_fallback() -> None:
    ws = workers([("h800", "both"), ("h20", "both")], cap=100)
    ws[0].kv_capacity_tokens = 10_000
    proxy = LLMProxy(ws, AFF)
    proxy.dispatch(ws[0], 9_000)
    assert proxy.route("FrozenLake").pool == "h800"   # 1 000 tokens of room left
    proxy.dispatch(ws[0], 2_000)
    assert ws[0].saturated
    assert proxy.route("FrozenLake").pool == "h20"    # KV full: fall back
    proxy.release(ws[0], 2_000)
    assert not ws[0].saturated and ws[0].kv_tokens == 9_000


def _scan_route(proxy: LLMProxy, tag: str, last_worker: int | None, role: str) -> int:
    """The routing policy as a scan of every worker (the reference for the indexed router)."""
    pool = proxy.preferred_pool(tag)
    candidates = [w for w in proxy.workers if w.role == role]
    preferred = [w for w in candidates if w.pool == pool] or candidates  # none of the role there: every pool
    open_preferred = [w for w in preferred if not w.saturated]
    if open_preferred:
        for w in open_preferred:
            if w.id == last_worker:
                return w.id
        return min(open_preferred, key=lambda w: (w.load, w.id)).id
    others = [w for w in candidates if w not in preferred and not w.saturated]
    if others:
        for w in others:
            if w.id == last_worker:
                return w.id
        return min(others, key=lambda w: (w.load, w.id)).id
    return min(preferred or candidates, key=lambda w: (w.load, w.id)).id


@pytest.mark.parametrize("affinity", [AFF, None])
def test_indexed_route_matches_a_scan_of_every_worker(affinity) -> None:
    import random

    rnd = random.Random(7)
    spec = [(rnd.choice(["h800", "h20"]), rnd.choice(["both", "both", "prefill", "decode"])) for _ in range(40)]
    ws = workers(spec, cap=4)
    for w in ws[::3]:
        w.kv_capacity_tokens = 5_000
    proxy = LLMProxy(ws, affinity)
    inflight: list[tuple[WorkerInfo, int]] = []
    for _ in range(2_000):
        op = rnd.random()
        if op < 0.5 or not inflight:
            tag, role = rnd.choice(["FrozenLake", "GEM-Math"]), rnd.choice(["both", "prefill", "decode"])
            last = rnd.choice([None, rnd.randrange(len(ws))])
            want = _scan_route(proxy, tag, last, role)
            got = proxy.route(tag, last, role=role)
            assert got.id == want
            kv = rnd.randrange(0, 3_000)
            proxy.dispatch(got, kv)
            inflight.append((got, kv))
        elif op < 0.9:
            w, kv = inflight.pop(rnd.randrange(len(inflight)))
            proxy.release(w, kv)
        else:  # someone else changes what routing reads
            w = rnd.choice(ws)
            w.max_num_seqs = rnd.choice([2, 4, 6])
