"""Fit environment latency distributions (``env.reset`` / ``env.step``) from measured call traces.

Trace format
------------
A CSV file with a header row and (at least) the columns ``task,phase,latency_s,status``, one
row per env call (a retry is another row); extra columns are ignored, and so are rows of
other tasks:

* ``task``: the task name as a scenario spells it (``SWE``, ``FrozenLake``, …);
* ``phase``: ``reset`` or ``step``;
* ``latency_s``: seconds the caller waited for the call. Required on ``ok`` rows. On a
  ``timeout`` row it is the timeout that fired (the call's real latency is at least that);
  it may be left empty there, and on ``error`` rows, when it was not recorded;
* ``status``: ``ok``, ``error`` (the call returned or raised an error) or ``timeout``.

Example::

    task,phase,latency_s,status
    SWE,reset,41.7,ok
    SWE,step,2.31,ok
    SWE,reset,600,timeout
    SWE,step,0.84,error

The model
---------
:func:`fit_latency` fits :class:`~rollart.plan.distributions.Spliced`: the threshold u is the
empirical ``tail_quantile`` quantile of the calls' latencies; the lognormal body is the maximum
likelihood fit to the latencies ≤ u *as a lognormal truncated at u* (so the body's sigma is not
shrunk by the cut); the tail is ``scipy.stats.genpareto.fit(exceedances, floc=0)`` on the
latencies above u, and ``tail_prob`` is the share of calls above u. Only ``ok`` latencies are
complete observations: ``error`` latencies are left out (errors often fail fast, so their
latencies say little about the working path). Timeouts recorded with their timeout value are
right-censored observations (the latency was at least that): they count as tail calls in
``tail_prob`` and the GPD is then refitted by maximising the censored likelihood, so the fitted
model's P(X > timeout) reproduces the trace's timeout rate — which is how the simulator produces
timeouts (``latency > timeout_s``). Goodness of fit compares the ``ok`` latencies with the fitted
model conditioned on not timing out (no conditioning when no timeouts were recorded).

:func:`fit_env_trace` fits both phases of one task and :meth:`EnvFitReport.task_block` turns
the result into a scenario task mapping; :func:`write_task_block` writes it as YAML under a
``# provenance`` comment. :func:`synthetic_trace` writes a trace drawn from known distributions
(tests and the README tour use it).
"""

from __future__ import annotations

import csv
import datetime as _dt
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Union

import numpy as np
import yaml

from rollart.plan.distributions import Empirical, LogNormal, Spliced

TRACE_COLUMNS = ("task", "phase", "latency_s", "status")
PHASES = ("reset", "step")
STATUSES = ("ok", "error", "timeout")
MIN_SAMPLES = 20  # ok calls per phase needed to fit
MIN_EXCEEDANCES = 5  # complete observations above the threshold the GPD fit needs at least
MAX_TAIL_SHAPE = 0.95  # a fitted ξ is kept below this (ξ ≥ 1 has no finite mean)
EMPIRICAL_LEVELS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
REPORT_QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))

Model = Union[Spliced, Empirical, LogNormal]


class TraceError(ValueError):
    """The trace cannot be fitted; the message is one line naming the problem."""


# ---------------------------------------------------------------- model CDFs and quantiles


def model_cdf(dist: Model, x: Any) -> np.ndarray:
    """F(x) of a fitted model (vectorised): spliced, empirical or lognormal."""
    x = np.asarray(x, dtype=float)
    if isinstance(dist, Spliced):
        return dist.cdf(x)
    if isinstance(dist, Empirical):
        ps, vs = np.array(list(dist.quantiles)), np.array(list(dist.quantiles.values()))
        return np.interp(x, vs, ps, left=0.0, right=1.0)
    if isinstance(dist, LogNormal):
        from scipy.special import ndtr

        with np.errstate(divide="ignore"):
            out = ndtr(np.log(np.maximum(x, 1e-300) / dist.median) / dist.sigma) if dist.sigma > 0 \
                else (x >= dist.median).astype(float)
        out = np.where(x <= 0, 0.0, out)
        return np.where(x >= dist.max, 1.0, out) if dist.max is not None else out
    raise TypeError(f"no CDF for {type(dist).__name__}")


