"""Measure this machine for ``rollart validate``: the engine, the generate call around it, the
trainer and the weight hand-off.

Everything is measured through the classes and Ray calls ``rollart run`` itself uses (a
:class:`RuntimeBackend`'s inference workers, trainer actor and weight store), so the simulator is calibrated on what the run executes, not
on a bare forward pass:

* engine: prefill and decode *steps* timed inside the run's inference workers (sampling, KV
  bookkeeping and the worker's own threads included), all workers at once, over batch sizes ×
  prompt lengths → an engine profile
  (``prefill(N, A) = a + b·N + c·A``, ``decode(B, X) = a + b·B + c·X``, plus ``call_step_s`` for
  a step during which generate calls arrived or returned: their Python takes the GIL);
* request overhead: a generate call's round trip beyond the worker's time for it, in the reference run
  (idle: round trip minus the engine time it caused);
* trainer: ``train_step`` round trips over batch sizes × sequence lengths → a train profile
  (``step = a + b·T + c·Σs²``);
* weights: bucketed publish + pull, the swap into the engine, and the synchronous hand-off.
"""

from __future__ import annotations

import bisect
import csv
import statistics
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import yaml

from rollart.plan.schema import ModelSpec, Plan

ENGINE_BATCHES = (1, 2, 4, 8, 16, 32)
ENGINE_PROMPTS = (16, 64, 192, 448)
DECODE_STEPS = 6
TRAIN_BATCHES = (4, 8, 16, 32)
TRAIN_LENGTHS = (32, 128, 384)
REFERENCE_STEPS = 8  # past the start-up transient (the first batches start together): the steady state's
                     # staggered arrivals are what the in-run fit and overheads must see
MIN_MATCHED_CALLS = 20
# What a profile directory holds and how it was measured; ``rollart validate`` reuses only a
# profile of this format (2: the in-run generate overhead and an 8-step reference run).
PROFILE_FORMAT = 2

Progress = Callable[[str], None]


def rows_from_step_log(log: list[dict[str, float]]) -> list[dict[str, Any]]:
    """Profile rows from an inference worker's step log: pure prefill steps and pure decode
    steps (mixed ones are left out), the median of each distinct point."""
    points: dict[tuple, list[float]] = {}
    for st in log:
        n, rows = int(st["prefill_requests"]), int(st["decode_rows"])
        if n and not rows:
            key = ("prefill", n, 0, round(st["prefill_tokens"] / n))
        elif rows and not n:
            key = ("decode", rows, round(st["decode_kv"] / rows), 1)
        else:
            continue
        points.setdefault(key, []).append(st["seconds"])
    return [{"phase": k[0], "batch_size": k[1], "kv_len": k[2], "new_tokens": k[3],
             "latency_us": statistics.median(v) * 1e6} for k, v in sorted(points.items())]


def decode_probe(model: ModelSpec, seed: int, start_at: float, batch: int = 8, prompt: int = 64,
                 steps: int = 150) -> float:
    """Mean seconds of a decode step at ``batch`` × ``prompt``, timed from the wall-clock
    ``start_at`` on (so copies started together measure together); runs where it is called."""
    from rollart.runtime.inference_worker import make_engine

    engine = make_engine(model, "torch", seed=seed, stop_token_ids=())
    rng = np.random.default_rng(seed)
    engine.add("warm", rng.integers(16, model.vocab, prompt).tolist(), 8)
    while engine.has_work():
        engine.step()
    time.sleep(max(0.0, start_at - time.time()))
    for i in range(batch):
        engine.add(f"r{i}", rng.integers(16, model.vocab, prompt).tolist(), steps + 1)
    engine.step()  # the prefill
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - t0) / steps


def parallelism_from_slowdowns(slowdowns: dict[int, float]) -> float:
    """The P of ``slowdown(k) = max(1, k / P)`` that fits measured slowdowns of k copies run
    together (k/slowdown averaged over the k that did slow down; the largest k when none did)."""
    slowed = [k / s for k, s in slowdowns.items() if k > 1 and s > 1.05]
    if not slowed:
        return float(max(slowdowns))
    return max(1.0, statistics.mean(slowed))


