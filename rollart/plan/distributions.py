"""Distributions a scenario can use for latencies, turn counts and token counts.

Each is a pydantic model tagged by ``kind`` and knows how to draw from a numpy
``Generator``; a bare number in YAML means ``{kind: constant, value: N}``.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Annotated, Literal, Union

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NonNeg = Annotated[float, Field(ge=0)]
# Spread parameters are bounded so that means stay representable (e^(σ²/2) with σ = 10 is
# 5·10^21) and so a typo (sigma: 1000) is an error naming the field, not an overflow.
Sigma = Annotated[float, Field(ge=0, le=10)]

# Every draw is finite and at most this (seconds, tokens or turns: far beyond any timeout,
# context length or episode), whatever parameters the schema admits; see :func:`_safe`.
SAMPLE_MAX = 1e12


def _midpoint(a: float, b: float) -> float:
    """(a + b) / 2, without overflowing near the float maximum (nor underflowing near 0)."""
    total = a + b
    return total / 2 if math.isfinite(total) else a / 2 + b / 2


def _safe(x: float) -> float:
    """A draw clipped to [0, SAMPLE_MAX]; NaN (inf − inf in a user's extreme parameters) maps
    to the ceiling, so a consumer never sees a non-finite number."""
    if not x < SAMPLE_MAX:  # also catches NaN
        return SAMPLE_MAX
    return x if x > 0 else 0.0


class _Dist(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    def sample(self, rng: np.random.Generator) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def mean(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError


class Constant(_Dist):
    """Always ``value``."""

    kind: Literal["constant"] = "constant"
    value: NonNeg

    def sample(self, rng: np.random.Generator) -> float:
        return _safe(self.value)

    def mean(self) -> float:
        return self.value


class LogNormal(_Dist):
    """exp(N(ln median, sigma²)), optionally capped at ``max``."""

    kind: Literal["lognormal"] = "lognormal"
    median: Annotated[float, Field(gt=0)]
    sigma: Sigma
    max: Annotated[float, Field(gt=0)] | None = None

    def sample(self, rng: np.random.Generator) -> float:
        e = self.sigma * rng.standard_normal()
        x = self.median * math.exp(e) if e < 700 else math.inf  # a float product overflows to inf, exp raises
        return _safe(min(x, self.max) if self.max is not None else x)

    def mean(self) -> float:
        """E[min(X, max)] = m·e^{σ²/2}·Φ((ln(c/m) − σ²)/σ) + c·(1 − Φ(ln(c/m)/σ))."""
        full = self.median * math.exp(self.sigma**2 / 2)
        if self.max is None:
            return full
        if self.sigma == 0:
            return min(self.median, self.max)
        z = (math.log(self.max) - math.log(self.median)) / self.sigma  # no ratio to overflow
        return full * _Phi(z - self.sigma) + self.max * (1 - _Phi(z))


class Gaussian(_Dist):
    """N(mean, std²) truncated below at ``min`` (latencies and counts are never negative)."""

    kind: Literal["gaussian"] = "gaussian"
    mean_: NonNeg = Field(alias="mean")
    std: NonNeg
    min: NonNeg = 0.0

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    def sample(self, rng: np.random.Generator) -> float:
        return _safe(max(self.min, self.mean_ + self.std * rng.standard_normal()))

    def mean(self) -> float:
        """E[max(X, c)] = c·Φ(z) + μ·(1 − Φ(z)) + σ·φ(z), z = (c − μ)/σ."""
        if self.std == 0:
            return max(self.min, self.mean_)
        z = (self.min - self.mean_) / self.std
        return self.min * _Phi(z) + self.mean_ * (1 - _Phi(z)) + self.std * _phi(z)


class Uniform(_Dist):
    """U(low, high)."""

    kind: Literal["uniform"] = "uniform"
    low: NonNeg
    high: NonNeg

    @model_validator(mode="after")
    def _ordered(self) -> "Uniform":
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    def sample(self, rng: np.random.Generator) -> float:
        return _safe(self.low + (self.high - self.low) * rng.random())

    def mean(self) -> float:
        return _midpoint(self.low, self.high)


class Pareto(_Dist):
    """Pareto type I: ``scale · U^(-1/shape)``; a heavy tail (shape ≤ 2 has infinite variance)."""

    kind: Literal["pareto"] = "pareto"
    scale: Annotated[float, Field(gt=0)]
    # below 0.01 a draw is 1e200 times the scale at the 1e-2 tail: no latency looks like that
    shape: Annotated[float, Field(ge=0.01, le=1000)]
    max: Annotated[float, Field(gt=0)] | None = None

    def sample(self, rng: np.random.Generator) -> float:
        try:
            x = self.scale * (1.0 - rng.random()) ** (-1.0 / self.shape)
        except OverflowError:  # small shapes: (1 − u)^(−1/shape) is beyond a float
            x = math.inf
        return _safe(min(x, self.max) if self.max is not None else x)

    def mean(self) -> float:
        """E[min(X, c)] = x + x^a·(c^{1−a} − x^{1−a})/(1 − a)  (x·(1 + ln(c/x)) for a = 1)."""
        x, a, c = self.scale, self.shape, self.max
        if c is None:
            return x * a / (a - 1) if a > 1 else math.inf
        if c <= x:
            return c
        if a == 1:
            return min(c, x * (1 + math.log(c) - math.log(x)))
        # x + x^a·(c^{1−a} − x^{1−a})/(1 − a), written as x·(1 + ((c/x)^{1−a} − 1)/(1 − a)) so
        # that no power of a large scale overflows; never above the cap
        try:
            return min(c, x * (1 + math.expm1((1 - a) * (math.log(c) - math.log(x))) / (1 - a)))
        except OverflowError:
            return c


class Empirical(_Dist):
    """Inverse-CDF interpolation between measured quantiles ``{probability: value}``.

    Probabilities must include 0 and 1 (the observed min and max)."""

    kind: Literal["empirical"] = "empirical"
    quantiles: dict[float, NonNeg]

    @field_validator("quantiles")
    @classmethod
    def _check(cls, q: dict[float, float]) -> dict[float, float]:
        ps = sorted(q)
        if len(ps) < 2 or ps[0] != 0.0 or ps[-1] != 1.0:
            raise ValueError("quantiles need at least the probabilities 0 and 1")
        vals = [q[p] for p in ps]
        if any(b < a for a, b in zip(vals, vals[1:])):
            raise ValueError("quantile values must not decrease as the probability grows")
        return {p: q[p] for p in ps}

    def sample(self, rng: np.random.Generator) -> float:
        ps = list(self.quantiles)
        return _safe(float(np.interp(rng.random(), ps, list(self.quantiles.values()))))

    def mean(self) -> float:
        ps = list(self.quantiles)
        vs = list(self.quantiles.values())
        return sum((p1 - p0) * _midpoint(v0, v1) for p0, p1, v0, v1 in zip(ps, ps[1:], vs, vs[1:]))


class Spliced(_Dist):
    """A lognormal body below ``threshold`` u spliced to a generalized-Pareto tail above it —
    the peaks-over-threshold model of a latency with rare, very slow calls.

    With probability ``tail_prob`` p the draw is ``u + Y``, Y ~ GPD(ξ = ``tail_shape``,
    β = ``tail_scale``) with survival S(y) = (1 + ξy/β)^(−1/ξ) (e^(−y/β) for ξ = 0; for ξ < 0
    the tail ends at u − β/ξ); otherwise it is LN(ln ``median``, ``sigma``²) truncated to
    (0, u]. Both parts are drawn by inverse CDF from one uniform q (``statistics.NormalDist``
    for the body), then capped at ``max``. With z(x) = ln(x/median)/σ:

        F(x) = (1 − p)·Φ(z(x))/Φ(z(u))        for x ≤ u
        F(x) = 1 − p + p·(1 − S(x − u))        for x > u

        E[X] = (1 − p)·median·e^{σ²/2}·Φ(z(u) − σ)/Φ(z(u)) + p·(u + β/(1 − ξ))

    ξ < 1 keeps the mean finite. With the cap c: for c > u the tail term becomes
    p·(u + E[min(Y, c − u)]), E[min(Y, d)] = β/(1 − ξ)·(1 − (1 + ξd/β)^{1 − 1/ξ})
    (β·(1 − e^{−d/β}) for ξ = 0); for c ≤ u the mean is
    (1 − p)·(median·e^{σ²/2}·Φ(z(c) − σ) + c·(Φ(z(u)) − Φ(z(c))))/Φ(z(u)) + p·c.
    """

    kind: Literal["spliced"] = "spliced"
    median: Annotated[float, Field(gt=0)]
    sigma: Annotated[float, Field(gt=0, le=10)]
    threshold: Annotated[float, Field(gt=0)]
    tail_prob: Annotated[float, Field(ge=0, lt=1)]
    tail_shape: Annotated[float, Field(ge=-1000, lt=1)]
    tail_scale: Annotated[float, Field(gt=0)]
    max: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _body_below_threshold(self) -> "Spliced":
        z_u = (math.log(self.threshold) - math.log(self.median)) / self.sigma
        if z_u < -8:
            raise ValueError(f"threshold ({self.threshold:g}) is {-z_u:.0f} sigmas below the body's median "
                             f"({self.median:g}): the lognormal body has no mass below it")
        return self

    @property
    def _body_mass(self) -> float:
        """Φ(z(u)): the untruncated body's mass below u (computed, not stored, so that
        ``model_copy(update=...)`` stays consistent)."""
        return _Phi((math.log(self.threshold) - math.log(self.median)) / self.sigma)

    def _quantile(self, q: float) -> float:
        """Inverse CDF at q ∈ [0, 1), before the cap."""
        p = self.tail_prob
        if q < 1 - p:
            r = max(q / (1 - p) * self._body_mass, 1e-300)
            return min(self.median * math.exp(self.sigma * _NORMAL.inv_cdf(r)), self.threshold)
        r = (q - (1 - p)) / p  # in [0, 1)
        xi, beta = self.tail_shape, self.tail_scale
        if abs(xi) < 1e-12:  # the exponential limit; beta / xi would overflow
            y = -beta * math.log1p(-r)
        else:
            try:
                y = beta / xi * ((1 - r) ** -xi - 1)
            except OverflowError:
                y = math.inf
        return self.threshold + y

    def sample(self, rng: np.random.Generator) -> float:
        x = self._quantile(rng.random())
        return _safe(min(x, self.max) if self.max is not None else x)

    def ppf(self, q: npt.ArrayLike) -> np.ndarray:
        """Inverse CDF (vectorised, capped at ``max``); q = 1 gives the support's upper end."""
        from scipy.special import ndtri

        q = np.asarray(q, dtype=float)
        p, u, xi, beta = self.tail_prob, self.threshold, self.tail_shape, self.tail_scale
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            body = self.median * np.exp(self.sigma * ndtri(np.clip(q / (1 - p), 0, 1) * self._body_mass))
            r = np.clip((q - (1 - p)) / p, 0, 1) if p > 0 else np.zeros_like(q)
            y = -beta * np.log1p(-r) if xi == 0 else beta / xi * ((1 - r) ** -xi - 1)
        x = np.where(q < 1 - p, np.minimum(body, u), u + y)
        return np.minimum(x, self.max) if self.max is not None else x

    def cdf(self, x: npt.ArrayLike) -> np.ndarray:
        """F(x) (vectorised); 1 at and above ``max``."""
        from scipy.special import ndtr

        x = np.asarray(x, dtype=float)
        p, u, xi, beta = self.tail_prob, self.threshold, self.tail_shape, self.tail_scale
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            body = (1 - p) * ndtr(np.log(np.maximum(x, 1e-300) / self.median) / self.sigma) / self._body_mass
            y = np.maximum(x - u, 0)
            if xi == 0:
                surv = np.exp(-y / beta)
            else:
                surv = np.maximum(1 + xi * y / beta, 0) ** (-1 / xi)
        out = np.where(x <= 0, 0.0, np.where(x <= u, body, 1 - p * surv))
        if self.max is not None:
            out = np.where(x >= self.max, 1.0, out)
        return out

    def mean(self) -> float:
        p, u, xi, beta, c = self.tail_prob, self.threshold, self.tail_shape, self.tail_scale, self.max
        m, s, mass = self.median, self.sigma, self._body_mass
        z_u = (math.log(u) - math.log(m)) / s
        full = m * math.exp(s * s / 2)
        if c is not None and c <= u:
            z_c = (math.log(c) - math.log(m)) / s
            body = (full * _Phi(z_c - s) + c * (mass - _Phi(z_c))) / mass
            return (1 - p) * body + p * c
        body = full * _Phi(z_u - s) / mass
        if c is None:
            tail = beta / (1 - xi)
        else:
            d = c - u
            if xi == 0:
                tail = beta * -math.expm1(-d / beta)
            else:
                base = 1 + xi * d / beta
                tail = beta / (1 - xi) * (1 - (base ** (1 - 1 / xi) if base > 0 else 0.0))
        return (1 - p) * body + p * (u + tail)


