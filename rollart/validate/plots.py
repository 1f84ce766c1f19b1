"""``validation.png``: simulated over real step times, and the mean step breakdown of each."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rollart.core.stats import BREAKDOWN_KEYS  # noqa: E402
from rollart.validate.compare import step_figures  # noqa: E402

if TYPE_CHECKING:  # pragma: no cover
    from rollart.validate.main import Validation

COLORS = {"generation": "#4C72B0", "env_queue": "#E9B98A", "env_reset": "#DD8452", "env_step": "#55A868", "reward": "#C44E52",
          "train": "#8172B3", "weight_sync": "#937860", "idle": "#CCCCCC"}


def plot_validation(v: "Validation", path: Path, warmup: int = 1) -> None:
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    seed = f"seed {v.sim.seed}" if len(v.sim_seeds) > 1 else ""  # the one drawn of several
    sim_label = f"simulated ({seed})" if seed else "simulated"
    for result, style, label in ((v.real, "-o", "real (rollart run)"), (v.sim, "--s", sim_label)):
        ax_t.plot([s.step for s in result.steps], [s.time_s for s in result.steps], style, ms=4, label=label)
    if warmup:
        ax_t.axvspan(-0.5, warmup - 0.5, color="#EEEEEE", zorder=0, label="warm-up (not compared)")
    ax_t.set_xlabel("step")
    ax_t.set_ylabel("step time (s)")
    ax_t.set_ylim(bottom=0)
    ax_t.set_title(f"{v.plan.name} · {v.real.mode}: step time", fontsize=10)
    ax_t.legend(fontsize=8, frameon=False)
    ax_t.grid(alpha=0.3)

    sides = [("real", step_figures(v.real, warmup)),
             (f"sim\n{seed}" if seed else "sim", step_figures(v.sim, warmup))]
    for i, (name, figs) in enumerate(sides):
        bottom = 0.0
        for key in BREAKDOWN_KEYS:
            h = figs.get(f"breakdown.{key}", 0.0)
            ax_b.bar(i, h, bottom=bottom, color=COLORS[key], width=0.6, label=key if i == 0 else None)
            bottom += h
    ax_b.set_xticks([0, 1], [s for s, _ in sides])
    ax_b.set_ylabel("mean step time (s)")
    ax_b.set_title("breakdown on the critical path", fontsize=10)
    ax_b.legend(fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
