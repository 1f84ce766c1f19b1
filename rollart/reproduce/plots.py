"""One PNG per experiment, in the style of the paper's figures (matplotlib, Agg backend)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rollart.reproduce.checks import tally  # noqa: E402
from rollart.reproduce.figures import busy_share, mean, ratio, share  # noqa: E402
from rollart.reproduce.model import Outcome  # noqa: E402

COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
HATCHES = ["", "//", "..", "xx", "\\\\", "++", "oo", "--"]
PAPER_COLOR = "#BBBBBB"


def _style() -> None:
    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
                         "axes.grid": True, "axes.grid.axis": "y", "grid.alpha": 0.3, "legend.frameon": False,
                         "figure.dpi": 110})


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _find(outs: list[Outcome], **params: Any) -> Outcome | None:
    for o in outs:
        if all(o.variant.params.get(k) == v for k, v in params.items()):
            return o
    return None


def _nz(x: float | None) -> float:
    return x if x is not None and math.isfinite(x) else 0.0


def _label_bars(ax: Any, bars: Any, fmt: str = "{:.2f}") -> None:
    for b in bars:
        h = b.get_height()
        if h and math.isfinite(h):
            ax.annotate(fmt.format(h), (b.get_x() + b.get_width() / 2, h), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 1), textcoords="offset points")


def _grouped(ax: Any, groups: list[str], series: list[tuple[str, list[float]]], fmt: str | None = "{:.2f}") -> None:
    n = max(1, len(series))
    width = 0.8 / n
    x = np.arange(len(groups))
    for i, (label, values) in enumerate(series):
        bars = ax.bar(x + (i - (n - 1) / 2) * width, [_nz(v) for v in values], width, label=label,
                      color=COLORS[i % len(COLORS)], hatch=HATCHES[i % len(HATCHES)], edgecolor="black", linewidth=0.5)
        if fmt:
            _label_bars(ax, bars, fmt)
    ax.set_xticks(x)
    ax.set_xticklabels(groups)


# ---------------------------------------------------------------- experiments


BREAKDOWN = (("generation", ("generation",)), ("training", ("train",)), ("env.reset", ("env_reset",)),
             ("env.step", ("env_step",)), ("other", ("reward", "weight_sync", "idle")))


def swe_breakdown(outs: list[Outcome], path: Path, paths_of: Callable[[Outcome], dict[str, list]]) -> None:
    _style()
    bars: list[tuple[str, dict[str, float], float]] = [
        ("paper\nsuccess path", {"generation": 0.54, "training": 0.23, "env.reset": 0.15, "other": 0.08}, 366.0)]
    for o in outs:
        for p, recs in paths_of(o).items():
            if recs:
                t = mean(r.time_s for r in recs)
                parts = {name: mean(share(r, *keys) for r in recs) for name, keys in BREAKDOWN}
                bars.append((f"{o.variant.params['kind']}\n{p} path ({len(recs)})", parts, t))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    x = np.arange(len(bars))
    bottom = np.zeros(len(bars))
    for i, (name, _) in enumerate(BREAKDOWN):
        secs = np.array([b[1].get(name, 0.0) * b[2] for b in bars])
        ax1.bar(x, secs, 0.6, bottom=bottom, label=name, color=COLORS[i], hatch=HATCHES[i], edgecolor="black",
                linewidth=0.5)
        bottom += secs
    ax1.bar([len(bars)], [513.0], 0.6, color=PAPER_COLOR, edgecolor="black", linewidth=0.5, hatch="//",
            label="paper, with timeouts (total only)")
    for xi, total in zip(list(x) + [len(bars)], list(bottom) + [513.0]):
        ax1.annotate(f"{total:,.0f} s", (xi, total), ha="center", va="bottom", fontsize=7)
    ax1.set_xticks(list(x) + [len(bars)])
    ax1.set_xticklabels([b[0] for b in bars] + ["paper\ntimeout path"], fontsize=7)
    ax1.set_ylabel("seconds per step (critical path)")
    ax1.set_title("SWE step, Qwen3-8B, 32 H800, batch 128")
    ax1.legend(fontsize=7, ncol=2)
    # Right: the same as shares of the step.
    bottom = np.zeros(len(bars))
    for i, (name, _) in enumerate(BREAKDOWN):
        frac = np.array([100 * b[1].get(name, 0.0) for b in bars])
        ax2.bar(x, frac, 0.6, bottom=bottom, color=COLORS[i], hatch=HATCHES[i], edgecolor="black", linewidth=0.5)
        bottom += frac
    ax2.set_xticks(x)
    ax2.set_xticklabels([b[0] for b in bars], fontsize=7)
    ax2.set_ylabel("% of step time")
    ax2.set_ylim(0, 105)
    ax2.set_title("breakdown shares")
    _save(fig, path)


def hw_contrast(outs: list[Outcome], path: Path, tasks: tuple, batches: tuple,
                rollout_mean: Callable[[Outcome | None], float]) -> None:
    _style()
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
    for ax, (task, _) in zip(axes[0], tasks):
        series = []
        for key, label in (("h800", "2 × H800"), ("h20", "6 × H20 (same cost)"), ("h20-2", "2 × H20 (same count)")):
            series.append((label, [rollout_mean(_find(outs, task=task, batch=b, hw=key)) for b in batches]))
        _grouped(ax, [str(b) for b in batches], series, "{:.0f}")
        ax.set_xlabel("batch size (trajectories)")
        ax.set_ylabel("rollout time per batch (s)")
        kind = "prefill-heavy" if task == "FrozenLake" else "decode-heavy"
        ax.set_title(f"{task} ({kind})")
        ax.legend()
    fig.suptitle("Rollout hardware per cost and per GPU, Qwen3-8B (lower is better)", fontsize=10)
    _save(fig, path)


def throughput(outs: list[Outcome], path: Path, bases: dict, modes: tuple, labels: dict, ablation: tuple,
               thr: Callable[[Outcome], float]) -> None:
    _style()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    models = list(bases)
    series = []
    for m in modes:
        vals = []
        for model in models:
            o, ref = _find(outs, model=model, mode=m), _find(outs, model=model, mode="sync+")
            vals.append(ratio(thr(o), thr(ref)) if o and ref else math.nan)
        series.append((labels[m], vals))
    _grouped(ax1, models, series)
    ax1.axhline(1.0, color="black", lw=0.6, ls="--")
    ax1.set_ylabel("throughput normalised to Sync+")
    ax1.set_title("End-to-end throughput, 128 GPUs")
    ax1.set_ylim(top=ax1.get_ylim()[1] * 1.2)
    ax1.legend(fontsize=7, ncol=3, loc="upper left")
    series = []
    for key, label, _, _ in ablation:
        vals = []
        for model in models:
            o, ref = _find(outs, model=model, mode=key), _find(outs, model=model, mode="sync")
            vals.append(ratio(thr(o), thr(ref)) if o and ref else math.nan)
        series.append((label, vals))
    _grouped(ax2, models, series, "{:.1f}")
    ax2.set_ylabel("throughput normalised to Sync")
    ax2.set_title("Incremental ablation")
    ax2.set_ylim(top=ax2.get_ylim()[1] * 1.45)
    ax2.legend(fontsize=6.5, loc="upper left")
    _save(fig, path)


def scaling(outs: list[Outcome], path: Path, modes: tuple, labels: dict, thr: Callable[[Outcome], float]) -> None:
    _style()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    series = [(f"{g} H800", [thr(o) if (o := _find(outs, mode=m, gpus=g)) else math.nan for m in modes])
              for g in (64, 128)]
    _grouped(ax, [labels[m] for m in modes], series, "{:.2f}")
    for i, m in enumerate(modes):
        a, b = _find(outs, mode=m, gpus=64), _find(outs, mode=m, gpus=128)
        r = ratio(thr(b), thr(a)) if a and b else math.nan
        if math.isfinite(r):
            top = max(_nz(thr(a)), _nz(thr(b)))
            ax.annotate(f"{r:.2f}×", (i, top * 1.08), ha="center", fontsize=8, weight="bold")
    ax.set_ylabel("trajectories / s")
    ax.set_title("Qwen3-14B scaling, 64 → 128 H800 (speed-up above each pair)")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.15)
    ax.legend()
    _save(fig, path)


def bars(outs: list[Outcome], path: Path, items: list[tuple[str, str]], key: str, value: Callable[[Outcome], float],
         ylabel: str, title: str, normalise: str | None = None) -> None:
    _style()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    vals = [value(o) if (o := _find(outs, **{key: k})) else math.nan for k, _ in items]
    if normalise is not None:
        ref = dict(zip([k for k, _ in items], vals)).get(normalise, math.nan)
        vals = [ratio(v, ref) for v in vals]
        ylabel = f"{ylabel}, × {dict(items)[normalise]}"
    b = ax.bar(range(len(items)), [_nz(v) for v in vals], 0.6, color=[COLORS[i % len(COLORS)] for i in range(len(items))],
               hatch=None, edgecolor="black", linewidth=0.5)
    for i, bar in enumerate(b):
        bar.set_hatch(HATCHES[i % len(HATCHES)])
    _label_bars(ax, b)
    ax.set_xticks(range(len(items)))
    ax.set_xticklabels([lbl.replace(", ", ",\n") for _, lbl in items], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _save(fig, path)


def sigma(outs: list[Outcome], path: Path, sigmas: tuple, kinds: tuple,
          rollout_mean: Callable[[Outcome | None], float]) -> None:
    _style()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, (m, label) in enumerate(kinds):
        ys = [rollout_mean(_find(outs, sigma=s, mode=m)) for s in sigmas]
        ax1.plot(sigmas, ys, marker="os"[i % 2], color=COLORS[i], label=label)
    ax1.set_xlabel("σ of env.step latency (s), mean 10 s")
    ax1.set_ylabel("rollout time per step (s)")
    ax1.set_title("Rollout time vs env-latency spread")
    ax1.legend()
    infl = [100 * (ratio(rollout_mean(_find(outs, sigma=s, mode="sync")),
                         rollout_mean(_find(outs, sigma=s, mode="sync+"))) - 1) for s in sigmas]
    b = ax2.bar([f"{s:g}" for s in sigmas], [_nz(v) for v in infl], color=COLORS[3], edgecolor="black", linewidth=0.5)
    _label_bars(ax2, b, "{:.0f} %")
    ax2.axhline(21.3, color="black", ls="--", lw=0.8, label="paper §2 profile: up to +21.3 %")
    ax2.set_xlabel("σ (s)")
    ax2.set_ylabel("batched rollout inflation (%)")
    ax2.set_title("Batched over trajectory-level")
    ax2.legend(fontsize=7)
    _save(fig, path)


def reward(outs: list[Outcome], path: Path, items: list[tuple[str, str]], thr: Callable[[Outcome], float],
           util_only: list[tuple[str, str]] = ()) -> None:
    """Judge utilisation of ``items`` and then ``util_only`` (another workload: no throughput bar,
    another colour), and the throughput of ``items``."""
    _style()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15 if util_only else 12, 4),
                                   gridspec_kw={"width_ratios": [len(items) + len(util_only), len(items)]})
    both = [*items, *util_only]
    labels = [lbl for _, lbl in both]
    util = []
    for k, _ in both:
        o = _find(outs, config=k)
        u = busy_share(o) if o else None
        util.append(100 * u if u is not None else math.nan)
    colors = [COLORS[0]] * len(items) + [COLORS[1]] * len(util_only)
    b = ax1.bar(range(len(both)), [_nz(u) for u in util], 0.6, color=colors, edgecolor="black", linewidth=0.5)
    _label_bars(ax1, b, "{:.1f} %")
    ax1.axhline(7.4, color="black", ls="--", lw=0.8, label="paper: 7.4 %")
    ax1.set_xticks(range(len(both)))
    ax1.set_xticklabels(labels, fontsize=7)
    ax1.set_ylabel("dedicated reward GPU utilisation (%)")
    ax1.set_title("Reward GPUs (none when serverless)")
    ax1.legend()
    vals = [thr(o) if (o := _find(outs, config=k)) else math.nan for k, _ in items]
    b = ax2.bar(range(len(items)), [_nz(v) for v in vals], 0.6, color=COLORS[2], edgecolor="black", linewidth=0.5)
    _label_bars(ax2, b, "{:.3f}")
    ax2.set_xticks(range(len(items)))
    ax2.set_xticklabels([lbl for _, lbl in items], fontsize=7)
    ax2.set_ylabel("trajectories / s")
    ax2.set_title("Throughput")
    _save(fig, path)


def alpha(outs: list[Outcome], path: Path, bases: dict, alphas: tuple, step_s: Callable[[Outcome], float]) -> None:
    _style()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, model in enumerate(bases):
        ys = [step_s(o) if (o := _find(outs, model=model, alpha=a)) else math.nan for a in alphas]
        ax1.plot(alphas, ys, marker="o^s"[i % 3], color=COLORS[i], label=model)
    ax1.set_xticks(alphas)
    ax1.set_xlabel("staleness bound α")
    ax1.set_ylabel("steady step time, past the first step (s)")
    ax1.set_title("Step time vs α (ROLLART)")
    ax1.legend()
    series = []
    for model in bases:
        vals = []
        for a in alphas:
            o = _find(outs, model=model, alpha=a)
            vals.append(float(o.summary.get("aborted_stale", math.nan)) if o else math.nan)
        series.append((model, vals))
    _grouped(ax2, [f"α = {a}" for a in alphas], series, "{:.0f}")
    ax2.set_ylabel("aborted stale trajectories (run total)")
    ax2.set_title("Trajectories aborted by the α window")
    ax2.legend()
    _save(fig, path)


def transfer(outs: list[Outcome], path: Path, bases: dict, transfers: tuple) -> None:
    _style()
    from rollart.reproduce.figures import breakdown_mean

    fig, ax = plt.subplots(figsize=(8, 3.8))
    series = []
    for key, label, _ in transfers:
        series.append((label, [breakdown_mean(o.records, "weight_sync") if (o := _find(outs, model=m, transfer=key))
                               else math.nan for m in bases]))
    _grouped(ax, list(bases), series, "{:.1f}")
    ax.set_ylabel("exposed weight sync per step (s)")
    ax.set_title("Cross-cluster weight transfer (ROLLART mode, 128 GPUs)")
    ax.legend(fontsize=7)
    _save(fig, path)


def redundancy(outs: list[Outcome], path: Path, conditions: tuple, redundancies: tuple,
               thr: Callable[[Outcome], float]) -> None:
    _style()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    series = []
    for r in redundancies:
        series.append((f"redundancy {r:g}", [thr(o) if (o := _find(outs, condition=c, redundancy=r)) else math.nan
                                             for c, _, _ in conditions]))
    _grouped(ax, [lbl for _, lbl, _ in conditions], series, "{:.3f}")
    ax.set_ylabel("trajectories / s")
    ax.set_title("Redundant env rollout, Qwen3-8B, 128 GPUs")
    ax.legend()
    _save(fig, path)


def pd(outs: list[Outcome], path: Path, models: tuple, layouts: tuple, setups: tuple,
       thr: Callable[[Outcome], float]) -> None:
    _style()
    fig, ax = plt.subplots(figsize=(9, 4.0))
    groups = [f"{mlabel.split(' (')[0]}\n{slabel}" for _, slabel, *_ in setups for _, mlabel, _ in models]
    series = []
    for lkey, llabel in layouts[1:]:  # each disaggregated layout against its colocated run
        vals = []
        for skey, *_ in setups:
            for mkey, _, _ in models:
                o = _find(outs, model=mkey, layout=lkey, setup=skey)
                ref = _find(outs, model=mkey, layout="colocated", setup=skey)
                vals.append(ratio(thr(o), thr(ref)) if o and ref else math.nan)
        series.append((llabel, vals))
    _grouped(ax, groups, series)
    ax.axhline(1.0, color="black", lw=0.6, ls="--")
    ax.set_ylabel("throughput ÷ colocated")
    ax.set_title("Prefill–decode disaggregation on SWE")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend()
    _save(fig, path)


def placeholder(path: Path, title: str, message: str) -> None:
    """A figure that says why there is no data (every variant failed)."""
    _style()
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.axis("off")
    ax.text(0.5, 0.6, title, ha="center", fontsize=10, weight="bold")
    ax.text(0.5, 0.35, message, ha="center", fontsize=8, wrap=True)
    _save(fig, path)


def checks(items: list[Any], path: Path, tolerance: float) -> None:
    """The like-for-like paper checks as deviation bars inside the ±``tolerance`` band (green
    within, red beyond; a figure the runs did not give is a grey tick), and how many of the
    qualitative statements agree."""
    _style()
    values = [c for c in items if c.like_for_like]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(values) + 1.4))
    y = np.arange(len(values))[::-1]
    dev = [100 * c.deviation if c.deviation is not None else 0.0 for c in values]
    colors = [PAPER_COLOR if c.agrees is None else "#55A868" if c.agrees else "#C44E52" for c in values]
    ax.barh(y, dev, 0.6, color=colors, edgecolor="black", linewidth=0.5)
    ax.axvspan(-100 * tolerance, 100 * tolerance, color="#55A868", alpha=0.08, zorder=0)
    ax.axvline(0, color="black", lw=0.8)
    for yi, d, c in zip(y, dev, values):
        text = "not computed" if c.agrees is None else f"{c.simulated} vs {c.paper}"
        ax.annotate(text, (d, yi), xytext=(4 if d >= 0 else -4, 0), textcoords="offset points", va="center",
                    ha="left" if d >= 0 else "right", fontsize=7)
    ax.set_yticks(y)
    ax.set_yticklabels([c.figure for c in values], fontsize=7)
    ax.set_xlabel(f"deviation from the paper's value or range (%); shaded: ±{100 * tolerance:.0f} %")
    lim = max([100 * tolerance * 2, *(abs(d) * 1.6 for d in dev)])
    ax.set_xlim(-lim, lim)
    ax.grid(axis="x", alpha=0.3)
    ax.grid(axis="y", visible=False)
    ok, n, agree, n_dirs = tally(items)
    ax.set_title(f"The paper's figures, simulated: {ok} of {n} like-for-like within ±{100 * tolerance:.0f} %\n"
                 f"{agree} of {n_dirs} qualitative statements agree (the report's table lists them)", fontsize=9)
    _save(fig, path)