def busy_engines(worker_logs: list[list[dict[str, float]]]) -> list[list[int]]:
    """For every logged step of every worker: how many engines (itself included) were inside a
    step at its midpoint. Steps carry ``started`` and ``seconds``; each log is in step order."""
    spans = [([s["started"] for s in log], [s["started"] + s["seconds"] for s in log]) for log in worker_logs]
    out = []
    for i, log in enumerate(worker_logs):
        counts = []
        for s in log:
            mid = s["started"] + s["seconds"] / 2
            k = 1
            for j, (starts, ends) in enumerate(spans):
                if j != i:
                    at = bisect.bisect_right(starts, mid) - 1
                    k += at >= 0 and ends[at] > mid
            counts.append(k)
        out.append(counts)
    return out


def in_run_parallelism(worker_logs: list[list[dict[str, float]]], predict: Callable[[dict[str, float]], float],
                       probe: float) -> float:
    """The host parallelism the run itself shows. With ``R`` = (Σ measured / Σ predicted over
    steps that ran while other engines stepped) / (the same over steps that ran alone) and k̄
    the mean number of engines busy in the first group, ``slowdown(k) = max(1, k / P)`` gives
    ``P = k̄ / R``. In a run, engines share the host with the driver, the env workers and Ray's
    own threads, so they can interfere more than the probe's bare copies did: the result is at
    most ``probe``, and ``probe`` itself when the run shows no interference (or cannot tell)."""
    sums = {False: [0.0, 0.0], True: [0.0, 0.0]}
    ks: list[int] = []
    for log, counts in zip(worker_logs, busy_engines(worker_logs)):
        for s, k in zip(log, counts):
            shared = k > 1
            sums[shared][0] += s["seconds"]
            sums[shared][1] += predict(s)
            if shared:
                ks.append(k)
    if not ks or min(sums[False][1], sums[True][1]) <= 0 or sums[False][0] <= 0:
        return probe
    ratio = (sums[True][0] / sums[True][1]) / (sums[False][0] / sums[False][1])
    if ratio <= 1.0:
        return probe
    return round(max(1.0, min(probe, statistics.mean(ks) / ratio)), 3)


def in_run_request_overhead(round_trips: dict[str, float],
                            request_logs: list[list[dict[str, Any]]]) -> tuple[Optional[float], int]:
    """Mean time a generate call of a run spent outside what the simulated engine models, and
    how many calls it is the mean of: the driver's round trip minus the worker's time from the
    call's arrival to the engine finishing it (the wait for the next step boundary and the
    steps themselves are the engine's). What remains is Ray's transport both ways, the worker's
    reply and the driver's event loop, under the run's own load. Aborted calls are left out
    (they return early), and so are calls the driver has no round trip for. The mean is None
    below ``MIN_MATCHED_CALLS`` calls."""
    spans = [rt - (r["done"] - r["called"]) for log in request_logs for r in log
             if r.get("finish_reason") != "abort" and "done" in r and (rt := round_trips.get(r["request"])) is not None]
    if len(spans) < MIN_MATCHED_CALLS:
        return None, len(spans)
    return max(0.0, statistics.mean(spans)), len(spans)


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["phase", "batch_size", "kv_len", "new_tokens", "latency_us"])
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, "latency_us": f"{r['latency_us']:.1f}"})


@dataclass
class LocalProfile:
    """Where the measured profiles were written, and the raw figures behind them."""

    engine_path: Path
    train_path: Path
    figures: dict[str, Any]


def _kill_actors(backend: Any) -> None:
    """The profile's workers hold pool resources: free them for the run that follows."""
    import ray

    for actor in [*getattr(backend, "workers", []), *getattr(backend, "env_workers", []),
                  getattr(backend, "trainer", None)]:
        if actor is not None:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass


def _median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else 0.0


