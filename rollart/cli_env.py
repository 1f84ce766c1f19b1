"""``rollart calibrate env``: fit a task's env latencies from a trace and write a task block.

The command function is registered on the CLI by ``rollart.cli`` (as ``calibrate env``);
it is importable on its own so it can be mounted on any typer app."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console


def calibrate_env(
    trace: Path = typer.Argument(..., help="trace CSV with columns task,phase,latency_s,status"),
    task: str = typer.Option(..., "--task", help="the task whose rows to fit (as the scenario names it)"),
    out: Optional[Path] = typer.Option(None, "--out", help="task-block YAML to write; <task>.env.yaml if omitted"),
    empirical: bool = typer.Option(False, "--empirical",
                                   help="write empirical quantiles instead of the spliced lognormal + GPD model"),
) -> None:
    """Fit env.reset / env.step latency tails, failure and timeout rates of one task from a
    trace; print the fit and write a task block a scenario can merge into its task."""
    from rollart.calibration.env_fit import TraceError, fit_env_trace, render_env_report, write_task_block

    console = Console()
    err_console = Console(stderr=True)
    try:
        report = fit_env_trace(trace, task, empirical=empirical)
    except (TraceError, OSError, UnicodeDecodeError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
    render_env_report(report, console)
    target = out if out is not None else Path(f"{task.replace('/', '_')}.env.yaml")
    try:
        write_task_block(report, target, source=str(trace))
    except OSError as exc:
        err_console.print(f"[bold red]error:[/] {target}: cannot write ({exc.strerror or exc})",
                          highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
    console.print(f"[dim]wrote {target} (merge it over the task '{task}' of a scenario)[/]", highlight=False)


__all__ = ["calibrate_env"]
