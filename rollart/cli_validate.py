"""``rollart validate``: simulation vs reality on this machine, side by side.

Registered on the main app by ``rollart.cli``; Ray and torch are imported when it runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def _fmt(value: float, unit: str) -> str:
    if unit in ("trajs",):
        return f"{value:.0f}"
    if unit == "":
        return f"{value:.0%}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def _err(fig) -> str:  # noqa: ANN001
    e = fig.error
    if e is None:
        return "-"
    if fig.kind == "absolute":
        return f"{e:+.0%}" if fig.unit == "" else f"{e:+.2g}"
    colour = "green" if abs(e) <= 0.10 else "yellow" if abs(e) <= 0.25 else "red"
    return f"[{colour}]{e:+.1%}[/]"


def figures_table(v) -> Table:  # noqa: ANN001
    table = Table(title=f"{v.plan.name} · mode {v.real.mode} · {len(v.real.steps)} steps (first "
                        f"{v.warmup} not compared) · real vs simulated", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("figure", "left"), ("unit", "left"), ("real", "right"), ("sim", "right"),
                          ("error", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for f in v.figures:
        table.add_row(f"[bold]{f.name}[/]" if f.headline else f.name, f.unit, _fmt(f.real, f.unit),
                      _fmt(f.sim, f.unit), _err(f))
    return table


def validate(
    scenario: str = typer.Argument(..., help="scenario YAML or shipped name (e.g. local/validate-sync)"),
    steps: Optional[int] = typer.Option(None, "--steps", help="override algorithm.steps"),
    out: Path = typer.Option(Path("validate-out"), "--out", help="folder for the JSON results, traces and PNG"),
    mode: Optional[str] = typer.Option(None, "--mode"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    set_: list[str] = typer.Option([], "--set", help="override a field (repeatable)"),
    profile_dir: Optional[Path] = typer.Option(None, "--profile-dir",
                                               help="where the machine profile is kept (default ~/.cache/rollart/validate/<host>-<model>)"),
    reprofile: bool = typer.Option(False, "--reprofile", help="measure again even if a fresh profile exists"),
    max_profile_age_h: float = typer.Option(24.0, "--max-profile-age", help="hours a profile stays fresh"),
    warmup: int = typer.Option(1, "--warmup-steps", min=0, help="first steps left out of the comparison"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
) -> None:
    """Run a plan for real, simulate it calibrated on this machine, and compare the two."""
    from rollart.cli import _check_mode, _fail, _load, _overrides
    from rollart.plan import PlanError
    from rollart.validate.main import validate as run_validation

    _check_mode(mode)
    plan = _load(scenario, _overrides(set_, steps, seed))
    try:
        import ray  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        _fail(["rollart validate needs the runtime extra: pip install -e '.[runtime]'"])
    if warmup >= plan.algorithm.steps:
        _fail([f"--warmup-steps: {warmup} leaves none of the {plan.algorithm.steps} steps to compare"])
    t0 = time.perf_counter()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                  TimeElapsedColumn(), console=err_console, transient=True, disable=quiet) as bar:
        task = bar.add_task("profiling this machine", total=plan.algorithm.steps)
        try:
            v = run_validation(plan, out, mode=mode, profile_dir=profile_dir, reprofile=reprofile,
                               max_profile_age_h=max_profile_age_h, warmup=warmup,
                               progress=lambda msg: bar.update(task, description=msg),
                               on_step=lambda rec: bar.update(task, advance=1))
        except PlanError as exc:
            _fail(exc.problems)
            return
    if v.figures:
        console.print(figures_table(v))
    for side, error in (("real run", v.real.error), ("simulation", v.sim.error)):
        if error:
            err_console.print(f"[bold red]{side} stopped:[/] {error}", highlight=False)
    p = v.profile
    reused = "reused" if p.get("reused") else "measured"
    console.print(f"[dim]profile {reused}: {p['dir']}"
                  + (f" · generate call overhead {p['request_overhead_s'] * 1e3:.1f} ms · publish+pull "
                     f"{p['publish_pull_s']:.2f} s · swap {p['swap_s']:.3f} s" if not p.get("reused") else "")
                  + f"[/]", highlight=False)
    console.print(f"[dim]wrote {out}/: {', '.join(v.files.values())} · {time.perf_counter() - t0:.0f} s wall[/]",
                  highlight=False)
    if v.real.error or v.sim.error:
        raise typer.Exit(code=1)