def model_ppf(dist: Model, q: Any) -> np.ndarray:
    """The inverse CDF of a fitted model (vectorised)."""
    q = np.asarray(q, dtype=float)
    if isinstance(dist, Spliced):
        return dist.ppf(q)
    if isinstance(dist, Empirical):
        return np.interp(q, list(dist.quantiles), list(dist.quantiles.values()))
    if isinstance(dist, LogNormal):
        from scipy.special import ndtri

        with np.errstate(divide="ignore"):
            out = dist.median * np.exp(dist.sigma * ndtri(q))
        return np.minimum(out, dist.max) if dist.max is not None else out
    raise TypeError(f"no quantile function for {type(dist).__name__}")


# ---------------------------------------------------------------- goodness of fit


@dataclass(frozen=True)
class GoodnessOfFit:
    """How well a model matches the measured ``ok`` latencies.

    ``fitted['max']`` is the model's median of the largest of n calls (n = the number of
    measured calls), F⁻¹(0.5^{1/n}), the fair counterpart of the measured maximum."""

    ks: float
    ks_pvalue: float
    measured: dict[str, float]
    fitted: dict[str, float]

    def rel_error(self, key: str) -> float:
        m = self.measured[key]
        return (self.fitted[key] - m) / m if m else math.inf


def goodness_of_fit(dist: Model, samples: Any, censor_at: float | None = None) -> GoodnessOfFit:
    """KS distance (``scipy.stats.kstest`` against the model's CDF) and p50/p90/p99/max
    measured vs fitted. With ``censor_at`` (the smallest recorded timeout) the model is
    conditioned on X ≤ censor_at, like the measured calls that did not time out."""
    from scipy.stats import kstest

    x = np.asarray(samples, dtype=float)
    mass = 1.0
    if censor_at is not None:
        mass = float(model_cdf(dist, censor_at))
        mass = mass if mass > 0 else 1.0

    def cdf(v: Any) -> np.ndarray:
        return np.minimum(model_cdf(dist, v) / mass, 1.0)

    def ppf(q: Any) -> np.ndarray:
        return model_ppf(dist, np.asarray(q, dtype=float) * mass)

    res = kstest(x, cdf)
    levels = [q for _, q in REPORT_QUANTILES] + [0.5 ** (1 / len(x))]
    fitted_q = ppf(levels)
    names = [k for k, _ in REPORT_QUANTILES] + ["max"]
    measured = {k: float(np.quantile(x, q)) for k, q in REPORT_QUANTILES}
    measured["max"] = float(x.max())
    return GoodnessOfFit(ks=float(res.statistic), ks_pvalue=float(res.pvalue), measured=measured,
                         fitted={k: float(v) for k, v in zip(names, fitted_q)})


# ---------------------------------------------------------------- fitting one latency sample


@dataclass(frozen=True)
class Fit:
    """A fitted latency distribution: ``dist`` (the one a task block uses), both candidate
    models, and their goodness of fit on the measured ``ok`` latencies."""

    dist: Union[Spliced, Empirical]
    spliced: Spliced
    empirical: Empirical
    gof_spliced: GoodnessOfFit
    gof_empirical: GoodnessOfFit
    n: int  # complete (ok) observations
    n_censored: int  # timeouts used as right-censored observations
    tail_quantile: float  # the quantile the threshold was put at (may be lowered; see notes)
    notes: tuple[str, ...] = ()

    @property
    def gof(self) -> GoodnessOfFit:
        return self.gof_empirical if isinstance(self.dist, Empirical) else self.gof_spliced

    @property
    def ks(self) -> float:
        return self.gof.ks

    def choose(self, empirical: bool) -> "Fit":
        return replace(self, dist=self.empirical if empirical else self.spliced)


def _sig(v: float, digits: int = 6) -> float:
    return float(f"{float(v):.{digits}g}")


