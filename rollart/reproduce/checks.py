"""Paper checks: one paper figure beside the simulated one, with a verdict, for the report's
at-a-glance table. A like-for-like figure agrees when it lies within ``TOLERANCE`` of the paper's
value or range; a qualitative statement (a direction, an ordering) agrees or not."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

TOLERANCE = 0.15  # the fidelity bound on like-for-like figures (relative)
NA = "—"


@dataclass(frozen=True)
class Check:
    figure: str
    simulated: str
    paper: str
    agrees: bool | None            # None: the runs did not give the figure
    deviation: float | None = None  # like-for-like only: relative distance from the paper's value or range
    like_for_like: bool = True      # False: a qualitative statement (direction, ordering)
    experiment: str = ""            # filled in by the report


def finite(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def versus_range(figure: str, x: float | None, lo: float, hi: float, paper: str,
                 fmt: Callable[[float], str]) -> Check:
    """``x`` against the paper's [lo, hi]: 0 inside, else the relative distance to the nearer end."""
    if not finite(x):
        return Check(figure, NA, paper, None)
    dev = 0.0 if lo <= x <= hi else (x - hi) / hi if x > hi else (x - lo) / lo
    return Check(figure, fmt(x), paper, abs(dev) <= TOLERANCE, dev)


def versus_value(figure: str, x: float | None, target: float, paper: str, fmt: Callable[[float], str]) -> Check:
    return versus_range(figure, x, target, target, paper, fmt)


def direction(figure: str, simulated: str, paper: str, agrees: bool | None) -> Check:
    return Check(figure, simulated if agrees is not None else NA, paper, agrees, like_for_like=False)


# Two single-seed figures this close are a tie: measured over seeds 0-3 (session 37), the cost-matched
# rollout hardware's throughput varies by 2.7 % (sd) from seed to seed, and the 64 -> 128 H800 speed-ups by
# 1.2 %, so a winner by less than this is the seed's, not the hardware's or the mode's.
TIE_MARGIN = 0.03


def leaders(values: dict[str, float], margin: float = TIE_MARGIN) -> list[str]:
    """The keys whose finite value lies within ``margin`` (relative) of the largest, largest first:
    one key is a winner, more are a tie. Empty when no value is finite."""
    known = {k: v for k, v in values.items() if finite(v)}
    if not known:
        return []
    top = max(known.values())
    return sorted((k for k, v in known.items() if v >= top * (1 - margin)), key=lambda k: -known[k])


def leader_text(keys: list[str], label: Callable[[str], str], margin: float = TIE_MARGIN,
                seeds: list[int] | None = None, paired: bool = False) -> str:
    """How :func:`leaders` reads in a table: the winner's label, or the tie's labels; ``seeds``: how
    many seeds each value is the mean of (:func:`seed_counts`), None for one seed each; ``paired``:
    the margin compared the values seed by seed (:func:`paired_margin`)."""
    if len(keys) <= 1:
        return label(keys[0]) if keys else NA
    if not seeds:
        within = f"{100 * margin:.0f} % (one seed)"
    else:
        lo, hi = min(seeds), max(seeds)
        over = f"mean of {lo} seeds" if lo == hi else f"means of {lo}–{hi} seeds"
        within = f"{100 * margin:.1f} % ({over}{', compared seed by seed' if paired else ''})"
    return f"tie within {within}: " + ", ".join(label(k) for k in keys)


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
    :func:`leaders`) gave a positive finite one at the same two or more seeds, else None."""
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


def tie_rule(paired: bool) -> str:
    """How the report says which margin made a tie (:func:`paired_margin` or :func:`seed_margin`)."""
    if paired:
        return ("twice the standard error of their difference read seed by seed (a seed draws each trajectory's "
                "workload from the same random stream in every variant, so the swing common to all variants "
                f"cancels), at least {100 * TIE_MARGIN:.0f} % ÷ √seeds.")
    return "twice the standard error of a difference of two means, from the seed-to-seed spread pooled over the variants."


def verdict(c: Check) -> str:
    if c.agrees is None:
        return "not computed"
    if c.deviation is not None:
        off = f"{round(100 * c.deviation):+d} %"  # an int: never "-0 %"
        return f"✓ within ±{100 * TOLERANCE:.0f} % ({off})" if c.agrees else f"✗ off by {off}"
    return "✓ agrees" if c.agrees else "✗ disagrees"


def tally(checks: list[Check]) -> tuple[int, int, int, int]:
    """(like-for-like within the bound, like-for-like, qualitative agreeing, qualitative)."""
    values = [c for c in checks if c.like_for_like]
    dirs = [c for c in checks if not c.like_for_like]
    return sum(1 for c in values if c.agrees), len(values), sum(1 for c in dirs if c.agrees), len(dirs)


def summary_line(checks: list[Check]) -> str:
    ok, n, agree, n_dirs = tally(checks)
    return (f"{ok} of {n} like-for-like figures within ±{100 * TOLERANCE:.0f} % of the paper's; {agree} of {n_dirs} "
            "qualitative statements agree.")
