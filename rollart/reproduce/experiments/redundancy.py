"""Experiment: Redundant environment rollout under env failures and stragglers."""

from __future__ import annotations

import math

from rollart.reproduce import plots
from rollart.reproduce.checks import direction
from rollart.reproduce.experiments.common import B8, _failures, _find
from rollart.reproduce.figures import NA, fr, fs, fx, ratio, step_s, steady, throughput
from rollart.reproduce.model import Experiment, MdTable, Outcome, Section, Variant


STRESS = tuple(f"tasks.{t}.env.failure_prob=0.05" for t in ("FrozenLake", "WebShop", "GEM-Math", "GEM-Game"))
CONDITIONS = (("calibrated", "calibrated envs", ()), ("stressed", "5 % env-call failures", STRESS))
REDUNDANCIES = (0.0, 0.25, 0.5)


def _analyse_redundancy(outs: list[Outcome]) -> Section:
    rows, head = [], {}
    for cond, clabel, _ in CONDITIONS:
        for r in REDUNDANCIES:
            o = _find(outs, condition=cond, redundancy=r)
            if o is None:
                continue
            sm = o.summary
            p90 = sorted(x.time_s for x in steady(o))
            head[f"{cond}.{r:g}"] = {"throughput": throughput(o), "step_s": step_s(o)}
            rows.append([clabel, f"{r:g}", fs(step_s(o)), fs(p90[-1] if p90 else math.nan), fr(throughput(o)),
                         str(sm.get("env_failures", NA)), str(sm.get("aborted_redundant", NA))])
    table = MdTable(["envs", "redundancy", "step s", "slowest step s", "traj/s", "trajectories lost to env failures",
                     "redundant aborts"], rows)
    comparison = MdTable(["quantity", "simulated", "paper"], [
        [f"throughput, redundancy 0.25 ÷ 0 ({c})",
         fx(ratio(head.get(f"{c}.0.25", {}).get("throughput"), head.get(f"{c}.0", {}).get("throughput"))),
         "redundant envs mask stragglers and env failures (qualitative)"] for c, _, _ in CONDITIONS])
    notes = ["Stragglers come from the calibrated tails (SWE env.reset reaching hundreds of seconds, heavy-tailed "
             "env.step and response lengths); the stressed condition adds a 5 % failure probability to every env "
             "call (each call retried once). Throughput over the steady-state steps."] + _failures(outs)
    gains = [ratio(head.get(f"{c}.0.25", {}).get("throughput"), head.get(f"{c}.0", {}).get("throughput"))
             for c, _, _ in CONDITIONS]
    gains = [g for g in gains if math.isfinite(g)]
    checks = [direction("redundant envs (0.25) raise throughput, calibrated and stressed envs",
                        " · ".join(fx(g) for g in gains), "> 1 (mask stragglers and failures)",
                        all(g > 1 for g in gains) if gains else None)]
    return Section(table, comparison, notes, headline=head, checks=checks)


REDUNDANCY = Experiment(
    name="redundancy",
    title="Redundant environment rollout under env failures and stragglers",
    setup=("ROLLART mode on the Qwen3-8B 128-GPU plan (four-task mix, batch 512, α = 1), launching 8 (redundancy "
           "0), 10 (0.25) or 12 (0.5) members per GRPO group of 8 and aborting the surplus once a group is full; "
           "with the calibrated env profiles, and with 5 % of env calls failing. Scenario "
           "`paper/qwen3-8b-128gpu`."),
    steps=8,
    variants=tuple(Variant(f"{clabel}, redundancy {r:g}", B8, "rollart", (*ov, f"algorithm.redundancy={r:g}"),
                           params={"condition": cond, "redundancy": r})
                   for cond, clabel, ov in CONDITIONS for r in REDUNDANCIES),
    analyse=_analyse_redundancy,
    plot=lambda outs, path: plots.redundancy(outs, path, CONDITIONS, REDUNDANCIES, throughput),
    paper=("Redundant environment rollout: launch more envs than the batch needs and abort the rest once enough "
           "are done, masking stragglers and env failures; no number in our notes."),
)
