"""Paper checks: one paper figure beside the simulated one, with a verdict, for the report's
at-a-glance table. A like-for-like figure agrees when it lies within ``TOLERANCE`` of the paper's
value or range; a qualitative statement (a direction, an ordering) agrees or not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rollart.core.ties import TIE_MARGIN, finite

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
