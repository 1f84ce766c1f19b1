"""Fit an engine profile from an end-to-end profiling CSV (``rollart calibrate profile``).

    prefill(N, A) = a + b·N + c·A     N new tokens, A = Σ new·(cached + new/2) attention pairs
    decode(B, X)  = a + b·B + c·X     B sequences, X = Σ cached tokens

Non-negative least squares on relative errors (each row divided by its latency), scored by
MAPE on rows held out of the fit."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from scipy.optimize import lsq_linear

from rollart.calibration.kernels import mape, split
from rollart.calibration.profiles import ComponentFit, EngineProfile, PhaseError

COLUMNS = ("phase", "batch_size", "kv_len", "new_tokens", "latency_us")


class EngineFitError(ValueError):
    pass


def _features(rows: list[dict[str, str]], phase: str) -> tuple[np.ndarray, np.ndarray]:
    X, y = [], []
    for r in rows:
        if r["phase"] != phase:
            continue
        b, kv, new = float(r["batch_size"]), float(r["kv_len"]), float(r["new_tokens"])
        if phase == "prefill":
            X.append([1.0, b * new, b * new * (kv + new / 2)])
        else:
            X.append([1.0, b, b * kv])
        y.append(float(r["latency_us"]) * 1e-6)
    return np.array(X), np.array(y)


def fit_linear(X: np.ndarray, y: np.ndarray, formula: str, source: str) -> ComponentFit:
    train, held = split(len(y))
    sol = lsq_linear(X[train] / y[train, None], np.ones(len(train)), bounds=(0, np.inf))
    a, b, c = (float(v) for v in sol.x)
    pred = X @ sol.x
    return ComponentFit(formula=formula, params={"a": float(f"{a:.6g}"), "b": float(f"{b:.6g}"), "c": float(f"{c:.6g}")},
                        data=[source], rows=len(train), heldout_rows=len(held),
                        mape_train=round(mape(pred[train], y[train]), 4),
                        mape_heldout=round(mape(pred[held], y[held]), 4) if len(held) else None)


def fit_engine_csv(path: Path, gpu: str, model: str, engine: str = "torch") -> EngineProfile:
    with Path(path).open() as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise EngineFitError(f"{path}: missing columns {', '.join(missing)} (expected the format written by "
                                 "`rollart calibrate profile`)")
        rows = list(reader)
    fits = {}
    for phase, formula in (("prefill", "a + b·N + c·A"), ("decode", "a + b·B + c·X")):
        X, y = _features(rows, phase)
        if len(y) < 5:
            raise EngineFitError(f"{path}: {len(y)} {phase} rows; at least 5 are needed to fit and hold some out")
        if np.any(y <= 0):
            raise EngineFitError(f"{path}: {phase} latencies must be positive")
        fits[phase] = fit_linear(X, y, formula, str(path))
    return EngineProfile(
        gpu=gpu, model=model, engine=engine, prefill=fits["prefill"], decode=fits["decode"],
        fit_error=PhaseError(prefill_mape_heldout=fits["prefill"].mape_heldout,
                             decode_mape_heldout=fits["decode"].mape_heldout,
                             note="rows held out of the least-squares fit"),
        assumptions=["engine step overheads are inside the measured latencies; KV capacity comes from the "
                     "GPU type's memory in the scenario"],
        source=f"measured with the {engine} engine ({path})",
    )


def step_features(step: dict[str, float], padded: bool = False) -> list[float]:
    """[has prefill, N, A, has decode, B, X] of one logged engine step (see ``fit_engine_steps``);
    ``padded``: X is rows × the longest row (the engine pads its KV), else Σ contexts."""
    n, tokens = float(step["prefill_requests"]), float(step["prefill_tokens"])
    rows, kv = float(step["decode_rows"]), float(step["decode_padded" if padded else "decode_kv"])
    pairs = n * (tokens / n) ** 2 / 2 if n else 0.0  # fresh contexts: n sequences of the mean length
    return [1.0 if n else 0.0, tokens, pairs, 1.0 if rows else 0.0, rows, kv]


def predict_step(profile: EngineProfile, step: dict[str, float]) -> float:
    """The profile's time for one logged engine step: the features ``fit_engine_steps`` fits,
    priced by the profile (a mixed step pays the decode's fixed cost only when the profile says
    prefill and decode run as separate forwards), plus the GIL hand-off when generate calls
    arrived or returned during the step."""
    padded = profile.kv_layout == "padded" and "decode_padded" in step
    has_p, n, a, has_d, b, x = step_features(step, padded)
    p, d = profile.prefill.params, profile.decode.params
    if has_p and has_d and profile.mixed_step == "one_fixed_cost":
        has_d = 0.0
    calls = profile.call_step_s if step.get("call_events", 0) else 0.0
    return has_p * p["a"] + n * p["b"] + a * p["c"] + has_d * d["a"] + b * d["b"] + x * d["c"] + calls


def fit_engine_steps(steps: list[dict[str, float]], gpu: str, model: str, engine: str, source: str,
                     data: list[str] | None = None) -> EngineProfile:
    """Fit an engine profile to logged engine steps (``InferenceWorker.record_steps``), pure and
    mixed alike: step = [prefill] (a_p + b_p·N + c_p·A) + [decode] (a_d + b_d·B + c_d·X) + [calls] g,
    so a step that both prefills and decodes pays both fixed costs (the torch engine runs them as
    separate forwards and then merges the new rows in). [calls]: generate calls arrived at or
    returned from the worker during the step (``call_events``, when every step has it). Their
    Python runs on the actor's event loop and takes the GIL from the engine thread for about a
    switch interval, however many calls it handles at once, so a step pays ``g`` (``call_step_s``)
    once. Non-negative least squares (absolute
    errors: the fit is the expected step time); MAPE on held-out steps. ``data``: the files of
    measured rows that ``calibrate show --plot`` draws (default ``[source]``)."""
    if len(steps) < 12:
        raise EngineFitError(f"{source}: {len(steps)} engine steps; at least 12 are needed to fit and hold some out")
    padded = all("decode_padded" in s for s in steps)  # the engine reports its padded KV
    with_calls = [1.0 if s.get("call_events") else 0.0 for s in steps]
    # the call term needs the count on every step, and steps both with and without calls (a column
    # of all ones would be one more fixed cost and split arbitrarily with the others)
    calls = all("call_events" in s for s in steps) and 0.0 < sum(with_calls) < len(steps)
    X = np.array([step_features(s, padded) + ([c] if calls else []) for s, c in zip(steps, with_calls)])
    y = np.array([float(s["seconds"]) for s in steps])
    if np.any(y <= 0):
        raise EngineFitError(f"{source}: step times must be positive")
    train, held = split(len(y))
    # Absolute, not relative, errors: the simulator needs a step's expected time, and a run's
    # occasional stalls (GC, a descheduled thread) are part of it.
    sol = lsq_linear(X[train], y[train], bounds=(0, np.inf))
    pred = X @ sol.x
    pre, dec = X[:, 0] > 0, X[:, 3] > 0
    heldout = np.zeros(len(y), dtype=bool)
    heldout[held] = True

    def part(names: tuple[str, str, str], coef: np.ndarray, rows: np.ndarray, formula: str) -> ComponentFit:
        tr, ho = rows & ~heldout, rows & heldout
        return ComponentFit(formula=formula, params={k: float(f"{v:.6g}") for k, v in zip(names, coef)},
                            data=list(data or [source]), rows=int(tr.sum()), heldout_rows=int(ho.sum()),
                            mape_train=round(mape(pred[tr], y[tr]), 4) if tr.any() else None,
                            mape_heldout=round(mape(pred[ho], y[ho]), 4) if ho.any() else None)

    prefill = part(("a", "b", "c"), sol.x[:3], pre, "a + b·N + c·A (steps that prefill; decode part added)")
    decode = part(("a", "b", "c"), sol.x[3:6], dec & ~pre, "a + b·B + c·X (decode-only steps)")
    return EngineProfile(
        gpu=gpu, model=model, engine=engine, prefill=prefill, decode=decode, mixed_step="both_fixed_costs",
        call_step_s=float(f"{sol.x[6]:.6g}") if calls else 0.0,
        kv_layout="padded" if padded else "paged",
        fit_error=PhaseError(prefill_mape_heldout=prefill.mape_heldout, decode_mape_heldout=decode.mape_heldout,
                             note=f"held-out engine steps ({int(heldout.sum())} of {len(y)}); 'prefill' = steps "
                                  "with a prefill, mixed ones included"),
        source=source)
