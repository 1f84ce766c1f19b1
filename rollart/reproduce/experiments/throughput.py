"""Experiment: End-to-end throughput of the five modes on 128 GPUs, and the incremental ablation."""

from __future__ import annotations

import math

from rollart.reproduce import plots
from rollart.reproduce.checks import versus_range
from rollart.reproduce.experiments.common import (BASES, MODES, MODE_LABEL, SEEDS, STEADY_NOTE, TIME_TO_SCORE_CAVEAT,
                                                  _bound_note, _failures, _find, _same_trainer, _seed_runs, _side,
                                                  _tokens_per_traj, _train_s, finite_mean, mean_throughput,
                                                  seed_figures, seed_throughputs, seeded)
from rollart.reproduce.figures import (NA, busy, fp, fr, fs, fx, ratio, response_tail, step_s, throughput,
                                      token_throughput, train_share, trainer_bound, wait_share)
from rollart.reproduce.model import Experiment, MdTable, Outcome, Section, Variant


ABLATION = (
    ("sync", "Sync", None, ()),
    ("sync+", "+ async reward/env (Sync+)", None, ()),
    ("areal", "+ train/rollout overlap (AReaL-style, α = 1)", None, ()),
    ("rollart-affinity", "+ hardware-affinity routing, staleness window (evicts)", "rollart",
     ("algorithm.redundancy=0", "weight_sync.transport=nccl_broadcast")),
    ("rollart", "+ redundant envs, async weight transfer (ROLLART)", None, ()),
)


# tp of the trainer and of a rollout worker in each base plan (placement.trainer / generation).
BASE_TP = {"Qwen3-8B": (2, 1), "Qwen3-14B": (4, 2), "Qwen3-32B": (8, 4)}


def baseline_placement(model: str, mode: str) -> tuple[str, ...]:
    """The paper runs every baseline on 128 H800 (ROLLART on 96 H800 + 32 H20). Sync and Sync+ are
    the standard synchronous pipeline, which time-shares the GPUs between training and rollout
    (colocated); One-off and AReaL train and roll out at once, so they split the 128 H800 in
    half (trainer | rollout) as the base plan splits its H800s. The h20 pool is left unused."""
    if mode == "rollart":
        return ()
    _, tp_gen = BASE_TP[model]
    if mode in ("sync", "sync+"):
        trainer, workers, extra = 128, 128 // tp_gen, ("placement.colocated=true",)
    else:
        trainer, workers, extra = 64, 64 // tp_gen, ()
    return ("cluster.gpu_pools.h800.count=128", *extra,
            f"placement.trainer.gpus={trainer}",
            f"placement.generation=[{{pool: h800, workers: {workers}, tp: {tp_gen}}}]",
            "placement.hw_affinity={}")


# The engines' memory share (vLLM's gpu_memory_utilization): the base plans keep vLLM's default, 0.90;
# ROLL's agentic example configs (the paper's code base) set 0.8. The KV cache gets what is left
# after the weights, so the share decides how many conversations a worker keeps cached.
MEMORY_SHARES = (0.8,)
SHARE_MODES = ("areal", "rollart")


def memory_share(model: str, mode: str, share: float) -> tuple[str, ...]:
    """The mode's placement with every generation group at ``share`` of its GPUs' memory."""
    groups = 1 if mode != "rollart" else 2  # the baselines' one H800 group; the base plans' H800 + H20
    return (*baseline_placement(model, mode),
            *(f"placement.generation.{i}.gpu_memory_utilization={share:g}" for i in range(groups)))


