"""Fuzzing the whole plan schema: a mutated scenario is either refused with one line per
problem that names the field (the CLI prints it and exits 2), or simulated to a finite,
self-consistent result. Nothing else: no traceback, no hang, no ``Infinity`` in the JSON.

Every leaf of two full plans (the embedded default and ``local/digits``, dumped with their
defaults, so ``prices``, ``runtime``, ``weight_sync``… are all there) is a mutation target;
a mutation puts a hostile value there (non-finite, huge, tiny, negative, the wrong type), swaps
a distribution for another kind with random parameters, adds a misspelt field, or removes a
field. ``scripts/fuzz_schema.py N`` runs N cases and prints the outcome counts."""

from __future__ import annotations

import json
import math
import os
import re
import signal
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollart.plan import PlanError, load_plan, plan_from_dict
from rollart.scenarios_catalog import resolve

# Simulations in the fuzz stay short: a plan estimated above this many generation requests is
# refused (as the schema refuses one above ROLLART_MAX_SIM_REQUESTS), and one case may take at
# most CASE_TIMEOUT_S of wall time before it counts as a hang.
FUZZ_MAX_SIM_REQUESTS = 3000
CASE_TIMEOUT_S = 60
BASES = ("default", "local/digits")
# A problem line is "<field.path>: what is wrong" (or "--set <path>: ..." from an override).
FIELD_LINE = re.compile(r"^(--set )?[A-Za-z_][^\s:]*( [^:]*)?: \S")
DIST_KINDS = ("constant", "lognormal", "gaussian", "uniform", "pareto", "empirical", "mixture", "spliced")


def _base(name: str) -> dict[str, Any]:
    plan = load_plan(resolve(name), ["algorithm.steps=2"])
    return plan.model_dump(by_alias=True)


_BASE_DATA: dict[str, dict[str, Any]] = {}


def base_data(name: str) -> dict[str, Any]:
    if name not in _BASE_DATA:
        _BASE_DATA[name] = _base(name)
    return _BASE_DATA[name]


def leaf_paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a leaf or a section (sections can be replaced or removed too)."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(leaf_paths(v, prefix + (k,)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(leaf_paths(v, prefix + (i,)))
    return out


# ---------------------------------------------------------------- values

FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, -1.0, 1e-300, 5e-324, 1e-9, 0.5, 1.0, 1.5, 3.0, 1e6, 1e12, 1e100, 1e308,
                     math.inf, -math.inf, math.nan]),
    st.floats(min_value=0, max_value=100),
)
INTS = st.one_of(st.integers(-3, 40), st.sampled_from([0, -1, 2**31, 2**63, 10**6, 10**9, 10**18, 10**30]),
                 st.integers(-(2**70), 2**70))
# fresh containers each draw (builds): a mutation must never edit a value another case shares
JUNK = st.one_of(st.none(), st.booleans(), st.text(max_size=8), st.builds(list), st.builds(dict),
                 st.builds(lambda: [1, 2]), st.builds(lambda: {"kind": "bogus"}), st.just("1e-3"), st.just(".inf"))


def numbers() -> st.SearchStrategy:
    return st.one_of(FLOATS, INTS)


