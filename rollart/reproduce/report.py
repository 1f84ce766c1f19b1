"""``DIR/report.md`` (one section per experiment) and ``DIR/results.json`` (the raw figures)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollart.reproduce.checks import TOLERANCE, Check, summary_line, verdict
from rollart.reproduce.model import Experiment, MdTable, Outcome, Section


@dataclass
class ExperimentRun:
    experiment: Experiment
    outcomes: list[Outcome]
    section: Section
    steps: int
    wall_s: float
    plot: str | None          # file name of the PNG inside the output folder
    analysis_error: str | None = None


def _clean(x: Any) -> Any:
    """JSON-safe: NaN/inf become null, tuples lists, mappings plain dicts."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(runs: list[ExperimentRun], path: Path, meta: dict[str, Any]) -> None:
    doc: dict[str, Any] = {"meta": meta, "experiments": {}}
    for run in runs:
        doc["experiments"][run.experiment.name] = {
            "title": run.experiment.title,
            "steps": run.steps,
            "wall_s": run.wall_s,
            "headline": run.section.headline,
            "checks": [{"figure": c.figure, "simulated": c.simulated, "paper": c.paper, "agrees": c.agrees,
                        "deviation": c.deviation, "like_for_like": c.like_for_like} for c in run.section.checks],
            "variants": [{
                "label": o.variant.label, "scenario": o.variant.scenario, "mode": o.variant.mode,
                "overrides": list(o.variant.overrides), "params": dict(o.variant.params),
                "command": o.command(), "error": o.error, "wall_s": o.wall_s, "cpu_s": o.cpu_s, "cached": o.cached,
                "summary": {k: v for k, v in o.summary.items() if k != "trajectories"},
                "steps": [{"step": r.step, "time_s": r.time_s, "breakdown_s": r.breakdown_s,
                           "trajectories": r.trajectories, "env_timeouts": r.env_timeouts} for r in o.records],
            } for o in run.outcomes],
        }
    path.write_text(json.dumps(_clean(doc), indent=1, ensure_ascii=False) + "\n")


def _calibration(runs: list[ExperimentRun]) -> dict[str, str]:
    seen: dict[str, str] = {}
    for run in runs:
        for o in run.outcomes:
            if o.result is not None:
                for gpu, source in o.result.calibration.items():
                    seen.setdefault(gpu, source)
    return seen


def all_checks(runs: list[ExperimentRun]) -> list[Check]:
    """Every experiment's paper checks, in report order, each tagged with its experiment."""
    return [dataclasses.replace(c, experiment=run.experiment.name) for run in runs for c in run.section.checks]


def checks_table(checks: list[Check]) -> MdTable:
    return MdTable(["paper figure", "experiment", "simulated", "paper", "verdict"],
                   [[c.figure, f"[{c.experiment}](#{c.experiment})", c.simulated, c.paper, verdict(c)]
                    for c in checks])


def reductions(steps: int | None, batch_cap: int | None) -> list[str]:
    """What makes a run reduced (its verdicts then do not judge the simulator); empty for a full run."""
    out = []
    if steps is not None:
        out.append(f"`--steps {steps}` for every experiment")
    if batch_cap is not None:
        out.append(f"batch sizes capped at {batch_cap} trajectories (`ROLLART_REPRODUCE_BATCH`)")
    return out


def write_markdown(runs: list[ExperimentRun], path: Path, meta: dict[str, Any]) -> None:
    lines = ["# The ROLLART paper's experiments, simulated", ""]
    reduced = reductions(meta.get("steps"), meta.get("batch_cap"))
    lines += [f"Written by `rollart reproduce` in {meta['wall_s']:.0f} s of wall time on {meta.get('jobs', 1)} "
              f"process(es): {len(runs)} experiment(s), {meta['variants']} variant(s) ({meta['cached']} reused from "
              "an identical variant)"
              + (f"; reduced run: {', '.join(reduced)}." if reduced else ".")]
    lines += ["", "Each experiment is a shipped scenario (`scenarios/paper/...`) plus variants (a mode and `--set` "
              "overrides); the commands to rerun any row with `rollart simulate` are listed under each section. "
              "The paper's figures are exactly those recorded in the project's paper notes; where the notes give "
              "none, the comparison is qualitative. One calibration serves every experiment — no experiment "
              "adjusts a cost model:", ""]
    for gpu, source in _calibration(runs).items():
        lines.append(f"* cost model {gpu}: {source}")
    lines.append("* task profiles: `calibration/tasks/*.yaml` (the paper scenarios' task mix)")
    checks = all_checks(runs)
    if checks:
        lines += ["", "## The paper's figures at a glance", "",
                  summary_line(checks) + " Like-for-like: the same quantity on the paper's setup, within the bound "
                  f"when inside the paper's value or range or within {100 * TOLERANCE:.0f} % of it; qualitative: the "
                  "paper's direction or ordering, no number. Each experiment's section has the detail."
                  + (" **This is a reduced run** (see above): its verdicts do not judge the simulator; run "
                     "`rollart reproduce` without reductions for that." if reduced else ""),
                  "", checks_table(checks).render()]
        if meta.get("glance_plot"):
            lines += ["", f"![the paper's figures at a glance]({meta['glance_plot']})"]
    lines += ["", "## Contents", ""]
    for i, run in enumerate(runs, 1):
        lines.append(f"{i}. [{run.experiment.title}](#{run.experiment.name}) (`{run.experiment.name}`)")
    for i, run in enumerate(runs, 1):
        e, s = run.experiment, run.section
        lines += ["", f'<a id="{e.name}"></a>', "", f"## {i}. {e.title}", ""]
        lines += [f"**Setup.** {e.setup} Simulated {run.steps} step(s) per variant "
                  f"({len(run.outcomes)} variants, {run.wall_s:.0f} s of simulation).", ""]
        if e.paper:
            lines += [f"**Paper.** {e.paper}", ""]
        if run.analysis_error:
            lines += [f"**The analysis failed:** {run.analysis_error}", ""]
        lines += ["### Simulated", "", s.table.render(), ""]
        for title, table in s.extra_tables:
            lines += [f"### {title}", "", table.render(), ""]
        if s.comparison is not None:
            lines += ["### Simulated vs paper", "", s.comparison.render(), ""]
        if s.notes:
            lines += [f"* {n}" for n in s.notes] + [""]
        if run.plot:
            lines += [f"![{e.name}]({run.plot})", ""]
        lines += ["<details><summary>Commands (one per variant)</summary>", "", "```bash"]
        seen = set()
        for o in run.outcomes:
            cmd = o.command()
            if cmd not in seen:
                seen.add(cmd)
                lines.append(cmd)
        lines += ["```", "", "</details>"]
    path.write_text("\n".join(lines) + "\n")