def _throughput_variants() -> tuple[Variant, ...]:
    out: list[Variant] = []
    for model, base in BASES.items():
        for m in MODES:  # the modes and the ablation at every seed: the paper's ratios are read off their means
            out += seeded(Variant(f"{model} · {MODE_LABEL[m]}", base, m, baseline_placement(model, m),
                                  params={"model": model, "mode": m}))
        key, label, mode, overrides = ABLATION[3]
        out += seeded(Variant(f"{model} · ROLLART without redundancy/async transfer", base, mode, overrides,
                              params={"model": model, "mode": key}))
        for share in MEMORY_SHARES:
            for m in SHARE_MODES:
                out.append(Variant(f"{model} · {MODE_LABEL[m]} · engines at {share:g} of GPU memory", base, m,
                                   memory_share(model, m, share),
                                   params={"model": model, "mode": f"{m}@{share:g}"}))  # not a base lookup's match
        for m in SHARE_MODES:
            out.append(Variant(f"{model} · {MODE_LABEL[m]} · one pool of env managers", base, m,
                               (*baseline_placement(model, m), "algorithm.env_groups=false"),
                               params={"model": model, "mode": f"{m}@pool"}))
    return tuple(out)


def _first(outs: list[Outcome], model: str, mode: str) -> Outcome | None:
    """The variant's run at seed 0 (a seeded variant) or its one run."""
    return _find(outs, model=model, mode=mode, seed=SEEDS[0]) or _find(outs, model=model, mode=mode)


def _thr(outs: list[Outcome], model: str, mode: str) -> float:
    """Throughput of the variant (``mode`` its params key) at seed 0 or its one run, NaN when it did not run."""
    o = _first(outs, model, mode)
    return throughput(o) if o is not None else math.nan


def _pool_table(outs: list[Outcome]) -> MdTable:
    rows = []
    for model in BASES:
        got = {k: _first(outs, model, k) for k in ("areal", "rollart", "areal@pool", "rollart@pool")}
        thr = {k: _thr(outs, model, k) for k in got}
        stale = {k: str((o.summary or {}).get("aborted_stale", NA)) if o is not None else NA for k, o in got.items()}
        rows.append([model, fr(thr["areal"]), fr(thr["rollart"]), fx(ratio(thr["rollart"], thr["areal"])),
                     fr(thr["areal@pool"]), fr(thr["rollart@pool"]) + f" ({stale['rollart@pool']} stale)",
                     fx(ratio(thr["rollart@pool"], thr["areal@pool"]))])
    return MdTable(["model", "AReaL-style traj/s, env groups (as shipped)", "ROLLART traj/s, env groups",
                    "ROLLART ÷ AReaL", "AReaL-style traj/s, one pool", "ROLLART traj/s, one pool",
                    "ROLLART ÷ AReaL, one pool"], rows)


def _memory_share_table(outs: list[Outcome]) -> MdTable:
    rows = []
    for model in BASES:
        for m in SHARE_MODES:
            base = _first(outs, model, m)  # seed 0, as the variants it is compared with
            for share in MEMORY_SHARES:
                o = _find(outs, model=model, mode=f"{m}@{share:g}")
                if o is None or base is None:
                    continue
                reuse = [fp((x.summary or {}).get("prefix_cache_hit_rate")) for x in (base, o)]
                rows.append([model, MODE_LABEL[m], fr(throughput(base)), reuse[0], fr(throughput(o)), reuse[1],
                             fx(ratio(throughput(o), throughput(base)))])
    return MdTable(["model", "mode", "traj/s at 0.90 (vLLM default, as shipped)", "prefix reuse at 0.90",
                    f"traj/s at {' / '.join(f'{s:g}' for s in MEMORY_SHARES)} (ROLL's agentic examples)",
                    "prefix reuse", "× as shipped"], rows)


