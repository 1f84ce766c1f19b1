"""Experiment: Scaling from 64 to 128 H800 (Qwen3-14B), every mode."""

from __future__ import annotations

import math
from typing import Any

from rollart.reproduce import plots
from rollart.core.ties import paired_margin, seed_counts
from rollart.reproduce.checks import direction, leader_text, leaders, tie_rule
from rollart.reproduce.experiments.common import (EXP, MODES, MODE_LABEL, SEEDS, STEADY_NOTE, _bound_note, _failures,
                                                  _find, _seed_runs, _side, _train_s, conversations_per_worker,
                                                  env_managers, finite_mean, mean_throughput, seeded)
from rollart.reproduce.figures import NA, busy, fp, fr, fs, fx, ratio, step_s, throughput, train_share, trainer_bound
from rollart.reproduce.model import Experiment, MdTable, Outcome, Section, Variant


SCALE = EXP + "scaling-14b-h800"
ROLLOUT_TP = 2  # the scenario's rollout workers


def _split(gpus: int, train: int) -> tuple[str, ...]:
    """``gpus`` H800, ``train`` of them training, the rest rollout workers of the scenario's tp."""
    return (f"cluster.gpu_pools.h800.count={gpus}", f"placement.trainer.gpus={train}",
            f"placement.generation=[{{pool: h800, workers: {(gpus - train) // ROLLOUT_TP}, "
            f"tp: {ROLLOUT_TP}}}]")


SCALE_64 = _split(64, 32)
# Other train shares for the two continuous modes, so each can be read at its best split at each size
SPLIT_SHARES = (3 / 8, 5 / 8)
SPLIT_MODES = ("areal", "rollart")
# What bounds ROLLART's rollout at 128 H800: one knob each, the rest as shipped
SCALE_PROBES = (
    ("alpha2", "α = 2 (a longer window per trajectory)", ("algorithm.alpha=2",)),
    ("tp4", "rollout workers of tp 4 (16 × tp 4: faster tokens, fewer workers)",
     ("placement.generation=[{pool: h800, workers: 16, tp: 4}]",)),
    ("envs2x", "2 × the env managers", ()),  # the count is set from the plan (env_managers_of) below
    ("workers48", "1.5 × the rollout workers (48 × tp 2: 160 H800, the trainer as shipped)",
     ("cluster.gpu_pools.h800.count=160", "placement.generation=[{pool: h800, workers: 48, tp: 2}]")),
)


def _scaling_variants() -> tuple[Variant, ...]:
    out: list[Variant] = []
    for m in MODES:  # the comparison and the splits at every seed (their differences are a few %)
        out += seeded(Variant(f"{MODE_LABEL[m]} · 64 H800", SCALE, m, SCALE_64,
                              params={"mode": m, "gpus": 64, "split": "half"}))
        out += seeded(Variant(f"{MODE_LABEL[m]} · 128 H800", SCALE, m, params={"mode": m, "gpus": 128, "split": "half"}))
    for m in SPLIT_MODES:
        for g in (64, 128):
            for share_ in SPLIT_SHARES:
                t = round(g * share_)
                out += seeded(Variant(f"{MODE_LABEL[m]} · {g} H800, {t} train, {(g - t) // ROLLOUT_TP} × tp "
                                      f"{ROLLOUT_TP} rollout", SCALE, m, _split(g, t),
                                      params={"mode": m, "gpus": g, "split": t}))
    from rollart.plan import load_plan
    from rollart.scenarios_catalog import resolve

    envs2x = 2 * env_managers(load_plan(resolve(SCALE)), "rollart")
    for key, label, overrides in SCALE_PROBES:
        extra = (f"algorithm.env_managers={envs2x}",) if key == "envs2x" else overrides
        out.append(Variant(f"ROLLART · 128 H800, {label}", SCALE, "rollart", extra,  # one seed: what bounds it
                           params={"mode": "rollart", "gpus": 128, "split": "probe", "probe": key, "seed": SEEDS[0]}))
    return tuple(out)


