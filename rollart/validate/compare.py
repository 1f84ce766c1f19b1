"""Side by side: what the real run measured and what the simulator predicted for the same plan.

Both results come from the same core (same StepRecords, same summary keys), so each figure is
read the same way from both. The first ``warmup`` steps are left out of the step figures on
both sides: a real run's first step also pays Python/torch first-use costs that no plan
describes, and the simulator's first step fills an empty pipeline."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rollart.core.stats import BREAKDOWN_KEYS
from rollart.report import RunResult, p90


@dataclass
class Figure:
    name: str
    real: float
    sim: float
    unit: str = "s"
    kind: str = "relative"   # "relative": (sim − real) / real; "absolute": sim − real (counts)
    headline: bool = False   # one of the figures the acceptance bound applies to
    sim_range: tuple[float, float] | None = None  # lowest and highest over the simulated seeds
    sim_span_s: float | None = None  # rates: the simulated seconds the rate was measured over

    @property
    def error(self) -> float | None:
        if self.kind == "absolute":
            return self.sim - self.real
        if self.real == 0:
            return 0.0 if self.sim == 0 else None
        return (self.sim - self.real) / self.real

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "error": self.error}


def step_figures(result: RunResult, warmup: int) -> dict[str, float]:
    """Step time, breakdown and throughput over the steps after ``warmup``."""
    steps = result.steps[warmup:] if len(result.steps) > warmup else result.steps
    if not steps:
        return {}
    times = [s.time_s for s in steps]
    span = steps[-1].end_s - steps[0].start_s
    trajs = sum(s.trajectories for s in steps)
    out = {"step_time_mean": sum(times) / len(times), "step_time_p90": p90(times),
           "trajectories_per_s": trajs / span if span > 0 else 0.0, "span_s": span}
    for key in BREAKDOWN_KEYS:
        out[f"breakdown.{key}"] = sum(s.breakdown_s.get(key, 0.0) for s in steps) / len(steps)
    return out


def compare(real: RunResult, sim: RunResult, warmup: int = 1) -> list[Figure]:
    r, s = step_figures(real, warmup), step_figures(sim, warmup)
    figs = [Figure("step time, mean", r["step_time_mean"], s["step_time_mean"], headline=True),
            Figure("step time, p90", r["step_time_p90"], s["step_time_p90"]),
            Figure("trajectories/s", r["trajectories_per_s"], s["trajectories_per_s"], unit="1/s", headline=True,
                   sim_span_s=s["span_s"])]
    for key in BREAKDOWN_KEYS:
        figs.append(Figure(f"breakdown: {key}", r[f"breakdown.{key}"], s[f"breakdown.{key}"]))
    rs, ss = real.summary, sim.summary
    for pool in sorted(set(rs.get("gpu_busy_fraction", {})) | set(ss.get("gpu_busy_fraction", {}))):
        figs.append(Figure(f"busy fraction: {pool}", rs.get("gpu_busy_fraction", {}).get(pool, 0.0),
                           ss.get("gpu_busy_fraction", {}).get(pool, 0.0), unit="", kind="absolute"))
    figs.append(Figure("generated tokens/s", rs.get("tokens_per_s", 0.0), ss.get("tokens_per_s", 0.0), unit="1/s",
                       sim_span_s=sim.steps[-1].end_s if sim.steps else 0.0))  # over the whole run
    figs.append(Figure("mean staleness", rs.get("mean_staleness", 0.0), ss.get("mean_staleness", 0.0),
                       unit="versions", kind="absolute"))
    for key, label in (("aborted_stale", "aborted: stale"), ("aborted_redundant", "aborted: redundant"),
                       ("env_failures", "env failures")):
        figs.append(Figure(label, float(rs.get(key, 0)), float(ss.get(key, 0)), unit="trajs", kind="absolute"))
    return figs


def compare_seeds(real: RunResult, sims: list[RunResult], warmup: int = 1) -> list[Figure]:
    """``compare`` against several simulated seeds of the plan: each figure's ``sim`` is the mean
    over the seeds and ``sim_range`` their spread. A plan whose α window makes groups race one
    another has run-to-run swings that one seed cannot average out; the mean is the estimate.
    Rates are pooled, ``Σ rate·span / Σ span``: all the seeds' work over all their time, the
    rate of one long run. The plain mean of rates would lean towards the fast seeds
    (E[1/T] ≥ 1/E[T]) and disagree with the mean step time."""
    per_seed = [{f.name: f for f in compare(real, sim, warmup)} for sim in sims]
    figs = list(per_seed[0].values())
    if len(sims) > 1:
        for f in figs:
            # a busy fraction of a pool one seed never used is absent there: it counts as 0
            values = [seed[f.name].sim if f.name in seed else 0.0 for seed in per_seed]
            spans = [seed[f.name].sim_span_s if f.name in seed else None for seed in per_seed]
            if f.unit == "1/s" and all(s is not None for s in spans) and sum(spans) > 0:
                f.sim = sum(v * s for v, s in zip(values, spans)) / sum(spans)
                f.sim_span_s = sum(spans)
            else:
                f.sim = sum(values) / len(values)
            f.sim_range = (min(values), max(values))
    return figs


def headline_errors(figs: list[Figure]) -> dict[str, float | None]:
    return {f.name: f.error for f in figs if f.headline}


def engine_in_run(log: list[dict[str, float]], profile: Any) -> Figure:
    """Mean engine step time during the real run, measured vs what the engine profile predicts
    for the same steps: does the profile still hold inside the run (contention, threads)?"""
    measured = sum(st["seconds"] for st in log) / len(log)
    from rollart.calibration.engine_fit import predict_step

    predicted = sum(predict_step(profile, st) for st in log) / len(log)
    return Figure("engine step in the run (profile check)", measured, predicted)