def _analyse_throughput(outs: list[Outcome]) -> Section:
    rows, head, per_seed = [], {}, {}
    for model in BASES:
        by_seed = {m: got for m in (*MODES, "rollart-affinity")
                   if (got := seed_throughputs(outs, model=model, mode=m))}
        thr = {m: finite_mean(v.values()) for m, v in by_seed.items()}
        per_seed[model] = by_seed
        for m in MODES:
            o = _first(outs, model, m)
            if o is None:
                continue
            runs = list(_seed_runs(outs, model=model, mode=m).values()) or [o]
            rows.append([model, MODE_LABEL[m], fs(finite_mean(step_s(r) for r in runs)),
                         fp(finite_mean(train_share(r) for r in runs)), fr(thr.get(m)),
                         " · ".join(fr(by_seed[m].get(s_)) for s_ in SEEDS),
                         fx(ratio(thr.get(m), thr.get("sync+"))), fx(ratio(thr.get(m), thr.get("sync"))), busy(o),
                         str(o.summary.get("aborted_stale", NA)), str(o.summary.get("aborted_redundant", NA))])
        head[model] = {m: thr.get(m) for m in thr}
    table = MdTable(["model", "mode", "step s", "train share of step", "traj/s",
                     f"traj/s at seeds {', '.join(map(str, SEEDS))}", "× Sync+", "× Sync", "GPU busy (seed 0)",
                     "stale aborts (seed 0)", "redundant aborts (seed 0)"], rows)

    abl_rows = []
    for model in BASES:
        prev = None
        base = head.get(model, {}).get("sync")
        for key, label, _, _ in ABLATION:
            t = head.get(model, {}).get(key)
            abl_rows.append([model, label, fr(t), fx(ratio(t, base)), fx(ratio(t, prev)) if prev else NA])
            prev = t

    def rng(num: str, den: str) -> str:
        vals = [(m, ratio(head.get(m, {}).get(num), head.get(m, {}).get(den))) for m in BASES]
        return " · ".join(f"{m.removeprefix('Qwen3-')} {fx(v)}" for m, v in vals)

    tokens = {model: {m: finite_mean(seed_figures(outs, token_throughput, model=model, mode=m).values())
                      for m in ("sync", "areal", "rollart")} for model in BASES}
    head["trained_tokens_per_s"] = tokens

    def by_tokens(num: str, den: str) -> str:
        return " · ".join(f"{m.removeprefix('Qwen3-')} {fx(ratio(tokens[m][num], tokens[m][den]))}" for m in BASES)

    waits = {m: wait_share(_first(outs, m, "rollart")) for m in BASES}
    head["rollart_wait_share"] = waits
    tails = {k: {m: response_tail(_first(outs, m, k)) for m in BASES} for k in ("sync", "rollart")}
    head["response_tail"] = tails
    h32 = head.get("Qwen3-32B", {})
    comparison = MdTable(["quantity", "simulated (8B · 14B · 32B)", "paper"], [
        ["throughput ROLLART ÷ AReaL", rng("rollart", "areal"), "1.22–1.36×"],
        ["throughput ROLLART ÷ Sync", rng("rollart", "sync"), "2.65–4.58×"],
        ["… the same two ratios in trained tokens/s: redundancy trains each step's shorter trajectories",
         f"÷ AReaL: {by_tokens('rollart', 'areal')}; ÷ Sync: {by_tokens('rollart', 'sync')}",
         "the paper's throughput unit is not in our notes"],
        ["32B: ROLLART ÷ Sync+", f"{fx(ratio(h32.get('rollart'), h32.get('sync+')))} throughput",
         "2.05× faster to score 0.85 (time-to-score, not throughput)"],
        ["32B: ROLLART ÷ One-off", f"{fx(ratio(h32.get('rollart'), h32.get('one-off')))} throughput",
         "1.35× faster to score 0.85 (time-to-score)"],
        ["32B: ROLLART ÷ AReaL", f"{fx(ratio(h32.get('rollart'), h32.get('areal')))} throughput",
         "1.31× faster to score 0.85 (time-to-score)"],
        ["ROLLART: trainer waiting in get_batch, share of the step",
         " · ".join(f"{m.removeprefix('Qwen3-')} {fp(w)}" for m, w in waits.items()),
         "62 % of iteration time, the main GPU idle cause (production: 3,000+ GPUs, 100B+ MoE; another workload, "
         "direction only)"],
        ["longest ÷ mean response in a trained batch (a trajectory's generated tokens): Sync, the whole batch · "
         "ROLLART, after redundancy dropped the slowest",
         " · ".join(f"{m.removeprefix('Qwen3-')} {fx(tails['sync'][m])} · {fx(tails['rollart'][m])}" for m in BASES),
         "~9× (production, another workload; direction only)"],
        ["end-to-end gain from tuning the production job", NA,
         "1.66× (production; what was tuned is not in our notes, so there is nothing to simulate)"],
    ])
    notes = [
        "Throughput is trajectories per second over the steady-state steps; step s is their mean. " + STEADY_NOTE,
        f"The modes and the ablation run at seeds {', '.join(map(str, SEEDS))} and their figures (traj/s, step s, "
        "train share, every ratio) are the means over the seeds, a ratio the ratio of the means; one seed's reading "
        "strays (" + _seed_spread(per_seed) + "). GPU busy, aborts and the other tables are seed 0's.",
        TIME_TO_SCORE_CAVEAT,
        "The base plans place no dedicated reward GPUs, so Sync and AReaL-style also send LLM-judge calls to the "
        "serverless platform (the paper's Sync had reserved reward GPUs).",
        "Incremental ablation: each stage adds to the previous one. *+ hardware-affinity routing, staleness window* is "
        "ROLLART mode with `algorithm.redundancy=0` and `weight_sync.transport=nccl_broadcast`, which differs from "
        "AReaL-style in routing by task tag and in its staleness window: groups older than n − α are evicted and their "
        "running members aborted (ROLL's GroupQueue), where AReaL bounds staleness by admission only and trains a "
        "straggler once it finishes.",
        "Env groups: the continuous modes roll out as ROLL does (`algorithm.env_groups`): the env managers form "
        "fixed env groups of one GRPO group's members, bound to the tasks by their shares, whose managers each take "
        "the env group's oldest episode still short of members or start the next one (α ahead), and a batch takes "
        "each env group's oldest finished episode, so "
        "every batch keeps the task mix. On one pool of env managers a batch is the oldest finished groups "
        "whatever their task: fast tasks fill the batches, and ROLLART's window expires the slow tasks' groups "
        "(the stale column), while AReaL-style trains them late.",
        "Response tail: per steady step, the longest response of the trained batch over the batch's mean, averaged "
        "over the steps. The task mix's per-turn response lengths are assumptions (`calibration/tasks/README.md`); "
        "their tail is what the trainer of a batch-level mode waits for and what ROLLART's redundancy cuts.",
    ] + _memory_share_note(outs) + _throughput_bound_note(outs) + _failures(outs)
    checks = [versus_range(f"throughput ROLLART ÷ {MODE_LABEL[den]}, {m}",
                           ratio(head.get(m, {}).get("rollart"), head.get(m, {}).get(den)), lo, hi, paper, fx)
              for den, lo, hi, paper in (("sync", 2.65, 4.58, "2.65–4.58×"), ("areal", 1.22, 1.36, "1.22–1.36×"))
              for m in BASES]
    return Section(table, comparison, notes,
                   extra_tables=[("Incremental ablation (throughput, × Sync and × the previous stage)",
                                  MdTable(["model", "stage", "traj/s", "× Sync", "× previous"], abl_rows)),
                                 ("The engines' memory share (`placement.generation[].gpu_memory_utilization`)",
                                  _memory_share_table(outs)),
                                 ("The continuous modes' rollout: env groups (ROLL, as shipped) or one pool of env "
                                  "managers (`algorithm.env_groups: false`, AReaL's own executor)",
                                  _pool_table(outs))],
                   headline=head, checks=checks)


