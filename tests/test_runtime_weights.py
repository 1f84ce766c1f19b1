"""Weight transfer: bucketing, the Mooncake store and the Ray object store between two
processes, the trainer actor publishing from inside Ray; the run's private Redis and its
resource-binding records."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rollart.runtime.weights.buckets import (Manifest, arena_of, cut, pipelined_reassemble,  # noqa: E402
                                             reassemble, state_bytes, states_equal)

MiB = 1 << 20


def synthetic_state(mib: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    """A model-like state of ``mib`` MiB: large and small matrices, a bf16 tensor, a tied pair."""
    g = torch.Generator().manual_seed(seed)
    n = mib * MiB // 4  # fp32 elements in the whole state
    emb = torch.randn(n // 4 // 512, 512, generator=g)                                  # 1/4
    return {
        "embed": emb,
        "layers.0.w": torch.randn(n // 2 // 1024 - 1, 1024, generator=g),              # 1/2 less a row
        "layers.0.norm": torch.randn(1024, generator=g),                                # the row
        "layers.1.w": torch.randn(n // 4 // 256, 256, generator=g).to(torch.bfloat16),  # 1/8
        "layers.1.w2": torch.randn(n // 4 // 256, 256, generator=g).to(torch.bfloat16),  # 1/8
        "head": emb,                                                                    # tied: stored once
    }


def tiny_state(seed: int = 0) -> dict[str, torch.Tensor]:
    pytest.importorskip("transformers")
    from rollart.calibration.profile_engine import build_model
    from rollart.plan.schema import ModelSpec

    return build_model(ModelSpec.model_validate("Qwen3-tiny"), seed=seed).state_dict()


# ---------------------------------------------------------------- buckets


def test_buckets_round_trip_for_tensors_smaller_and_larger_than_a_bucket():
    g = torch.Generator().manual_seed(0)
    state = {
        "small": torch.randn(3, 5, generator=g),                  # 60 B
        "big": torch.randn(40, 10, generator=g),                  # 1600 B, rows of 40 B
        "wide": torch.randn(2, 300, generator=g),                 # rows of 1200 B > bucket
        "half": torch.randn(7, generator=g).to(torch.bfloat16),
        "scalar": torch.tensor(3.5),
        "flag": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
        "transposed": torch.randn(6, 4, generator=g).t(),         # not contiguous
    }
    state["tied"] = state["small"]
    for bucket in (8, 100, 256, 1000, 1 << 20):
        manifest, buckets = cut(state, bucket)
        assert all(b.numel() <= bucket for b in buckets)
        assert manifest.total_bytes == state_bytes(state) == sum(b.numel() for b in buckets)
        again = reassemble(Manifest.from_json(manifest.to_json()), [bytes(b.numpy()) for b in buckets])
        assert states_equal(state, again), bucket
        assert again["tied"] is again["small"]  # stored once, restored tied
        assert not any(p.name == "tied" for p in manifest.pieces)
    manifest, buckets = cut(state, 256)
    big = [p for p in manifest.pieces if p.name == "big"]
    assert len(big) > 1 and all(p.start % 40 == 0 and p.nbytes % 40 == 0 for p in big)  # split along dim 0
    whole = [p for p in manifest.pieces if p.name in ("small", "half", "scalar")]
    assert all(p.start == 0 for p in whole) and len(whole) == 3  # tensors that fit are never split
    with pytest.raises(ValueError):
        cut({"x": torch.zeros(2, dtype=torch.float64)}, 4)  # a bucket smaller than one element


def test_bucket_plan_packs_tensors_whole_and_views_one_arena():
    m, b = cut({"a": torch.zeros(30, dtype=torch.uint8), "b": torch.zeros(30, dtype=torch.uint8),
                "c": torch.zeros(50, dtype=torch.uint8)}, 64)
    assert m.bucket_sizes == [60, 50]  # b fits after a; c does not fit after b
    ptr, n = arena_of(b)
    assert n == 110 and b[0].data_ptr() == ptr and b[1].data_ptr() == ptr + 60


def test_qwen3_tiny_state_round_trips_through_pipelined_reassembly():
    state = tiny_state()
    manifest, buckets = cut(state, 100_000)  # smaller than the 256 KiB embedding
    assert manifest.num_buckets > 5
    out, timing = pipelined_reassemble(manifest, lambda i: buckets[i].numpy().copy())
    assert states_equal(state, out)
    assert out["lm_head.weight"] is out["model.embed_tokens.weight"]
    assert timing["bytes"] == manifest.total_bytes and timing["seconds"] > 0

    def broken(i: int):
        if i == 2:
            raise ConnectionError("transport down")
        return buckets[i]

    with pytest.raises(ConnectionError):
        pipelined_reassemble(manifest, broken)


# ---------------------------------------------------------------- Mooncake


def _publisher(spec, path: str, bucket_bytes: int, versions, q, done) -> None:
    """Child process: publish the states saved at ``path`` as ``versions``; hold them until
    ``done`` (the publisher's segment holds the data)."""
    states = torch.load(path, weights_only=True)
    store = spec.open()
    try:
        for v, name in versions:
            q.put((v, store.publish(v, states[name], bucket_bytes)))
        done.wait(120)
    finally:
        store.close()


@pytest.mark.slow
def test_mooncake_publish_pull_between_two_processes(tmp_path: Path):
    from rollart.runtime.weights import mooncake_store as ms

    ok, why = ms.available()
    if not ok:
        pytest.skip(f"Mooncake: {why}")
    tiny, synth = tiny_state(), synthetic_state(64)
    assert state_bytes(synth) == 64 * MiB
    path = str(tmp_path / "states.pt")
    torch.save({"tiny": tiny, "synth": synth}, path)
    with ms.start_master() as master:
        from rollart.runtime.sockets import listening

        # no HTTP metadata server (it would bind 0.0.0.0): the master's own ports are loopback only
        mine = [s for s in listening() if master.proc.pid in s.pids]
        assert master.host == "127.0.0.1" and master.metadata_server == "P2PHANDSHAKE"
        assert {s.port for s in mine} >= {master.rpc_port} and all(s.loopback for s in mine), mine
        spec = master.spec(segment_bytes=256 * MiB, keep=2)
        ctx = mp.get_context("spawn")
        q, done = ctx.Queue(), ctx.Event()
        child = ctx.Process(target=_publisher, args=(spec, path, 16 * MiB, [(1, "tiny"), (2, "synth"), (3, "tiny")],
                                                     q, done))
        child.start()
        puller = spec.for_puller().open()
        try:
            got1 = puller.pull(1, timeout=60)
            assert states_equal(tiny, got1)
            assert got1["lm_head.weight"] is got1["model.embed_tokens.weight"]
            pull_tiny = dict(puller.last_pull)
            got2 = puller.pull_async(2, timeout=60).result(timeout=90)  # overlapped with this thread
            assert states_equal(synth, got2)
            pull_synth = dict(puller.last_pull)
            published = dict(q.get(timeout=60) for _ in range(3))
            assert published[2]["bytes"] == 64 * MiB and published[2]["buckets"] == 4
            assert states_equal(tiny, puller.pull(3, timeout=60))
            with pytest.raises(TimeoutError):  # keep=2: version 1 was removed when 3 arrived
                puller.pull(1, timeout=0.3)
        finally:
            done.set()
            child.join(60)
            puller.close()
        assert child.exitcode == 0
        proc = master.proc
    assert proc.poll() is not None  # the master stopped with the context
    print(f"\nMooncake TCP 127.0.0.1, 16 MiB buckets: publish 64 MiB {published[2]['mib_per_s']:.0f} MiB/s "
          f"({published[2]['seconds'] * 1e3:.0f} ms), pull 64 MiB {pull_synth['mib_per_s']:.0f} MiB/s "
          f"({pull_synth['seconds'] * 1e3:.0f} ms); Qwen3-tiny ({published[1]['bytes'] / 1024:.0f} KiB) publish "
          f"{published[1]['seconds'] * 1e3:.1f} ms, pull {(pull_tiny['seconds'] - pull_tiny['wait_s']) * 1e3:.1f} ms "
          "after it was published")
    assert pull_synth["mib_per_s"] > 0 and published[2]["mib_per_s"] > 0


@pytest.mark.slow
def test_mooncake_unavailable_reports_a_reason(monkeypatch):
    from rollart.runtime.weights import mooncake_store as ms

    monkeypatch.setattr(ms, "_AVAILABLE", None)
    monkeypatch.setattr(ms, "master_binary", lambda: None)
    ok, why = ms.available()
    assert not ok and "mooncake_master" in why
    with pytest.raises(ms.MooncakeUnavailable):
        ms.start_master()
    monkeypatch.setattr(ms, "_AVAILABLE", None)  # forget the fake answer


# ---------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    from rollart.runtime.cluster import init_local_ray

    init_local_ray(2, object_store_memory=200_000_000)  # loopback only, token auth on
    yield ray
    ray.shutdown()


def _pull_in_task(spec, version: int, seed: int):
    """Runs in a Ray worker: pull ``version`` and compare it with the synthetic state."""
    store = spec.open()
    state = store.pull(version, timeout=60)
    return states_equal(synthetic_state(64, seed), state), dict(store.last_pull)


@pytest.mark.slow
def test_ray_object_store_between_processes_and_the_trainer_actor(ray_session, tmp_path: Path):
    ray = ray_session
    from rollart.runtime.trainer.actor import TrainerActor
    from rollart.runtime.trainer.grpo import Sample
    from rollart.runtime.weights.ray_store import RayStoreSpec

    store = RayStoreSpec("test-weights", keep=2).open()
    try:
        # The trainer actor (another process) trains, then publishes from inside the actor.
        trainer = TrainerActor.options(num_cpus=1).remote("Qwen3-tiny", lr=1e-3, seed=0)
        pending = store.pull_async(1, timeout=120)  # a worker waiting for the next version
        samples = [Sample(0, [1, 2, 3], [4, 5, 6, 7], [-6.9] * 4, float(r)) for r in (0, 1, 0, 1)]
        metrics = ray.get(trainer.train_step.remote(samples, 1))
        assert metrics["version"] == 1.0 and metrics["tokens"] == 16
        pub = ray.get(trainer.publish.remote(store.spec, None, 64 * 1024))
        assert pub["version"] == 1.0 and pub["buckets"] > 1
        pulled = pending.result(timeout=120)
        assert states_equal(ray.get(trainer.state_dict.remote()), pulled)
        assert pulled["lm_head.weight"] is pulled["model.embed_tokens.weight"]
        tiny_pull = dict(store.last_pull)

        step, version = 1, 1
        ckpt = ray.get(trainer.save_checkpoint.remote(str(tmp_path)))
        assert Path(ckpt).name == "step_00000001"
        assert ray.get(trainer.load_checkpoint.remote(str(tmp_path))) == (step, version)

        # 64 MiB published by the driver, pulled by a task in a worker process.
        synth_pub = store.publish(2, synthetic_state(64, seed=3), 16 * MiB)
        equal, synth_pull = ray.get(ray.remote(num_cpus=1)(_pull_in_task).remote(store.spec, 2, 3))
        assert equal
        assert ray.get(store.registry.versions_held.remote()) == [1, 2]
        store.publish(3, {"x": torch.zeros(4)}, 1024)
        assert ray.get(store.registry.versions_held.remote()) == [2, 3]  # keep=2
        with pytest.raises(KeyError):
            store.pull(1, timeout=1)
        with pytest.raises(TimeoutError):
            store.pull(9, timeout=0.2)

        # The actor publishing through Mooncake: the realistic cross-process path.
        from rollart.runtime.weights import mooncake_store as ms

        if ms.available()[0]:
            with ms.start_master() as master:
                spec = master.spec(segment_bytes=64 * MiB)
                ray.get(trainer.publish.remote(spec, 5, 64 * 1024))
                puller = spec.for_puller().open()
                try:
                    assert states_equal(ray.get(trainer.state_dict.remote()), puller.pull(5, timeout=30))
                finally:
                    puller.close()
                    ray.get(trainer.close_stores.remote())
        ray.kill(trainer)
    finally:
        store.close()
    print(f"\nRay object store, 16 MiB buckets: publish 64 MiB {synth_pub['mib_per_s']:.0f} MiB/s "
          f"({synth_pub['seconds'] * 1e3:.0f} ms), pull in another process {synth_pull['mib_per_s']:.0f} MiB/s "
          f"({synth_pull['seconds'] * 1e3:.0f} ms); Qwen3-tiny publish {pub['seconds'] * 1e3:.1f} ms, "
          f"pull {tiny_pull['fetch_s'] * 1e3 + tiny_pull['assemble_s'] * 1e3:.1f} ms after it arrived")


# ---------------------------------------------------------------- Redis


def test_redis_server_starts_records_bindings_and_stops():
    from rollart.runtime.redis_server import (RESOURCE_KEYS, RedisServer, binding_events, bindings, pool_view,
                                              record_binding, register_pool, remove_binding)

    ok, why = RedisServer.available()
    if not ok:
        pytest.skip(why)
    t0 = time.perf_counter()
    with RedisServer() as srv:
        assert srv.running and srv.url == f"redis://:{srv.password}@127.0.0.1:{srv.port}/0"
        r = srv.client()
        assert r.ping()
        assert r.config_get("save")["save"] == "" and r.config_get("appendonly")["appendonly"] == "no"
        register_pool(r, "h800", {"GPU": 8}, kind="compute")
        register_pool(r, "h20", {"GPU": 8}, kind="bandwidth")
        register_pool(r, "cpu", {"CPU": 32})
        assert record_binding(r, "trainer-0", "h800", {"GPU": 4}) is None
        record_binding(r, "gen-0", "h20", {"GPU": 1}, tag="GEM-Math")
        record_binding(r, "gen-1", "h800", {"GPU": 1, "preferred": "h20"}, fallback_from="h20")
        record_binding(r, "env-0", "cpu", {"CPU": 2})
        view = pool_view(r)
        assert view["h800"] == {"kind": "compute", "capacity": {"GPU": 8.0}, "used": {"GPU": 5.0},
                                "free": {"GPU": 3.0}, "workers": ["gen-1", "trainer-0"]}
        assert view["h20"]["workers"] == ["gen-0"] and view["cpu"]["free"] == {"CPU": 30.0}
        # gen-1 moves back to h20 when it frees up: one binding, in one pool
        prev = record_binding(r, "gen-1", "h20", {"GPU": 1})
        assert prev is not None and prev["pool"] == "h800" and prev["fallback_from"] == "h20"
        assert prev["preferred"] == "h20" and prev["resources"] == {"GPU": 1.0}  # non-numbers are metadata
        view = pool_view(r)
        assert view["h800"]["workers"] == ["trainer-0"] and view["h20"]["workers"] == ["gen-0", "gen-1"]
        b = bindings(r)
        assert b["gen-0"]["tag"] == "GEM-Math" and b["env-0"]["resources"] == {"CPU": 2.0}
        assert remove_binding(r, "env-0", reason="died")["pool"] == "cpu"
        assert remove_binding(r, "env-0") is None
        assert pool_view(r)["cpu"]["workers"] == [] and "env-0" not in bindings(r)
        events = binding_events(r)
        assert events[0]["event"] == "unbind" and events[0]["reason"] == "died"
        assert events[1] == {**events[1], "event": "bind", "worker": "gen-1", "pool": "h20", "from": "h800"}
        assert r.exists(RESOURCE_KEYS.pool_workers("h20"))
        # nothing of it on disk while it runs (a SIGKILLed run leaves no password or folder in /tmp):
        # its folder is gone once it answered, its config (the password) came on stdin, its log is unlinked
        assert os.readlink(f"/proc/{srv.proc.pid}/cwd").endswith(" (deleted)")
        assert "Ready to accept connections" in srv.log_tail()
        port, proc = srv.port, srv.proc
    assert proc.poll() is not None and not srv.running
    import socket

    with pytest.raises(OSError):  # nothing listens there any more
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    assert time.perf_counter() - t0 < 20
