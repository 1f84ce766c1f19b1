"""``rollart run``: execute a plan for real on Ray — the same core and the same outputs as
``rollart simulate`` (step table, JSON contract, Perfetto trace with the same track names)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

console = Console()
err_console = Console(stderr=True)


def run(
    scenario: str = typer.Argument(..., help="scenario YAML or shipped name (e.g. local/digits)"),
    steps: Optional[int] = typer.Option(None, "--steps", help="override algorithm.steps"),
    mode: Optional[str] = typer.Option(None, "--mode"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    set_: list[str] = typer.Option([], "--set", help="override a field (repeatable)"),
    address: Optional[str] = typer.Option(None, "--address", help="join a running Ray cluster (HOST:PORT of its "
                                          "head; token from RAY_AUTH_TOKEN[_PATH] or ~/.ray/auth_token)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the result as JSON"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="write a Chrome/Perfetto trace"),
    checkpoint_dir: Optional[Path] = typer.Option(None, "--checkpoint-dir",
                                                  help="where runtime.checkpoint_every writes checkpoints"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="restart from a checkpoint directory"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
) -> None:
    """Run a plan for real: Ray actors for inference, environments, reward and training."""
    from rollart.cli import _check_mode, _fail, _load, _overrides
    from rollart.core.modes import mode_config
    from rollart.trace import Tracer

    _check_mode(mode)
    plan = _load(scenario, _overrides(set_, steps, seed))
    __import__("rollart.preflight").preflight.require_runnable(plan, address)  # before Ray: GPUs, memory
    try:
        import ray  # noqa: F401
    except ImportError:
        _fail(["rollart run needs the runtime extra: pip install -e '.[runtime]'"])
    if resume is not None and not resume.is_dir():
        _fail([f"--resume: no checkpoint directory '{resume}'"])
    if resume is not None:  # before Ray: a checkpoint this run cannot continue is refused in a second
        from rollart.runtime.trainer.grpo import GRPOTrainer, resume_problem

        problem = resume_problem(resume, GRPOTrainer.name, plan.run_model)
        if problem:
            _fail([f"--resume: {problem}"])
    from rollart.runtime.backend import RuntimeBackend
    from rollart.runtime.cluster import ClusterError

    tracer = Tracer()  # always kept: an interrupted run writes the trace of its finished steps
    cfg = mode_config(plan, mode)
    t0 = time.perf_counter()
    exit_code = 0
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                  TimeElapsedColumn(), console=err_console, transient=True, disable=quiet or not err_console.is_terminal) as bar:
        task = bar.add_task(f"running {plan.name} ({cfg.name}) on Ray", total=plan.algorithm.steps)
        backend = RuntimeBackend(plan, cfg, plan.algorithm.seed, address=address, tracer=tracer,
                                 on_step=lambda rec: bar.update(task, advance=1), checkpoint_dir=checkpoint_dir,
                                 resume=resume)
        if resume is not None:
            bar.update(task, completed=0)

        def report(outcome) -> None:  # noqa: ANN001 - before Ray's tear-down, which can hang
            nonlocal exit_code
            bar.stop()
            exit_code = _report(outcome, backend, tracer, json_path, trace, t0)

        try:
            backend.run(on_outcome=report)
        except ClusterError as exc:
            _fail([str(exc)])
    if backend.teardown_stuck:  # the outputs are written; Ray's exit hook would wait on the same shutdown
        err_console.print(f"tear-down: {backend.teardown_stuck}", highlight=False, soft_wrap=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    if exit_code:
        raise typer.Exit(code=exit_code)


def _report(outcome, backend, tracer, json_path: Optional[Path], trace: Optional[Path],  # noqa: ANN001
            t0: float) -> int:
    """Print the result and write its JSON and trace; returns the exit code."""
    from rollart.cli import write_output
    from rollart.report import print_result

    result = outcome.to_result()
    interrupted = backend.interrupted
    if interrupted is not None:  # say where the finished steps went, even without --json/--trace
        stamp = time.strftime("%Y%m%d-%H%M%S")
        json_path = json_path or Path(f"rollart-run-{stamp}.json")
        trace = trace or Path(f"rollart-run-{stamp}.trace.json")
    print_result(result, console)
    sm = result.summary
    console.print(f"[dim]ran {len(result.steps)} steps in {time.perf_counter() - t0:.1f} s wall · generate call "
                  f"{sm['mean_generate_s'] * 1e3:.0f} ms mean · reward call {sm['mean_reward_call_s'] * 1e3:.1f} ms "
                  f"mean ({sm['reward_failures']} failed) · weight transfer {sm['weight_transfer_s_mean']:.2f} s[/]")
    if json_path:
        write_output("--json", json_path, result.write_json)
        console.print(f"[dim]wrote {json_path}[/]")
    if trace is not None:
        write_output("--trace", trace, tracer.write)
        console.print(f"[dim]wrote {trace} (open in https://ui.perfetto.dev)[/]")
    if interrupted is not None:
        err_console.print(f"{result.error}; the result of those steps is in {json_path}, their trace in {trace}",
                          highlight=False, soft_wrap=True)
        return 128 + int(interrupted)  # 130 for SIGINT, 143 for SIGTERM
    return 1 if result.error else 0