def _fit_truncated_lognormal(body: np.ndarray, u: float) -> tuple[float, float]:
    """MLE of (median, sigma) of a lognormal observed only below ``u``: maximises
    Σ log φ((ln x − μ)/σ) − n·ln σ − n·ln Φ((ln u − μ)/σ) over (μ, ln σ)."""
    from scipy.optimize import minimize
    from scipy.special import log_ndtr

    y = np.log(body)
    n, ly = len(y), math.log(u)
    mu0, sd0 = float(y.mean()), float(y.std())
    if not sd0 > 0:
        raise TraceError(f"the latencies below the threshold are all {body[0]:g} s: "
                         "a constant, not a distribution (write the number instead)")
    s1, s2 = float(y.sum()), float((y * y).sum())

    def nll(theta: np.ndarray) -> float:
        mu, log_s = theta
        s = math.exp(log_s)
        ss = s2 - 2 * mu * s1 + n * mu * mu
        return n * log_s + ss / (2 * s * s) + n * float(log_ndtr((ly - mu) / s))

    bounds = [(mu0 - 10 * sd0, ly + 10 * sd0), (math.log(sd0) - 3, math.log(sd0) + 5)]
    res = minimize(nll, np.array([mu0, math.log(sd0)]), method="L-BFGS-B", bounds=bounds)
    mu, log_s = res.x
    return math.exp(mu), math.exp(log_s)


def _gpd_censored_fit(exc: np.ndarray, cens: np.ndarray, start: tuple[float, float]) -> tuple[float, float]:
    """MLE of a GPD(ξ, β) from complete exceedances and right-censored ones (ξ bounded to
    [−0.9, MAX_TAIL_SHAPE])."""
    from scipy.optimize import minimize
    from scipy.stats import genpareto

    def nll(theta: np.ndarray) -> float:
        xi, log_b = theta
        b = math.exp(log_b)
        ll = genpareto.logpdf(exc, xi, loc=0, scale=b).sum()
        if len(cens):
            ll += genpareto.logsf(cens, xi, loc=0, scale=b).sum()
        return -ll if np.isfinite(ll) else 1e300

    xi0 = min(max(start[0], -0.5), MAX_TAIL_SHAPE - 0.05)
    b0 = max(start[1], 1e-9)
    top = float(max(exc.max(initial=0), cens.max(initial=0)))
    if xi0 < 0 and top >= -b0 / xi0:  # the start must hold every observation in its support
        b0 = -xi0 * top * 1.01
    res = minimize(nll, np.array([xi0, math.log(b0)]), method="Nelder-Mead",
                   options={"xatol": 1e-6, "fatol": 1e-8, "maxiter": 4000})
    xi, log_b = res.x
    xi = min(max(float(xi), -0.9), MAX_TAIL_SHAPE)
    return xi, math.exp(log_b)


