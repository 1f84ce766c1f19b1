"""Sweep results as a table: one row per point, written as CSV (always) and Parquet (when
pyarrow is importable)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from rollart.core.stats import BREAKDOWN_KEYS

METRICS = ("trajectories_per_s", "tokens_per_s", "step_time_s_mean", "step_time_s_p90", "cost_usd_per_hour",
           "cost_per_step_usd", "cost_per_1k_trajectories_usd", "mean_staleness", "aborted_stale",
           "aborted_redundant", "env_failures", "serverless_gpu_seconds", "serverless_serving_s", "steps_done",
           "simulated_s")

STEADY_METRICS = ("trajectories_per_s", "cost_per_1k_trajectories_usd", "step_time_s_mean", "mean_staleness")


def all_steady(rows: list[dict[str, Any]]) -> bool:
    """Whether every successful point reached its steady state (ran at least 3 steps): only then are
    the points compared past their cold first step, else all over their whole runs, so that no two
    points are read on different bases."""
    ok = [r for r in rows if not r.get("error")]
    return bool(ok) and all(r.get("steady_trajectories_per_s") for r in ok)


def rates(row: dict[str, Any], steady: bool) -> tuple[Any, Any]:
    """(trajectories/s, US$ per 1k trajectories) a row is ranked by: its steady state's when the
    sweep is read on that basis (:func:`all_steady`), else its whole run's."""
    if steady:
        return row.get("steady_trajectories_per_s"), row.get("steady_cost_per_1k_trajectories_usd")
    return row.get("trajectories_per_s"), row.get("cost_per_1k_trajectories_usd")


def _cell(v: Any) -> Any:
    """Scalars stay as they are; lists and mappings become compact JSON (one CSV cell)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def result_row(key: str, point: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """A flat row: key, the point's grid values (column = --grid path), seed, mode, placed GPUs,
    the summary metrics, mean breakdown per step, the scale-approximation factor, wall seconds and
    the error (empty if none)."""
    sm = record.get("summary") or {}
    row: dict[str, Any] = {"key": key}
    row.update({path: _cell(v) for path, v in point.items()})
    placed = record.get("placed_gpus") or {}
    row.update({"seed": record.get("seed"), "mode": record.get("mode"),
                "gpus": sum(placed.values()) if placed else None, "gpus_by_pool": _cell(placed or None)})
    for m in METRICS:
        row[m] = sm.get(m)
    # the steady state's rates (past the cold first step; empty when the run was too short to reach
    # it): what the frontier and the table rank by when every point has them
    steady = sm.get("steady") or {}
    settled = bool(steady.get("settled"))
    for m in STEADY_METRICS:
        row[f"steady_{m}"] = steady.get(m) if settled else None
    row["steady_steps_needed"] = steady.get("steps_needed")
    bd = sm.get("breakdown_s_mean") or {}
    for k in BREAKDOWN_KEYS:
        row[f"breakdown_{k}_s"] = bd.get(k)
    row["gpu_busy_fraction"] = _cell(sm.get("gpu_busy_fraction"))
    # --scale-approx: the m the point was approximated with (1: simulated in full); empty without it
    row["scale_factor"] = record.get("scale_factor")
    row["wall_s"] = record.get("wall_s")
    row["error"] = record.get("error") or ""
    return row


def write_results(rows: list[dict[str, Any]], out: str | Path) -> list[Path]:
    """``OUT/results.csv`` and, with pyarrow, ``OUT/results.parquet``; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for r in rows:
        columns += [c for c in r if c not in columns]
    written = []
    path = out / "results.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: ("" if r.get(c) is None else r.get(c)) for c in columns})
    written.append(path)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return written
    # One type per column: a grid column mixing numbers and text is stored as text.
    table_cols = {}
    for c in columns:
        vals = [r.get(c) for r in rows]
        kinds = {type(v) for v in vals if v is not None}
        if len(kinds) > 1 and not kinds <= {int, float}:
            vals = [None if v is None else str(v) for v in vals]
        elif kinds == {int, float}:
            vals = [None if v is None else float(v) for v in vals]
        table_cols[c] = vals
    pq.write_table(pa.table(table_cols), out / "results.parquet")
    written.append(out / "results.parquet")
    return written
