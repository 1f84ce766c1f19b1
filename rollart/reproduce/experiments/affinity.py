"""Experiment: Hardware affinity on a cost-matched 64 H800 + 24 H20 mix vs all-H800 and all-H20."""

from __future__ import annotations

import math

from rollart.reproduce import plots
from rollart.core.ties import paired_margin, seed_counts
from rollart.reproduce.checks import direction, leader_text, leaders, tie_rule
from rollart.reproduce.experiments.common import (BOUND_RULE, EXP, SEEDS, STEADY_NOTE, _failures, _find, _same_trainer,
                                                  _seed_runs, _side, _train_s, finite_mean, mean_throughput,
                                                  seed_throughputs, seeded)
from rollart.reproduce.figures import NA, busy, fp, fr, fs, fx, ratio, step_s, train_share, trainer_bound
from rollart.reproduce.model import Experiment, MdTable, Outcome, Section, Variant


AFF = EXP + "hw-affinity-mix"
AFF_VARIANTS = (
    ("mix-affinity", "64 H800 + 24 H20, affinity routing", ()),
    ("mix-least-loaded", "64 H800 + 24 H20, least-loaded routing", ("placement.hw_affinity={}",)),
    ("all-h800", "72 H800", ("cluster.gpu_pools.h800.count=72", "placement.generation=[{pool: h800, workers: 72, tp: 1}]",
                             "placement.hw_affinity={default: h800}")),
    ("all-h20", "216 H20", ("cluster.gpu_pools.h20.count=216", "placement.generation=[{pool: h20, workers: 216, tp: 1}]",
                            "placement.hw_affinity={default: h20}")),
)


def _analyse_affinity(outs: list[Outcome]) -> Section:
    rows, head, per_seed = [], {}, {}
    tref = mean_throughput(outs, config="all-h800")
    for key, label, _ in AFF_VARIANTS:
        by_run = _seed_runs(outs, config=key)
        if not by_run:
            continue
        runs = list(by_run.values())
        by_seed = seed_throughputs(outs, config=key)
        per_seed[key] = by_seed
        t = head[key] = finite_mean(by_seed.values())
        spread = " · ".join(fr(by_seed.get(s)) for s in SEEDS)  # a missing or failed seed: "—"
        fallback = [o.summary["routed_fallback"] for o in runs if o.ok and "routed_fallback" in o.summary]
        shown = next((o for o in runs if o.ok), runs[0])  # GPU busy of one run: the first seed that gave it
        rows.append([label, fs(finite_mean(step_s(o) for o in runs)), fp(finite_mean(train_share(o) for o in runs)),
                     fr(t), spread, fx(ratio(t, tref)), f"{busy(shown)} (seed {shown.variant.params['seed']})",
                     str(sum(fallback)) if fallback else NA])
    table = MdTable(["rollout hardware (same cost)", "step s", "train share of step", "traj/s",
                     f"traj/s at seeds {', '.join(map(str, SEEDS))}", "× all-H800", "GPU busy",
                     "requests routed off their preferred pool (all seeds)"], rows)
    margin, paired = paired_margin(per_seed)
    top = leaders(head, margin)
    label = dict((k, lbl) for k, lbl, _ in AFF_VARIANTS)
    fastest = leader_text(top, lambda k: label.get(k, NA), margin, seed_counts(per_seed), paired)
    comparison = MdTable(["quantity", "simulated", "paper"], [
        ["fastest cost-matched rollout hardware", fastest,
         "the affinity-routed H800 + H20 mix (qualitative, no number in our notes)"],
        ["mix with affinity ÷ all-H800", fx(ratio(head.get("mix-affinity"), head.get("all-h800"))), "> 1 (qualitative)"],
        ["mix with affinity ÷ all-H20", fx(ratio(head.get("mix-affinity"), head.get("all-h20"))), "> 1 (qualitative)"],
        ["affinity ÷ least-loaded on the mix", fx(ratio(head.get("mix-affinity"), head.get("mix-least-loaded"))),
         "> 1 (qualitative)"],
    ])
    notes = ["Training runs on its own 64 H800 in every variant (as in the base plans; with 32 the trainer bounds every variant); only the rollout hardware changes. Cost matching: "
             "1 H800 = 3 H20, the paper's 2 × H800 ≈ 6 × H20 pairing. Throughput over the steady-state steps. "
             + STEADY_NOTE,
             f"Each variant runs at seeds {', '.join(map(str, SEEDS))} (env latencies, response lengths, failures); the "
             f"figures are their means. Variants within {100 * margin:.1f} % of the fastest tie: "
             + tie_rule(paired)] \
        + _affinity_bound_note(outs) + _failures(outs)
    known = [k for k, t in head.items() if math.isfinite(t)]
    checks = [direction("fastest cost-matched rollout hardware (64 H800 + 24 H20 mix)", fastest,
                        "the affinity-routed mix", top == ["mix-affinity"] if "mix-affinity" in known and len(known) > 1
                        else None)]
    return Section(table, comparison, notes, headline=head, checks=checks)


def _affinity_bound_note(outs: list[Outcome]) -> list[str]:
    """Which variants are trainer-bound: when all are, the rollout hardware cannot change the step."""
    runs = [(label, o) for key, label, _ in AFF_VARIANTS if (o := _find(outs, config=key, seed=SEEDS[0]))]
    if not runs:
        return []
    text = f"Which side bounds the step ({BOUND_RULE}): " + "; ".join(f"{lbl}: {_side(o)}" for lbl, o in runs)
    if all(trainer_bound(o) for _, o in runs):
        ref = _find(outs, config="all-h800", seed=SEEDS[0])
        spread = " · ".join(fx(ratio(_train_s(ref), _train_s(o))) for _, o in runs) if ref else NA
        text += (" — every variant is, so × all-H800 is then mostly the ratio of their train steps "
                 f"(all-H800's ÷ each: {spread}{_same_trainer([o for _, o in runs])}) and the rollout hardware "
                 "cannot show")
    return [text + "."]


AFFINITY = Experiment(
    name="hw-affinity",
    title="Hardware affinity on a cost-matched 64 H800 + 24 H20 mix vs all-H800 and all-H20",
    setup=("Qwen3-8B, the four-task mix, batch 512, ROLLART mode (α = 1, redundancy 0.25, async weight transfer); "
           "training on a separate 64 H800; rollout on 64 H800 + 24 H20 (prefill-heavy SWE, FrozenLake, WebShop "
           "routed to H800, decode-heavy GEM-Math and GEM-Game to H20, with fall-back when a pool is saturated), "
           "the same mix with least-loaded routing, or the same cost as 72 H800 or 216 H20. Scenario "
           "`paper/experiments/hw-affinity-mix`."),
    steps=8,
    variants=tuple(v for key, label, ov in AFF_VARIANTS
                   for v in seeded(Variant(label, AFF, "rollart", ov, params={"config": key}))),
    analyse=_analyse_affinity,
    plot=lambda outs, path: plots.bars(outs, path, [(k, lbl) for k, lbl, _ in AFF_VARIANTS], "config",
                                       lambda o: mean_throughput(outs, config=o.variant.params["config"]),
                                       f"trajectories / s (mean of {len(SEEDS)} seeds)",
                                       "Hardware affinity, cost-matched rollout (Qwen3-8B)", normalise="all-h800"),
    paper=("Hardware affinity on a cost-matched 64 H800 + 24 H20 mix was compared with all-H800 and all-H20; the "
           "notes record no number."),
)
