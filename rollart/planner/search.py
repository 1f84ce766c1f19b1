"""The search: successive halving on short simulations, then full simulations of the finalists.

1. **Start**: if the space has at most ``candidates`` members, all of them, each simulated at
   full length at once (the result is the grid's optimum: a one-step rung is mostly the start-up
   transient and can rank a small space wrongly); else hand-made
   starting points (the scenario's own placement when it fits, even / single-pool splits with
   the heuristic affinity) plus seeded random candidates that use the whole budget.
2. **Rung 0** simulates each for ``min_steps`` training steps (two by default: step 0 is the
   start-up transient, with no overlap and no staleness, so one step cannot rank α or the
   trainer/rollout split; two are read whole, which understates α ≥ 1 against α = 0, but a third
   step costs a halving rung and found worse plans: see calibration/CHANGES.md, session 47); a
   local search then simulates the
   untried neighbours (one move away: GPUs between pools, tp, one tag's affinity, α, redundancy,
   reward placement) of the leaders, ``local_rounds`` times.
3. **Halving**: the best ``1/eta`` (at least ``finalists``) go on, each rung doubling the steps,
   until the last rung runs the scenario's full ``algorithm.steps``; the scenario's own placement
   (when it fits the budget) is simulated in full too, as the reference.
4. **Polish**: the winner's untried neighbours are simulated at full length, and the climb
   repeats from a better one while that improves, at most ``polish_rounds`` times (a climb that
   stops after one move can end one tp change short of the optimum).

Every simulation is deterministic (same data + seed ⇒ same result), so the winner's figures are
exactly what ``rollart simulate`` prints for the plan file written from it.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rollart.plan import apply_overrides
from rollart.planner.space import Budget, Candidate, Space
from rollart.report import plan_rates
from rollart.sweep.runner import RayPool, SerialPool

OBJECTIVES = ("throughput", "cost")


@dataclass
class Evaluation:
    candidate: Candidate
    steps: int
    record: dict[str, Any]

    @property
    def summary(self) -> dict[str, Any]:
        return self.record.get("summary") or {}

    @property
    def error(self) -> str | None:
        return self.record.get("error")


@dataclass(frozen=True)
class SeedSpread:
    """One plan's figures (:func:`~rollart.report.plan_rates`) over several seeds: the first is the
    seed ``rollart simulate`` reproduces, the rest what the same plan draws with other env latencies,
    response lengths and failures; and its dearest hour (a US$ budget must hold at every seed)."""

    seeds: tuple[int, ...]
    throughputs: tuple[float, ...]
    costs_per_1k: tuple[float | None, ...]
    usd_per_hour: float | None = None

    @classmethod
    def of(cls, evals: list[Evaluation], seeds: tuple[int, ...] = ()) -> "SeedSpread":
        """The spread of one plan's runs ``evals`` (at ``seeds``), none of them failed."""
        rates = [plan_rates(e.summary) for e in evals]
        hourly = [e.summary.get("cost_usd_per_hour") for e in evals]
        return cls(seeds, tuple(t for t, _, _ in rates), tuple(c for _, c, _ in rates),
                   None if None in hourly else max(hourly))

    @property
    def mean_throughput(self) -> float:
        return sum(self.throughputs) / len(self.throughputs)

    @property
    def mean_cost_per_1k(self) -> float | None:
        return None if any(c is None for c in self.costs_per_1k) else sum(self.costs_per_1k) / len(self.costs_per_1k)

    def evaluation(self, first: Evaluation) -> Evaluation:
        """The plan of ``first`` as one evaluation to rank: the mean throughput and cost per 1k trajectories,
        the dearest hour."""
        figs = {"settled": True, "trajectories_per_s": self.mean_throughput,
                "cost_per_1k_trajectories_usd": self.mean_cost_per_1k}
        summary = {"steady": figs, "trajectories_per_s": figs["trajectories_per_s"],
                   "cost_per_1k_trajectories_usd": figs["cost_per_1k_trajectories_usd"],
                   "cost_usd_per_hour": self.usd_per_hour}
        return Evaluation(first.candidate, first.steps, {"summary": summary})


def seed_mean(evals: list[Evaluation]) -> Evaluation:
    """One plan's runs at several seeds as one evaluation to rank (:meth:`SeedSpread.evaluation`), failed if
    any seed failed."""
    bad = next((e for e in evals if e.error or not e.summary), None)
    return bad if bad is not None else SeedSpread.of(evals).evaluation(evals[0])


