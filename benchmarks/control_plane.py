"""Control-plane overhead of the real runtime on this machine (prints the figures).

    python benchmarks/control_plane.py

* generate: one Qwen3-tiny request of 1 new token, in-process engine vs through the
  InferenceWorker Ray actor (the LLMProxy's round trip = actor time − engine time);
* reward: rule function in-process vs the Ray Serve endpoint (warm), over HTTP;
* weights: Mooncake store publish and pull of a 64 MiB state between two processes.
"""

from __future__ import annotations

import statistics
import time



def _median_ms(fn, n: int = 30) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    import ray
    import torch

    from rollart.plan.schema import ModelSpec
    from rollart.runtime.cluster import init_local_ray
    from rollart.runtime.inference_worker import InferenceWorkerActor, make_engine
    from rollart.runtime.reward.rules import score
    from rollart.runtime.reward.serverless import HttpReward, deploy_reward, shutdown_reward

    spec = ModelSpec.model_validate("Qwen3-tiny")
    engine = make_engine(spec, "torch", seed=0)
    prompt = list(range(3, 67))
    counter = iter(range(10**6))

    def in_process() -> None:
        engine.add(f"r{next(counter)}", prompt, 1)
        while engine.has_work():
            engine.step()

    engine_ms = _median_ms(in_process)
    init_local_ray(2, object_store_memory=200_000_000)  # loopback only, token auth
    worker = InferenceWorkerActor.options(num_cpus=0).remote(spec, "torch", seed=0)
    ray.get(worker.ping.remote())
    actor_ms = _median_ms(lambda: ray.get(worker.generate.remote(f"a{next(counter)}", prompt, 1)))
    record = {"task": "Digits", "messages": [], "env_reward": 0.5, "final_answer": "12 34", "steps": []}
    rule_ms = _median_ms(lambda: score("Digits", record), n=200)
    url = deploy_reward("bench-reward")
    client = HttpReward(url, timeout_s=30, retries=1)
    client.score(record)  # cold start
    serve_ms = _median_ms(lambda: client.score(record))
    shutdown_reward()
    print(f"generate (1 token, 64-token prompt): engine {engine_ms:.2f} ms, through the actor {actor_ms:.2f} ms "
          f"-> control-plane round trip {actor_ms - engine_ms:.2f} ms")
    print(f"reward: rule in-process {rule_ms * 1e3:.1f} µs, serverless (Ray Serve, warm, HTTP) {serve_ms:.2f} ms")
    ray.shutdown()

    from rollart.runtime.weights import mooncake_store

    ok, reason = mooncake_store.available()
    if not ok:
        print(f"mooncake: unavailable ({reason})")
        return
    import multiprocessing as mp

    state = {f"w{i}": torch.randn(4 * 2**20 // 4) for i in range(16)}  # 16 × 4 MiB = 64 MiB fp32
    with mooncake_store.start_master() as master:
        spec_store = master.spec()
        store = spec_store.open()
        t0 = time.perf_counter()
        store.publish(1, state, 16 * 2**20)
        pub = time.perf_counter() - t0
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=_pull, args=(spec_store.for_puller(), q))
        p.start()
        pull = q.get(timeout=120)
        p.join()
        store.close()
    print(f"mooncake 64 MiB, 16 MiB buckets: publish {pub * 1e3:.0f} ms ({64 / pub:.0f} MiB/s), "
          f"pull in another process {pull * 1e3:.0f} ms ({64 / pull:.0f} MiB/s)")


def _pull(spec, q) -> None:  # noqa: ANN001
    store = spec.open()
    t0 = time.perf_counter()
    store.pull(1)
    q.put(time.perf_counter() - t0)
    store.close()


if __name__ == "__main__":
    main()