def _seed_spread(per_seed: dict[str, dict[str, dict[int, float]]]) -> str:
    """ROLLART ÷ AReaL-style at each seed, per model: how far one seed's reading strays."""
    parts = []
    for model, by in per_seed.items():
        r, a = by.get("rollart", {}), by.get("areal", {})
        vals = [ratio(r[s_], a[s_]) for s_ in SEEDS if s_ in r and s_ in a]
        if vals:
            parts.append(f"{model.removeprefix('Qwen3-')} " + " · ".join(fx(v) for v in vals))
    return "ROLLART ÷ AReaL-style seed by seed: " + ", ".join(parts) if parts else "no seeds ran"


def _memory_share_note(outs: list[Outcome]) -> list[str]:
    """ROLLART ÷ AReaL-style at each memory share, where the share moves it."""
    parts = []
    for model in BASES:
        shipped = ratio(_thr(outs, model, "rollart"), _thr(outs, model, "areal"))
        for share in MEMORY_SHARES:
            at = ratio(_thr(outs, model, f"rollart@{share:g}"), _thr(outs, model, f"areal@{share:g}"))
            if math.isfinite(at) and math.isfinite(shipped) and abs(at / shipped - 1) > 0.02:
                parts.append(f"{model}: ROLLART ÷ AReaL-style {fx(shipped)} at 0.90, {fx(at)} at {share:g}")
    if not parts:
        return []
    return ["The engines' memory share: the KV cache is what a worker's share of GPU memory leaves after the weights "
            "and activations, and it holds the conversations the worker serves between their turns; once they no "
            "longer fit, each turn recomputes its whole context (the prefix-reuse columns). ROLLART's affinity map "
            "concentrates the tasks it binds to a pool on that pool's workers (`placement.hw_affinity`; the 32B plan "
            "binds SWE, the longest contexts, to the H800 workers), and routing falls back to another pool only when "
            "a worker's running requests fill it, not when its cached conversations overflow, so those workers lose "
            "their cache first: " + "; ".join(parts) + "."]