# Throughputs within about this fraction of each other are one rank for the throughput objective:
# below the simulator's step-to-step spread, so the cheaper plan (per 1k trajectories) wins the tie
# rather than one that buys 0.04 % more throughput for half again the price.
THROUGHPUT_TIE = 0.01


def score(ev: Evaluation, objective: str, budget: Budget) -> tuple[float, float] | None:
    """Smaller is better; None when the run failed or broke the US$ budget (which counts the
    billed serverless time, known only after simulating). Throughput objective: (−throughput, cost per
    1k trajectories), which :func:`rank_evaluations` ranks in blocks of throughputs within
    ``THROUGHPUT_TIE`` of each block's best; cost objective: (cost, −throughput). Both past the cold
    first step where the run has at least two more (:func:`~rollart.report.plan_rates`): over a
    scenario's 4 steps that step is a third of an asynchronous plan's time and a quarter of a
    synchronous one's, which understated α ≥ 1 against α = 0 and α 2–4 against α 1 by 10–30 % on
    128 GPUs (benchmarks/planner_horizon.py)."""
    if ev.error or not ev.summary:
        return None
    sm = ev.summary
    tps, c1k, _ = plan_rates(sm)
    if tps <= 0:
        return None
    cph = sm.get("cost_usd_per_hour")
    if budget.usd_per_hour is not None and (cph is None or cph > budget.usd_per_hour * (1 + 1e-9)):
        return None
    c1k = math.inf if c1k is None else c1k
    if objective == "throughput":
        return (-tps, c1k)  # rank_evaluations ties throughputs within THROUGHPUT_TIE of a block's best
    return (c1k, -tps)


def rank_evaluations(evals: list[Evaluation], objective: str, budget: Budget,
                     tie: Callable[[Evaluation, Evaluation], float] | None = None) -> list[Evaluation]:
    """Best first, failures and over-budget runs left out. Throughput objective, in blocks: the
    best remaining throughput leads a block of every remaining plan within ``THROUGHPUT_TIE`` of it
    (throughput ≥ leader / (1 + THROUGHPUT_TIE)), ordered cheaper per 1k trajectories first (then
    throughput, then label); the next block starts from the best plan left, so every plan of a later
    block is more than ``THROUGHPUT_TIE`` below each earlier block's leader, and the tie-break holds
    at every position, not only first place (a fixed logarithmic bin would split 2.819 and 2.806
    traj/s apart and let the dearer one win). ``tie(leader, other)``: the width a pair's block takes where
    their seeds measured it (:func:`pair_tie`, the seed-confirmed finalists), else ``THROUGHPUT_TIE``. Cost
    objective: cost, then throughput."""
    scored = sorted(((s, e) for e in evals if (s := score(e, objective, budget)) is not None),
                    key=lambda se: (se[0], se[1].candidate.label()))
    if objective != "throughput":
        return [e for _, e in scored]
    out: list[tuple[tuple[float, float], Evaluation]] = []
    while scored:  # scored stays in throughput order, so its head leads the next block
        lead_s, lead = scored[0]
        block = [(s, e) for s, e in scored
                 if -s[0] >= -lead_s[0] / (1 + (tie(lead, e) if tie is not None and e is not lead else THROUGHPUT_TIE))]
        out += sorted(block, key=lambda se: (se[0][1], se[0][0], se[1].candidate.label()))
        taken = {id(e) for _, e in block}
        scored = [se for se in scored if id(se[1]) not in taken]
    return [e for _, e in out]


@dataclass
class PlanSearch:
    ranked: list[Evaluation]              # full-length simulations that fit, best first
    baseline: Evaluation | None           # the scenario's own placement (full length), if it fits
    rungs: list[tuple[int, int]]          # (steps simulated, candidates) per rung, local search included
    simulations: int
    simulated_steps: int
    wall_s: float
    objective: str
    budget: Budget
    exhaustive: bool                      # the whole space fitted in the first rung
    infeasible: list[Evaluation] = field(default_factory=list)  # full-length runs that failed or broke budget
    # the finalists re-run at further seeds: candidate -> SeedSpread (ranked by their mean, see search)
    spreads: dict[Candidate, "SeedSpread"] = field(default_factory=dict)

    @property
    def best(self) -> Evaluation | None:
        return self.ranked[0] if self.ranked else None