@st.composite
def distributions(draw: Callable, depth: int = 0) -> dict[str, Any]:
    kind = draw(st.sampled_from(DIST_KINDS if depth < 2 else DIST_KINDS[:-2]))
    n = numbers
    if kind == "constant":
        return {"kind": kind, "value": draw(n())}
    if kind == "lognormal":
        d = {"kind": kind, "median": draw(n()), "sigma": draw(n())}
    elif kind == "gaussian":
        d = {"kind": kind, "mean": draw(n()), "std": draw(n()), "min": draw(n())}
    elif kind == "uniform":
        d = {"kind": kind, "low": draw(n()), "high": draw(n())}
    elif kind == "pareto":
        d = {"kind": kind, "scale": draw(n()), "shape": draw(n())}
    elif kind == "empirical":
        ps = sorted(set(draw(st.lists(st.floats(0, 1), max_size=4))) | {0.0, 1.0})
        vals = sorted(draw(st.lists(n(), min_size=len(ps), max_size=len(ps))), key=lambda v: (v != v, v))
        return {"kind": kind, "quantiles": dict(zip(ps, vals))}
    elif kind == "mixture":
        comps = draw(st.lists(st.builds(lambda w, dist: {"weight": w, "dist": dist}, n(),
                                        distributions(depth + 1)), min_size=1, max_size=3))
        return {"kind": kind, "components": comps}
    else:
        d = {"kind": kind, "median": draw(n()), "sigma": draw(n()), "threshold": draw(n()),
             "tail_prob": draw(st.one_of(st.floats(0, 1), n())), "tail_shape": draw(n()), "tail_scale": draw(n())}
    if kind in ("lognormal", "pareto", "spliced") and draw(st.booleans()):
        d["max"] = draw(n())
    return d


def value_for(draw: Callable, old: Any) -> Any:
    """A hostile replacement, mostly of the old value's type."""
    if isinstance(old, dict) and "kind" in old:
        return draw(st.one_of(distributions(), numbers(), JUNK))
    if isinstance(old, bool):
        return draw(st.one_of(st.booleans(), JUNK))
    if isinstance(old, int):
        return draw(st.one_of(INTS, INTS, FLOATS, JUNK))
    if isinstance(old, float):
        return draw(st.one_of(FLOATS, FLOATS, INTS, JUNK))
    if isinstance(old, str):
        return draw(st.one_of(st.sampled_from(["h800", "h20", "pool_a", "pool_b", "env", "H800", "cpu", "Qwen3-tiny",
                                               "sync", "areal", "nocpu", ""]), st.text(max_size=6), JUNK))
    return draw(st.one_of(numbers(), JUNK, distributions()))


def _set(data: Any, path: tuple, value: Any) -> None:
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _remove(data: Any, path: tuple) -> None:
    node = data
    for key in path[:-1]:
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    elif len(node) > 1:
        node.pop(path[-1])


def _get(data: Any, path: tuple) -> Any:
    node = data
    for key in path:
        node = node[key]
    return node


@st.composite
def mutated_plans(draw: Callable) -> tuple[str, dict[str, Any], list[str]]:
    """(base name, mutated data, what was done) — one to three mutations."""
    import copy

    name = draw(st.sampled_from(BASES))
    data = copy.deepcopy(base_data(name))
    done = []
    for _ in range(draw(st.integers(1, 3))):
        paths = leaf_paths(data)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["value", "value", "value", "scale", "scale", "remove", "typo"]))
        try:
            old = _get(data, path)
        except (KeyError, IndexError, TypeError):
            continue
        if action == "remove":
            _remove(data, path)
        elif action == "scale" and isinstance(old, (int, float)) and not isinstance(old, bool):
            # a plausible what-if: the same field, 0.1× to 10× (ints stay ints)
            factor = draw(st.sampled_from([0.1, 0.5, 2, 3, 10]))
            _set(data, path, type(old)(old * factor) if isinstance(old, int) else old * factor)
        elif action == "typo" and isinstance(old, dict):
            old[draw(st.sampled_from(["alpah", "sigam", "cout", "medain", "share_", "x"]))] = 1
        else:
            _set(data, path, value_for(draw, old))
        done.append(f"{action} {'.'.join(map(str, path))}")
    return name, data, done


# ---------------------------------------------------------------- one case


class Hang(Exception):
    pass


