"""When two runs' figures differ by their draws, not by what they ran: the tie margins `rollart reproduce`
reads a winner by, and the planner ranks its seed-confirmed finalists by."""

from __future__ import annotations

import itertools
import math


def finite(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


# Two single-seed figures this close are a tie: measured over seeds 0-3 (session 37), the cost-matched
# rollout hardware's throughput varies by 2.7 % (sd) from seed to seed, and the 64 -> 128 H800 speed-ups by
# 1.2 %, so a winner by less than this is the seed's, not the hardware's or the mode's.
TIE_MARGIN = 0.03


def seed_counts(per_seed: dict[str, list[float]] | dict[str, dict[int, float]]) -> list[int]:
    """How many finite values (seeds that gave the figure) each key has, fewest first; keys with none left out.
    A key's values: a list, or a dict by seed."""
    return sorted(n for vs in per_seed.values()
                  if (n := sum(1 for v in (vs.values() if isinstance(vs, dict) else vs) if finite(v))))


def seed_margin(per_seed: dict[str, list[float]]) -> float:
    """The tie margin for means over seeds: twice the standard error of a difference of two means,
    2·s·√(1/n₁ + 1/n₂) for the two keys with the fewest seeds (the widest a pair can be), s the relative
    seed-to-seed standard deviation pooled over the keys with two or more (each key's values divided by
    their mean). At least :data:`TIE_MARGIN`·√((1/n₁ + 1/n₂)/2), the single-seed margin scaled, so
    that a few seeds that happen to agree do not make a tie vanish; :data:`TIE_MARGIN` when no key has
    two seeds to measure the spread by."""
    runs = {k: [v for v in vs if finite(v)] for k, vs in per_seed.items()}
    spread = [vs for vs in runs.values() if len(vs) >= 2 and sum(vs) > 0]
    counts = seed_counts(per_seed)
    if not spread or not counts:
        return TIE_MARGIN
    n1, n2 = counts[0], counts[1] if len(counts) > 1 else counts[0]
    dev2 = dof = 0.0
    for vs in spread:
        mean = sum(vs) / len(vs)
        dev2 += sum((v / mean - 1) ** 2 for v in vs)
        dof += len(vs) - 1
    s = math.sqrt(dev2 / dof)
    pair = 1 / n1 + 1 / n2
    return max(2 * s * math.sqrt(pair), TIE_MARGIN * math.sqrt(pair / 2))


def _paired_runs(per_seed: dict[str, dict[int, float]]) -> dict[str, dict[int, float]] | None:
    """The keys' values by seed when every key that gave any (a key that failed at every seed is out, as in
    reproduce's leaders) gave a positive finite one at the same two or more seeds, else None."""
    runs = {k: {s: v for s, v in vs.items() if finite(v)} for k, vs in per_seed.items()}
    runs = {k: vs for k, vs in runs.items() if vs}
    seeds = {frozenset(vs) for vs in runs.values()}
    if len(runs) < 2 or len(seeds) != 1 or len(next(iter(seeds))) < 2:
        return None
    return None if any(v <= 0 for vs in runs.values() for v in vs.values()) else runs


def paired_margin(per_seed: dict[str, dict[int, float]]) -> tuple[float, bool]:
    """The tie margin for means over the same seeds, and whether it compared them seed by seed. A seed
    draws each trajectory's workload (task, turns, response lengths, env latencies and failures) from
    that trajectory's own random stream (``sim/costs/env.py``), the same in every variant, so the
    seed-to-seed swing common to all variants cancels in a difference (common random numbers). Margin
    2·s_d/√n: s_d the standard deviation of the per-seed log-ratio ln(a_s/b_s), pooled over every pair of
    keys (so a far pair's spread widens a close pair's margin: conservative); n the seeds. At least
    :data:`TIE_MARGIN`/√n (the one-seed margin scaled, as :func:`seed_margin`). When the keys that gave
    values do not share the same two or more seeds (a seed failed), :func:`seed_margin`'s unpaired rule
    (False)."""
    runs = _paired_runs(per_seed)
    if runs is None:
        return seed_margin({k: list(vs.values()) for k, vs in per_seed.items()}), False
    seeds = sorted(next(iter(runs.values())))
    dev2 = dof = 0.0
    for a, b in itertools.combinations(sorted(runs), 2):
        d = [math.log(runs[a][s] / runs[b][s]) for s in seeds]
        mean = sum(d) / len(d)
        dev2 += sum((x - mean) ** 2 for x in d)
        dof += len(d) - 1
    n = len(seeds)
    return max(2 * math.sqrt(dev2 / dof) / math.sqrt(n), TIE_MARGIN / math.sqrt(n)), True
