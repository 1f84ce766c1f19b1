"""Measure this machine for ``rollart validate``: the engine, the generate call around it, the
trainer and the weight hand-off.

Everything is measured through the classes and Ray calls ``rollart run`` itself uses (the
runtime's engine factory in a Ray worker process, a :class:`RuntimeBackend`'s inference worker,
trainer actor and weight store), so the simulator is calibrated on what the run executes, not
on a bare forward pass:

* engine: prefill and decode *steps* of the runtime's engine (sampling, KV bookkeeping and
  the merge of new rows included) over batch sizes × prompt lengths → an engine profile
  (``prefill(N, A) = a + b·N + c·A``, ``decode(B, X) = a + b·B + c·X``);
* request overhead: a generate call's round trip minus the engine time it caused;
* trainer: ``train_step`` round trips over batch sizes × sequence lengths → a train profile
  (``step = a + b·T + c·Σs²``);
* weights: bucketed publish + pull, the swap into the engine, and the synchronous hand-off.
"""

from __future__ import annotations

import csv
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from rollart.plan.schema import ModelSpec, Plan

ENGINE_BATCHES = (1, 2, 4, 8, 16, 32)
ENGINE_PROMPTS = (16, 64, 192, 448)
DECODE_STEPS = 6
TRAIN_BATCHES = (4, 8, 16, 32)
TRAIN_LENGTHS = (32, 128, 384)

Progress = Callable[[str], None]


def engine_step_rows(model: ModelSpec, seed: int, repeats: int = 3, batches: tuple[int, ...] = ENGINE_BATCHES,
                     prompts: tuple[int, ...] = ENGINE_PROMPTS, max_batch: int = 32) -> list[dict[str, Any]]:
    """Median step times of the runtime's engine (runs in the process that calls it).

    For each (batch B, prompt P): B requests of P random tokens arrive together (as a GRPO
    group's turn does), one step prefills them, then ``DECODE_STEPS`` steps decode; the first
    round is a warm-up. Stop tokens are disabled so every request runs its whole length."""
    from rollart.runtime.inference_worker import make_engine

    engine = make_engine(model, "torch", seed=seed, stop_token_ids=(), max_batch=max_batch)
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for b in batches:
        if b > max_batch:
            continue
        for p in prompts:
            prefill, decode = [], [[] for _ in range(DECODE_STEPS)]
            for rep in range(repeats + 1):
                for i in range(b):
                    prompt = rng.integers(16, model.vocab, p).tolist()
                    engine.add(f"{b}-{p}-{rep}-{i}", prompt, DECODE_STEPS + 1, 1.0, seed=rep * 1000 + i)
                t0 = time.perf_counter()
                engine.step()
                if rep:
                    prefill.append(time.perf_counter() - t0)
                for k in range(DECODE_STEPS):
                    t0 = time.perf_counter()
                    engine.step()
                    if rep:
                        decode[k].append(time.perf_counter() - t0)
                if engine.has_work():  # pragma: no cover - the engine changed its step semantics
                    raise RuntimeError("engine profile: requests still running after their last decode step")
            rows.append({"phase": "prefill", "batch_size": b, "kv_len": 0, "new_tokens": p,
                         "latency_us": statistics.median(prefill) * 1e6})
            for k in range(DECODE_STEPS):
                rows.append({"phase": "decode", "batch_size": b, "kv_len": p + k + 1, "new_tokens": 1,
                             "latency_us": statistics.median(decode[k]) * 1e6})
    return rows


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
            # All of the plan's engines step side by side in the run and share this host's cores,
            # so they are profiled side by side too: one copy of the grid per generation worker.
            workers = sum(g.workers for g in self.plan.placement.generation)
            self.progress(f"engine steps ({workers} engines side by side, prefill and decode over batch × prompt)")
            max_batch = max(g.max_num_seqs for g in self.plan.placement.generation)
            step_rows = ray.remote(num_cpus=0)(engine_step_rows)
            copies = ray.get([step_rows.remote(model, self.seed + i, self.repeats, max_batch=max_batch)
                              for i in range(workers)])
            rows = [r for copy in copies for r in copy]
            csv_path = out_dir / "engine.csv"
            write_rows(rows, csv_path)
            self.progress("generate call overhead")
            overhead = self._request_overhead(backend)
            self.progress("trainer steps")
            train_rows = self._train_rows(backend)
            self.progress("weight hand-off")
            weights = self._weights(backend)
        finally:
            backend.close()
        engine_path = self._write_engine_profile(csv_path, model, overhead, out_dir)
        train_path = self._write_train_profile(train_rows, weights, model, out_dir)
        return LocalProfile(engine_path, train_path, {"request_overhead_s": overhead, **weights,
                                                      "engine_rows": len(rows), "train_rows": len(train_rows)})

    # ---- the pieces -----------------------------------------------------------------------

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
        """The runtime's own weight calls, timed from the driver as ``rollart run`` awaits them."""
        import functools

        import ray

        from rollart.runtime.backend import pull_version

        worker, trainer = backend.workers[0], backend.trainer
        bucket = int(self.plan.weight_sync.bucket_mb * 2**20)
        spec = backend.store_spec.for_puller() if hasattr(backend.store_spec, "for_puller") else backend.store_spec
        publish, swap, broadcast = [], [], []
        for rep in range(self.repeats + 1):
            version = 100 + rep
            t0 = time.perf_counter()
            ray.get(trainer.publish.remote(backend.store_spec, version, bucket))
            ray.get(worker.prefetch_weights.remote(version, functools.partial(pull_version, spec, version)))
            t1 = time.perf_counter()
            ray.get(worker.update_weights.remote(version, None))
            t2 = time.perf_counter()
            ref = ray.put(ray.get(trainer.state_dict.remote()))
            ray.get(worker.update_weights.remote(version, ref))
            t3 = time.perf_counter()
            if rep:
                publish.append(t1 - t0)
                swap.append(t2 - t1)
                broadcast.append(t3 - t2)
        return {"publish_pull_s": _median(publish), "swap_s": _median(swap), "broadcast_s": _median(broadcast)}

    # ---- writing the profiles ---------------------------------------------------------------

    def _write_engine_profile(self, csv_path: Path, model: ModelSpec, overhead: float, out_dir: Path) -> Path:
        from rollart.calibration.engine_fit import fit_engine_csv
        from rollart.calibration.profiles import save_profile

        gpu = self._device_type()
        profile = fit_engine_csv(csv_path, gpu=gpu, model=model.name, engine="torch")
        profile.request_overhead_s = round(overhead, 6)
        profile.assumptions = [
            "steps of the runtime's own engine (sampling and KV bookkeeping included), one torch thread, "
            "as `rollart run` runs it",
            "all of the plan's engines profiled side by side (one grid copy each): they share this host's cores",
            "a prefill of several context lengths is one forward per length in the engine, one fixed cost here",
            "request_overhead_s: generate round trip through the inference worker actor minus its engine time",
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
            assumptions=["train_step round trips through the trainer actor (GRPO update, samples shipped)",
                         f"publish/pull through the run's weight store ({self.plan.runtime.weight_store}), "
                         f"{self.plan.weight_sync.bucket_mb:g} MiB buckets; broadcast = ray.put of the state "
                         "dict + the worker's load"],
            source="measured by `rollart validate` on this machine")
        path = out_dir / "train.yaml"
        save_profile(profile, path, header=f"{model.name} trainer measured by `rollart validate`")
        return path

    def _device_type(self) -> str:
        pools = {self.plan.cluster.gpu_pools[g.pool].gpu for g in self.plan.placement.generation}
        return sorted(pools)[0]
