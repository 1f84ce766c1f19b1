"""A whole sweep: points → jobs (skipping those already on disk) → Ray tasks → rows, frontier,
``results.csv``/``results.parquet`` and ``pareto.png``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rollart.sweep.grid import GridDim, Point
from rollart.sweep.pareto import pareto_front, plot_pareto
from rollart.sweep.results import result_row, write_results
from rollart.sweep.runner import RayPool, SerialPool
from rollart.sweep.store import ResultStore, point_key


@dataclass
class SweepOutcome:
    dims: list[GridDim]
    rows: list[dict[str, Any]]
    front: list[dict[str, Any]]
    ran: int = 0
    skipped: int = 0
    failed: int = 0          # points whose simulation or plan reported an error (kept on disk)
    lost: int = 0            # tasks Ray lost (not kept: a rerun retries them)
    wall_s: float = 0.0
    written: list[Path] = field(default_factory=list)


def run_sweep(data: dict[str, Any], dims: list[GridDim], points: list[Point], out: str | Path,
              pool: RayPool | SerialPool, base_overrides: list[str] = (), seed: int | None = None,
              mode: str | None = None, console: Console | None = None, progress: bool = True,
              title: str = "") -> SweepOutcome:
    """Run every point not yet in ``OUT/points`` (a point is keyed by the scenario content, the
    base overrides followed by the point's, the seed and the mode) and write the results of all
    of ``points``, in their order."""
    t0 = time.perf_counter()
    store = ResultStore(out)
    keyed = []
    for p in points:
        overrides = [*base_overrides, *p.overrides]
        keyed.append((point_key(data, overrides, seed, mode, getattr(pool, "scale_approx", False)), p, overrides))
    records: dict[str, dict[str, Any]] = {}
    jobs = []
    queued: set[str] = set()
    for key, p, overrides in keyed:
        rec = store.load(key)
        if rec is not None:
            records[key] = rec
        elif key not in queued:
            queued.add(key)
            jobs.append((key, data, overrides, seed, mode))
    outcome = SweepOutcome(dims, [], [], skipped=len({k for k, _, _ in keyed}) - len(jobs))
    console = console or Console(stderr=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("points · {task.fields[note]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=console, transient=True, disable=not progress) as bar:
        task = bar.add_task(f"sweep {title}".strip(), total=len(jobs) + outcome.skipped,
                            completed=outcome.skipped, note=f"{outcome.skipped} done before")
        if jobs:
            with pool:
                bar.update(task, note=f"{outcome.skipped} done before · {pool.workers} workers")
                for key, rec in pool.imap_unordered(jobs):
                    if rec.get("lost"):
                        outcome.lost += 1
                    else:
                        store.save(key, rec)
                        outcome.ran += 1
                    records[key] = rec
                    bar.update(task, advance=1)
    for key, p, _ in keyed:
        rec = records.get(key) or {"error": "not run", "summary": None}
        row = result_row(key, p.as_dict(dims), rec)
        if row["error"]:
            outcome.failed += 1
        outcome.rows.append(row)
    outcome.failed -= outcome.lost
    outcome.front = pareto_front(outcome.rows)
    out = Path(out)
    outcome.written = write_results(outcome.rows, out)
    outcome.written.append(plot_pareto(outcome.rows, outcome.front, out / "pareto.png",
                                       title=f"{title}: cost vs throughput ({len(outcome.rows)} points)",
                                       label_keys=[d.path for d in dims]))
    outcome.wall_s = time.perf_counter() - t0
    return outcome