def _half(outs: list[Outcome]) -> list[Outcome]:
    """The variants of the scenario's half/half split (the main table and the plot)."""
    return [o for o in outs if o.variant.params.get("split", "half") == "half"]


def _pair(outs: list[Outcome], mode: str, split64: Any = "half", split128: Any = "half") -> dict[str, Any]:
    """One mode's 64- and 128-GPU runs over the seeds: mean throughputs, their ratio (the speed-up)
    and the speed-up of each seed that gave both."""
    a, b = _seed_runs(outs, mode=mode, gpus=64, split=split64), _seed_runs(outs, mode=mode, gpus=128, split=split128)
    ta, tb = mean_throughput(outs, mode=mode, gpus=64, split=split64), mean_throughput(outs, mode=mode, gpus=128,
                                                                                         split=split128)
    per_seed = {s: ratio(throughput(b[s]), throughput(a[s])) for s in SEEDS if s in a and s in b}
    return {"64": ta, "128": tb, "speedup": ratio(tb, ta), "speedups": per_seed, "runs": (a, b)}


def _analyse_scaling(all_outs: list[Outcome]) -> Section:
    outs = _half(all_outs)
    rows, head, per_seed = [], {}, {}
    for m in MODES:
        pair = _pair(outs, m)
        head[m] = {k: pair[k] for k in ("64", "128", "speedup")}
        per_seed[m] = pair["speedups"]
        cells = []
        for runs, t in zip(pair["runs"], (pair["64"], pair["128"])):
            shown = next((o for o in runs.values() if o.ok), None)  # GPU busy of one run: its first good seed
            cells += [fs(finite_mean(step_s(o) for o in runs.values())),
                      fp(finite_mean(train_share(o) for o in runs.values())), fr(t), busy(shown) if shown else NA]
        up = pair["speedup"]
        rows.append([MODE_LABEL[m], *cells, fx(up), " · ".join(fx(x) for x in pair["speedups"].values()) or NA,
                     fp(up / 2 if math.isfinite(up) else math.nan)])
    table = MdTable(["mode", "64 H800 step s", "64 H800 train share of step", "64 H800 traj/s", "64 H800 GPU busy (seed 0)",
                     "128 H800 step s", "128 H800 train share of step", "128 H800 traj/s", "128 H800 GPU busy (seed 0)",
                     "speed-up (ideal 2×)", f"speed-up at seeds {', '.join(map(str, SEEDS))}", "scaling efficiency"],
                    rows)
    margin, paired = paired_margin(per_seed)
    top = leaders({m: head[m]["speedup"] for m in MODES}, margin)
    scales_best = leader_text(top, lambda m: f"{MODE_LABEL[m]} ({fx(head[m]['speedup'])})", margin,
                              seed_counts(per_seed), paired)
    comparison = MdTable(["quantity", "simulated", "paper"], [
        ["mode that scales best from 64 to 128 H800", scales_best,
         "ROLLART scaled better than the baselines (qualitative)"],
        ["ROLLART speed-up 64 → 128", fx(head.get("rollart", {}).get("speedup")), "no number in our notes"],
    ])
    checks = [direction("mode that scales best from 64 to 128 H800 (Qwen3-14B)", scales_best,
                        "ROLLART", top == ["rollart"] if top else None)]
    best_table, splits = _best_splits(all_outs)
    if splits:
        split_seeds = {m: splits[m]["speedups"] for m in splits}
        split_margin, split_paired = paired_margin(split_seeds)
        winners = leaders({m: splits[m]["speedup"] for m in splits}, split_margin)
        at_best = leader_text(winners, lambda m: f"{MODE_LABEL[m]} ({fx(splits[m]['speedup'])})", split_margin,
                              seed_counts(split_seeds), split_paired)
        checks.append(direction("… each continuous mode at its best train/rollout split", at_best, "ROLLART",
                                winners == ["rollart"]))
        comparison.rows.append([f"mode that scales best, {' and '.join(MODE_LABEL[m] for m in splits)} each at its "
                                "best train/rollout split", at_best, "ROLLART scaled better (qualitative)"])
        head["best_split"] = splits
    probe_table, probe_note = _rollart_probes(all_outs)
    notes = ["Throughput over the steady-state steps. Batch size stays 512 at both sizes. " + STEADY_NOTE,
             f"The mode comparison and the splits run at seeds {', '.join(map(str, SEEDS))}: throughputs are their means, "
             "a speed-up the ratio of the means; modes whose speed-ups lie within the margin tie: " + tie_rule(paired)
             + " GPU busy is seed 0's; the one-knob probes run at seed 0."] \
        + _scaling_bound_note(outs) + probe_note + _failures(all_outs)
    extra = [(t, tbl) for t, tbl in (("Each continuous mode at its best train/rollout split", best_table),
                                      ("What bounds ROLLART's rollout at 128 H800 (one knob each)", probe_table))
             if tbl is not None]
    return Section(table, comparison, notes, extra_tables=extra, headline=head, checks=checks)


