"""``rollart reproduce``: simulate the ROLLART paper's experiments and write a report.

The command function is registered on the main app by ``rollart.cli``. Environment:
``ROLLART_REPRODUCE_BATCH`` caps every plan's batch size (reduced runs, CI);
``ROLLART_REPRODUCE_VARIANT_TIMEOUT`` bounds one variant's CPU time (seconds, default 90; see
:mod:`rollart.reproduce.runner`);
``ROLLART_REPRODUCE_JOBS`` sets the worker processes (default one per CPU, at most 8).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

console = Console()
err_console = Console(stderr=True)


def _experiment_lines() -> str:
    from rollart.reproduce import EXPERIMENTS

    return "\n\n".join(f"{e.name}: {getattr(e, 'title', '')}" for e in EXPERIMENTS.values())


try:
    from typer.core import TyperCommand
except ImportError:  # pragma: no cover
    TyperCommand = None  # type: ignore[assignment,misc]

if TyperCommand is not None:
    class ReproduceCommand(TyperCommand):  # type: ignore[misc,valid-type]
        """``rollart reproduce --help`` lists the experiments; they are imported (matplotlib and
        all) only when the help is shown, not on every start of the CLI."""

        def format_help(self, ctx, formatter):  # noqa: ANN001, ANN201
            if "Experiments (--only" not in (self.help or ""):
                self.help = f"{self.help}\n\nExperiments (--only NAME,...):\n\n{_experiment_lines()}"
            return super().format_help(ctx, formatter)

    reproduce_command_cls = ReproduceCommand


def _fail(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def reproduce(
    only: Optional[str] = typer.Option(None, "--only", help="run only these experiments (comma-separated names)"),
    out: Path = typer.Option(Path("reproduce-out"), "--out", help="folder for report.md, results.json and PNGs"),
    steps: Optional[int] = typer.Option(None, "--steps", help="simulated steps per variant (default: per experiment)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
) -> None:
    """Simulate the ROLLART paper's experiments and write DIR/report.md with the paper's figures beside."""
    from rollart.plan import PlanError
    from rollart.reproduce import ReproduceError, env_batch_cap, run_reproduce, select

    try:
        experiments = select(only)
        if steps is not None and steps < 1:
            raise ReproduceError(f"--steps: must be at least 1, got {steps}")
        batch_cap = env_batch_cap()
    except ReproduceError as exc:
        _fail(str(exc))
        return
    except PlanError as exc:
        _fail("; ".join(exc.problems))
        return
    from rollart.cli import prepare_output_dir, show_progress

    prepare_output_dir(out, "--out")
    t0 = time.perf_counter()
    try:
        runs = run_reproduce(experiments, out, steps=steps, batch_cap=batch_cap, progress=show_progress(not quiet),
                             console=err_console)
    except OSError as exc:
        _fail(f"--out {out}: {exc.strerror or exc}")
        return
    failed = [(r.experiment.name, o.variant.label, o.error) for r in runs for o in r.outcomes if o.error]
    console.print(f"wrote {out / 'report.md'} ({len(runs)} experiments, {sum(len(r.outcomes) for r in runs)} "
                  f"variants, {time.perf_counter() - t0:.0f} s)", highlight=False)
    for name, label, error in failed:
        console.print(f"[yellow]{escape(name)} · {escape(label)}:[/] {escape(error or '')}", highlight=False)
    from rollart.reproduce.checks import summary_line, verdict
    from rollart.reproduce.report import all_checks, reductions

    checks = all_checks(runs)
    if checks:
        console.print(summary_line(checks) + (" (a reduced run: not a verdict on the simulator)"
                                               if reductions(steps, batch_cap) else ""), highlight=False)
        for c in checks:
            if c.agrees is False:
                console.print(f"  [red]{escape(c.figure)}[/] ({escape(c.experiment)}): {escape(c.simulated)} vs "
                              f"{escape(c.paper)}, {escape(verdict(c))}", highlight=False)
