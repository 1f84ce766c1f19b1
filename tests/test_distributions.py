"""Distributions: sample statistics match ``.mean()``, samples are never negative, caps hold,
seeding is reproducible, and YAML shorthand (a bare number) becomes a Constant."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from rollart.plan import load_plan, plan_from_dict, read_yaml
from rollart.plan.distributions import (
    Component,
    Constant,
    Distribution,
    Empirical,
    Gaussian,
    LogNormal,
    Mixture,
    Pareto,
    Uniform,
    coerce_distribution,
)
from rollart.scenarios_catalog import default_scenario

N = 20_000
DIST = TypeAdapter(Distribution)


def draws(dist, n: int = N, seed: int = 12345) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([dist.sample(rng) for _ in range(n)], dtype=float)


def parse(data) -> object:
    return DIST.validate_python(data)


# Distributions whose .mean() is exact for the sampler, with a relative tolerance on the
# mean of N draws (a few standard errors; pareto's tail is capped far out).
CASES = {
    "constant": (parse({"kind": "constant", "value": 3.5}), 1e-12),
    "lognormal": (parse({"kind": "lognormal", "median": 2.0, "sigma": 0.5}), 0.02),
    "lognormal-capped-far": (parse({"kind": "lognormal", "median": 100, "sigma": 0.4, "max": 1e6}), 0.02),
    "gaussian": (parse({"kind": "gaussian", "mean": 10.0, "std": 2.0}), 0.01),
    "uniform": (parse({"kind": "uniform", "low": 2, "high": 6}), 0.01),
    "pareto": (parse({"kind": "pareto", "scale": 1.0, "shape": 3.0, "max": 1e4}), 0.03),
    "empirical": (parse({"kind": "empirical", "quantiles": {0: 1, 0.5: 2, 0.9: 5, 1: 20}}), 0.02),
    "mixture": (parse({"kind": "mixture", "components": [
        {"weight": 3, "dist": {"kind": "uniform", "low": 0, "high": 2}},
        {"weight": 1, "dist": {"kind": "lognormal", "median": 10, "sigma": 0.3}},
    ]}), 0.02),
}


def test_every_kind_is_covered():
    kinds = {dist.kind for dist, _ in CASES.values()}
    assert kinds == {"constant", "lognormal", "gaussian", "uniform", "pareto", "empirical", "mixture"}


def test_parsed_kinds_are_the_right_classes():
    expected = {"constant": Constant, "lognormal": LogNormal, "gaussian": Gaussian, "uniform": Uniform,
                "pareto": Pareto, "empirical": Empirical, "mixture": Mixture}
    for dist, _ in CASES.values():
        assert type(dist) is expected[dist.kind]


@pytest.mark.parametrize("name", list(CASES))
def test_sample_mean_matches_mean(name: str):
    dist, rel = CASES[name]
    xs = draws(dist)
    assert math.isfinite(dist.mean())
    assert xs.mean() == pytest.approx(dist.mean(), rel=rel, abs=1e-12)


def test_known_means():
    assert CASES["constant"][0].mean() == 3.5
    assert CASES["lognormal"][0].mean() == pytest.approx(2.0 * math.exp(0.125))
    assert CASES["gaussian"][0].mean() == pytest.approx(10.0, rel=1e-6)  # floored at 0, 5σ away
    assert CASES["uniform"][0].mean() == 4.0
    assert CASES["pareto"][0].mean() == pytest.approx(1.5)
    # trapezoids: 0.5*(1+2)/2 + 0.4*(2+5)/2 + 0.1*(5+20)/2
    assert CASES["empirical"][0].mean() == pytest.approx(0.75 + 1.4 + 1.25)
    assert CASES["mixture"][0].mean() == pytest.approx((3 * 1.0 + 1 * 10 * math.exp(0.045)) / 4)


def test_pareto_median_heavy_tail():
    # shape <= 2 has infinite variance: compare the median, scale * 2**(1/shape).
    dist = Pareto(scale=20.0, shape=1.5)
    xs = draws(dist)
    assert float(np.median(xs)) == pytest.approx(20.0 * 2 ** (1 / 1.5), rel=0.03)
    assert xs.min() >= 20.0


def test_pareto_infinite_mean():
    assert Pareto(scale=1.0, shape=1.0).mean() == math.inf
    assert Pareto(scale=1.0, shape=0.5).mean() == math.inf


def test_lognormal_median():
    xs = draws(LogNormal(median=7.0, sigma=1.2))
    assert float(np.median(xs)) == pytest.approx(7.0, rel=0.03)


def test_uniform_range_and_spread():
    xs = draws(Uniform(low=2, high=6))
    assert xs.min() >= 2 and xs.max() < 6
    assert xs.std() == pytest.approx(4 / math.sqrt(12), rel=0.03)


def test_gaussian_std():
    xs = draws(Gaussian(mean=10.0, std=2.0))
    assert xs.std() == pytest.approx(2.0, rel=0.03)


def test_empirical_quantiles_are_respected():
    dist = CASES["empirical"][0]
    xs = draws(dist)
    assert float(np.quantile(xs, 0.5)) == pytest.approx(2.0, rel=0.03)
    assert float(np.quantile(xs, 0.9)) == pytest.approx(5.0, rel=0.05)
    assert xs.min() >= 1 and xs.max() <= 20


def test_mixture_picks_components_by_weight():
    # components with disjoint supports: [0, 1) with weight 1, [10, 11) with weight 3
    dist = Mixture(components=[Component(weight=1, dist=Uniform(low=0, high=1)),
                               Component(weight=3, dist=Uniform(low=10, high=11))])
    xs = draws(dist)
    assert float((xs >= 10).mean()) == pytest.approx(0.75, abs=0.015)
    assert not ((xs >= 1) & (xs < 10)).any()


# ---------------------------------------------------------------- never negative, caps


NEGATIVE_PRONE = {
    **{name: dist for name, (dist, _) in CASES.items()},
    "gaussian-wide": Gaussian(mean=0.5, std=3.0),
    "gaussian-zero": Gaussian(mean=0.0, std=1.0),
    "lognormal-wide": LogNormal(median=0.01, sigma=3.0),
    "uniform-from-zero": Uniform(low=0, high=0.001),
    "empirical-from-zero": Empirical(quantiles={0: 0, 0.99: 0, 1: 1}),
    "mixture-gaussians": parse({"kind": "mixture", "components": [
        {"weight": 1, "dist": {"kind": "gaussian", "mean": 0, "std": 5}},
        {"weight": 1, "dist": {"kind": "pareto", "scale": 0.001, "shape": 0.3}}]}),
}


@pytest.mark.parametrize("name", list(NEGATIVE_PRONE))
def test_samples_are_never_negative(name: str):
    xs = draws(NEGATIVE_PRONE[name])
    assert np.isfinite(xs).all()
    assert xs.min() >= 0.0


def test_gaussian_min_is_a_floor():
    xs = draws(Gaussian(mean=1.0, std=2.0, min=0.5))
    assert xs.min() == 0.5  # the floor is reached (about 40% of draws)
    assert float((xs == 0.5).mean()) == pytest.approx(0.4013, abs=0.02)


@pytest.mark.parametrize("dist, cap", [
    (LogNormal(median=100.0, sigma=1.5, max=300.0), 300.0),
    (Pareto(scale=20.0, shape=1.5, max=300.0), 300.0),
    (Pareto(scale=1.0, shape=0.5, max=50.0), 50.0),
])
def test_max_cap_is_respected(dist, cap: float):
    xs = draws(dist)
    assert xs.max() <= cap
    assert xs.max() == cap  # the cap binds for these parameters
    assert float((xs == cap).mean()) > 0.01


def test_max_cap_inside_a_mixture():
    dist = parse({"kind": "mixture", "components": [
        {"weight": 0.95, "dist": {"kind": "lognormal", "median": 4, "sigma": 0.4}},
        {"weight": 0.05, "dist": {"kind": "pareto", "scale": 20, "shape": 1.5, "max": 300}}]})
    xs = draws(dist)
    assert xs.max() == 300.0
    assert float((xs >= 20).mean()) == pytest.approx(0.05, abs=0.01)


# ---------------------------------------------------------------- reproducibility


@pytest.mark.parametrize("name", list(CASES))
def test_same_seed_same_sequence(name: str):
    dist, _ = CASES[name]
    a = draws(dist, n=500, seed=7)
    b = draws(dist, n=500, seed=7)
    assert np.array_equal(a, b)
    if name != "constant":
        c = draws(dist, n=500, seed=8)
        assert not np.array_equal(a, c)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("data", [
    {"kind": "constant", "value": -1},
    {"kind": "lognormal", "median": 0, "sigma": 1},
    {"kind": "lognormal", "median": 1, "sigma": -1},
    {"kind": "lognormal", "median": 1, "sigma": 1, "max": 0},
    {"kind": "gaussian", "mean": 1, "std": -1},
    {"kind": "gaussian", "mean": -1, "std": 1},
    {"kind": "uniform", "low": 3, "high": 2},
    {"kind": "uniform", "low": -1, "high": 2},
    {"kind": "pareto", "scale": 0, "shape": 2},
    {"kind": "pareto", "scale": 1, "shape": 0},
    {"kind": "empirical", "quantiles": {0.1: 1, 1: 2}},
    {"kind": "empirical", "quantiles": {0: 1, 0.9: 2}},
    {"kind": "empirical", "quantiles": {0: 3, 1: 2}},
    {"kind": "empirical", "quantiles": {0: -1, 1: 2}},
    {"kind": "mixture", "components": []},
    {"kind": "mixture", "components": [{"weight": 0, "dist": 1}]},
    {"kind": "lognormal", "median": 1, "sigma": 1, "mean": 2},
    {"kind": "weibull", "scale": 1},
])
def test_invalid_distributions_rejected(data):
    with pytest.raises(ValidationError):
        parse(data)


@settings(max_examples=200, deadline=None)
@given(
    inner=st.lists(st.tuples(st.floats(0.0, 1.0, exclude_min=True, exclude_max=True),
                             st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False)),
                   max_size=8, unique_by=lambda t: t[0]),
    ends=st.tuples(st.floats(0.0, 1e6), st.floats(0.0, 1e6)),
    seed=st.integers(0, 2**32 - 1),
)
def test_empirical_samples_stay_within_the_quantile_range(inner, ends, seed):
    values = sorted([ends[0], ends[1], *(v for _, v in inner)])
    probs = [0.0, *sorted(p for p, _ in inner), 1.0]
    table = dict(zip(probs, values))  # non-decreasing values over increasing probabilities
    dist = Empirical(quantiles=table)
    lo, hi = values[0], values[-1]
    rng = np.random.default_rng(seed)
    for _ in range(200):
        x = dist.sample(rng)
        assert lo <= x <= hi
    assert lo <= dist.mean() <= hi


@settings(max_examples=100, deadline=None)
@given(median=st.floats(1e-3, 1e4), sigma=st.floats(0, 3), cap=st.floats(1e-3, 1e5), seed=st.integers(0, 2**32 - 1))
def test_capped_lognormal_property(median, sigma, cap, seed):
    dist = LogNormal(median=median, sigma=sigma, max=cap)
    rng = np.random.default_rng(seed)
    xs = [dist.sample(rng) for _ in range(50)]
    assert all(0 <= x <= cap for x in xs)


# ---------------------------------------------------------------- YAML shorthand


@pytest.mark.parametrize("value", [60, 0, 2.5])
def test_bare_number_is_a_constant(value):
    assert coerce_distribution(value) == {"kind": "constant", "value": value}
    assert parse(coerce_distribution(value)) == Constant(value=value)


def test_non_numbers_pass_through_coerce():
    assert coerce_distribution(True) is True
    d = {"kind": "uniform", "low": 1, "high": 2}
    assert coerce_distribution(d) is d


def test_bare_numbers_in_task_fields_become_constants():
    plan = load_plan(default_scenario())
    math_task = plan.task("GEM-Math")
    assert math_task.obs_tokens == Constant(value=60)
    assert math_task.prompt_tokens == Constant(value=300)
    assert math_task.env.reset == Constant(value=0.05)
    assert math_task.env.step == Constant(value=0.02)
    assert math_task.obs_tokens.sample(np.random.default_rng(0)) == 60
    # and structured ones parse to their classes
    assert isinstance(plan.task("FrozenLake").obs_tokens, LogNormal)
    assert isinstance(plan.task("CodeExec").env.reset, Mixture)
    assert isinstance(plan.task("FrozenLake").turns, Uniform)


def test_bare_number_via_override_becomes_constant():
    plan = load_plan(default_scenario(), ["tasks.FrozenLake.obs_tokens=42", "tasks.FrozenLake.env.step=0.5"])
    assert plan.task("FrozenLake").obs_tokens == Constant(value=42)
    assert plan.task("FrozenLake").env.step == Constant(value=0.5)


def test_default_prompt_tokens_is_a_constant():
    data = read_yaml(default_scenario())
    del data["tasks"][0]["prompt_tokens"]
    plan = plan_from_dict(data)
    assert plan.tasks[0].prompt_tokens == Constant(value=512)
    assert plan.tasks[0].prompt_tokens.sample(np.random.default_rng(0)) == 512


def test_scientific_notation_number_is_a_constant():
    plan = load_plan(default_scenario(), ["tasks.GEM-Math.env.reset=1e-3"])
    assert plan.task("GEM-Math").env.reset == Constant(value=0.001)


# ---------------------------------------------------------------- .mean() of capped / floored samplers


def test_capped_lognormal_mean_matches_samples():
    dist = LogNormal(median=100.0, sigma=1.5, max=300.0)
    assert draws(dist).mean() == pytest.approx(dist.mean(), rel=0.05)


def test_capped_pareto_mean_matches_samples():
    # the CodeExec reset tail of the default scenario: capped mean ≈ 49.7, .mean() says 60
    dist = Pareto(scale=20.0, shape=1.5, max=300.0)
    assert draws(dist).mean() == pytest.approx(dist.mean(), rel=0.05)


def test_capped_heavy_pareto_mean_matches_samples():
    dist = Pareto(scale=1.0, shape=0.5, max=50.0)  # E[min(X, 50)] = 2*sqrt(50) - 1 ≈ 13.1
    assert draws(dist).mean() == pytest.approx(dist.mean(), rel=0.05)


def test_floored_gaussian_mean_matches_samples():
    dist = Gaussian(mean=0.5, std=3.0)
    assert draws(dist).mean() == pytest.approx(dist.mean(), rel=0.05)

