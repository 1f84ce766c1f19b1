"""Run a selection of experiments with a progress bar and write the report."""

from __future__ import annotations

import time
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Iterable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rollart.reproduce.experiments import EXPERIMENTS
from rollart.reproduce.model import Experiment, MdTable, ReproduceError, Section
from rollart.reproduce import plots
from rollart.reproduce.checks import TOLERANCE
from rollart.reproduce.plots import placeholder
from rollart.reproduce.report import ExperimentRun, all_checks, write_json, write_markdown
from rollart.reproduce.runner import Runner, env_jobs


def select(only: str | Iterable[str] | None) -> list[Experiment]:
    """Experiments by name (comma-separated or a list); all of them, in report order, for None."""
    if only is None:
        return list(EXPERIMENTS.values())
    names = [n.strip() for n in (only.split(",") if isinstance(only, str) else only) if n.strip()]
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown or not names:
        what = f"unknown experiment '{unknown[0]}'" if unknown else "give at least one experiment name"
        raise ReproduceError(f"--only: {what}; experiments are: {', '.join(EXPERIMENTS)}")
    return [EXPERIMENTS[n] for n in dict.fromkeys(names)]


def run_reproduce(experiments: list[Experiment], out: Path, steps: int | None = None, batch_cap: int | None = None,
                  progress: bool = True, console: Console | None = None,
                  variant_timeout_s: float | None = None, jobs: int | None = None) -> list[ExperimentRun]:
    """Simulate every variant of ``experiments`` and write ``out/report.md``, ``out/results.json``
    and ``out/<experiment>.png``. ``steps`` overrides each experiment's own step count; ``jobs``
    worker processes (default ``ROLLART_REPRODUCE_JOBS`` or one per CPU) share the simulations."""
    if steps is not None and steps < 1:
        raise ReproduceError(f"--steps: must be at least 1, got {steps}")
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(batch_cap=batch_cap, variant_timeout_s=variant_timeout_s)
    jobs = env_jobs() if jobs is None else jobs
    console = console or Console(stderr=True)
    runs: list[ExperimentRun] = []
    t_all = time.perf_counter()
    items = [(e, v, steps if steps is not None else e.steps) for e in experiments for v in e.variants]
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("variants"),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True, disable=not progress)
    task = bar.add_task(f"reproducing {len(experiments)} experiment(s) on {jobs} process(es)", total=len(items))
    with ExitStack() as stack:
        outcomes = runner.run_many([(v, n) for _, v, n in items], jobs=jobs,
                                   on_start=lambda: stack.enter_context(bar),
                                   on_done=lambda n: bar.advance(task, n))
        bar.update(task, description="analysing and plotting")
        for e in experiments:
            mine = [o for (ex, _, _), o in zip(items, outcomes) if ex is e]
            n_steps = steps if steps is not None else e.steps
            runs.append(_finish(e, mine, n_steps, sum(o.wall_s for o in mine), out))
    n_variants = sum(len(r.outcomes) for r in runs)
    n_cached = sum(o.cached for r in runs for o in r.outcomes)
    meta = {"steps": steps, "batch_cap": batch_cap, "jobs": jobs, "wall_s": time.perf_counter() - t_all,
            "variants": n_variants,
            "cached": n_cached, "experiments": [r.experiment.name for r in runs],
            "glance_plot": _glance_plot(runs, out)}
    write_markdown(runs, out / "report.md", meta)
    write_json(runs, out / "results.json", meta)
    return runs


GLANCE_PNG = "at-a-glance.png"


def _glance_plot(runs: list[ExperimentRun], out: Path) -> str | None:
    """The paper checks as one figure; None (and no file) without like-for-like checks or when the
    plot fails: the report does not depend on it."""
    checks = all_checks(runs)
    if not any(c.like_for_like for c in checks):
        return None
    try:
        plots.checks(checks, out / GLANCE_PNG, TOLERANCE)
    except Exception:  # noqa: BLE001 - the table carries the same figures
        return None
    return GLANCE_PNG


def _finish(e: Experiment, outcomes: list, steps: int, wall_s: float, out: Path) -> ExperimentRun:
    """Analyse and plot; a bug in one experiment's analysis must not lose the others' report."""
    error = None
    try:
        section = e.analyse(outcomes)
    except Exception as exc:  # noqa: BLE001 - reported in the section
        error = f"{type(exc).__name__}: {exc}"
        section = Section(MdTable(["variant", "error"], [[o.variant.label, o.error or ""] for o in outcomes]),
                          notes=[traceback.format_exc(limit=3).replace("\n", " ")])
    png = f"{e.name}.png"
    try:
        if any(o.ok for o in outcomes):
            e.plot(outcomes, out / png)
        else:
            placeholder(out / png, e.title, "no variant produced a step: " + (outcomes[0].error or "?"
                                                                            if outcomes else "no variants"))
    except Exception as exc:  # noqa: BLE001
        error = (error + "; " if error else "") + f"plot: {type(exc).__name__}: {exc}"
        placeholder(out / png, e.title, f"the plot failed: {type(exc).__name__}: {exc}")
    return ExperimentRun(e, outcomes, section, steps, wall_s, png, error)
