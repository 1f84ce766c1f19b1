"""Simulator speed and memory, as ratios to raw SimPy on the same machine (prints the figures).

    python benchmarks/sim_speed.py                      # paper scale, floor, memory
    python benchmarks/sim_speed.py --big                # + the 3,072-GPU step and the week estimate
    python benchmarks/sim_speed.py --json out.json      # the figures as JSON too

All times are CPU seconds of this process (``time.process_time``), so a busy shared machine
changes them less than wall time; the figure to track is the *ratio* of the simulator's
events per CPU-s to raw SimPy's events per CPU-s measured in the same run (the floor).
An "event" is one SimPy event scheduled (``Environment._eid``), the same count for both.

To compare two trees in one run, point ``PYTHONPATH`` at the other tree's checkout (with
``rollart/sim``, ``rollart/calibration`` and ``rollart/scenarios`` linked to its top-level
folders) and run this file from there; the script imports only public entry points.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import resource
import sys
import time
import tracemalloc
from typing import Any

import simpy

PAPER = "paper/qwen3-32b-128gpu"
SIM_WEEK_S = 7 * 24 * 3600.0


def scaled_overrides(k: int) -> list[str]:
    """The paper cluster (128 GPUs, batch 512) × ``k``: every pool, worker count, trainer,
    env core count, serverless concurrency and the batch scale together (k = 24: 3,072 GPUs)."""
    return [f"cluster.gpu_pools.h800.count={96 * k}", f"cluster.gpu_pools.h20.count={32 * k}",
            f"cluster.cpu_pools.env.cores={4096 * k}", f"cluster.serverless.max_concurrency={64 * k}",
            f"placement.trainer.gpus={64 * k}",
            f"placement.generation.0.workers={8 * k}", f"placement.generation.1.workers={8 * k}",
            f"algorithm.batch_size={512 * k}"]


def raw_simpy_events_per_cpu_s(n_procs: int = 200, events: int = 400_000) -> float:
    """The floor: processes that only wait on timeouts (one event per yield, plus SimPy's own
    bookkeeping events), the cheapest thing a SimPy model can do."""
    env = simpy.Environment()
    per = events // n_procs

    def proc(i: int):
        d = 0.001 * (1 + i % 7)
        for _ in range(per):
            yield env.timeout(d)

    for i in range(n_procs):
        env.process(proc(i))
    t0 = time.process_time()
    env.run()
    cpu = time.process_time() - t0
    return next(env._eid) / cpu


def heap_slope(heap: list[int]) -> float:
    """Bytes per step: the least-squares slope of the traced heap after each step."""
    n = len(heap)
    xm, ym = (n - 1) / 2, sum(heap) / n
    return sum((i - xm) * (y - ym) for i, y in enumerate(heap)) / max(1e-9, sum((i - xm) ** 2 for i in range(n)))


class GcClock:
    """CPU seconds the cyclic garbage collector spends, per generation (``gc.callbacks``): at large
    scale it is a share of the run worth tracking (16 % of a 3,072-GPU step against ~2 % at paper scale
    when first measured)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
        else:
            self.seconds[info["generation"]] += time.process_time() - self._t0
            self.count[info["generation"]] += 1

    def __enter__(self) -> "GcClock":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def requests_routed(backend: Any) -> int:
    """Generation requests the run routed: one per trajectory turn (PD: two); 0 for trees whose proxy
    does not count them."""
    proxy = backend.ctl.proxy
    return getattr(proxy, "routed_preferred", 0) + getattr(proxy, "routed_fallback", 0)


