"""The cost/throughput Pareto frontier of a sweep and its plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

X = "cost_per_1k_trajectories_usd"   # lower is better
Y = "trajectories_per_s"             # higher is better


def _ok(r: dict[str, Any]) -> bool:
    x, y = r.get(X), r.get(Y)
    return (not r.get("error") and isinstance(x, (int, float)) and isinstance(y, (int, float))
            and math.isfinite(x) and math.isfinite(y) and y > 0)


def pareto_front(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows no other row beats on both cost per 1 000 trajectories (lower) and throughput
    (higher), cheapest first. Rows with an error or no throughput are left out; of exact
    duplicates the first is kept."""
    ok = sorted((r for r in rows if _ok(r)), key=lambda r: (r[X], -r[Y]))
    front: list[dict[str, Any]] = []
    best_y = -math.inf
    for r in ok:
        if r[Y] > best_y:
            front.append(r)
            best_y = r[Y]
    return front


def plot_pareto(rows: list[dict[str, Any]], front: list[dict[str, Any]], path: str | Path, title: str = "",
                label_keys: list[str] | None = None) -> Path:
    """Scatter of every successful point (cost per 1 000 trajectories vs trajectories/s) with
    the frontier highlighted and, when ``label_keys`` are given, its points labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if _ok(r)]
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    ax.scatter([r[X] for r in ok], [r[Y] for r in ok], s=18, c="0.65", label=f"points ({len(ok)})")
    if front:
        ax.plot([r[X] for r in front], [r[Y] for r in front], "-o", c="tab:red", ms=5,
                label=f"Pareto frontier ({len(front)})")
        for r in front if label_keys else []:
            text = ", ".join(f"{k.rsplit('.', 1)[-1]}={r.get(k)}" for k in label_keys)
            ax.annotate(text, (r[X], r[Y]), textcoords="offset points", xytext=(4, 4), fontsize=6)
    ax.set_xlabel("cost per 1 000 trajectories (US$)")
    ax.set_ylabel("throughput (trajectories/s)")
    ax.set_title(title or "sweep: cost vs throughput", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
