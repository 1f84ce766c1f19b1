"""Run results: the JSON contract, the step table and the comparison table.

Both backends produce a :class:`RunResult`, so a simulated and a real run print and
serialise the same way."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rollart.core.stats import BREAKDOWN_KEYS, SE_MIN_PAIRS, StepRecord, steady_state, warmup_steps
from rollart.files import write_text_atomic

SHORT = {"generation": "gen", "env_queue": "cpu", "env_reset": "reset", "env_step": "env", "reward": "reward", "train": "train",
         "weight_sync": "sync", "idle": "idle"}


def decimals_for(values: list[float]) -> int:
    """Decimals for a column of seconds, chosen from its magnitudes: one for GPU-scale steps
    (tens of seconds), up to three for CPU-scale ones (a 0.04 s env step is not 0.0)."""
    top = max((abs(v) for v in values), default=0.0)
    if top >= 10:
        return 1
    if top >= 1:
        return 2
    return 3


def _num(x: float, decimals: int = 1) -> str:
    """Seconds for a table cell: ``decimals`` below 100 s, whole seconds above (keeps 80 columns)."""
    return f"{x:.{decimals}f}" if abs(x) < 100 else f"{x:.0f}"


def p90(values: list[float]) -> float:
    """The 90th percentile (nearest rank; 0 for no values)."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


@dataclass
class RunResult:
    scenario: str
    mode: str
    seed: int
    backend: str
    steps: list[StepRecord]
    summary: dict[str, Any]
    calibration: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "mode": self.mode,
            "seed": self.seed,
            "backend": self.backend,
            "calibration": self.calibration,
            "steps": [{"step": s.step, "time_s": s.time_s, "start_s": s.start_s, "end_s": s.end_s,
                       "breakdown_s": s.breakdown_s, "trajectories": s.trajectories, "tokens": s.tokens,
                       "mean_staleness": s.mean_staleness, "mean_reward": s.mean_reward,
                       "env_timeouts": s.env_timeouts, "response_tokens_max": s.response_tokens_max,
                       "response_tokens_mean": s.response_tokens_mean,
                       "task_trajectories": dict(sorted(s.task_trajectories.items()))} for s in self.steps],
            "summary": self.summary,
            "error": self.error,
        }

    def write_json(self, path: str | Path) -> None:
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")


def summary_from_steps(steps: list[StepRecord], alpha: int = 0) -> dict[str, Any]:
    """The whole run's figures, and under ``steady`` the same rates past its warm-up
    (:func:`~rollart.core.stats.steady_state`; the cold first step, or 1 + ``alpha`` steps in a run
    bound by the weight transfer: :func:`~rollart.core.stats.warmup_steps`): what a long run
    converges to, and what plans are compared by."""
    times = [s.time_s for s in steps]
    elapsed = steps[-1].end_s if steps else 0.0
    trajs = sum(s.trajectories for s in steps)
    tokens = sum(s.tokens for s in steps)
    return {
        "step_time_s_mean": sum(times) / len(times) if times else 0.0,
        "step_time_s_p90": p90(times),
        "trajectories_per_s": trajs / elapsed if elapsed else 0.0,
        "trained_tokens_per_s": tokens / elapsed if elapsed else 0.0,
        "mean_staleness": sum(s.mean_staleness * s.trajectories for s in steps) / trajs if trajs else 0.0,
        "env_timeouts": sum(s.env_timeouts for s in steps),
        "breakdown_s_mean": {k: sum(s.breakdown_s.get(k, 0.0) for s in steps) / len(steps) if steps else 0.0
                             for k in BREAKDOWN_KEYS},
        "steady": steady_state(steps, warmup_steps(steps, alpha)),
    }


def price_steady_state(summary: dict[str, Any]) -> None:
    """Add the steady state's cost per 1k trajectories: the run's US$ an hour (placed GPUs and cores,
    and its serverless spend averaged over the run) over the steady state's trajectories an hour."""
    steady, usd_per_hour = summary.get("steady"), summary.get("cost_usd_per_hour")
    if not steady:
        return
    tps = steady["trajectories_per_s"]
    steady["cost_per_1k_trajectories_usd"] = (None if usd_per_hour is None else
                                              1000.0 * usd_per_hour / (3600.0 * tps) if tps > 0 else 0.0)