def fit_latency(samples: Any, tail_quantile: float = 0.9, *, censored: Any = None,
                empirical: bool = False) -> Fit:
    """Fit the spliced lognormal + GPD model (and the empirical alternative) to latencies.

    ``samples`` are complete latencies in seconds (> 0); ``censored`` optional right-censored
    ones (timeouts recorded at the timeout value). The threshold is the ``tail_quantile``
    quantile of all calls, lowered when needed so that at least ``MIN_EXCEEDANCES`` complete
    latencies, and at least as many complete as censored ones, lie above it (noted in
    ``notes``). ``empirical`` makes the empirical model the chosen ``dist``."""
    from scipy.stats import genpareto

    x = np.asarray(samples, dtype=float).ravel()
    c = np.asarray(censored if censored is not None else [], dtype=float).ravel()
    if len(x) < MIN_SAMPLES:
        raise TraceError(f"{len(x)} latencies; at least {MIN_SAMPLES} are needed to fit a distribution")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise TraceError("latencies must be finite and > 0 seconds")
    c = c[np.isfinite(c)]
    if not 0 < tail_quantile < 1:
        raise TraceError(f"tail_quantile must be in (0, 1), got {tail_quantile}")
    notes: list[str] = []
    n, m = len(x), len(c)
    total = n + m
    q = min(tail_quantile, 1 - MIN_EXCEEDANCES / total, 1 - 2 * m / total)
    if q < 0.5:
        raise TraceError(f"{m} of {total} calls timed out: too many for a tail fit "
                         "(the threshold would fall below the median); use the empirical model")
    if q < tail_quantile:
        notes.append(f"threshold lowered to the {q:.3g} quantile (tail_quantile {tail_quantile:g}) to keep "
                     f"{MIN_EXCEEDANCES}+ measured calls and more measured than timed-out calls above it")
    u = _sig(np.quantile(np.concatenate([x, c]), q))
    if m and c.min() <= u:
        raise TraceError(f"a timeout is recorded at {c.min():g} s, below the fitted threshold {u:g} s; "
                         "timeouts should carry the timeout value in latency_s")
    body = x[x <= u]
    exc = x[x > u] - u
    if len(exc) < 2 or len(body) < 2:
        raise TraceError(f"latencies are (nearly) constant at {u:g} s: write the number instead")
    median, sigma = _fit_truncated_lognormal(body, u)
    xi, _, beta = genpareto.fit(exc, floc=0)
    if m:
        xi, beta = _gpd_censored_fit(exc, c - u, (xi, beta))
        notes.append(f"GPD tail fitted with {m} timeouts as censored observations")
    elif not -0.9 <= xi <= MAX_TAIL_SHAPE:
        mle = xi
        xi, beta = _gpd_censored_fit(exc, np.array([]), (xi, beta))
        notes.append(f"GPD shape bounded to {xi:.3g} (unbounded MLE {mle:.3g}"
                     + (": no finite mean)" if mle >= 1 else ")"))
    spliced = Spliced(median=_sig(median), sigma=_sig(sigma), threshold=u,
                      tail_prob=_sig((len(exc) + m) / total), tail_shape=_sig(xi), tail_scale=_sig(beta))
    emp = Empirical(quantiles={float(p): _sig(v) for p, v in zip(EMPIRICAL_LEVELS, np.quantile(x, EMPIRICAL_LEVELS))})
    censor_at = float(c.min()) if m else None
    fit = Fit(dist=spliced, spliced=spliced, empirical=emp,
              gof_spliced=goodness_of_fit(spliced, x, censor_at), gof_empirical=goodness_of_fit(emp, x),
              n=n, n_censored=m, tail_quantile=float(q), notes=tuple(notes))
    return fit.choose(empirical)


# ---------------------------------------------------------------- traces


@dataclass(frozen=True)
class PhaseFit:
    """One phase of one task: call counts and the latency fit."""

    phase: str
    calls: int
    ok: int
    errors: int
    timeouts: int
    fit: Fit
    timeout_latencies: tuple[float, ...] = ()  # recorded timeout values

    @property
    def failure_rate(self) -> float:
        """Error share of calls."""
        return self.errors / self.calls

    @property
    def timeout_rate(self) -> float:
        return self.timeouts / self.calls


