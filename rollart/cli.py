"""The ``rollart`` command line (typer): simulate, compare, scenarios."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from rollart.cli_calibrate import calibrate_app
from rollart.core.modes import mode_config
from rollart.plan import MODES, Plan, PlanError, load_plan
from rollart.plan.loader import did_you_mean
from rollart.report import RunResult, compare_table, print_result, routing_text
from rollart.scenarios_catalog import default_scenario, resolve_existing, shipped

def _flags_without_type() -> None:
    """typer 0.2x prints ``<bool>`` as the type of every flag (--quiet, --help): a flag takes no
    value, so show none."""
    try:
        from typer.core import TyperOption
    except ImportError:  # pragma: no cover - older typer has no typed help
        return
    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "_rollart", False):
        return

    def display_type_rich(self, ctx):  # noqa: ANN001, ANN202
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    display_type_rich._rollart = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_without_type()
app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Plan, simulate and run disaggregated multi-task agentic RL training.")
app.add_typer(calibrate_app, name="calibrate")
console = Console()
err_console = Console(stderr=True)


def _fail(problems: list[str]) -> None:
    from rich.markup import escape

    for line in problems:  # user text may contain [brackets]: never read it as markup
        err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def _load(scenario: Optional[str], overrides: list[str]) -> Plan:
    try:
        path = resolve_existing(scenario) if scenario else default_scenario()
        return load_plan(path, overrides)
    except PlanError as exc:
        _fail(exc.problems)
        raise  # unreachable


def check_output_file(path: Optional[Path], option: str) -> None:
    """Before any work: ``path`` can be written (its folder exists and is writable, it is not a
    folder), so a long run never ends in a traceback while writing its result."""
    if path is None:
        return
    folder = path.parent
    if path.is_dir():
        _fail([f"{option} {path}: is a folder; give a file name"])
    if not folder.is_dir():
        _fail([f"{option} {path}: folder '{folder}' does not exist (create it first)"])
    if not os.access(folder, os.W_OK):
        _fail([f"{option} {path}: folder '{folder}' is not writable"])


def prepare_output_dir(path: Path, option: str) -> None:
    """Before any work: create the output folder ``path`` (and its parents), or say why not."""
    if path.exists() and not path.is_dir():
        _fail([f"{option} {path}: is a file, not a folder"])
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail([f"{option} {path}: cannot create the folder ({exc.strerror or exc})"])
    if not os.access(path, os.W_OK):
        _fail([f"{option} {path}: folder is not writable"])


def write_output(option: str, path: Path, write) -> None:  # noqa: ANN001
    """``write(path)``; a failure (disk full, removed folder) is one error line, exit 2."""
    try:
        write(path)
    except OSError as exc:
        _fail([f"{option} {path}: cannot write ({exc.strerror or exc})"])


def show_progress(requested: bool) -> bool:
    """A progress bar only on a terminal: piped, it would leave blank lines on stderr."""
    return requested and err_console.is_terminal


def _overrides(set_: list[str], steps: Optional[int], seed: Optional[int]) -> list[str]:
    """``--set`` values plus the ``--steps``/``--seed`` shortcuts (which win)."""
    out = list(set_)
    if steps is not None:
        out.append(f"algorithm.steps={steps}")
    if seed is not None:
        out.append(f"algorithm.seed={seed}")
    return out


def _check_mode(mode: Optional[str], option: str = "--mode") -> None:
    if mode is not None and mode not in MODES:
        _fail([f"{option}: unknown mode '{mode}'{did_you_mean(mode, MODES, 'modes')}"])


def run_simulation(plan: Plan, mode: Optional[str], seed: int, trace: Optional[Path], progress: bool,
                   scale_approx: int = 1) -> RunResult:
    """Simulate ``plan`` with a progress bar over training steps."""
    from rollart.sim import simulate_plan
    from rollart.trace import Tracer

    cfg = mode_config(plan, mode)
    tracer = Tracer(stream_to=trace) if trace else None  # streamed: a long run's trace is not held in memory
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("steps · simulated {task.fields[sim]}"), TimeElapsedColumn(),
                  TextColumn("· ETA"), TimeRemainingColumn(),
                  console=err_console, transient=True, disable=not show_progress(progress)) as bar:
        task = bar.add_task(f"simulating {plan.name} ({cfg.name})", total=plan.algorithm.steps, sim="0 s")
        outcome = simulate_plan(plan, cfg, seed, tracer, scale_approx=scale_approx,
                                on_step=lambda rec: bar.update(task, advance=1, sim=f"{rec.end_s:,.0f} s"))
    try:
        result = outcome.to_result()
    except PlanError as exc:
        _fail(exc.problems)
        raise
    if tracer is not None and trace is not None:
        write_output("--trace", trace, tracer.write)
    return result


@app.command()
def simulate(
    scenario: Optional[str] = typer.Argument(None, help="scenario YAML or shipped name; the embedded default if omitted"),
    mode: Optional[str] = typer.Option(None, "--mode", help=f"override algorithm.mode ({', '.join(MODES)})"),
    steps: Optional[int] = typer.Option(None, "--steps", help="override algorithm.steps"),
    seed: Optional[int] = typer.Option(None, "--seed", help="override algorithm.seed"),
    set_: list[str] = typer.Option([], "--set", help="override a field: --set algorithm.alpha=2 (repeatable)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the result as JSON"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="write a Chrome/Perfetto trace"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
    scale_approx: bool = typer.Option(False, "--scale-approx",
                                      help="very large clusters: simulate a representative 1/m of the exchangeable "
                                           "workers and env managers, account for the rest by symmetry and for the "
                                           "slowest groups it does not sample by order statistics (stated); "
                                           "trajectory-level modes (rollart, areal) only: the others run in full"),
) -> None:
    """Simulate a plan and print the step table."""
    _check_mode(mode)
    from rollart.plan.schema import sim_request_scale
    from rollart.sim.scale import approximation_factor

    with sim_request_scale(math.inf if scale_approx else 1.0):  # the approximation's own share is checked below
        plan = _load(scenario, _overrides(set_, steps, seed))
    cfg = mode_config(plan, mode)
    factor = 1
    if scale_approx:
        try:
            factor = approximation_factor(plan, cfg.batch_level_launch)
        except PlanError as exc:
            _fail(exc.problems)
    check_output_file(json_path, "--json")
    check_output_file(trace, "--trace")
    if scale_approx and factor == 1:
        why = (f"mode {cfg.name} launches whole batches (the approximation covers trajectory-level modes only)"
               if cfg.batch_level_launch else "the plan is too small to approximate")
        console.print(f"[dim]--scale-approx: {why}; simulated in full[/]")
    t0 = time.perf_counter()
    try:
        result = run_simulation(plan, mode, plan.algorithm.seed, trace, progress=not quiet, scale_approx=factor)
    except PlanError as exc:
        _fail(exc.problems)
        return
    wall = time.perf_counter() - t0
    print_result(result, console)
    if result.summary.get("scale_approx"):
        console.print(f"[bold yellow]{result.summary['scale_approx']['note']}[/]")
    console.print(f"[dim]simulated {result.summary['simulated_s']:,.0f} s in {wall:.1f} s wall "
                  f"({result.summary['effects'] / max(wall, 1e-9):,.0f} effects/s)[/]")
    if json_path:
        write_output("--json", json_path, result.write_json)
        console.print(f"[dim]wrote {json_path}[/]")
    if trace:
        console.print(f"[dim]wrote {trace} (open in https://ui.perfetto.dev)[/]")
    if result.error:
        raise typer.Exit(code=1)


@app.command()
def compare(
    scenario: str = typer.Argument(..., help="scenario YAML or shipped name"),
    modes: str = typer.Option("sync,sync+,one-off,areal,rollart", "--modes", help="comma-separated modes"),
    steps: Optional[int] = typer.Option(None, "--steps"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    set_: list[str] = typer.Option([], "--set"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write every mode's result as JSON"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
) -> None:
    """Simulate one plan under several modes; throughput is normalised to the first mode."""
    names = [m.strip() for m in modes.split(",") if m.strip()]
    if not names:
        _fail([f"--modes: give at least one mode; modes are: {', '.join(MODES)}"])
    for m in names:
        _check_mode(m, "--modes")
    plan = _load(scenario, _overrides(set_, steps, seed))
    check_output_file(json_path, "--json")
    results = []
    try:
        for m in names:
            results.append(run_simulation(plan, m, plan.algorithm.seed, None, progress=not quiet))
    except PlanError as exc:
        _fail(exc.problems)
    console.print(compare_table(results))
    from rich.markup import escape

    for r in results:
        for warning in r.summary.get("warnings") or ():
            console.print(f"[bold yellow]{r.mode} task mix:[/] {escape(warning)}")
        spill = routing_text(r.summary)  # a mode that routes by affinity may be comparing the map, not the mode
        if spill:
            console.print(f"[bold yellow]{r.mode} routing:[/] {escape(spill)}")
        if r.error:
            console.print(f"[bold red]{r.mode} stopped early:[/] {r.error}")
    if json_path:
        write_output("--json", json_path,
                     lambda p: p.write_text(json.dumps([r.to_dict() for r in results], indent=2) + "\n"))
        console.print(f"[dim]wrote {json_path}[/]")
    if any(r.error for r in results):  # as simulate: the table and JSON are kept, the exit says it stopped
        raise typer.Exit(code=1)


@app.command()
def scenarios() -> None:
    """List the shipped scenarios."""
    from rich.table import Table

    table = Table(title="shipped scenarios (pass the name or a path to simulate/compare)", title_justify="left")
    table.add_column("name")
    table.add_column("description")
    for name, _, desc in shipped():
        table.add_row(name.removesuffix(".yaml"), desc)
    console.print(table)


def _register_commands() -> None:
    """Commands defined in their own modules (heavy imports happen when they run)."""
    from rollart.cli_run import run

    app.command("run")(run)
    for module, names in (("rollart.cli_reproduce", ("reproduce",)), ("rollart.cli_sweep", ("sweep", "plan")),
                          ("rollart.cli_validate", ("validate",))):
        try:
            mod = __import__(module, fromlist=list(names))
        except ImportError:  # pragma: no cover - the modules ship with the package
            continue
        for name in names:
            if hasattr(mod, name):  # a module may give the command its own class (lazy help)
                app.command(name, cls=getattr(mod, f"{name}_command_cls", None))(getattr(mod, name))


_register_commands()


def main() -> None:  # pragma: no cover
    app()