def best_of(results: dict[str, PlanSearch], objective: str, budget: Budget) -> str | None:
    """The key of the search whose plan ranks first when every search's finalists are ranked together, each
    read as :func:`search` ranks them (the mean over the seeds it ran at, :func:`seed_mean`; a search whose
    finalists ran at one seed offers all its full-length runs), so the objective's tie rule sees every plan at once
    (ranking the winners alone could keep a plan up to two ties' width slower). None when no search found one."""
    entries: list[tuple[str, Evaluation]] = []
    for key, r in results.items():
        confirmed = [ev for ev in r.ranked if ev.candidate in r.spreads]
        for ev in confirmed or r.ranked:
            spread = r.spreads.get(ev.candidate)
            entries.append((key, spread.evaluation(ev) if spread is not None else ev))
    spreads = {c: sp for r in results.values() for c, sp in r.spreads.items()}
    order = rank_evaluations([ev for _, ev in entries], objective, budget, spread_ties(spreads))
    return next((k for k, ev in entries if order and ev is order[0]), None)


def rung_steps(full: int, min_steps: int) -> list[int]:
    """Steps per rung: ``min_steps``, doubling, ending with ``full``."""
    s = max(1, min(min_steps, full))
    out = []
    while s < full:
        out.append(s)
        s *= 2
    return out + [full]