class Component(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    weight: Annotated[float, Field(gt=0, le=1e9)]
    dist: "Distribution"


class Mixture(_Dist):
    """Draws from one component, chosen with probability proportional to its weight
    (e.g. bimodal turn counts, or a lognormal body plus a Pareto tail)."""

    kind: Literal["mixture"] = "mixture"
    components: list[Component] = Field(min_length=1)

    def sample(self, rng: np.random.Generator) -> float:
        total = sum(c.weight for c in self.components)
        u = rng.random() * total
        for c in self.components:
            u -= c.weight
            if u < 0:
                return c.dist.sample(rng)
        return self.components[-1].dist.sample(rng)

    def mean(self) -> float:
        total = sum(c.weight for c in self.components)
        return sum(c.weight * c.dist.mean() for c in self.components) / total


Distribution = Annotated[
    Union[Constant, LogNormal, Gaussian, Uniform, Pareto, Empirical, Spliced, Mixture],
    Field(discriminator="kind"),
]
Component.model_rebuild()


def coerce_distribution(value: object) -> object:
    """YAML shorthand: a plain number is a constant distribution (YAML reads ``1e-3`` as a
    string, so numeric strings count too)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"kind": "constant", "value": value}
    return value


_NORMAL = NormalDist()


def _phi(z: float) -> float:
    return math.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def _Phi(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))