@dataclass(frozen=True)
class EnvFitReport:
    """Both phases of one task fitted from a trace, with the reliability numbers a scenario's
    ``env`` needs.

    * ``failure_prob``: errors ÷ calls that did not time out, reset and step pooled — the
      simulator draws an error only for a call that did not time out, with one probability
      for both phases (the per-phase error shares are in ``phases``).
    * ``timeout_s``: the largest ``latency_s`` recorded on a timeout row when the trace has
      any (the timeout that was configured); otherwise the p99.9 of the ok latencies of the
      slower phase, rounded up to a whole second — a suggestion: the fitted tail then times
      out about 0.1 % of that phase's calls in simulation, which the trace never saw.
    """

    task: str
    source: str
    rows_total: int  # rows in the file
    rows_task: int  # rows of this task
    phases: dict[str, PhaseFit]
    failure_prob: float
    timeout_s: float
    timeout_rule: str
    empirical: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def failure_rate(self) -> float:
        """Error share of all calls (both phases)."""
        return sum(p.errors for p in self.phases.values()) / self.rows_task

    @property
    def timeout_rate(self) -> float:
        return sum(p.timeouts for p in self.phases.values()) / self.rows_task

    def task_block(self) -> dict[str, Any]:
        """``{"name": task, "env": {reset, step, failure_prob, timeout_s}}`` as plain,
        YAML-serialisable data; deep-merge it over the scenario's task of the same name."""
        env: dict[str, Any] = {ph: self.phases[ph].fit.dist.model_dump(by_alias=True, exclude_none=True)
                               for ph in PHASES}
        env["failure_prob"] = _sig(self.failure_prob, 4)
        env["timeout_s"] = float(self.timeout_s)
        return {"name": self.task, "env": _plain(env)}


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {_plain(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (np.floating, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def read_trace(path: str | Path, task: str) -> tuple[int, dict[str, dict[str, list[float]]]]:
    """(rows in the file, {phase: {status: [latency_s or nan]}}) for ``task``'s rows.
    Raises :class:`TraceError` with a one-line message for a missing file, missing columns,
    a bad value (naming the line) or no rows of the task."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    out: dict[str, dict[str, list[float]]] = {ph: {st: [] for st in STATUSES} for ph in PHASES}
    tasks: set[str] = set()
    rows = 0
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [col for col in TRACE_COLUMNS if col not in header]
        if missing:
            raise TraceError(f"{path}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
                             f"a trace has the columns {','.join(TRACE_COLUMNS)}")
        reader.fieldnames = header
        for row in reader:
            rows += 1
            name = (row.get("task") or "").strip()
            tasks.add(name)
            if name != task:
                continue
            line = reader.line_num
            phase = (row.get("phase") or "").strip()
            status = (row.get("status") or "").strip()
            raw = (row.get("latency_s") or "").strip()
            if phase not in PHASES:
                raise TraceError(f"{path} line {line}: phase '{phase}' is not one of {', '.join(PHASES)}")
            if status not in STATUSES:
                raise TraceError(f"{path} line {line}: status '{status}' is not one of {', '.join(STATUSES)}")
            try:
                latency = float(raw) if raw else math.nan
            except ValueError:
                raise TraceError(f"{path} line {line}: latency_s '{raw}' is not a number") from None
            if status == "ok" and not (math.isfinite(latency) and latency > 0):
                raise TraceError(f"{path} line {line}: an ok call needs a latency_s > 0 (got '{raw}')")
            out[phase][status].append(latency)
    n_task = sum(len(v) for ph in out.values() for v in ph.values())
    if n_task == 0:
        known = ", ".join(sorted(t for t in tasks if t)) or "none"
        raise TraceError(f"{path}: no rows for task '{task}'; tasks in the trace: {known}")
    return rows, out


def fit_env_trace(path: str | Path, task: str, empirical: bool = False, tail_quantile: float = 0.9) -> EnvFitReport:
    """Fit reset and step latencies of ``task`` from the trace at ``path`` (see the module
    docstring for the format and the model) plus its failure and timeout rates."""
    rows_total, data = read_trace(path, task)
    phases: dict[str, PhaseFit] = {}
    for ph in PHASES:
        ok = np.array(data[ph]["ok"], dtype=float)
        if len(ok) < MIN_SAMPLES:
            raise TraceError(f"{path}: task '{task}' has {len(ok)} ok {ph} calls; "
                             f"at least {MIN_SAMPLES} are needed to fit a latency distribution")
        touts = [v for v in data[ph]["timeout"] if math.isfinite(v)]
        try:
            fit = fit_latency(ok, tail_quantile, censored=touts, empirical=empirical)
        except TraceError as exc:
            raise TraceError(f"{path}: task '{task}' {ph}: {exc}") from None
        calls = sum(len(v) for v in data[ph].values())
        phases[ph] = PhaseFit(ph, calls, len(ok), len(data[ph]["error"]), len(data[ph]["timeout"]), fit,
                              tuple(touts))
    rows_task = sum(p.calls for p in phases.values())
    errors = sum(p.errors for p in phases.values())
    timeouts = sum(p.timeouts for p in phases.values())
    failure_prob = errors / max(1, rows_task - timeouts)
    recorded = [v for p in phases.values() for v in p.timeout_latencies]
    notes: list[str] = []
    if recorded:
        timeout_s = max(recorded)
        rule = f"largest latency_s on a timeout row ({len(recorded)} recorded)"
    else:
        p999 = max(float(np.quantile(np.array(data[ph]["ok"]), 0.999)) for ph in PHASES)
        timeout_s = float(max(1, math.ceil(p999)))
        rule = "p99.9 of ok latencies (no timeout values recorded), rounded up to a whole second"
    if timeouts and not recorded:
        notes.append(f"{timeouts} timeouts without a latency_s: counted in the timeout rate, but the fitted "
                     "latencies do not reproduce them (record the timeout value to fit them as censored calls)")
    return EnvFitReport(task=task, source=str(path), rows_total=rows_total, rows_task=rows_task, phases=phases,
                        failure_prob=failure_prob, timeout_s=float(timeout_s), timeout_rule=rule,
                        empirical=empirical, notes=tuple(notes))


# ---------------------------------------------------------------- output


def _fit_date(date: str | _dt.date | None) -> str:
    """The date written into provenance: the argument, else ``SOURCE_DATE_EPOCH`` (reproducible
    builds), else today."""
    if date is not None:
        return str(date)
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.strip().isdigit():
        return _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc).date().isoformat()
    return _dt.date.today().isoformat()


def provenance_lines(report: EnvFitReport, source: str | None = None, date: str | _dt.date | None = None) -> list[str]:
    model = "empirical quantiles" if report.empirical else "spliced: lognormal body + generalized-Pareto tail"
    lines = [f"provenance: env latencies of task '{report.task}' fitted by `rollart calibrate env`",
             f"  trace: {source or report.source} ({report.rows_total:,} rows, {report.rows_task:,} of task "
             f"{report.task})",
             f"  model: {model}"]
    for ph, p in report.phases.items():
        lines.append(f"  {ph}: {p.calls:,} calls ({p.ok:,} ok, {p.errors:,} error, {p.timeouts:,} timeout); "
                     f"KS distance {p.fit.ks:.3f}, threshold at the {p.fit.tail_quantile:.3g} quantile")
    lines.append(f"  failure_prob: errors / calls that did not time out, both phases ({report.failure_prob:.4g})")
    lines.append(f"  timeout_s: {report.timeout_rule}")
    lines.append(f"  fitted: {_fit_date(date)}")
    return lines


def write_task_block(report: EnvFitReport, path: str | Path, source: str | None = None,
                     date: str | _dt.date | None = None) -> Path:
    """Write ``report.task_block()`` as YAML under a ``# provenance`` comment (trace path,
    row counts, fit date: ``date``, else ``SOURCE_DATE_EPOCH``, else today)."""
    path = Path(path)
    head = "".join(f"# {line}\n" for line in provenance_lines(report, source, date))
    body = yaml.safe_dump(report.task_block(), sort_keys=False, default_flow_style=False)
    path.write_text(head + body)
    return path


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    if v == 0:
        return "0"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _params(dist: Union[Spliced, Empirical]) -> str:
    if isinstance(dist, Spliced):
        return (f"spliced · body LN(median {_fmt(dist.median)} s, σ {dist.sigma:.3g}) ≤ {_fmt(dist.threshold)} s · "
                f"tail p {dist.tail_prob:.3g}, GPD ξ {dist.tail_shape:.3g}, β {_fmt(dist.tail_scale)} s · "
                f"mean {_fmt(dist.mean())} s")
    qs = " ".join(f"{p:g}:{_fmt(v)}" for p, v in dist.quantiles.items())
    return f"empirical quantiles (s) {qs}"


def render_env_report(report: EnvFitReport, console: Any) -> None:
    """Print one table per phase (parameters, KS distance, p50/p90/p99/max measured vs
    fitted with relative errors) and the reliability summary."""
    from rich import box
    from rich.table import Table

    for ph, p in report.phases.items():
        fit, gof = p.fit, p.fit.gof
        table = Table(title=f"{report.task} · env.{ph} · {p.calls:,} calls: {p.ok:,} ok, {p.errors:,} error, "
                            f"{p.timeouts:,} timeout", title_justify="left", caption=_params(fit.dist),
                      caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                      min_width=min(getattr(console, "width", 80), 80))
        for col in ("", "measured s", "fitted s", "rel. error"):
            table.add_column(col, justify="left" if not col else "right", no_wrap=True)
        for key in ("p50", "p90", "p99", "max"):
            table.add_row(key, _fmt(gof.measured[key]), _fmt(gof.fitted[key]), f"{gof.rel_error(key):+.1%}")
        other = fit.gof_spliced if fit.gof is fit.gof_empirical else fit.gof_empirical
        other_name = "spliced" if other is fit.gof_spliced else "empirical"
        table.add_row("KS", "", f"{gof.ks:.4f}", f"({other_name} {other.ks:.4f})")
        console.print(table)
        for note in fit.notes:
            console.print(f"  [dim]note: {note}[/]", highlight=False)
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="dim")
    summary.add_column()
    rates = ", ".join(f"{ph} {p.failure_rate:.2%}" for ph, p in report.phases.items())
    trates = ", ".join(f"{ph} {p.timeout_rate:.2%}" for ph, p in report.phases.items())
    summary.add_row("failure rate", f"{report.failure_rate:.2%} of calls ({rates}) → failure_prob "
                                    f"{report.failure_prob:.4g}")
    summary.add_row("timeout rate", f"{report.timeout_rate:.2%} of calls ({trates})")
    summary.add_row("timeout_s", f"{report.timeout_s:g} s — {report.timeout_rule}")
    console.print(summary)
    for note in report.notes:
        console.print(f"[dim]note: {note}[/]", highlight=False)


# ---------------------------------------------------------------- synthetic traces


def default_synthetic_models() -> dict[str, Spliced]:
    """The reset/step models :func:`synthetic_trace` draws from unless told otherwise."""
    return {
        "reset": Spliced(median=20.0, sigma=0.5, threshold=37.0, tail_prob=0.1, tail_shape=0.25, tail_scale=15.0),
        "step": Spliced(median=1.2, sigma=0.6, threshold=2.6, tail_prob=0.1, tail_shape=0.2, tail_scale=1.5),
    }


def synthetic_trace(path: str | Path, task: str, n: int, seed: int, *, reset: Any = None, step: Any = None,
                    failure_prob: float = 0.01, timeout_s: float | None = None,
                    other_tasks: Iterable[str] = ("Other",), other_rows: int = 50,
                    record_timeout_latency: bool = True) -> Path:
    """Write a trace of ``n`` reset and ``n`` step calls of ``task`` drawn from ``reset`` and
    ``step`` (distributions; :func:`default_synthetic_models` when omitted), shuffled, plus
    ``other_rows`` rows of each of ``other_tasks`` (which a fit must ignore). A call whose
    latency exceeds ``timeout_s`` is written as a timeout at ``timeout_s`` (an empty latency
    unless ``record_timeout_latency``); any other call is an error with ``failure_prob``."""
    rng = np.random.default_rng(seed)
    models = default_synthetic_models()
    dists = {"reset": reset or models["reset"], "step": step or models["step"]}
    rows: list[tuple[str, str, str, str]] = []

    def calls(name: str, count: int) -> None:
        for ph in PHASES:
            for _ in range(count):
                lat = float(dists[ph].sample(rng))
                if timeout_s is not None and lat > timeout_s:
                    rows.append((name, ph, f"{timeout_s:g}" if record_timeout_latency else "", "timeout"))
                elif rng.random() < failure_prob:
                    rows.append((name, ph, f"{lat:.6g}", "error"))
                else:
                    rows.append((name, ph, f"{max(lat, 1e-6):.6g}", "ok"))

    calls(task, n)
    for other in other_tasks:
        calls(other, other_rows)
    order = rng.permutation(len(rows))
    path = Path(path)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(TRACE_COLUMNS)
        for i in order:
            w.writerow(rows[i])
    return path


__all__ = ["EMPIRICAL_LEVELS", "EnvFitReport", "Fit", "GoodnessOfFit", "MIN_SAMPLES", "PhaseFit", "TRACE_COLUMNS",
           "TraceError", "default_synthetic_models", "fit_env_trace", "fit_latency", "goodness_of_fit", "model_cdf",
           "model_ppf", "provenance_lines", "read_trace", "render_env_report", "synthetic_trace", "write_task_block"]