def plan_figures(summary: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The figures to compare plans by, and whether they are the steady state's: ``summary["steady"]``
    when the run passed its warm-up with trajectories to show, else the whole run's ``summary`` (False:
    a short run's cold first step included). Both carry the same rate, cost, step-time and breakdown keys."""
    steady = summary.get("steady") or {}
    if steady.get("settled") and steady.get("trajectories_per_s", 0.0) > 0:
        return steady, True
    return summary, False


def plan_rates(summary: dict[str, Any]) -> tuple[float, float | None, bool]:
    """(trajectories/s, US$ per 1k trajectories, steady) of :func:`plan_figures`."""
    figs, steady = plan_figures(summary)
    return figs.get("trajectories_per_s") or 0.0, figs.get("cost_per_1k_trajectories_usd"), steady


# a task whose trained share falls short of its planned share by more than this is warned about
SHARE_SHORTFALL = 0.05


def task_share_summary(plan: Any, steps: list[StepRecord], stats: Any, mode: Any = None) -> dict[str, Any]:
    """Each task's planned share (the scenario's ``share``s, normalised) beside its share of the
    trajectories trained, and a warning per task that fell short: by more than 5 percentage points,
    or with nothing trained, as long as the shortfall is at least one group's trajectories (a short
    run's batches hold whole groups). The warning names the task's env failures and timeouts
    (``stats``: :class:`~rollart.core.stats.RunStats`) and the fix (``mode``: the run's
    :class:`~rollart.core.modes.ModeConfig`, for the env-group cause)."""
    total_share = sum(t.share for t in plan.tasks)
    counts: Counter[str] = Counter()
    for s in steps:
        counts.update(s.task_trajectories)
    trained_total = sum(counts.values())
    group = plan.algorithm.group_size
    shares: dict[str, dict[str, float]] = {}
    warnings: list[str] = []
    for t in plan.tasks:
        planned = t.share / total_share
        trained = counts.get(t.name, 0) / trained_total if trained_total else 0.0
        shares[t.name] = {"planned": planned, "trained": trained}
        short = planned - trained
        if not trained_total or short * trained_total < group or (short <= SHARE_SHORTFALL and trained > 0):
            continue
        failed = stats.env_failures_by_task.get(t.name, 0)
        timeouts = stats.env_timeouts_by_task.get(t.name, 0)
        causes = []
        if failed:
            knob = f" (tasks.{t.name}.env.failure_prob={t.env.failure_prob:g})" if t.env.failure_prob else ""
            causes.append(f"its env failed {failed:,} trajectories{knob}")
        if timeouts:
            causes.append(f"{timeouts:,} of its env calls timed out (tasks.{t.name}.env.timeout_s={t.env.timeout_s:g})")
            if t.env.image_gb > 0:  # a reset waits for its image: a slow pull times out the reset (helper-88)
                pool = plan.env_pool(t)
                causes.append(f"its resets first pull a {t.env.image_gb:g} GB image through "
                              f"cluster.cpu_pools.{pool}.image_pull_gbps, a pull a reset's timeout_s cuts off")
        why = ("; ".join(causes) + "; fix the env or remove the task from tasks") if causes else \
            ("no env failures: its groups finished after the other tasks' had filled the batches (slower "
             "episodes, or evicted as stale); the other tasks were trained in its place"
             + _surplus_env_groups(plan, mode))
        warnings.append(f"{t.name}: {_pct(trained)} trained of {_pct(planned)} planned: {why}")
    return {"task_shares": shares, "warnings": warnings}


def _surplus_env_groups(plan: Any, mode: Any) -> str:
    """Why a slow task loses its share when the env managers form more env groups than a batch has
    groups, in a mode that expires stale episodes (ROLL's queues): '' where that is not the case."""
    from rollart.plan.schema import env_managers_of, members_per_group

    if mode is None or not mode.env_groups or mode.batch_level_launch or not mode.evict_stale:
        return ""
    a, groups = plan.algorithm, plan.groups_per_batch
    members = members_per_group(a.group_size, mode.redundancy)
    managers = env_managers_of(a.env_managers, groups, a.group_size, mode.redundancy)
    if managers // members <= groups:
        return ""
    return (f"; algorithm.env_managers={managers} forms {managers // members} env groups for batches of {groups} "
            f"groups: each rolls out its own episodes (ROLL's queues), a batch takes the first to finish and the "
            f"rest expire once α passes them, which costs the slower tasks; {groups * members} (one batch's "
            "members) keeps every task in its share")


def waste_summary(stats: Any, discarded: int = 0) -> dict[str, Any]:
    """Decode work thrown away by aborts and failures (``stats``: :class:`~rollart.core.stats.RunStats`).
    ``wasted_tokens``: tokens the engines decoded for turns cut short by an abort (redundant or stale
    trajectories), left out of ``tokens_per_s``, which counts returned turns only; None where the
    backend cannot report a cut turn's partial output (the Ray runtime: vLLM's abort returns none).
    ``discarded_tokens`` (``discarded``, :meth:`~rollart.core.controller.Controller.discarded_tokens`):
    the returned turns of trajectories that ended untrained (aborted, failed), in ``tokens_per_s`` but
    thrown away as well. ``wasted_token_share``: both as a share of all decoded tokens (returned + cut).
    GPU time is unaffected: the engines are charged for every iteration they ran."""
    wasted = None if stats.wasted_unreported else stats.wasted_tokens
    decoded = stats.generated_tokens + (wasted or 0)
    share = None if wasted is None else ((wasted + discarded) / decoded if decoded else 0.0)
    return {"wasted_tokens": wasted, "discarded_tokens": discarded, "wasted_token_share": share}


def _pct(x: float) -> str:
    """A share as a whole percent, never rounded to 0 % or 100 % unless it is."""
    if 0 < x < 0.005:
        return "<1%"
    if 0.995 <= x < 1:
        return ">99%"
    return f"{x:.0%}"


def step_table(result: RunResult) -> Table:
    # a real run knows the batch's rewards: show the mean, so learning is visible in the table
    rewards = result.backend != "sim" and any(s.mean_reward is not None for s in result.steps)
    d = decimals_for([s.time_s for s in result.steps])
    # waiting for env cores: a column only where some step waited (a pool sized for the run never does)
    keys = [k for k in BREAKDOWN_KEYS if k != "env_queue" or any(s.breakdown_s.get(k, 0.0) > 0 for s in result.steps)]
    table = Table(title=f"{result.scenario} · mode {result.mode} · seed {result.seed} · {result.backend} "
                        "(seconds per step; breakdown along the critical path; t/o: env calls timed out"
                        + ("; cpu: waiting for env cores" if "env_queue" in keys else "")
                        + ("; R: the batch's mean reward" if rewards else "") + ")",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  # wider cells (0.029), the R or the cpu column: one space between columns keeps 80 columns
                  padding=(0, 1) if d == 1 and not rewards and "env_queue" not in keys else 0)
    columns = ["step", "time", *(SHORT[k] for k in keys), "trajs", "stale", "t/o"]
    if rewards:
        columns.append("R")
    for name in columns:
        table.add_column(name, justify="right", no_wrap=True, min_width=len(name),
                         style="bold" if name == "time" else None)
    for s in result.steps:
        row = [str(s.step), _num(s.time_s, d), *(_num(s.breakdown_s.get(k, 0.0), d) for k in keys),
               str(s.trajectories), f"{s.mean_staleness:.2f}", str(s.env_timeouts)]
        if rewards:
            row.append("-" if s.mean_reward is None else f"{s.mean_reward:.2f}")
        table.add_row(*row)
    return table


def summary_table(result: RunResult) -> Table:
    sm = result.summary
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column()
    d = decimals_for([sm["step_time_s_mean"], sm["step_time_s_p90"]])
    table.add_row("step time", f"{sm['step_time_s_mean']:.{d}f} s mean · {sm['step_time_s_p90']:.{d}f} s p90")
    table.add_row("throughput", f"{sm['trajectories_per_s']:.3f} trajectories/s · "
                                f"{sm.get('tokens_per_s', 0.0):,.0f} generated tokens/s")
    if sm.get("steady"):
        table.add_row("steady state", steady_text(sm["steady"], result.steps))
    batch = sm.get("decode_batch_mean") or {}
    busy = " · ".join(f"{pool} {x:.0%}" + (f" (decode batch {batch[pool]:.1f})" if pool in batch else "")
                      for pool, x in sm.get("gpu_busy_fraction", {}).items())
    table.add_row("GPU busy", busy or "-")
    spill = routing_text(sm)
    if spill:
        table.add_row("routing", spill)
    if sm.get("reward_gpu_busy_fraction") is not None:
        table.add_row("reward GPUs busy", f"{sm['reward_gpu_busy_fraction']:.1%}")
    if sm.get("serverless_gpu_seconds"):
        serving = sm.get("serverless_serving_s")
        share = f" ({serving / sm['serverless_gpu_seconds']:.0%} serving calls)" if serving is not None else ""
        per_request = sm.get("serverless_billing", "per_request") == "per_request"
        up = f"; instances up {sm['serverless_instance_s']:.0f} GPU·s" \
            if per_request and sm.get("serverless_instance_s") else ""
        table.add_row("serverless reward", f"{sm['serverless_gpu_seconds']:.0f} GPU·s billed "
                                           f"{'per request' if per_request else 'as instance time'}{share}, "
                                           f"{sm.get('serverless_cold_starts', 0)} cold starts{up}")
    wasted, discarded = sm.get("wasted_tokens"), sm.get("discarded_tokens") or 0
    thrown = []
    if wasted:
        thrown.append(f"{wasted:,} decoded for cut turns")
    if discarded:
        thrown.append(f"{discarded:,} in the finished turns of trajectories not trained")
    table.add_row("aborted", f"{sm['aborted_stale']} stale · {sm['aborted_redundant']} redundant · "
                             f"{sm['env_failures']} env failures"
                             + (f" · {sm['env_timeouts']} env timeouts" if sm.get("env_timeouts") else "")
                             + (f" · tokens wasted: {' and '.join(thrown)}" if thrown else "")
                             + (f" ({sm['wasted_token_share']:.1%} of decoded tokens)"
                                if thrown and sm.get("wasted_token_share") is not None else ""))
    for pool, c in (sm.get("env_cores") or {}).items():
        wait = f" · envs waited {c['mean_wait_s']:.1f} s for cores on average" if c["mean_wait_s"] >= 0.05 else ""
        idle = (f" · billed for all {c['cores']:,g} (cluster.cpu_pools.{pool}.cores)"
                if c["peak_held_share"] < 0.5 and "cost_usd_per_hour" in sm and "cpu_cores_billed_at_peak" not in sm
                else "")
        pulls = (f" · {c['image_pulls']:,} image pulls, {c['mean_pull_s']:.1f} s mean, up to {c['peak_pulls']:,} at once"
                 if c.get("image_pulls") else "")
        if c.get("image_pulls_abandoned"):  # cut off by reset timeouts: a retry resumes them
            pulls += f" · {c['image_pulls_abandoned']:,} cut off (a reset's timeout or an abort; a retry resumes them)"
        busy = (f" · {c['mean_held_share']:.0%} held on average, {c['computing_share_of_held']:.0%} of that in env "
                f"calls" if c.get("mean_held_share") else "")
        table.add_row("env cores", f"{pool}: at most {c['peak_held_share']:.0%} of {c['cores']:,g} held{busy}{wait}"
                                   f"{idle}{pulls}")
    for warning in sm.get("warnings") or ():
        table.add_row(Text("warning", style="not dim bold yellow"), Text(f"task mix: {warning}", style="bold yellow"))
    if "cost_usd_per_hour" in sm:
        table.add_row("cost", "- (a placed GPU type has no price: set prices.gpu_usd_per_hour)"
                      if sm["cost_usd_per_hour"] is None else
                      f"${sm['cost_per_step_usd']:,.2f}/step · ${sm['cost_per_1k_trajectories_usd']:,.2f} per 1k "
                      f"trajectories · ${sm['cost_usd_per_hour']:,.0f}/h"
                      + (f" · env CPU billed for the {sm['cpu_cores_billed_at_peak']:,.0f} cores held at peak "
                         "(the plan sets no cluster.cpu_pools; its default pool is not bought whole)"
                         if "cpu_cores_billed_at_peak" in sm else ""))
    steady = sm.get("steady") or {}
    past = f" · {steady['mean_staleness']:.2f} past the cold first step (the steady state's)" \
        if steady.get("settled") and "mean_staleness" in steady else ""
    table.add_row("staleness", f"{sm['mean_staleness']:.2f} versions mean over the whole run{past}")
    if "prefix_cache_hit_rate" in sm:
        preempted = sm.get("kv_preemptions") or 0
        held, flight = sm.get("kv_conversations_held"), sm.get("env_managers_in_flight")
        rounds, fits = sm.get("env_manager_rounds", 1), sm.get("env_managers_fit")
        fit = ""
        if held is not None and flight is not None and flight > held:
            fit = f"; the engines' KV holds ~{held:,} conversations of the trained length and {flight:,} ran at once"
            fit += (f": try algorithm.env_managers={fits:,}" + (
                f" ({-(-sm['groups_per_batch'] // rounds):,} env groups, each {rounds} of a batch's "
                f"{sm['groups_per_batch']:,} groups)" if rounds > 1 else "")
                if fits is not None else ": not one group's; more KV (GPUs, tp, FP8 KV) or shorter contexts")
        table.add_row("prefix cache", f"{sm['prefix_cache_hit_rate']:.0%} of prompt tokens reused" + (
            f" · KV full: {preempted:,} requests preempted and recomputed "
            f"({sm.get('kv_preempted_reuse_share', 0.0):.0%} of the reuse their own KV){fit}" if preempted else ""))
    if sm.get("weight_sync"):
        table.add_row("weight sync", sm["weight_sync"])
    for note in sm.get("unused_settings") or ():
        table.add_row("not used", note)
    for note in sm.get("context_notes") or ():
        table.add_row("note", note)
    for gpu, source in result.calibration.items():
        table.add_row(f"cost model {gpu}", source)
    mixed = mixed_cost_models(result.calibration)
    if mixed:
        table.add_row("note", mixed)
    return table


# the share of generation requests run off their preferred pool from which the summary says so
SPILL_NOTE_SHARE = 0.05


def routing_text(sm: dict[str, Any]) -> str | None:
    """A line when hardware-affinity routing ran at least :data:`SPILL_NOTE_SHARE` of the requests off their
    preferred pool. The proxy spills a request only when every worker of that pool is saturated (its
    sequence slots or its KV cache full), so the map gives that pool more work than its workers hold at
    once: its requests run in the largest batches it allows while the other pools take the overflow,
    and the run's answer is the map's as much as the hardware's."""
    spilled = sm.get("routed_fallback") or 0
    total = spilled + (sm.get("routed_preferred") or 0)
    if not total or spilled / total < SPILL_NOTE_SHARE:
        return None
    pools = sm.get("routed_fallback_from") or {}
    pool = max(sorted(pools), key=lambda p: pools[p]) if pools else None
    busy = sm.get("gpu_busy_fraction", {}).get(pool) if pool else None
    where = f"{pool}{f' ({busy:.0%} busy)' if busy is not None else ''}" if pool else "their preferred pool"
    return (f"{spilled:,.0f} requests ({spilled / total:.0%}) ran off {where}, the pool placement.hw_affinity "
            f"prefers for them: it spills only when all its workers are full (sequence slots or KV cache), so the "
            f"map gives {pool or 'it'} more than its workers hold at once; compare least-loaded routing "
            "(--set 'placement.hw_affinity={}') or bind a task to another pool")


def steady_text(steady: dict[str, Any], steps: list[StepRecord]) -> str:
    """The steady-state rate in words, or why the run has none: what a long run of this plan does,
    without the first step's cold rollout."""
    if not steady["settled"]:
        return (f"not reached: run --steps {steady['steps_needed']} or more for the long-run rate (the "
                "throughput above is mostly the cold first step)")
    last = steps[-1].step if steps else steady["from_step"]
    c1k = steady.get("cost_per_1k_trajectories_usd")
    se = steady.get("trajectories_per_s_se")
    spread = f" ± {2 * se:.3f}" if se is not None else ""
    tokens = steady.get("trained_tokens_per_s")
    return (f"{steady['trajectories_per_s']:.3f}{spread} trajectories/s"
            + (f" · {tokens:,.0f} trained tokens/s" if tokens else "")
            + (f" · ${c1k:,.2f} per 1k trajectories" if c1k is not None else "")
            + f" (steps {steady['from_step']}–{last}, past the cold first step; "
            + ("± twice the standard error over pairs of those steps)" if spread else
               f"run --steps {steady['from_step'] + 2 * SE_MIN_PAIRS} or more for its error bar)"))


def mixed_cost_models(calibration: dict[str, str]) -> str | None:
    """A warning when the generation pools mix calibrated profiles with the datasheet roofline: the
    roofline's efficiencies are assumed, so a comparison across those pools carries that assumption
    (a pool with ``profile: datasheet`` beside calibrated H800s reads the roofline's assumed 55 %
    prefill efficiency)."""
    pools = {gpu: src for gpu, src in calibration.items() if gpu != "trainer"}
    roofline = sorted(g for g, src in pools.items() if "roofline" in src)
    if not roofline or len(roofline) == len(pools):
        return None
    return (f"{', '.join(roofline)} on the datasheet roofline (assumed efficiencies) beside calibrated profiles: "
            "compare those pools with care, or measure them (rollart calibrate fit)")


def print_result(result: RunResult, console: Console | None = None) -> None:
    console = console or Console()
    console.print(step_table(result))
    console.print(summary_table(result))
    if result.error:
        console.print(f"[bold red]stopped early:[/] {result.error}")


def compare_table(results: list[RunResult]) -> Table:
    """The modes side by side, throughput normalised to the first: rates and step time past the cold
    first step when every run has at least two more steps (what a long run of each converges to:
    that step costs an asynchronous mode ~2-3 of its steady steps and Sync about one), else the
    whole runs'."""
    steady = all(plan_figures(r.summary)[1] for r in results)
    figs = [r.summary["steady"] if steady else r.summary for r in results]  # one basis for every mode
    base = figs[0]["trajectories_per_s"] or 1.0
    what = ("traj/s, trained tok/s, step s and stale (the trained trajectories' mean policy lag, versions) past "
            "the cold first step; busy and aborted (stale / redundant) over the whole run" if steady else
            "whole run; tok/s: trained tokens; stale: their mean policy lag; aborted: stale / redundant")
    table = Table(title=f"{results[0].scenario}: throughput normalised to {results[0].mode} ({what})",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("mode", "step s", "traj/s", f"× {results[0].mode}", "tok/s", "stale", "GPU busy", "aborted"):
        table.add_column(col, justify="left" if col in ("mode", "GPU busy") else "right", no_wrap=col != "GPU busy",
                         min_width=len(col))
    d = decimals_for([f["step_time_s_mean"] for f in figs])
    for r, f in zip(results, figs):
        sm = r.summary
        busy = " ".join(f"{p}:{x:.0%}" for p, x in sm.get("gpu_busy_fraction", {}).items())
        table.add_row(r.mode, f"{f['step_time_s_mean']:.{d}f}", f"{f['trajectories_per_s']:.3f}",
                      f"{f['trajectories_per_s'] / base:.2f}", f"{f.get('trained_tokens_per_s', 0.0):,.0f}",
                      f"{f.get('mean_staleness', sm.get('mean_staleness', 0.0)):.2f}", busy,
                      f"{sm['aborted_stale']} / {sm['aborted_redundant']}")
    return table