def search(space: Space, base: dict[str, Any], pool: RayPool | SerialPool, objective: str = "throughput",
           full_steps: int | None = None, candidates: int = 48, eta: int = 3, finalists: int = 4,
           min_steps: int = 2, local_rounds: int = 1, polish_rounds: int = 4, seed: int = 0,
           confirm_seeds: int = 2,
           on_rung: Callable[[str, int], None] | None = None, on_done: Callable[[], None] | None = None) -> PlanSearch:
    """Search ``space`` (see the module docstring). ``base`` is the scenario data the candidates
    are applied to (overrides already in it; the space's ``trainer_overrides`` are applied here);
    ``pool`` runs the simulations (entered here); ``confirm_seeds``: further seeds the ``finalists``
    best are re-run at, ranked by their mean."""
    if objective not in OBJECTIVES:
        raise ValueError(f"--objective: unknown objective '{objective}'; objectives are: {', '.join(OBJECTIVES)}")
    if space.trainer_overrides:  # a trainer layout the scenario's cannot train: every candidate takes it
        base = apply_overrides(base, space.trainer_overrides)
    t0 = time.perf_counter()
    full = full_steps or int(base["algorithm"]["steps"])
    rng = random.Random(seed)
    cache: dict[tuple[Candidate, int], Evaluation] = {}
    stats = {"sims": 0, "steps": 0}
    rung_log: list[tuple[int, int]] = []

    def rank(evals: list[Evaluation]) -> list[Evaluation]:
        return rank_evaluations([e for e in evals if space.valid(e.candidate)], objective, space.budget)

    def by_score(evals: list[Evaluation]) -> list[Evaluation]:
        """What a rung keeps and explores from: the score alone (throughput objective: faster first).
        Cheaper-first within each tie block there cut the faster plans: on tests/test_planner.py's
        successive-halving problem, seeds 0–7, it missed the grid's best by 13 % at three seeds (by
        score: at none). The tie rule orders the full-length list (rank)."""
        scored = [(s, e) for e in evals
                  if space.valid(e.candidate) and (s := score(e, objective, space.budget)) is not None]
        return [e for _, e in sorted(scored, key=lambda se: (se[0], se[1].candidate.label()))]

    seed_caches: dict[int, dict[tuple[Candidate, int], Evaluation]] = {}  # the finalists' runs at further seeds

    with pool:
        def evaluate(cands: list[Candidate], steps: int, what: str, seed: int | None = None) -> list[Evaluation]:
            store = cache if seed is None else seed_caches.setdefault(seed, {})  # None: the scenario's seed
            todo = [c for c in dict.fromkeys(cands) if (c, steps) not in store]
            if on_rung:
                on_rung(f"{what}: {len(todo)} × {steps} step{'s' if steps > 1 else ''}", len(todo))
            jobs = [(str(i), c.apply(base, steps), [], seed, None) for i, c in enumerate(todo)]
            for key, rec in pool.imap_unordered(jobs):
                c = todo[int(key)]
                store[(c, steps)] = Evaluation(c, steps, rec)
                stats["sims"] += 1
                stats["steps"] += steps
                if on_done:
                    on_done()
            if todo:
                rung_log.append((steps, len(todo)))
            return [store[(c, steps)] for c in dict.fromkeys(cands)]

        exhaustive = space.count(candidates) <= candidates
        if exhaustive:
            pop = list(space.enumerate())
        else:
            # the cost objective's best is often well inside the budget: start from smaller plans, and
            # from fewer, wider engines, too
            pop = space.structured((1.0, 0.75, 0.5), widest=True) if objective == "cost" else space.structured()
            tries = 0
            while len(pop) < candidates and tries < 20 * candidates:
                tries += 1
                c = space.random(rng, full=objective == "throughput" or rng.random() < 0.5)
                if c is not None and c not in pop:
                    pop.append(c)
        steps_list = rung_steps(full, min_steps)
        if exhaustive or len(pop) <= finalists:
            steps_list = [full]
        for r, steps in enumerate(steps_list):
            last = r == len(steps_list) - 1
            if last and space.baseline is not None and space.fits(space.baseline) and space.baseline not in pop:
                if space.valid(space.baseline):
                    pop = pop + [space.baseline]
                else:  # outside the allowed α / redundancy / reward: simulated as the reference only
                    evaluate([space.baseline], steps, "the scenario's own placement (reference)")
            evals = evaluate(pop, steps, "full simulation of the finalists" if last else f"rung {r}")
            if r == 0 and not exhaustive:
                for _ in range(local_rounds):
                    leaders = by_score(evals)[:finalists]
                    nbrs = [n for e in leaders for n in space.neighbours(e.candidate)
                            if (n, steps) not in cache]
                    if not nbrs:
                        break
                    evals = evals + evaluate(nbrs, steps, f"rung {r}, neighbours of the leaders")
                    pop = list(dict.fromkeys(pop + nbrs))
            if last:
                break
            ranked = by_score(evals)
            keep = max(finalists, math.ceil(len(ranked) / eta))
            pop = [e.candidate for e in ranked[:keep]]

        def full_runs() -> list[Evaluation]:
            """The full-length runs of the plans in ``pop`` that the user's options allow."""
            return [cache[(c, full)] for c in dict.fromkeys(pop) if (c, full) in cache and space.valid(c)]

        # Polish: hill-climb from the winner at full length (low-fidelity ranks are noisy; a
        # one-move neighbour of the winner is the likeliest thing they got wrong).
        for _ in range(polish_rounds):
            ranked = rank(full_runs())
            if not ranked:
                break
            nbrs = [n for n in space.neighbours(ranked[0].candidate) if (n, full) not in cache]
            if not nbrs:
                break
            evaluate(nbrs, full, "full simulation of the winner's neighbours")
            pop = list(dict.fromkeys(pop + nbrs))
            if rank(full_runs())[0] is ranked[0]:
                break

        finals = full_runs()
        ranked = rank(finals)
        spreads: dict[Candidate, SeedSpread] = {}
        seed0 = int(base["algorithm"].get("seed", 0))
        for again in range(2 if confirm_seeds > 0 else 0):
            if len(ranked) < 2:
                break
            lucky = ranked[0]
            ranked, spreads = _confirm(ranked, finalists, [seed0 + k for k in range(confirm_seeds + 1)], objective,
                                       space.budget, lambda cands, s: evaluate(cands, full, f"seed {s}", seed=s))
            # the best mean is not the best single draw the climb started from: climb one move from it too
            nbrs = [n for n in space.neighbours(ranked[0].candidate) if (n, full) not in cache]
            if again or ranked[0] is lucky or not nbrs:
                break
            evaluate(nbrs, full, "full simulation of the best mean's neighbours")
            pop = list(dict.fromkeys(pop + nbrs))
            finals = full_runs()
            ranked = rank(finals)

    baseline = cache.get((space.baseline, full)) if space.baseline is not None else None
    infeasible = [e for e in finals if e not in ranked]
    if not ranked and not infeasible:  # every candidate failed before the last rung: say why they did
        infeasible = [e for e in cache.values() if e.error]
    return PlanSearch(ranked=ranked, baseline=baseline, rungs=rung_log, simulations=stats["sims"],
                      simulated_steps=stats["steps"], wall_s=time.perf_counter() - t0, objective=objective,
                      budget=space.budget, exhaustive=exhaustive,
                      infeasible=infeasible, spreads=spreads)


