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
        sim = _fmt(f.sim, f.unit)
        if f.sim_range is not None and f.headline:
            sim += f" [dim]({_fmt(f.sim_range[0], f.unit)}–{_fmt(f.sim_range[1], f.unit)})[/]"
        table.add_row(f"[bold]{f.name}[/]" if f.headline else f.name, f.unit, _fmt(f.real, f.unit), sim, _err(f))
    if len(v.sim_seeds) > 1:
        table.caption = (f"sim: mean over seeds {v.sim_seeds[0]}–{v.sim_seeds[-1]}, rates pooled over their time "
                         "(range in brackets); "
                         f"sim.json and its trace: seed {v.sim_seeds[0]}")
    return table


def summary_markdown(runs: list) -> str:  # noqa: ANN001
    """One row per validated scenario: the headline figures and their errors (VALIDATION.md)."""
    lines = ["| scenario | mode | step time real / sim (s) | error | p90 real / sim (s) | trajectories/s real / sim "
             "| error | busy real / sim | aborted real / sim |",
             "|---|---|---|---|---|---|---|---|---|"]
    for v in runs:
        f = {x.name: x for x in v.figures}
        if not f:
            lines.append(f"| {v.plan.name} | {v.real.mode} | failed: {v.real.error or v.sim.error} | | | | | | |")
            continue
        st, p90, tp = f["step time, mean"], f["step time, p90"], f["trajectories/s"]
        busy = " · ".join(f"{x.name.split(': ')[1]} {x.real:.0%}/{x.sim:.0%}" for x in v.figures
                          if x.name.startswith("busy fraction"))
        ab = " · ".join(f"{x.name.split(': ')[1]} {x.real:.0f}/{x.sim:.0f}" for x in v.figures
                        if x.name.startswith("aborted") and (x.real or x.sim)) or "0/0"
        spread = f" ({st.sim_range[0]:.2f}–{st.sim_range[1]:.2f})" if st.sim_range else ""
        lines.append(f"| {v.plan.name} | {v.real.mode} | {st.real:.2f} / {st.sim:.2f}{spread} | {st.error:+.1%} | "
                     f"{p90.real:.2f} / {p90.sim:.2f} | {tp.real:.2f} / {tp.sim:.2f} | {tp.error:+.1%} | {busy} | {ab} |")
    return "\n".join(lines) + "\n"


def validate(
    scenarios: list[str] = typer.Argument(..., help="scenario YAMLs or shipped names (e.g. local/validate-sync); "
                                                    "with several, each gets its own folder under --out"),
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
    sim_seeds: int = typer.Option(16, "--sim-seeds", min=1,
                                  help="simulate this many seeds (the plan's and the next ones) and compare the "
                                       "real run with their mean (rates: all their work over all their time); "
                                       "the simulator is cheap, one real run is not"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
) -> None:
    """Run a plan for real, simulate it calibrated on this machine, and compare the two."""
    from rollart.cli import _check_mode, _fail, _load, _overrides

    _check_mode(mode)
    plans = [_load(name, _overrides(set_, steps, seed)) for name in scenarios]
    from rollart.preflight import require_runnable

    for plan in plans:  # before Ray and torch: does each plan fit this machine?
        require_runnable(plan)
    try:
        import ray  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        _fail(["rollart validate needs the runtime extra: pip install -e '.[runtime]'"])
    for plan in plans:
        if warmup >= plan.algorithm.steps:
            _fail([f"--warmup-steps: {warmup} leaves none of the {plan.algorithm.steps} steps to compare"])
    t0 = time.perf_counter()
    runs = []
    failed = False
    for i, plan in enumerate(plans):
        folder = out if len(plans) == 1 else out / plan.name
        v = _validate_one(plan, folder, mode, profile_dir, reprofile and i == 0, max_profile_age_h, warmup, sim_seeds,
                          quiet, f"[{i + 1}/{len(plans)}] " if len(plans) > 1 else "")
        runs.append(v)
        failed |= bool(v.real.error or v.sim.error)
    if len(plans) > 1:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.md").write_text(summary_markdown(runs))
        console.print(f"[dim]wrote {out / 'summary.md'}[/]", highlight=False)
    console.print(f"[dim]{time.perf_counter() - t0:.0f} s wall[/]", highlight=False)
    if failed:
        raise typer.Exit(code=1)


def _validate_one(plan, out: Path, mode, profile_dir, reprofile: bool, max_profile_age_h: float,  # noqa: ANN001
                  warmup: int, sim_seeds: int, quiet: bool, prefix: str):  # noqa: ANN202
    from rollart.cli import _fail
    from rollart.plan import PlanError
    from rollart.validate.main import validate as run_validation

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                  TimeElapsedColumn(), console=err_console, transient=True, disable=quiet or not err_console.is_terminal) as bar:
        task = bar.add_task(f"{prefix}{plan.name}: profiling this machine", total=plan.algorithm.steps)
        try:
            v = run_validation(plan, out, mode=mode, profile_dir=profile_dir, reprofile=reprofile,
                               max_profile_age_h=max_profile_age_h, warmup=warmup, sim_seeds=sim_seeds,
                               progress=lambda msg: bar.update(task, description=f"{prefix}{plan.name}: {msg}"),
                               on_step=lambda rec: bar.update(task, advance=1))
        except PlanError as exc:
            _fail(exc.problems)
            raise
    if v.figures:
        console.print(figures_table(v))
    for side, error in (("real run", v.real.error), ("simulation", v.sim.error)):
        if error:
            err_console.print(f"[bold red]{side} stopped:[/] {error}", highlight=False)
    p = v.profile
    reused = "reused" if p.get("reused") else "measured"
    line = f"[dim]profile {reused}: {p['dir']}"
    if not p.get("reused"):
        calls = p.get("request_overhead_calls")
        source = f"in the reference run, {calls} calls" if calls else "idle: the reference run matched too few calls"
        line += (f" · generate call overhead {p['request_overhead_s'] * 1e3:.1f} ms ({source})"
                 f" · engine step with calls +{p.get('call_step_s', 0.0) * 1e3:.1f} ms · publish+pull "
                 f"{p['publish_pull_s']:.2f} s · swap {p['swap_s']:.3f} s")
    console.print(line + "[/]", highlight=False)
    console.print(f"[dim]wrote {out}/: {', '.join(v.files.values())}[/]", highlight=False)
    return v