def _throughput_bound_note(outs: list[Outcome]) -> list[str]:
    """Per model, whether ROLLART and AReaL-style are trainer-bound: when both are, their ratio
    compares train steps, not the rollout-side mechanisms ROLLART adds."""
    parts = []
    for model in BASES:
        r, a = _first(outs, model, "rollart"), _first(outs, model, "areal")
        if r is None and a is None:
            continue
        part = f"{model}: ROLLART {_side(r)}, AReaL-style {_side(a)}"
        if trainer_bound(r) and trainer_bound(a):
            tokens = ratio(_tokens_per_traj(a), _tokens_per_traj(r))
            part += (f" — both, so ROLLART ÷ AReaL ({fx(ratio(throughput(r), throughput(a)))}) is then mostly the "
                     f"ratio of their train steps (AReaL-style's ÷ ROLLART's: {fx(ratio(_train_s(a), _train_s(r)))}"
                     + (f", with {fx(tokens)} the trained tokens per trajectory" if math.isfinite(tokens) else "")
                     + f"{_same_trainer([r, a])}) and rollout-side mechanisms cannot show")
        parts.append(part)
    return _bound_note(parts)


THROUGHPUT = Experiment(
    name="throughput",
    title="End-to-end throughput of the five modes on 128 GPUs, and the incremental ablation",
    setup=("Qwen3-8B, 14B and 32B; the agentic mix FrozenLake, WebShop, GEM-Math, GEM-Game (equal shares), plus SWE "
           "for Qwen3-32B only (the paper uses SWE only with 32B); GRPO batch 512 = 64 prompts × 8, α = 1, serverless "
           "reward. As the paper sets them up: ROLLART on 96 H800 + 32 H20 (64 H800 train; 32 H800 + 32 H20 serve "
           "rollout; 14B and 32B served with tp 2 and tp 4), redundancy 0.25, bucketed weight store over the 200 Gbps "
           "cross-cluster link; every baseline on 128 H800 — Sync and Sync+ colocated (training and rollout "
           "time-share all 128), One-off and AReaL-style 64 train + 64 rollout. The ablation adds ROLLART without "
           "redundancy and with blocking weight transfer. Scenarios `paper/qwen3-{8b,14b,32b}-128gpu` "
           "(`baseline_placement` gives the baselines' overrides)."),
    steps=10,
    variants=_throughput_variants(),
    analyse=_analyse_throughput,
    plot=lambda outs, path: plots.throughput(
        outs, path, BASES, MODES, MODE_LABEL, ABLATION,
        lambda o: mean_throughput(outs, model=o.variant.params["model"], mode=o.variant.params["mode"])),
    paper=("Throughput over 8B, 14B and 32B: ROLLART 1.22–1.36× AReaL and 2.65–4.58× Sync. Time to reach a score "
           "of 0.85 on Qwen3-32B: ROLLART (α = 1) 2.05× faster than Sync+, 1.35× than One-off, 1.31× than AReaL."),
)
