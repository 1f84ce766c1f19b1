"""``rollart sweep`` and ``rollart plan``: typer command functions, registered on the main app
(``app.command()(sweep)``, ``app.command()(plan)``). Ray is imported only when a sweep (or a
parallel plan search) actually runs."""

from __future__ import annotations

import dataclasses
import math

import os
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rollart.plan import MODES, PlanError, apply_overrides, plan_from_dict, read_yaml

console = Console()
err_console = Console(stderr=True)


def _fail(problems: list[str]) -> None:
    for line in problems:
        err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


SCALE_APPROX_HELP = ("very large clusters: simulate each point as `rollart simulate --scale-approx` does (a "
                     "representative 1/m of a trajectory-level mode's plan; small plans and batch-level modes in full)")


def _scenario_data(scenario: Optional[str], overrides: list[str],
                   scale_approx: bool = False) -> tuple[dict[str, Any], Any]:
    """The scenario's data (``extends:`` merged) and its validated plan with ``overrides`` (under
    ``scale_approx`` the simulated-work guard is each point's, checked on its 1/m subset)."""
    import math

    from rollart.plan.schema import sim_request_scale
    from rollart.scenarios_catalog import default_scenario, resolve_existing

    try:
        path = resolve_existing(scenario) if scenario else default_scenario()
        data = read_yaml(path)
        with sim_request_scale(math.inf if scale_approx else 1.0):
            return data, plan_from_dict(data, overrides)
    except PlanError as exc:
        _fail(exc.problems)
        raise  # unreachable


def _shortcuts(set_: list[str], steps: Optional[int], seed: Optional[int], mode: Optional[str]) -> list[str]:
    out = list(set_)
    if mode is not None:
        if mode not in MODES:
            from rollart.plan.loader import did_you_mean

            _fail([f"--mode: unknown mode '{mode}'{did_you_mean(mode, MODES, 'modes')}"])
        out.append(f"algorithm.mode={mode}")
    if steps is not None:
        out.append(f"algorithm.steps={steps}")
    if seed is not None:
        out.append(f"algorithm.seed={seed}")
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


# ---------------------------------------------------------------- sweep


