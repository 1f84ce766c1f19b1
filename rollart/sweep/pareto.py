"""The cost/throughput Pareto frontier of a sweep and its plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rollart.sweep.results import all_steady, rates


def _xy(r: dict[str, Any], steady: bool) -> tuple[Any, Any]:
    """(cost per 1k trajectories: lower is better, trajectories/s: higher is better), past the cold
    first step when every point reached it (:func:`~rollart.sweep.results.all_steady`)."""
    y, x = rates(r, steady)
    return x, y


def _ok(r: dict[str, Any], steady: bool) -> bool:
    x, y = _xy(r, steady)
    return (not r.get("error") and isinstance(x, (int, float)) and isinstance(y, (int, float))
            and math.isfinite(x) and math.isfinite(y) and y > 0)


def pareto_front(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows no other row beats on both cost per 1 000 trajectories (lower) and throughput
    (higher), cheapest first; past the cold first step when every point reached it, else over the
    whole runs. Rows with an error or no throughput are left out; of exact duplicates the first is
    kept."""
    steady = all_steady(rows)
    ok = sorted((r for r in rows if _ok(r, steady)), key=lambda r: (_xy(r, steady)[0], -_xy(r, steady)[1]))
    front: list[dict[str, Any]] = []
    best_y = -math.inf
    for r in ok:
        if _xy(r, steady)[1] > best_y:
            front.append(r)
            best_y = _xy(r, steady)[1]
    return front


def plot_pareto(rows: list[dict[str, Any]], front: list[dict[str, Any]], path: str | Path, title: str = "",
                label_keys: list[str] | None = None) -> Path:
    """Scatter of every successful point (cost per 1 000 trajectories vs trajectories/s) with
    the frontier highlighted and, when ``label_keys`` are given, its points labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steady = all_steady(rows)
    ok = [r for r in rows if _ok(r, steady)]
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    ax.scatter([_xy(r, steady)[0] for r in ok], [_xy(r, steady)[1] for r in ok], s=18, c="0.65", label=f"points ({len(ok)})")
    if front:
        ax.plot([_xy(r, steady)[0] for r in front], [_xy(r, steady)[1] for r in front], "-o", c="tab:red", ms=5,
                label=f"Pareto frontier ({len(front)})")
        for r in front if label_keys else []:
            text = ", ".join(f"{k.rsplit('.', 1)[-1]}={r.get(k)}" for k in label_keys)
            ax.annotate(text, _xy(r, steady), textcoords="offset points", xytext=(4, 4), fontsize=6)
    ax.set_xlabel("cost per 1 000 trajectories (US$)")
    ax.set_ylabel("throughput (trajectories/s, " + ("past the first step)" if steady else "whole run)"))
    ax.set_title(title or "sweep: cost vs throughput", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
