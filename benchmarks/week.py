"""A simulated week of the 3,072-GPU cluster (the paper cluster × 24) under the scale-out approximation.

    python benchmarks/week.py                      # 168 simulated hours (issue 16's target: <= 10 min wall)
    python benchmarks/week.py --sim-hours 24       # one simulated day
    python benchmarks/week.py --sim-hours 0.5 -q   # a quick check, no progress bar

Prints wall time, CPU time, training steps, peak RSS and the simulated figures; the run stops at
the simulated horizon (``algorithm.max_sim_hours``), so the last step in flight is not counted.
The approximation is always on here and the output says so (``--scale-approx``: 1/m of the
exchangeable workers, env managers and groups in full detail, see sim/scale.py).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root holds `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sim_speed import PAPER, SIM_WEEK_S, scaled_overrides  # noqa: E402

# The horizon ends the run; the step budget only has to outlast it. No step of this plan is this short (its
# train step alone is ~370 s at 3,072 GPUs), and the schema's guard on simulated requests counts the budget,
# so it is not set wider than that (at 60 s a week's budget was 10,080 steps: refused). If a run ever used
# the whole budget before the horizon, run_week says so instead of reporting a short week.
MIN_STEP_S = 240.0


class _PlainProgress:
    """Off a terminal (a log file): one line per tenth of the horizon, with the ETA."""

    def __init__(self, total_s: float) -> None:
        self.total_s, self.next_mark, self.t0 = total_s, 0.1, time.perf_counter()

    def __call__(self, rec: Any) -> None:
        done = rec.end_s / self.total_s
        if done < self.next_mark:
            return
        self.next_mark = (int(done * 10) + 1) / 10
        wall = time.perf_counter() - self.t0
        eta = wall * (1 - done) / done if done > 0 else float("nan")
        print(f"  {min(done, 1):4.0%} of the horizon: step {rec.step + 1}, simulated {rec.end_s / 3600:,.1f} h, "
              f"{wall:,.0f} s wall, ETA {eta:,.0f} s", file=sys.stderr, flush=True)


def run_week(sim_hours: float, k: int = 24, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from rollart.core import mode_config
    from rollart.plan import load_plan
    from rollart.plan.schema import sim_request_scale
    from rollart.scenarios_catalog import resolve
    from rollart.sim import simulate_plan
    from rollart.sim.scale import auto_factor

    horizon_s = sim_hours * 3600.0
    # The horizon ends the run, so allow more steps than fit in it. The schema's guard on simulated
    # requests counts the full plan; the approximation simulates 1/m of them, so the guard is m times wider.
    steps = max(2, math.ceil(horizon_s / MIN_STEP_S))
    overrides = [*scaled_overrides(k), f"algorithm.max_sim_hours={sim_hours!r}", f"algorithm.seed={seed}",
                 f"algorithm.steps={steps}"]
    with sim_request_scale(math.inf):  # the subset's share is checked once m is known
        m = auto_factor(load_plan(resolve(PAPER), overrides))
    with sim_request_scale(m):
        plan = load_plan(resolve(PAPER), overrides)
    gpus = sum(p.count for p in plan.cluster.gpu_pools.values())
    console = Console(stderr=True)
    print(f"{plan.name} × {k}: {gpus:,} GPUs, batch {plan.algorithm.batch_size:,}, {sim_hours:g} simulated hours, "
          f"--scale-approx on (1/{m} simulated in full detail)", flush=True)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    cfg = mode_config(plan)
    if progress and console.is_terminal:
        with Progress(TextColumn("[bold]simulating"), BarColumn(), TextColumn("{task.fields[steps]} steps · "
                      "{task.completed:,.0f} of {task.total:,.0f} simulated s"), TimeElapsedColumn(),
                      TextColumn("· ETA"), TimeRemainingColumn(), console=console, transient=True) as bar:
            task = bar.add_task("week", total=horizon_s, steps=0)
            outcome = simulate_plan(plan, cfg, seed, scale_approx=m, on_step=lambda rec: bar.update(
                task, completed=min(rec.end_s, horizon_s), steps=rec.step + 1))
    else:
        outcome = simulate_plan(plan, cfg, seed, scale_approx=m,
                                on_step=_PlainProgress(horizon_s) if progress else None)
    result = outcome.to_result()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if result.error and not result.error.startswith("algorithm.max_sim_hours"):
        raise RuntimeError(result.error)  # anything but the horizon ending the run is a failure
    if not result.error:
        raise RuntimeError(f"the step budget ({steps:,} steps, one per {MIN_STEP_S:g} simulated s) ran out before "
                           f"the horizon: lower MIN_STEP_S in benchmarks/week.py")
    steps = result.steps
    steady = steps[1:]
    steady_s = sum(s.time_s for s in steady)
    out: dict[str, Any] = {
        "scenario": plan.name, "k": k, "gpus": gpus, "batch_size": plan.algorithm.batch_size, "seed": seed,
        "sim_hours": sim_hours, "scale_factor": m, "scale_approx": result.summary.get("scale_approx"),
        "wall_s": wall, "cpu_s": cpu, "steps": len(steps),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        # the last step's end with the tail correction (it may pass the horizon a little)
        "simulated_s": steps[-1].end_s if steps else 0.0,
        "steady_step_s": steady_s / len(steady) if steady else None,
        "steady_trained_tokens_per_s": sum(s.tokens for s in steady) / steady_s if steady_s else None,
        "cpu_s_per_step": cpu / len(steps) if steps else None,
        "effects": result.summary.get("effects"),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim-hours", type=float, default=SIM_WEEK_S / 3600, help="simulated hours (default: a week)")
    ap.add_argument("--k", type=int, default=24, help="the paper cluster × k (default 24: 3,072 GPUs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    if not (0 < args.sim_hours <= 1e6):
        print("--sim-hours: must be > 0 and <= 1e6", file=sys.stderr)
        return 2
    if args.k < 1:
        print("--k: must be >= 1", file=sys.stderr)
        return 2
    out = run_week(args.sim_hours, args.k, args.seed, progress=not args.quiet)
    note = (out["scale_approx"] or {}).get("note", "--scale-approx: the plan is too small to approximate; "
                                                    "simulated in full")
    print(note)
    steady = out["steady_step_s"]
    print(f"{out['steps']:,} steps in {out['simulated_s'] / 3600:,.1f} simulated hours "
          f"(steady step {steady:,.1f} s, {out['steady_trained_tokens_per_s']:,.0f} trained tokens/s)"
          if steady else f"{out['steps']} steps in {out['simulated_s'] / 3600:,.2f} simulated hours")
    print(f"wall {out['wall_s']:,.1f} s ({out['wall_s'] / 60:.2f} min), CPU {out['cpu_s']:,.1f} s, "
          f"peak RSS {out['peak_rss_mb']:,.0f} MB", flush=True)
    if out["simulated_s"] and out["sim_hours"] < SIM_WEEK_S / 3600:
        # not measured: a week at this run's pace (the steady state is stationary; the start-up
        # step's extra cost is spread over the week, so this errs high for short runs)
        scale = SIM_WEEK_S / out["simulated_s"]
        out["week_extrapolated"] = {"wall_min": out["wall_s"] * scale / 60, "cpu_min": out["cpu_s"] * scale / 60}
        print(f"a simulated week at this pace (extrapolated, not measured): "
              f"{out['week_extrapolated']['wall_min']:,.1f} min wall, {out['week_extrapolated']['cpu_min']:,.1f} "
              f"CPU-min", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