def sweep(
    scenario: str = typer.Argument(..., help="scenario YAML or shipped name"),
    grid: list[str] = typer.Option([], "--grid", help="PATH=v1,v2,... (values parsed like --set; repeatable): "
                                                      "the cross product is swept"),
    samples: Optional[int] = typer.Option(None, "--samples", min=1,
                                          help="draw N Latin-hypercube points over the grid's values instead"),
    sample_seed: int = typer.Option(0, "--sample-seed", help="seed of the Latin-hypercube draw"),
    address: Optional[str] = typer.Option(None, "--address", help="an existing Ray cluster (default: a local Ray)"),
    workers: Optional[int] = typer.Option(None, "--workers", min=1,
                                          help="CPUs of the local Ray = points simulated at once (default: all cores)"),
    out: Path = typer.Option(Path("sweep-out"), "--out", help="results folder (finished points are kept there and "
                                                               "skipped when the sweep is run again)"),
    set_: list[str] = typer.Option([], "--set", help="override a field for every point (repeatable)"),
    steps: Optional[int] = typer.Option(None, "--steps", help="override algorithm.steps for every point"),
    seed: Optional[int] = typer.Option(None, "--seed", help="override algorithm.seed for every point"),
    mode: Optional[str] = typer.Option(None, "--mode", help=f"override algorithm.mode ({', '.join(MODES)})"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
    scale_approx: bool = typer.Option(False, "--scale-approx", help=SCALE_APPROX_HELP),
) -> None:
    """Simulate a grid of what-ifs as parallel Ray tasks; write results.csv and a Pareto plot.

    Each point is one Ray task; finished points are kept under --out and skipped on a rerun.
    results.parquet is written too when pyarrow is installed."""
    from rollart.sweep.runner import RAY_EXTRA_HINT, RayPool, ray_available

    if not ray_available():
        _fail([RAY_EXTRA_HINT])
    from rollart.sim.costs.price import require_prices
    from rollart.sweep.grid import grid_points, lhs_points, parse_grid
    from rollart.sweep.run import run_sweep

    base = _shortcuts(set_, steps, seed, mode)
    data, plan = _scenario_data(scenario, base, scale_approx)
    try:
        require_prices(plan)  # the frontier needs a cost for every point
        dims = parse_grid(grid)
    except PlanError as exc:
        _fail(exc.problems)
        return
    if not dims:
        _fail(["--grid: give at least one PATH=v1,v2,... to sweep (e.g. --grid algorithm.alpha=0,1,2)"])
    try:  # the grid's paths must name fields: check them on the first point before starting Ray
        plan_from_dict(data, [*base, *(d.override(0) for d in dims)])
    except PlanError as exc:  # a point may be infeasible (kept as a failed row), a misspelt path never is
        typos = [line.replace("--set", "--grid", 1) for line in exc.problems
                 if line.startswith("--set") or "unknown field" in line]
        if typos:
            _fail(typos)
    from rollart.cli import prepare_output_dir, show_progress

    prepare_output_dir(out, "--out")
    points = lhs_points(dims, samples, sample_seed) if samples else grid_points(dims)
    what = (f"{len(points)} Latin-hypercube points" if samples else f"{len(points)} points") + \
        f" of {plan.name} ({' × '.join(str(len(d.values)) for d in dims)} grid)"
    err_console.print(f"[dim]sweep: {what} → {out}[/]", highlight=False)
    result = run_sweep(data, dims, points, out, RayPool(workers, address, scale_approx), base_overrides=base,
                       console=err_console,
                       progress=show_progress(not quiet), title=plan.name)
    _print_points(result)
    console.print(f"[dim]{result.ran} simulated, {result.skipped} already done, {result.failed} failed"
                  + (f", {result.lost} lost by Ray (rerun to retry)" if result.lost else "")
                  + f" · {result.wall_s:.1f} s wall · wrote {', '.join(str(p) for p in result.written)}[/]",
                  highlight=False)
    failed = [r for r in result.rows if r["error"]]
    if failed or result.lost:
        raise typer.Exit(code=1)


def _num(row: dict[str, Any], key: str, spec: str) -> str:
    v = row.get(key)
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def _print_points(result: Any) -> None:
    """Every point, fastest first (failed ones last, with their error); * marks the frontier."""
    from rich import box
    from rich.table import Table

    from rollart.report import decimals_for
    from rollart.sweep.results import all_steady, rates

    front = {id(r) for r in result.front}
    steady = all_steady(result.rows)
    ok = sorted((r for r in result.rows if not r["error"]), key=lambda r: -(rates(r, steady)[0] or 0.0))
    bad = [r for r in result.rows if r["error"]]
    over = "past the cold first step" if steady else "over the whole run"
    table = Table(title=f"{len(result.rows)} points, fastest first; * the Pareto frontier ({len(result.front)}: "
                        f"cost per 1 000 trajectories vs throughput); rates, step s and stale (the trained "
                        f"trajectories' mean policy lag, versions) {over}",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("*", justify="center")
    for d in result.dims:
        table.add_column(d.path, justify="right")
    for col in ("traj/s", "$/1k traj", "$/h", "GPUs", "step s", "stale"):
        table.add_column(col, justify="right")
    step_key = "steady_step_time_s_mean" if steady else "step_time_s_mean"
    stale_key = "steady_mean_staleness" if steady else "mean_staleness"
    d = decimals_for([r.get(step_key) or 0.0 for r in ok])
    for r in ok:
        tps, c1k = rates(r, steady)
        table.add_row("*" if id(r) in front else "", *(_fmt(r.get(dim.path)) for dim in result.dims),
                      "-" if tps is None else f"{tps:.3f}", "-" if c1k is None else f"{c1k:.2f}",
                      _num(r, "cost_usd_per_hour", ",.0f"), _fmt(r.get("gpus")), _num(r, step_key, f".{d}f"),
                      _num(r, stale_key, ".2f"))
    for r in bad:
        table.add_row("", *(_fmt(r.get(dim.path)) for dim in result.dims), "[red]failed[/]", "-", "-", "-", "-", "-")
    console.print(table)
    if ok and not steady:
        need = max(r.get("steady_steps_needed") or 0 for r in ok)
        console.print(f"every point is read over its whole run, cold first step included: a point ran fewer than "
                      f"{need} steps; --steps {need} or more reads them past it, as a long run", highlight=False)
    for r in bad:
        where = ", ".join(f"{dim.path}={_fmt(r.get(dim.path))}" for dim in result.dims)
        console.print(f"[red]failed[/] {escape(where)}: {escape(str(r['error']).splitlines()[0])}", highlight=False,
                      soft_wrap=True)


# ---------------------------------------------------------------- plan


def _csv(text: str, kind: type, option: str, lo: float, hi: float) -> list[Any]:
    """Comma-separated values of ``kind``, each finite and within [lo, hi]."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail([f"{option}: expected comma-separated {kind.__name__}s, got '{text}'"])
        raise
    if not values:
        _fail([f"{option}: give at least one value"])
    bad = [v for v in values if not (math.isfinite(v) and lo <= v <= hi)]
    if bad:
        _fail([f"{option}: {', '.join(map(str, bad))} outside {lo:g}–{hi:g}"])
    return values


def _trainer_pool_choices(plan: Any, choice: Optional[str]) -> list[str]:
    """The pools ``--trainer-pools`` names (``all``: every GPU pool), the scenario's trainer pool first; by
    default only that one."""
    own = plan.placement.trainer.pool
    if choice is None:
        return [own]
    pools = list(plan.cluster.gpu_pools)
    given = [x.strip() for x in choice.split(",") if x.strip()]
    if not given:
        _fail([f"--trainer-pools: give pool names or all; pools are: {', '.join(pools)}"])
    if "all" in given and len(given) > 1:
        _fail([f"--trainer-pools: all stands alone (it tries every pool: {', '.join(pools)})"])
    names = pools if given == ["all"] else given
    unknown = [n for n in names if n not in pools]
    if unknown:
        _fail([f"--trainer-pools: unknown pool {', '.join(repr(n) for n in unknown)}; pools are: "
               f"{', '.join(pools)} (or all)"])
    return sorted(set(names), key=lambda p: (p != own, pools.index(p)))


def _trainer_pool_overrides(plan: Any, pool: str) -> list[str]:
    """Overrides that move the trainer to ``pool``, with room for it there (the search caps an owned pool,
    priced 0, at its real count: see ``owned_counts``). A stated MFU that was the trainer GPU's own stays the
    scenario GPU's, moved to the new type by the GEMM rule (``mfu_measured_on``); the default MFU is an H800
    fit wherever the trainer goes (``effective_mfu``); a measured train profile belongs to its GPU and
    cannot move."""
    tr = plan.placement.trainer
    if pool == tr.pool:
        return []
    if tr.profile is not None:
        raise PlanError([f"placement.trainer.profile: a measured train profile ({tr.profile}) is of the "
                         f"'{tr.pool}' pool's GPU; it cannot price a trainer on '{pool}'"])
    spec = plan.cluster.gpu_pools[pool]
    here = plan.cluster.gpu_pools[tr.pool].gpu
    measured = ([] if tr.mfu_measured_on is not None or spec.gpu == here or "mfu" not in tr.model_fields_set
                else [f"placement.trainer.mfu_measured_on={here}"])
    return [f"placement.trainer.pool={pool}", f"cluster.gpu_pools.{pool}.count={spec.count + tr.gpus}", *measured]


def plan(
    scenario: str = typer.Argument(..., help="scenario YAML or shipped name (its GPU types, task mix, model)"),
    budget_usd_per_hour: Optional[float] = typer.Option(None, "--budget-usd-per-hour",
                                                        help="at most this US$/h (placed GPUs + env cores + "
                                                             "serverless, priced by the plan's prices)"),
    budget_gpus: Optional[int] = typer.Option(None, "--budget-gpus", min=1,
                                              help="at most this many placed GPUs (trainer + generation + reward)"),
    objective: str = typer.Option("throughput", "--objective", help="throughput (max traj/s; plans within 1 % "
                                                                   "tie, or finalists within their seeds' noise, "
                                                                   "twice the standard error of their per-seed "
                                                                   "difference: the cheaper plan first) or cost "
                                                                   "(min $ per 1 000 trajectories)"),
    out: Path = typer.Option(Path("plan.yaml"), "--out", help="where to write the winning plan"),
    candidates: int = typer.Option(48, "--candidates", min=1, help="candidates in the first (shortest) rung"),
    finalists: int = typer.Option(4, "--finalists", min=1, help="plans simulated at full length"),
    confirm_seeds: int = typer.Option(2, "--confirm-seeds", min=0,
                                      help="further seeds the finalists run at; they rank by the mean (0: one seed)"),
    min_steps: int = typer.Option(2, "--min-steps", min=1, help="training steps simulated in the first rung (step 0 alone is the start-up transient)"),
    local_rounds: int = typer.Option(1, "--local-rounds", min=0, help="neighbour-search rounds in the first rung"),
    polish_rounds: int = typer.Option(4, "--polish-rounds", min=0, help="most hill-climbing rounds from the winner at "
                                                                       "full length (stops when a round finds nothing better)"),
    gpu_step: Optional[int] = typer.Option(None, "--gpu-step", min=1, help="GPU counts move in steps of this "
                                                                            "(default 8, a node, for big budgets)"),
    tp: Optional[str] = typer.Option(None, "--tp", help="generation tensor-parallel degrees to try (default: "
                                                          "the powers of two within each pool's NVLink domain, "
                                                          "1,2,4,8 on HGX boards)"),
    alphas: str = typer.Option("0,1,2", "--alphas", help="staleness bounds α to try"),
    redundancies: str = typer.Option("0,0.25,0.5", "--redundancies", help="redundancy fractions to try"),
    fixed_affinity: bool = typer.Option(False, "--fixed-affinity", help="do not search the affinity map: "
                                                                         "prefill-heavy tasks → compute GPUs"),
    search_seed: int = typer.Option(0, "--search-seed", help="seed of the random candidates"),
    workers: Optional[int] = typer.Option(None, "--workers", min=1,
                                          help="simulate this many candidates at once in local processes "
                                               "(default: every core; 1: in this process)"),
    address: Optional[str] = typer.Option(None, "--address", help="run the simulations on an existing Ray cluster"),
    trainer_pools: Optional[str] = typer.Option(None, "--trainer-pools",
                                                help="GPU pools to try the trainer on, comma-separated, or 'all' "
                                                     "(one search each, the best kept; default: the scenario's)"),
    top: int = typer.Option(5, "--top", min=1, help="plans to list"),
    set_: list[str] = typer.Option([], "--set", help="override a scenario field first (repeatable)"),
    steps: Optional[int] = typer.Option(None, "--steps", help="training steps of the full simulations"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    mode: Optional[str] = typer.Option(None, "--mode"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
    scale_approx: bool = typer.Option(False, "--scale-approx", help=SCALE_APPROX_HELP),
) -> None:
    """Search placements within a budget; print the top plans and why; write the best as a plan.

    Successive halving on short simulations, then full simulations of the finalists and of the
    winner's neighbours. `rollart simulate PLAN.yaml` reproduces the winner's figures."""
    from rollart.plan.schema import sim_request_scale
    from rollart.planner import (Budget, Space, affinity_note, best_of, held_fixed_line, plan_data, search,
                                 serverless_billing_line, spread_line, top_table, trainer_pools_table, why_lines,
                                 write_plan)
    from rollart.planner.search import OBJECTIVES
    from rollart.report import plan_rates
    from rollart.sim.costs.price import require_prices
    from rollart.cli import check_output_file, show_progress
    from rollart.sweep.runner import RAY_EXTRA_HINT, ProcessPool, RayPool, SerialPool, ray_available

    if (budget_usd_per_hour is None) == (budget_gpus is None):
        _fail(["--budget-usd-per-hour / --budget-gpus: give exactly one budget"])
    if budget_usd_per_hour is not None and not math.isfinite(budget_usd_per_hour):
        _fail([f"--budget-usd-per-hour: {budget_usd_per_hour} is not a finite amount"])
    if budget_usd_per_hour is not None and budget_usd_per_hour < 0:
        _fail([f"--budget-usd-per-hour: {budget_usd_per_hour:g} is below 0"])
    if objective not in OBJECTIVES:
        _fail([f"--objective: unknown objective '{objective}'; objectives are: {', '.join(OBJECTIVES)}"])
    use_ray = address is not None
    if use_ray and not ray_available():
        _fail([RAY_EXTRA_HINT.replace("rollart sweep runs its points", "--address runs the simulations")])
    overrides = _shortcuts(set_, steps, seed, mode)
    data, base_plan = _scenario_data(scenario, overrides, scale_approx)
    budget = Budget(gpus=budget_gpus, usd_per_hour=budget_usd_per_hour)
    tps = None if tp is None else _csv(tp, int, "--tp", 1, 1024)
    alpha_list = _csv(alphas, int, "--alphas", 0, 1000)
    redundancy_list = _csv(redundancies, float, "--redundancies", 0, 16)
    # one search per trainer pool tried: its space, its scenario data and plan
    searches: dict[str, tuple[Any, dict[str, Any], Any]] = {}
    refused: dict[str, str] = {}
    counts = {p: spec.count for p, spec in base_plan.cluster.gpu_pools.items()}  # an owned pool's real count
    for tr_pool in _trainer_pool_choices(base_plan, trainer_pools):
        try:
            moved = overrides + _trainer_pool_overrides(base_plan, tr_pool)
            with sim_request_scale(math.inf if scale_approx else 1.0):
                plan_p = plan_from_dict(data, moved)
            if objective == "cost" or budget_usd_per_hour is not None:
                require_prices(plan_p)
            space = Space.from_plan(plan_p, budget, step=gpu_step, tps=tps, alphas=alpha_list,
                                    redundancies=redundancy_list, search_affinity=not fixed_affinity,
                                    owned_counts=counts)
            if space.trainer_overrides:  # the layout every plan trains with, in the plan written and said
                moved = moved + space.trainer_overrides
                with sim_request_scale(math.inf if scale_approx else 1.0):
                    plan_p = plan_from_dict(data, moved)
        except PlanError as exc:
            refused[tr_pool] = exc.problems
            continue
        searches[tr_pool] = (space, apply_overrides(data, moved), plan_p)
    if not searches:
        problems = list(refused.values())
        if all(ps == problems[0] for ps in problems):  # the same for every pool: the search's, said once
            _fail(problems[0])
        _fail([f"--trainer-pools {p}: {why}" for p, ps in refused.items() for why in ps])
        return
    check_output_file(out, "--out")
    n = workers or os.cpu_count() or 1
    pool = RayPool(workers, address, scale_approx) if use_ray else \
        ProcessPool(n, scale_approx) if n > 1 else SerialPool(scale_approx)
    t0 = time.perf_counter()
    if not quiet:
        err_console.print(f"[dim]plan: simulating on {pool.workers if not use_ray else 'the Ray cluster'}"
                          f"{' processes' if not use_ray and n > 1 else ' (this process)' if not use_ray else ''}; "
                          "the bar shows each rung's time left[/]", highlight=False)
    results: dict[str, Any] = {}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("· left"), TimeRemainingColumn(),
                  console=err_console, transient=True, disable=not show_progress(not quiet)) as bar:
        task = bar.add_task("planning", total=0)
        for tr_pool, (space, base, _) in searches.items():
            where = f"trainer on {tr_pool}: " if len(searches) > 1 else ""

            def on_rung(what: str, n: int) -> None:
                bar.reset(task, total=n, description=where + what)

            results[tr_pool] = search(space, base, pool, objective=objective, candidates=candidates,
                                      finalists=finalists, min_steps=min_steps, local_rounds=local_rounds,
                                      polish_rounds=polish_rounds, seed=search_seed, confirm_seeds=confirm_seeds,
                                      on_rung=on_rung, on_done=lambda: bar.advance(task))
    wall = time.perf_counter() - t0
    if len(searches) > 1 or refused:
        console.print(trainer_pools_table(results, {p: ps[0] for p, ps in refused.items()}), highlight=False)
    chosen = best_of(results, objective, budget) or next(iter(results))
    scenario_pool = base_plan.placement.trainer.pool
    result, (_, base, base_plan) = results[chosen], searches[chosen]
    if chosen != scenario_pool:  # "vs the scenario placement": the scenario as given, its own trainer pool's run
        result = dataclasses.replace(result, baseline=results[scenario_pool].baseline if scenario_pool in results
                                     else None)
    rungs = ", ".join(f"{n}×{s}" for s, n in result.rungs)
    sims, sim_steps = sum(r.simulations for r in results.values()), sum(r.simulated_steps for r in results.values())
    per_pool = f"; {len(results)} trainer pools, the kept one's: " if len(results) > 1 else ": "
    console.print(f"[dim]searched {sims} simulations ({sim_steps} simulated steps{per_pool}"
                  f"{rungs} candidates×steps{'; whole space' if result.exhaustive else ''}) in {wall:.1f} s[/]",
                  highlight=False)
    # what each search's space held or left out, and why: the trainer's layout, then generation's
    notes = list(dict.fromkeys([f"trainer {n}" for space, _, _ in searches.values() for n in space.trainer_notes]
                               + [f"generation on {n}" for space, _, _ in searches.values() for n in space.notes]))
    if result.best is None:
        why = result.infeasible[0].error if result.infeasible and result.infeasible[0].error else \
            "every finalist failed or broke the budget"
        console.print(f"[bold red]no plan fits the budget:[/] {escape(why)}", highlight=False)
        for note in notes:  # what the space left out may be why
            console.print(f"[dim]{escape(note)}[/]", highlight=False)
        raise typer.Exit(code=1)
    console.print(top_table(result, top))
    for line in why_lines(result, top):
        console.print(line, highlight=False)
    best = result.best
    sm = best.summary
    tps, c1k, steady = plan_rates(sm)
    spread = spread_line(result)
    name = f"{base_plan.name}-plan"
    approx = " --scale-approx" if (best.record.get("scale_factor") or 1) > 1 else ""
    written = write_plan(plan_data(best, base, name), out, [
        f"written by `rollart plan` from {base_plan.name}: objective {objective}, budget {budget.describe()}",
        f"{best.candidate.label()}",
        f"simulated ({'steady state' if steady else 'whole run'}): {tps:.4f} trajectories/s, step "
        f"{(sm['steady'] if steady else sm)['step_time_s_mean']:.1f} s mean"
        + (f", ${sm['cost_usd_per_hour']:,.2f}/h, ${c1k:,.2f} per 1k trajectories"
           if sm.get("cost_usd_per_hour") is not None and c1k is not None else ""),
        *([spread] if spread else []),
        f"reproduce: rollart simulate {out}{approx}",
    ])
    if spread:
        console.print(f"#1 {spread}", highlight=False)
    from rollart.sim.costs.price import serverless_price

    billing = serverless_billing_line(best, serverless_price(base_plan), budget.usd_per_hour)
    if billing:
        console.print(billing, highlight=False)
    space = searches[chosen][0]
    routed = affinity_note(best, space.heuristic_affinity, space.compute_rank, base_plan.placement.prefix_cache)
    if routed:
        console.print(routed, highlight=False)
    console.print(f"[dim]{held_fixed_line(base_plan, [*searches, *refused] if trainer_pools else None)}[/]",
                  highlight=False)
    for note in notes:
        console.print(f"[dim]{escape(note)}[/]", highlight=False)
    console.print(f"[dim]wrote {written} · rollart simulate {written}{approx} reproduces these figures"
                  + (" (--seed k: each seed's)" if spread else "") + "[/]", highlight=False)