class LocalProfiler:
    """Measures a plan's model on this machine through a :class:`RuntimeBackend`'s components."""

    def __init__(self, plan: Plan, seed: int = 0, repeats: int = 3, progress: Optional[Progress] = None):
        self.plan, self.seed, self.repeats = plan, seed, repeats
        self.progress = progress or (lambda _msg: None)

    def run(self, out_dir: Path) -> LocalProfile:
        import ray

        from rollart.core.modes import mode_config
        from rollart.runtime.backend import RuntimeBackend

        out_dir.mkdir(parents=True, exist_ok=True)
        backend = RuntimeBackend(self.plan, mode_config(self.plan, "rollart"), self.seed)
        try:
            self.progress("starting Ray and the run's workers")
            backend.setup()
            model = backend.model
            self.progress(f"engine steps in the {len(backend.workers)} inference workers, side by side")
            rows = self._engine_rows(backend)
            csv_path = out_dir / "engine.csv"
            write_rows(rows, csv_path)
            self.progress("host parallelism (1 to 4 engines decoding at once)")
            parallelism, slowdowns = self._host_parallelism(model)
            self.progress("generate call overhead")
            overhead = self._request_overhead(backend)
            self.progress("trainer steps")
            train_rows = self._train_rows(backend)
            self.progress("weight hand-off")
            weights = self._weights(backend)
            self.progress("env call overhead")
            env_overheads = self._env_overheads()
            grid_log = self._grid_log
            n_workers = len(backend.workers)
        finally:
            _kill_actors(backend)
            backend.close()
        self.progress(f"reference run ({REFERENCE_STEPS} steps of {self.plan.name}, another seed)")
        run_train = self._reference_run()
        # the generate call as the run pays it; the idle figure when the run matched too few calls
        in_run = self._run_request_overhead
        request_overhead = in_run if in_run is not None else overhead
        calls = self._run_request_calls if in_run is not None else 0  # 0: the idle figure
        engine_path = self._write_engine_profile(csv_path, grid_log, model, request_overhead, out_dir,
                                                 parallelism, n_workers)
        train_rows += run_train
        idle_weights = dict(weights)
        weights.update(self._run_weights)  # in-run figures where the reference run measured them
        train_path = self._write_train_profile(train_rows, weights, model, out_dir)
        self._write_host_profile(env_overheads, out_dir)
        return LocalProfile(engine_path, train_path, {"request_overhead_s": request_overhead,
                                                      "idle_request_overhead_s": overhead,
                                                      "request_overhead_calls": calls,
                                                      "call_step_s": self._call_step_s,
                                                      **weights,
                                                      "idle_weights": idle_weights,
                                                      "env_reset_overhead_s": self._run_env_overhead["reset"],
                                                      "env_step_overhead_s": self._run_env_overhead["step"],
                                                      "idle_env_overhead_s": list(env_overheads),
                                                      "host_parallelism": self._parallelism["run"],
                                                      "host_parallelism_probe": parallelism,
                                                      "effect_cpu_s": self._run_effect_cpu_s,
                                                      "slowdowns": {str(k): v for k, v in slowdowns.items()},
                                                      "engine_rows": len(rows), "train_rows": len(train_rows)})

    # ---- the pieces -----------------------------------------------------------------------

    def _engine_rows(self, backend: Any) -> list[dict[str, Any]]:
        """Drive every inference worker of the run through the grid at once (they share this
        host in the run too) and read back what each engine step computed and took.

        Per (batch B, prompt P): the workers are suspended, B requests of P random tokens are
        queued on each, and the resume makes one step prefill them together (as a GRPO group's
        turn arrives), then ``DECODE_STEPS`` decode steps follow. One warm-up round first."""
        import ray

        workers = backend.workers
        max_batch = max(g.max_num_seqs for g in self.plan.placement.generation)
        vocab = backend.model.vocab
        rng = np.random.default_rng(self.seed)

        def round_(tag: str, b: int, p: int) -> None:
            ray.get([w.suspend.remote() for w in workers])
            refs = [w.generate.remote(f"{tag}-{wi}-{i}", rng.integers(16, vocab, p).tolist(), DECODE_STEPS + 1, 1.0,
                                      int(rng.integers(2**31))) for wi, w in enumerate(workers) for i in range(b)]
            ray.get([w.resume.remote() for w in workers])
            ray.get(refs)

        round_("warm", 4, 32)
        ray.get([w.record_steps.remote(True) for w in workers])
        for b in (x for x in ENGINE_BATCHES if x <= max_batch):
            for p in ENGINE_PROMPTS:
                for rep in range(self.repeats):
                    round_(f"{b}-{p}-{rep}", b, p)
        logs = ray.get([w.record_steps.remote(False) for w in workers])
        self._grid_log = [st for log in logs for st in log]
        return rows_from_step_log(self._grid_log)

    def _reference_run(self) -> list[tuple[int, int, float]]:
        """A short real run of the plan with another seed, in the conditions no grid reproduces
        (staggered arrivals, steps that prefill and decode, padded KV after merges, the driver and
        envs running alongside): keeps every worker's logged engine steps (``_run_logs``) and the
        in-run overheads, returns the train steps as profile rows."""
        from rollart.core.modes import mode_config
        from rollart.runtime.backend import RuntimeBackend

        algo = self.plan.algorithm.model_copy(update={"steps": REFERENCE_STEPS, "seed": self.seed + 1000})
        plan = self.plan.model_copy(update={"algorithm": algo})
        backend = RuntimeBackend(plan, mode_config(plan, None), algo.seed, record_engine_steps=True)
        try:
            outcome = backend.run()
        finally:
            _kill_actors(backend)
        if outcome.error:
            raise RuntimeError(f"profile: the reference run failed: {outcome.error}")
        self._run_logs = [w.get("step_log", []) for w in outcome.worker_stats]  # per worker, in step order
        self._run_request_overhead, self._run_request_calls = in_run_request_overhead(
            backend.counters.generate_round_trips, [w.get("request_log", []) for w in outcome.worker_stats])
        summary = outcome.to_result().summary
        self._run_env_overhead = summary["env_call_overhead_s"]
        self._run_effect_cpu_s = summary["host_cpu_per_effect_s"]
        c = backend.counters
        mean = statistics.mean
        self._run_weights: dict[str, float] = {}
        if c.weight_publish_s and c.update_s:  # what this plan's transport did inside a run
            if plan.weight_sync.transport == "bucketed_store":
                self._run_weights = {"publish_pull_s": mean(c.weight_publish_s), "swap_s": mean(c.update_s)}
            else:
                self._run_weights = {"broadcast_s": mean(c.weight_publish_s) + mean(c.update_s)}
        train = [(sum(m["context_tokens"]), sum(s * s for s in m["context_tokens"]), m["round_trip_s"])
                 for m in backend.counters.train_metrics[1:]]  # the first step warms the trainer up
        return train

    def _env_overheads(self, calls: int = 30) -> tuple[float, float]:
        """Mean reset and step round trips through an env worker actor of the plan's first task
        with no latency injected: what a real env call costs beyond the env's own time."""
        import ray

        from rollart.runtime.envs.worker import remote_env_worker

        task = self.plan.tasks[0].name
        worker = remote_env_worker(num_cpus=0, tasks=self.plan, seed=self.seed, inject=False)
        try:
            ray.get(worker.warmup.remote([task]))
            resets, steps = [], []
            for i in range(calls + 1):
                t0 = time.perf_counter()
                ray.get(worker.reset.remote(f"o{i}", task, i))
                t1 = time.perf_counter()
                ray.get(worker.step.remote(f"o{i}", "1 2 3"))
                t2 = time.perf_counter()
                ray.get(worker.close.remote(f"o{i}"))
                if i:
                    resets.append(t1 - t0)
                    steps.append(t2 - t1)
        finally:
            ray.kill(worker)
        return statistics.mean(resets), statistics.mean(steps)

    def _host_parallelism(self, model: ModelSpec, copies: int = 4) -> tuple[float, dict[int, float]]:
        """How many engines this host runs at full speed at once: the same decode workload on
        1, 2, … ``copies`` engines started together (Ray tasks, like the workers' processes)."""
        import ray

        probe = ray.remote(num_cpus=0)(decode_probe)
        per_step: dict[int, float] = {}
        for k in range(1, copies + 1):
            start = time.time() + 3.0  # after every copy has built its model
            per_step[k] = statistics.mean(ray.get([probe.remote(model, self.seed + i, start) for i in range(k)]))
        slowdowns = {k: round(t / per_step[1], 3) for k, t in per_step.items()}
        return round(parallelism_from_slowdowns(slowdowns), 3), slowdowns

    def _request_overhead(self, backend: Any, calls: int = 40) -> float:
        """Mean generate round trip minus the engine's busy time for it (1-token requests,
        one at a time, so nothing overlaps)."""
        import ray

        worker = backend.workers[0]
        prompt = list(range(16, 48))
        ray.get(worker.generate.remote("warm", prompt, 1, 1.0, 0))
        busy0 = ray.get(worker.stats.remote())["busy_seconds"]
        t0 = time.perf_counter()
        for i in range(calls):
            ray.get(worker.generate.remote(f"o{i}", prompt, 1, 1.0, i))
        wall = time.perf_counter() - t0
        busy = ray.get(worker.stats.remote())["busy_seconds"] - busy0
        return max(0.0, (wall - busy) / calls)

    def _train_rows(self, backend: Any) -> list[tuple[int, int, float]]:
        """(tokens, Σ s², seconds) per timed ``train_step`` round trip."""
        import ray

        from rollart.runtime.trainer.grpo import Sample

        rng = np.random.default_rng(self.seed)
        vocab = backend.model.vocab
        rows = []
        for n in TRAIN_BATCHES:
            for length in TRAIN_LENGTHS:
                times = []
                for rep in range(self.repeats + 1):
                    half = length // 2
                    samples = [Sample(group_id=i // 4, prompt_ids=rng.integers(16, vocab, half).tolist(),
                                      completion_ids=rng.integers(16, vocab, length - half).tolist(),
                                      loss_mask=[1] * (length - half),
                                      behaviour_logprobs=[-5.0] * (length - half), reward=float(rng.random()))
                               for i in range(n)]
                    t0 = time.perf_counter()
                    ray.get(backend.trainer.train_step.remote(samples, rep))
                    if rep:
                        times.append(time.perf_counter() - t0)
                rows.append((n * length, n * length * length, _median(times)))
        return rows

    def _weights(self, backend: Any) -> dict[str, float]:
        """The runtime's own weight calls on every worker at once, timed from the driver as
        ``rollart run`` awaits them."""
        import ray

        workers, trainer = backend.workers, backend.trainer
        bucket = int(self.plan.weight_sync.bucket_mb * 2**20)
        publish, swap, broadcast = [], [], []
        for rep in range(self.repeats + 1):  # every worker at once, as the run does
            version = 100 + rep
            loader = backend.pull_loader(version)
            t0 = time.perf_counter()
            ray.get(trainer.publish.remote(backend.store_spec, version, bucket))
            ray.get([w.prefetch_weights.remote(version, loader) for w in workers])
            t1 = time.perf_counter()
            ray.get([w.update_weights.remote(version, None) for w in workers])
            t2 = time.perf_counter()
            ref = ray.put(ray.get(trainer.state_dict.remote()))
            ray.get([w.update_weights.remote(version, ref) for w in workers])
            t3 = time.perf_counter()
            if rep:
                publish.append(t1 - t0)
                swap.append(t2 - t1)
                broadcast.append(t3 - t2)
        return {"publish_pull_s": _median(publish), "swap_s": _median(swap), "broadcast_s": _median(broadcast)}

    # ---- writing the profiles ---------------------------------------------------------------

    def _write_engine_profile(self, csv_path: Path, grid_log: list[dict[str, float]],
                              model: ModelSpec, request_overhead: float, out_dir: Path,
                              parallelism: float, side_by_side: int) -> Path:
        from rollart.calibration.engine_fit import fit_engine_steps, predict_step
        from rollart.calibration.profiles import save_profile
        from rollart.sim.contention import slowdown

        gpu = self._device_type()

        def fit(run_steps: list[dict[str, float]]) -> Any:
            return fit_engine_steps(grid_log + run_steps, gpu=gpu, model=model.name, engine="torch",
                                    source=f"{csv_path} (grid) + {len(run_steps)} steps of a reference run",
                                    data=[str(csv_path)])

        profile = fit([st for steps in self._run_logs for st in steps])
        # The grid drives every engine at once; the run's engines also step alone, and faster.
        # Measure how much (host_parallelism as the run shows it), then bring the run's steps to
        # the grid's condition and fit again, so the profile is "all engines busy" throughout.
        run_parallelism = in_run_parallelism(self._run_logs, partial(predict_step, profile), parallelism)
        self._parallelism = {"probe": parallelism, "run": run_parallelism}
        if run_parallelism < parallelism:
            ref = slowdown(side_by_side, run_parallelism)
            profile = fit([dict(st, seconds=st["seconds"] * ref / slowdown(k, run_parallelism))
                           for steps, ks in zip(self._run_logs, busy_engines(self._run_logs))
                           for st, k in zip(steps, ks)])
        self._call_step_s = profile.call_step_s
        profile.request_overhead_s = round(request_overhead, 6)
        profile.host_parallelism, profile.side_by_side = run_parallelism, max(1, side_by_side)
        profile.effect_cpu_s = round(self._run_effect_cpu_s, 7)
        profile.assumptions = [
            "engine steps timed inside the run's own inference workers (sampling, KV bookkeeping, the "
            "worker's threads included), one torch thread each: a grid with all workers driven at once, "
            f"plus every step of a {REFERENCE_STEPS}-step reference run of the plan (another seed)",
            "a prefill of several context lengths is one forward per length in the engine, one fixed cost here",
            "request_overhead_s: a generate call's round trip in the reference run minus the worker's time from its "
            "arrival to the engine finishing it (Ray both ways and the driver's loop, under the run's load); the idle "
            "figure (round trip minus engine time, one call at a time) when the run matched too few calls",
            "call_step_s: engine time of a step during which generate calls arrived or returned (their Python on "
            "the actor's event loop takes the GIL from the engine thread), fitted with the steps",
            "host_parallelism: engines at full speed at once on this host: 1-4 copies of one decode workload "
            f"started together (P = {parallelism}), or less when the reference run's engines slowed each other "
            "down more than that; the simulator slows engines and the trainer down beyond it",
            "effect_cpu_s: CPU of the driver and the env workers over the reference run beyond their idle rate, "
            "per effect of the core (the simulator counts it as load at the effect rate it runs at)",
        ]
        path = out_dir / "engine.yaml"
        save_profile(profile, path, header=f"{gpu} / {model.name}: measured by `rollart validate` on this machine "
                                           f"({time.strftime('%Y-%m-%d %H:%M')})")
        return path

    def _write_train_profile(self, rows: list[tuple[int, int, float]], weights: dict[str, float],
                             model: ModelSpec, out_dir: Path) -> Path:
        from rollart.calibration.engine_fit import fit_linear
        from rollart.calibration.profiles import TrainProfile, save_profile

        X = np.array([[1.0, t, s2] for t, s2, _ in rows])
        y = np.array([sec for _, _, sec in rows])
        fit = fit_linear(X, y, "a + b·T + c·S", "train_step round trips (rollart validate)")
        profile = TrainProfile(
            gpu=self._device_type(), model=model.name, trainer=self.plan.runtime.trainer, step=fit,
            publish_pull_s=round(weights["publish_pull_s"], 6), broadcast_s=round(weights["broadcast_s"], 6),
            swap_s=round(weights["swap_s"], 6),
            assumptions=["train_step round trips through the trainer actor (GRPO update, samples shipped): a grid "
                         "on an idle trainer plus the steps of the reference run",
                         f"publish/pull through the run's weight store ({self.plan.runtime.weight_store}), "
                         f"{self.plan.weight_sync.bucket_mb:g} MiB buckets, every worker at once; broadcast = "
                         "ray.put of the state dict + every worker's load; the figures of the plan's own "
                         f"transport ({self.plan.weight_sync.transport}) are the reference run's, the other "
                         "transport's were measured on idle workers"],
            source="measured by `rollart validate` on this machine")
        path = out_dir / "train.yaml"
        save_profile(profile, path, header=f"{model.name} trainer measured by `rollart validate`")
        return path

    def _write_host_profile(self, idle_env: tuple[float, float], out_dir: Path) -> Path:
        """``host.yaml``: what an env call costs beyond the env inside a run (the reference run's
        calls), with the idle figures beside it."""
        run_env = self._run_env_overhead
        host = {"env_reset_overhead_s": round(run_env["reset"], 6), "env_step_overhead_s": round(run_env["step"], 6),
                "idle_env_reset_overhead_s": round(idle_env[0], 6), "idle_env_step_overhead_s": round(idle_env[1], 6),
                "measured": time.strftime("%Y-%m-%d %H:%M"), "format": PROFILE_FORMAT,
                "note": "env call round trip minus the injected latency, mean over the reference run's calls "
                        "(idle_*: the same through an idle env worker, for comparison)"}
        path = out_dir / "host.yaml"
        path.write_text(yaml.safe_dump(host, sort_keys=False))
        return path

    def _device_type(self) -> str:
        pools = {self.plan.cluster.gpu_pools[g.pool].gpu for g in self.plan.placement.generation}
        return sorted(pools)[0]