def pair_tie(a: SeedSpread, b: SeedSpread) -> float:
    """How far apart two plans' mean throughputs can be by their draws alone: twice the standard error of their
    difference read seed by seed where they ran at the same seeds (:func:`~rollart.core.ties.paired_margin`, as
    `rollart reproduce` reads a winner: a seed draws each trajectory's workload from the same stream in every
    plan, so the common swing cancels), else of a difference of two means; at least :data:`THROUGHPUT_TIE`.
    Read per pair, so a far plan's spread does not widen a close pair's tie (helper-93: #1 ranked 1.9 % above
    #2 at 18 % more per trajectory, 0.3 % apart over 8 seeds)."""
    from rollart.core.ties import paired_margin

    if len(a.seeds) < 2 or a.seeds != b.seeds:
        return THROUGHPUT_TIE
    margin, _ = paired_margin({"a": dict(zip(a.seeds, a.throughputs)), "b": dict(zip(b.seeds, b.throughputs))})
    return max(THROUGHPUT_TIE, margin)


def spread_ties(spreads: dict[Candidate, SeedSpread]) -> Callable[[Evaluation, Evaluation], float]:
    """:func:`rank_evaluations`' pair tie for plans with seed spreads (:func:`pair_tie`), ``THROUGHPUT_TIE`` for
    any other pair."""
    def tie(a: Evaluation, b: Evaluation) -> float:
        sa, sb = spreads.get(a.candidate), spreads.get(b.candidate)
        return pair_tie(sa, sb) if sa is not None and sb is not None else THROUGHPUT_TIE
    return tie


def _confirm(ranked: list[Evaluation], finalists: int, seeds: list[int], objective: str, budget: Budget,
             run_at: Callable[[list[Candidate], int], list[Evaluation]]
             ) -> tuple[list[Evaluation], dict[Candidate, SeedSpread]]:
    """Re-run the ``finalists`` best (``ranked``: their runs at ``seeds[0]``) at the other ``seeds``
    (``run_at``) and order them by their mean over every seed (:func:`seed_mean`), the rest of ``ranked``
    after them. A search ranks a few hundred single-seed runs, whose throughput spreads ±15 % from seed
    to seed on the default scenario: the best of them is the luckiest draw as much as the best plan (a
    review: the plan printed 2.77 trajectories/s, 2.45 over six seeds and over 30 steps). A finalist
    that fails at some seed follows the ones that did not."""
    head = ranked[:finalists]
    runs = [run_at([e.candidate for e in head], s) for s in seeds[1:]]
    by_seed = [[e, *(at[i] for at in runs)] for i, e in enumerate(head)]
    means = [seed_mean(evs) for evs in by_seed]
    ran = {head[i].candidate: SeedSpread.of(evs, tuple(seeds)) for i, evs in enumerate(by_seed)
           if not means[i].error and means[i].summary}  # a finalist that failed at a seed ranks on no mean
    order = {id(m): n for n, m in enumerate(rank_evaluations(means, objective, budget, spread_ties(ran)))}
    kept = sorted(range(len(head)), key=lambda i: order.get(id(means[i]), len(head) + i))
    spreads = {}
    for i in kept:
        if id(means[i]) in order:
            spreads[head[i].candidate] = SeedSpread.of(by_seed[i], tuple(seeds))
    return [head[i] for i in kept] + ranked[finalists:], spreads


def grid_ranked(space: Space, base: dict[str, Any], pool: RayPool | SerialPool, objective: str = "throughput",
                full_steps: int | None = None) -> tuple[list[Evaluation], int]:
    """Brute force: simulate every candidate at full length; the feasible ones best first (ties by
    label) and how many ran."""
    full = full_steps or int(base["algorithm"]["steps"])
    cands = list(space.enumerate())
    evals = []
    with pool:
        jobs = [(str(i), c.apply(base, full), [], None, None) for i, c in enumerate(cands)]
        for key, rec in pool.imap_unordered(jobs):
            evals.append(Evaluation(cands[int(key)], full, rec))
    return rank_evaluations(evals, objective, space.budget), len(cands)


def grid_optimum(space: Space, base: dict[str, Any], pool: RayPool | SerialPool, objective: str = "throughput",
                 full_steps: int | None = None) -> tuple[Evaluation | None, int]:
    """Brute force: the best of ``grid_ranked`` and how many ran."""
    ranked, n = grid_ranked(space, base, pool, objective, full_steps)
    return (ranked[0] if ranked else None), n