def run_plan(overrides: list[str], steps: int, seed: int = 0, memory: bool = False,
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Simulate; CPU-s per step (all steps, and steady: after the first), events, effects,
    and with ``memory`` the traced heap after each step (bytes per step = the slope)."""
    from rollart.core import mode_config
    from rollart.plan import load_plan
    from rollart.scenarios_catalog import resolve
    from rollart.sim import SimBackend

    plan = load_plan(resolve(PAPER), [*overrides, f"algorithm.steps={steps}"])
    marks: list[tuple[float, int, float]] = []  # (cpu, heap bytes, simulated end)

    def on_step(rec: Any) -> None:
        if memory:  # what is live, not what the cycle collector has yet to free (trajectory <-> group cycles)
            gc.collect()
        heap = tracemalloc.get_traced_memory()[0] if memory else 0
        marks.append((time.process_time(), heap, rec.end_s))

    gc.collect()
    if memory:
        tracemalloc.start()
    t0 = time.process_time()
    kwargs = dict(extra or {})
    if "keep_history" in inspect.signature(SimBackend).parameters:  # trees before bounded memory lack it
        kwargs.setdefault("keep_history", False)
    backend = SimBackend(plan, mode_config(plan), seed, on_step=on_step, **kwargs)
    with GcClock() as collector:
        out = backend.run()
    cpu = time.process_time() - t0
    if memory:
        tracemalloc.stop()
    assert out.error is None, out.error
    events = next(backend.env._eid)
    requests = requests_routed(backend)
    res: dict[str, Any] = {"steps": steps, "cpu_s": cpu, "cpu_per_step_s": cpu / steps, "events": events,
                           "requests": requests,
                           "effects": backend.effects_handled, "events_per_cpu_s": events / cpu,
                           "sim_step_s": out.elapsed_s / steps, "gc_s": sum(collector.seconds),
                           "gc_s_by_generation": collector.seconds, "gc_collections": collector.count}
    if len(marks) >= 2:
        res["steady_cpu_per_step_s"] = (marks[-1][0] - marks[0][0]) / (len(marks) - 1)
        res["steady_sim_step_s"] = (marks[-1][2] - marks[0][2]) / (len(marks) - 1)
    if memory and len(marks) >= 3:
        # least-squares slope over the second half of the run (the first steps fill the pipeline)
        res["bytes_per_step"] = heap_slope([m[1] for m in marks[len(marks) // 2:]])
        res["heap_bytes_end"] = marks[-1][1]
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="paper-scale steps to time")
    ap.add_argument("--mem-steps", type=int, default=10, help="paper-scale steps for the memory slope (0: skip)")
    ap.add_argument("--big", action="store_true", help="also time the 3,072-GPU plan (k = 24)")
    ap.add_argument("--big-steps", type=int, default=2)
    ap.add_argument("--approx-steps", type=int, default=0,
                    help="also time the 3,072-GPU plan under --scale-approx for this many steps (0: skip)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    if 0 < args.mem_steps < 3:  # the slope is fitted over the run's second half: three steps at least
        ap.error(f"--mem-steps: {args.mem_steps} is too few for a memory slope; give 3 or more (0 skips it)")
    import rollart

    out: dict[str, Any] = {"tree": rollart.__file__}
    floor = out["simpy_events_per_cpu_s"] = raw_simpy_events_per_cpu_s()
    print(f"raw SimPy: {floor:,.0f} events per CPU-s", flush=True)
    p = out["paper"] = run_plan([], args.steps)
    print(f"paper scale ({PAPER}, {args.steps} steps): {p['cpu_per_step_s']:.3f} CPU-s/step "
          f"(steady {p.get('steady_cpu_per_step_s', float('nan')):.3f}); {p['events'] / args.steps:,.0f} events "
          f"and {p['effects'] / args.steps:,.0f} effects per step; {p['events_per_cpu_s']:,.0f} events/CPU-s = "
          f"floor / {floor / p['events_per_cpu_s']:.1f}; cyclic GC {p['gc_s'] / p['cpu_s']:.1%} of it", flush=True)
    if p["requests"]:  # the workload's unit: one generation request = one turn of one trajectory
        per = p["requests"]
        out["paper_per_request"] = {"cpu_us": 1e6 * p["cpu_s"] / per, "events": p["events"] / per,
                                    "floor_us": 1e6 * p["events"] / per / floor}
        q = out["paper_per_request"]
        print(f"  per generation request (a turn; {per / args.steps:,.0f} a step): {q['cpu_us']:.1f} CPU-µs, "
              f"{q['events']:.2f} events, which raw SimPy alone spends {q['floor_us']:.1f} CPU-µs on", flush=True)
    if args.mem_steps:
        m = out["paper_memory"] = run_plan([], args.mem_steps, memory=True)
        print(f"memory (paper scale, {args.mem_steps} steps, tracemalloc): {m['bytes_per_step'] / 1e3:+,.0f} kB "
              f"per step, {m['heap_bytes_end'] / 1e6:.1f} MB traced at the end", flush=True)
    if args.big:
        b = out["big"] = run_plan(scaled_overrides(24), args.big_steps)
        steady = b.get("steady_cpu_per_step_s", b["cpu_per_step_s"])
        week_steps = SIM_WEEK_S / b.get("steady_sim_step_s", b["sim_step_s"])
        out["week"] = {"steps": week_steps, "cpu_h": steady * week_steps / 3600}
        print(f"3,072 GPUs, batch 12,288 ({args.big_steps} steps): {b['cpu_per_step_s']:.1f} CPU-s/step "
              f"(steady {steady:.1f}); {b['events_per_cpu_s']:,.0f} events/CPU-s = floor / "
              f"{floor / b['events_per_cpu_s']:.1f}; cyclic GC {b['gc_s'] / b['cpu_s']:.1%} of it; a simulated week ≈ "
              f"{week_steps:,.0f} steps ≈ "
              f"{out['week']['cpu_h']:.2f} CPU-h", flush=True)
    if args.approx_steps:
        from rollart.plan import load_plan
        from rollart.scenarios_catalog import resolve
        from rollart.plan.schema import sim_request_scale
        from rollart.sim.scale import auto_factor

        with sim_request_scale(math.inf):  # the factor depends on the run's length (sim/scale.py, min_groups)
            m = auto_factor(load_plan(resolve(PAPER), [*scaled_overrides(24), f"algorithm.steps={args.approx_steps}"]))
        a = out["big_approx"] = run_plan(scaled_overrides(24), args.approx_steps, extra={"scale_approx": m})
        steady = a.get("steady_cpu_per_step_s", a["cpu_per_step_s"])
        week_steps = SIM_WEEK_S / a.get("steady_sim_step_s", a["sim_step_s"])
        out["week_approx"] = {"factor": m, "steps": week_steps, "cpu_min": steady * week_steps / 60}
        print(f"3,072 GPUs with --scale-approx (1/{m} simulated, {args.approx_steps} steps): {a['cpu_per_step_s']:.2f} "
              f"CPU-s/step (steady {steady:.2f}); a simulated week ≈ {week_steps:,.0f} steps ≈ "
              f"{out['week_approx']['cpu_min']:.1f} CPU-min (extrapolated from steps 2-{args.approx_steps}, whose "
              f"steps are longer than a long run's: this errs low; benchmarks/week.py measures the week)", flush=True)
    out["simpy_events_per_cpu_s_end"] = raw_simpy_events_per_cpu_s()
    out["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"raw SimPy at the end: {out['simpy_events_per_cpu_s_end']:,.0f} events per CPU-s (the machine's speed "
          f"drifted by {out['simpy_events_per_cpu_s_end'] / floor - 1:+.0%}); peak RSS {out['max_rss_mb']:,.0f} MB",
          flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
