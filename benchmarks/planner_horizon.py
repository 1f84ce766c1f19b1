"""How well a short simulation predicts a long run: the whole run's rate against the rate past the
cold first step (what ``rollart simulate``'s *steady state*, ``compare``, ``sweep``, ``plan`` and
``reproduce`` use), and past the 1 + α pipeline-fill steps (``reproduce``'s rule until session 48).

Two regimes, measured in one run:

* **paper scale** (``paper/qwen3-14b-128gpu``, batch 512, 128 GPUs): α ∈ {0, 1, 2, 4} ×
  redundancy ∈ {0, 0.25}, each simulated ``--long`` steps; the truth is the rate over its second
  half. Printed: each estimator's largest error over the 8 plans at ``--short`` steps.
* **a small space** (the default scenario at batch 16, 12 GPUs: 208 plans the planner's tests
  enumerate), each simulated ``--long`` steps. Printed: for each estimator at ``--short`` steps,
  the truth of the plan it ranks first, the mean of its top 10 (shortfall from the true best), the
  Spearman correlation with the truth, and how often it orders the α 1 and α 2 versions of the same
  placement as the truth does (pairs more than 3 % apart).

And, only when named, **reproduce's comparisons** (``--only modes``): the throughput experiment's
Sync, AReaL-style and ROLLART plans of Qwen3-8B/14B/32B at seeds 0 and 1. Printed: each estimator's
error on a run's rate and on ROLLART ÷ AReaL-style and ÷ Sync, and the long runs' ratios.

    python benchmarks/planner_horizon.py            # ~6 min on 2 cores
    python benchmarks/planner_horizon.py --only modes --short 10 --long 24   # ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from scipy.stats import spearmanr

from rollart.core.stats import START_UP_STEPS
from rollart.plan import apply_overrides, load_plan, read_yaml
from rollart.planner import Budget, Space
from rollart.scenarios_catalog import default_scenario, resolve
from rollart.sweep.runner import ProcessPool

Steps = list[dict]  # a sweep record's steps: {"step", "time_s", "trajectories"}


def rate(steps: Steps, lo: int, hi: int) -> float:
    window = steps[lo:hi]
    return sum(s["trajectories"] for s in window) / sum(s["time_s"] for s in window)


def estimators(short: int) -> dict[str, Callable[[Steps, int], float]]:
    return {
        "whole run": lambda st, a: rate(st, 0, short),
        "past the first step": lambda st, a: rate(st, START_UP_STEPS, short),
        # the rule reproduce used until session 48: also skip the 1 + α batches admitted at version 0
        "past the 1 + α fill": lambda st, a: rate(st, min(1 + a, short - 1), short),
    }


def _simulate(jobs: list[tuple[str, dict]], workers: int) -> dict[str, Steps]:
    out: dict[str, Steps] = {}
    with ProcessPool(workers) as pool:
        for key, rec in pool.imap_unordered([(k, d, [], None, None) for k, d in jobs]):
            if rec.get("error"):
                raise SystemExit(f"{key}: {rec['error']}")
            out[key] = rec["steps"]
    return out


def paper_scale(short: int, long: int, workers: int) -> None:
    base = read_yaml(resolve("paper/qwen3-14b-128gpu"))
    points = [(a, r) for a in (0, 1, 2, 4) for r in (0.0, 0.25)]
    jobs = [(f"{a}/{r}", apply_overrides(base, [f"algorithm.alpha={a}", f"algorithm.redundancy={r}",
                                                f"algorithm.steps={long}"])) for a, r in points]
    runs = _simulate(jobs, workers)
    print(f"paper/qwen3-14b-128gpu, 8 plans (α 0/1/2/4 × redundancy 0/0.25); truth: steps {long // 2}–{long - 1}")
    truth = {k: rate(st, long // 2, long) for k, st in runs.items()}
    for name, f in estimators(short).items():
        errs = {k: f(st, int(k.split("/")[0])) / truth[k] - 1 for k, st in runs.items()}
        worst = max(errs, key=lambda k: abs(errs[k]))
        by_alpha = " · ".join(f"α{a} {min(v for k, v in errs.items() if k.startswith(f'{a}/')):+.0%}…"
                              f"{max(v for k, v in errs.items() if k.startswith(f'{a}/')):+.0%}" for a in (0, 1, 2, 4))
        print(f"  {name:>20} at {short} steps: largest error {errs[worst]:+.1%} (α {worst.split('/')[0]}) · {by_alpha}")


def small_space(short: int, long: int, workers: int) -> None:
    overrides = ["algorithm.batch_size=16"]
    base = apply_overrides(read_yaml(default_scenario()), overrides)
    plan = load_plan(default_scenario(), overrides)
    space = Space.from_plan(plan, Budget(gpus=12), step=4, tps=[1, 2], alphas=[1, 2], redundancies=[0.0, 0.25],
                            reward_gpus=[2])
    cands = list(space.enumerate())
    runs = _simulate([(str(i), c.apply(base, long)) for i, c in enumerate(cands)], workers)
    steps = [runs[str(i)] for i in range(len(cands))]
    truth = [rate(st, long // 2, long) for st in steps]
    best = max(truth)
    pairs: dict[tuple, dict[int, int]] = {}
    for i, c in enumerate(cands):
        pairs.setdefault((c.trainer_gpus, c.gen, c.affinity, c.redundancy, c.reward), {})[c.alpha] = i
    pairs_apart = [(d[1], d[2]) for d in pairs.values() if 1 in d and 2 in d and abs(truth[d[2]] / truth[d[1]] - 1) > 0.03]
    print(f"the default scenario at batch 16, {len(cands)} plans on 12 GPUs; truth: steps {long // 2}–{long - 1} "
          f"(best {best:.3f} trajectories/s)")
    for name, f in estimators(short).items():
        score = [f(st, c.alpha) for st, c in zip(steps, cands)]
        order = sorted(range(len(cands)), key=lambda i: -score[i])
        right = sum((score[j] > score[i]) == (truth[j] > truth[i]) for i, j in pairs_apart)
        print(f"  {name:>20} at {short} steps: #1 {1 - truth[order[0]] / best:.1%} short · top 10 "
              f"{sum(1 - truth[i] / best for i in order[:10]) / 10:.1%} short · Spearman "
              f"{spearmanr(score, truth).statistic:.3f} · α 1 vs 2 ordered right {right}/{len(pairs_apart)}")


def modes(short: int, long: int, workers: int) -> None:
    """The ``reproduce`` throughput experiment's comparisons (ROLLART against AReaL-style and Sync, each
    on its own placement as the paper sets it up), read off ``short`` of ``long`` steps."""
    from rollart.reproduce.experiments.common import BASES
    from rollart.reproduce.experiments.throughput import baseline_placement

    keys = [(m, mode, seed) for m in BASES for mode in ("sync", "areal", "rollart") for seed in (0, 1)]
    runs = _simulate([("|".join(map(str, k)), apply_overrides(read_yaml(resolve(BASES[k[0]])), [
        *baseline_placement(k[0], k[1]), f"algorithm.mode={k[1]}", f"algorithm.seed={k[2]}",
        f"algorithm.steps={long}"])) for k in keys], workers)
    truth = {k: rate(st, long // 2, long) for k, st in runs.items()}
    print(f"the reproduce throughput plans (Qwen3-8B/14B/32B × Sync, AReaL-style, ROLLART × seeds 0, 1); "
          f"truth: steps {long // 2}–{long - 1}")
    def ratio(rates: dict[str, float], m: str, d: str, s: int) -> float:  # ROLLART ÷ mode d, model m, seed s
        return rates[f"{m}|rollart|{s}"] / rates[f"{m}|{d}|{s}"]

    for name, f in estimators(short).items():
        read = {k: f(st, 0 if "|sync|" in k else 1) for k, st in runs.items()}
        run_err = [abs(read[k] / truth[k] - 1) for k in runs]
        ratio_err = [abs(ratio(read, m, d, s) / ratio(truth, m, d, s) - 1)
                     for m in BASES for d in ("areal", "sync") for s in (0, 1)]
        print(f"  {name:>20} at {short} steps: a run's rate off by {sum(run_err) / len(run_err):.1%} on average "
              f"(worst {max(run_err):.1%}) · ROLLART ÷ AReaL-style and ÷ Sync off by "
              f"{sum(ratio_err) / len(ratio_err):.1%} on average (worst {max(ratio_err):.1%})")
    for m in BASES:
        print(f"  {m} truth: ROLLART ÷ AReaL-style "
              + " · ".join(f"{truth[f'{m}|rollart|{s}'] / truth[f'{m}|areal|{s}']:.2f}" for s in (0, 1))
              + ", ÷ Sync " + " · ".join(f"{truth[f'{m}|rollart|{s}'] / truth[f'{m}|sync|{s}']:.2f}" for s in (0, 1)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", type=int, default=4, help="steps of the short runs (the paper scenarios' 4)")
    ap.add_argument("--long", type=int, default=16, help="steps of the long runs (the truth: their second half)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", choices=("paper", "small", "modes"),
                    help="one regime; 'modes' (reproduce's throughput plans, ~10 min on 2 cores) runs only when named, "
                         "as --only modes --short 10 --long 24")
    a = ap.parse_args(argv)
    if a.short < 3 or a.long < 2 * a.short:
        ap.error("need --short ≥ 3 and --long ≥ 2 × --short (the truth is the long run's second half)")
    if a.only == "modes":
        modes(a.short, a.long, a.workers)
        return 0
    if a.only != "small":
        paper_scale(a.short, a.long, a.workers)
    if a.only != "paper":
        small_space(a.short, max(a.long, 48), a.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