def _best_splits(outs: list[Outcome]) -> tuple[MdTable | None, dict[str, dict[str, Any]]]:
    """Per continuous mode and size, the train/rollout split with the highest mean throughput over
    the seeds among the half split and SPLIT_SHARES; the speed-up then compares each size at its best."""
    rows, best = [], {}
    for m in SPLIT_MODES:
        picks = {}
        for g in (64, 128):
            splits = {o.variant.params.get("split") for o in outs if o.variant.params.get("mode") == m
                      and o.variant.params.get("gpus") == g and o.variant.params.get("split") != "probe"}
            means = {sp: mean_throughput(outs, mode=m, gpus=g, split=sp) for sp in splits}
            means = {sp: t for sp, t in means.items() if math.isfinite(t)}
            if means:
                sp = max(means, key=lambda k: means[k])
                picks[g] = (sp, means[sp], len(means))
        if len(picks) < 2 or picks[64][2] < 2:  # no split to choose from: nothing beyond the main table
            continue
        pair = _pair(outs, m, picks[64][0], picks[128][0])
        train = {g: picks[g][0] if isinstance(picks[g][0], int) else g // 2 for g in (64, 128)}
        best[m] = {"64": (train[64], pair["64"]), "128": (train[128], pair["128"]), "speedup": pair["speedup"],
                   "speedups": pair["speedups"]}
        rows.append([MODE_LABEL[m], f"{train[64]} train", fr(pair["64"]), f"{train[128]} train", fr(pair["128"]),
                     fx(pair["speedup"]), " · ".join(fx(x) for x in pair["speedups"].values()) or NA])
    if not rows:
        return None, best
    shares = ", ".join(f"{s_:.3g}" for s_ in sorted((0.5, *SPLIT_SHARES)))
    return MdTable(["mode", "64 H800 best split", "64 H800 traj/s", "128 H800 best split", "128 H800 traj/s",
                    f"speed-up (train shares tried: {shares})", f"speed-up at seeds {', '.join(map(str, SEEDS))}"],
                   rows), best


def _rollart_probes(outs: list[Outcome]) -> tuple[MdTable | None, list[str]]:
    """ROLLART at 128 H800 with one knob turned each: a window that lets a trajectory run longer (α),
    faster tokens (tp), more concurrency (env managers), more or fewer rollout workers (the splits).
    Which knobs move the step says what bounds it."""
    base = _find(outs, mode="rollart", gpus=128, split="half", seed=SEEDS[0])
    if base is None or not math.isfinite(throughput(base)):
        return None, []
    knobs = [(o.variant.label.split(", ", 1)[-1], o) for o in outs
             if o.variant.params.get("mode") == "rollart" and o.variant.params.get("gpus") == 128
             and o.variant.params.get("split") != "half" and o.variant.params.get("seed") == SEEDS[0]]
    rows = [["as shipped (64 train, 32 × tp 2 rollout, α = 1)", fs(step_s(base)), fr(throughput(base)), "1.00×"]]
    rows += [[label, fs(step_s(o)), fr(throughput(o)), fx(ratio(throughput(o), throughput(base)))] for label, o in knobs]
    gain = {o.variant.params.get("probe", "split"): ratio(throughput(o), throughput(base)) for _, o in knobs}
    note = []
    lat = [k for k in ("alpha2", "tp4") if gain.get(k, math.nan) >= 1.05]
    flat = all(abs(gain.get(k, math.nan) - 1) < 0.05 for k in ("envs2x", "workers48"))
    if lat and flat:
        rows_per = conversations_per_worker(base)
        per_engine = f"at ~{rows_per:.0f} rows per engine " if math.isfinite(rows_per) else ""
        note = [f"ROLLART at 128 H800 is bound by the latency of its long trajectories, not by GPU count or "
                f"concurrency: a longer window (α = 2: {fx(gain.get('alpha2'))}) or faster tokens (tp 4: "
                f"{fx(gain.get('tp4'))}) speed it up; twice the env managers ({fx(gain.get('envs2x'))}) or 1.5 × the "
                f"rollout GPUs ({fx(gain.get('workers48'))}) barely move it. "
                f"A 30–100-turn trajectory pays one decode latency per turn, and {per_engine}a decode step is "
                "weight- and KV-read-bound, so its time hardly changes with the number of engines: "
                "at α = 1 more rollout GPUs buy little, a wider window or faster tokens do."]
    return MdTable(["ROLLART, 128 H800", "step s", "traj/s", "× as shipped"], rows), note


def _scaling_bound_note(outs: list[Outcome]) -> list[str]:
    """Per mode, which side bounds the step at each size. A mode trainer-bound at 64 H800 waits on
    its train step there, so its speed-up compares that train step (which the 128-GPU trainer
    shortens) with whatever bounds it at 128, not two rollouts."""
    parts = []
    for m in MODES:
        a, b = _find(outs, mode=m, gpus=64, seed=SEEDS[0]), _find(outs, mode=m, gpus=128, seed=SEEDS[0])
        if a is None or b is None:
            continue
        part = f"{MODE_LABEL[m]}: {_side(a)} at 64, {_side(b)} at 128"
        if trainer_bound(a):
            up, trainer = fx(ratio(throughput(b), throughput(a))), fx(ratio(_train_s(a), _train_s(b)))
            part += (f" — its speed-up ({up}) is then its trainer's (train step 64 ÷ 128: {trainer})" if trainer_bound(b)
                     else f" — its speed-up ({up}) sets its 64-GPU train step against its 128-GPU rollout (the trainer "
                          f"alone would give {trainer}), so its rollout-side mechanisms show only at 128")
        parts.append(part)
    return _bound_note(parts)


SCALING = Experiment(
    name="scaling",
    title="Scaling from 64 to 128 H800 (Qwen3-14B), every mode",
    setup=("Qwen3-14B on an all-H800 cluster, half training (tp 4) and half rollout (workers of tp 2): 32 + 32 GPUs "
           "vs 64 + 64, the four-task mix, batch 512, α = 1. Every affinity tag maps to the H800 pool. Scenario "
           "`paper/experiments/scaling-14b-h800` (the 128-GPU point; the 64-GPU point is three overrides). AReaL-style "
           "and ROLLART also run at 3/8 and 5/8 of the GPUs training, to read each at its best split, and ROLLART at "
           "128 H800 with one knob turned each (α, rollout tp, env managers, rollout workers) to show what bounds it."),
    steps=8,
    variants=_scaling_variants(),
    analyse=_analyse_scaling,
    plot=lambda outs, path: plots.scaling(_half(outs), path, MODES, MODE_LABEL,
                                          lambda o: mean_throughput(_half(outs), mode=o.variant.params["mode"],
                                                                    gpus=o.variant.params["gpus"])),
    paper="ROLLART scaled better than the baselines from 64 to 128 H800 on Qwen3-14B (no number in our notes).",
)