@contextmanager
def wall_limit(seconds: int) -> Iterator[None]:
    def on_alarm(signum: int, frame: Any) -> None:  # noqa: ARG001
        raise Hang(f"no result within {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _finite(x: Any) -> bool:
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    if isinstance(x, list):
        return all(_finite(v) for v in x)
    return True


def consistency_problems(result: Any, plan: Any) -> list[str]:
    """What is wrong with a finished simulation's result (empty: finite and self-consistent)."""
    d = result.to_dict()
    out = []
    try:
        json.dumps(d, allow_nan=False)
    except ValueError:
        out.append("the JSON has a non-finite number")
    if not _finite(d):
        out.append("non-finite value in the result")
    sm, steps = d["summary"], d["steps"]
    if sm["steps_done"] != len(steps):
        out.append(f"summary.steps_done {sm['steps_done']} != {len(steps)} steps")
    if result.error is None and len(steps) != plan.algorithm.steps:
        out.append(f"no error but {len(steps)} of {plan.algorithm.steps} steps")
    trained = sum(s["trajectories"] for s in steps)
    used = sm["trajectories"]["used"]
    # "used" counts trajectories taken by a batch; a run stopped early may hold one batch it
    # took but did not finish training on
    if not (trained <= used <= trained + plan.algorithm.batch_size) or (result.error is None and used != trained):
        out.append(f"summary.trajectories.used {used} vs {trained} trained in the steps")
    for s in steps:
        if s["time_s"] < 0 or s["end_s"] < s["start_s"] or s["trajectories"] < 0:
            out.append(f"step {s['step']}: negative time or count")
        if any(v < -1e-9 for v in s["breakdown_s"].values()):
            out.append(f"step {s['step']}: negative breakdown")
    return out


def run_case(data: dict[str, Any]) -> tuple[str, str]:
    """('refused' | 'simulated' | 'stopped', detail) or a failure outcome:
    ('bad-error' | 'traceback' | 'hang' | 'invalid-output', detail)."""
    import traceback

    from rollart.core.modes import mode_config
    from rollart.sim import simulate_plan

    old_limit = os.environ.get("ROLLART_MAX_SIM_REQUESTS")
    os.environ["ROLLART_MAX_SIM_REQUESTS"] = str(FUZZ_MAX_SIM_REQUESTS)
    try:
        with wall_limit(CASE_TIMEOUT_S):
            try:
                plan = plan_from_dict(data)
            except PlanError as exc:
                bad = [ln for ln in exc.problems if "\n" in ln or not FIELD_LINE.match(ln)]
                return ("bad-error", bad[0]) if bad or not exc.problems else ("refused", exc.problems[0])
            try:
                outcome = simulate_plan(plan, mode_config(plan, None), plan.algorithm.seed, None)
                result = outcome.to_result()
            except PlanError as exc:
                bad = [ln for ln in exc.problems if "\n" in ln or not FIELD_LINE.match(ln)]
                return ("bad-error", bad[0]) if bad or not exc.problems else ("refused", exc.problems[0])
            problems = consistency_problems(result, plan)
            if problems:
                return "invalid-output", "; ".join(problems)
            return ("stopped", result.error) if result.error else ("simulated", "")
    except Hang as exc:
        return "hang", str(exc)
    except Exception as exc:  # noqa: BLE001 - every other exception is what the fuzz looks for
        return "traceback", f"{type(exc).__name__}: {exc} @ {traceback.format_exc().splitlines()[-3].strip()}"
    finally:
        if old_limit is None:
            os.environ.pop("ROLLART_MAX_SIM_REQUESTS", None)
        else:
            os.environ["ROLLART_MAX_SIM_REQUESTS"] = old_limit


GOOD = ("refused", "simulated", "stopped")


# ---------------------------------------------------------------- the test


@settings(max_examples=int(os.environ.get("ROLLART_FUZZ_EXAMPLES", "200")), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_plans())
def test_mutated_plan_is_refused_by_field_or_simulates_finitely(case: tuple[str, dict[str, Any], list[str]]):
    name, data, done = case
    outcome, detail = run_case(data)
    assert outcome in GOOD, f"{name} after {done}: {outcome}: {detail}"


@pytest.mark.parametrize("override, needle", [
    ("tasks.FrozenLake.env.pool=nocpu", "tasks.FrozenLake.env.pool"),
    ("tasks.GEM-Math.response_tokens=.inf", "tasks.GEM-Math.response_tokens"),
    ("tasks.CodeExec.env.step.sigma=1000", "tasks.CodeExec.env.step.sigma"),
    ("tasks.FrozenLake.env.step={kind: pareto, scale: 1, shape: 1e-9}", "tasks.FrozenLake.env.step.shape"),
    ("prices.gpu_usd_per_hour.H800=.inf", "prices.gpu_usd_per_hour.H800"),
    ("algorithm.batch_size=1000000", "algorithm"),
    ("algorithm.redundancy=1000000", "algorithm.redundancy"),
    ("weight_sync.bucket_mb=1e-300", "weight_sync.bucket_mb"),
    ("algorithm.alpha=1000000", "algorithm.alpha"),
])
def test_issue_reproducers_on_default_are_field_errors(override: str, needle: str):
    from rollart.scenarios_catalog import default_scenario

    with pytest.raises(PlanError) as err:
        load_plan(default_scenario(), [override])
    (line,) = err.value.problems
    assert line.startswith(needle) and FIELD_LINE.match(line), line


def test_issue_reproducers_on_digits_are_field_errors():
    for override, needle in (("tasks.Digits.prompt_tokens=1e308", "tasks.Digits.prompt_tokens"),
                             ("algorithm.alpha=1000000", "algorithm.alpha")):
        with pytest.raises(PlanError) as err:
            load_plan(resolve("local/digits"), [override])
        assert err.value.problems[0].startswith(needle + ":"), err.value.problems


@pytest.mark.parametrize("dist", [
    {"kind": "lognormal", "median": 1e300, "sigma": 10},
    {"kind": "pareto", "scale": 1e-300, "shape": 0.01},
    {"kind": "pareto", "scale": 1e300, "shape": 1000, "max": 1e308},
    {"kind": "gaussian", "mean": 1e308, "std": 1e308},
    {"kind": "uniform", "low": 0, "high": 1.7e308},
    {"kind": "spliced", "median": 1, "sigma": 10, "threshold": 1e300, "tail_prob": 0.9, "tail_shape": 0.999,
     "tail_scale": 1e300},
    {"kind": "spliced", "median": 1, "sigma": 0.5, "threshold": 2, "tail_prob": 0.5, "tail_shape": 1e-300,
     "tail_scale": 1e10},
    {"kind": "mixture", "components": [{"weight": 1e9, "dist": {"kind": "constant", "value": 1.7e308}},
                                       {"weight": 1e9, "dist": {"kind": "pareto", "scale": 1, "shape": 0.01}}]},
])
def test_every_admitted_distribution_draws_finite_values(dist: dict[str, Any]):
    import numpy as np
    from pydantic import TypeAdapter

    from rollart.plan.distributions import SAMPLE_MAX, Distribution

    d = TypeAdapter(Distribution).validate_python(dist)
    rng = np.random.default_rng(0)
    draws = [d.sample(rng) for _ in range(2000)]
    assert all(0 <= x <= SAMPLE_MAX for x in draws)
    m = d.mean()
    assert not math.isnan(m)


@pytest.mark.parametrize("pool", ["x\ny", "a\x1eb", "c\rd"])
def test_a_users_string_never_splits_an_error_line(pool: str):
    from rollart.scenarios_catalog import default_scenario

    data = load_plan(default_scenario()).model_dump(by_alias=True)
    data["placement"]["hw_affinity"]["FrozenLake"] = pool
    with pytest.raises(PlanError) as err:
        plan_from_dict(data)
    (line,) = err.value.problems
    assert line.startswith("placement.hw_affinity.FrozenLake: unknown pool") and "\n" not in line and "\r" not in line
