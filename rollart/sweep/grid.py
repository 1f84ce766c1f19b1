"""``--grid PATH=v1,v2,...`` parsing, the cross product, and Latin-hypercube samples.

Each value is the text after ``PATH=`` of a ``--set`` override, so it is parsed exactly like
``--set`` (YAML): ``--grid algorithm.alpha=0,1,2``, ``--grid placement.reward={where: serverless},
{where: dedicated, pool: h20, gpus: 4}``. Commas inside ``[]``, ``{}`` or quotes do not split.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any, Iterable

from rollart.plan.loader import PlanError, parse_override


@dataclass(frozen=True)
class GridDim:
    path: str                 # dotted --set path
    raw: tuple[str, ...]      # value texts as written
    values: tuple[Any, ...]   # YAML-parsed values

    def override(self, i: int) -> str:
        return f"{self.path}={self.raw[i]}"


@dataclass(frozen=True)
class Point:
    """One sweep point: the override per grid dimension (in dimension order)."""

    overrides: tuple[str, ...]
    values: tuple[Any, ...]

    def as_dict(self, dims: list[GridDim]) -> dict[str, Any]:
        return {d.path: v for d, v in zip(dims, self.values)}


def split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets, braces and quotes."""
    parts, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def parse_grid(specs: Iterable[str]) -> list[GridDim]:
    """``["a.b=1,2", ...]`` → dimensions; problems raise :class:`PlanError` naming ``--grid``."""
    dims: list[GridDim] = []
    problems: list[str] = []
    for spec in specs:
        if "=" not in spec:
            problems.append(f"--grid {spec}: expected PATH=v1,v2,..., e.g. algorithm.alpha=0,1,2")
            continue
        key, _, rest = spec.partition("=")
        key = key.strip()
        raws = split_top_level(rest)
        if not key or any(r == "" for r in raws):
            problems.append(f"--grid {spec}: empty path or value (values are comma-separated YAML)")
            continue
        if any(d.path == key for d in dims):
            problems.append(f"--grid {key}: given twice; list every value in one --grid")
            continue
        values = []
        for r in raws:
            try:
                values.append(parse_override(f"{key}={r}")[1])
            except PlanError as exc:
                problems.extend(line.replace("--set", "--grid", 1) for line in exc.problems)
        seen = [json.dumps(v, sort_keys=True, default=str) for v in values]
        if len(set(seen)) != len(seen):
            problems.append(f"--grid {key}: a value is listed twice")
        dims.append(GridDim(key, tuple(raws), tuple(values)))
    if problems:
        raise PlanError(problems)
    return dims


def grid_points(dims: list[GridDim]) -> list[Point]:
    """The cross product, first dimension slowest."""
    if not dims:
        return [Point((), ())]
    out = []
    for idx in itertools.product(*(range(len(d.values)) for d in dims)):
        out.append(Point(tuple(d.override(i) for d, i in zip(dims, idx)),
                         tuple(d.values[i] for d, i in zip(dims, idx))))
    return out


def lhs_indices(sizes: list[int], n: int, seed: int) -> list[tuple[int, ...]]:
    """``n`` Latin-hypercube draws over discrete levels: each dimension's unit interval is cut
    into ``n`` strata (one sample each) and a stratum maps to level ``floor(u × size)``, so every
    level of a dimension appears ``n / size`` times (±1)."""
    import numpy as np
    from scipy.stats import qmc

    if not sizes:
        return [()] * min(n, 1)
    try:
        sampler = qmc.LatinHypercube(d=len(sizes), rng=np.random.default_rng(seed))
    except TypeError:  # scipy < 1.15 names it seed
        sampler = qmc.LatinHypercube(d=len(sizes), seed=seed)
    u = sampler.random(n)
    return [tuple(min(int(x * s), s - 1) for x, s in zip(row, sizes)) for row in u]


def lhs_points(dims: list[GridDim], n: int, seed: int = 0) -> list[Point]:
    """``n`` Latin-hypercube samples over the dimensions' value lists (duplicates dropped, so
    fewer than ``n`` come back when the grid has fewer than ``n`` distinct points)."""
    out, seen = [], set()
    for idx in lhs_indices([len(d.values) for d in dims], n, seed):
        if idx in seen:
            continue
        seen.add(idx)
        out.append(Point(tuple(d.override(i) for d, i in zip(dims, idx)),
                         tuple(d.values[i] for d, i in zip(dims, idx))))
    return out
