"""``rollart validate``: run a plan for real, simulate the same plan calibrated on this machine,
and put the two side by side.

1. profile: the engine, the generate call, the trainer and the weight hand-off, measured here
   (:mod:`rollart.validate.profile`), or a fresh enough earlier profile of the same model;
2. real: ``rollart run`` of the plan (Ray actors, real envs with their injected latency);
3. sim: the same plan, with every generation pool and the trainer pointed at that profile;
4. compare (:mod:`rollart.validate.compare`), and write both JSON results, both Perfetto
   traces, ``validation.json`` and ``validation.png``."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from rollart.calibration.profiles import EngineProfile, TrainProfile, load_profile
from rollart.plan import Plan
from rollart.plan.loader import plan_from_dict
from rollart.report import RunResult
from rollart.validate.compare import Figure, compare_seeds, engine_in_run

Progress = Callable[[str], None]


def default_profile_dir(plan: Plan) -> Path:
    return Path.home() / ".cache" / "rollart" / "validate" / f"{platform.node() or 'host'}-{plan.model.name}"


def fresh_profile(directory: Path, plan: Plan, max_age_h: float) -> bool:
    """An earlier profile can be reused: all three files there, for this model, younger than
    ``max_age_h``, and measured the way this version measures (``PROFILE_FORMAT``)."""
    from rollart.validate.profile import PROFILE_FORMAT

    engine, train, host = directory / "engine.yaml", directory / "train.yaml", directory / "host.yaml"
    if not (engine.is_file() and train.is_file() and host.is_file()):
        return False
    if time.time() - min(engine.stat().st_mtime, train.stat().st_mtime) > max_age_h * 3600:
        return False
    try:
        e, t = load_profile(engine), load_profile(train)
        measured = yaml.safe_load(host.read_text()) or {}
    except (OSError, ValueError, yaml.YAMLError):
        return False
    if not isinstance(measured, dict) or measured.get("format") != PROFILE_FORMAT:
        return False
    model = plan.run_model.name.lower()
    return (isinstance(e, EngineProfile) and isinstance(t, TrainProfile)
            and e.model.lower() == model and t.model.lower() == model)


def calibrated_plan(plan: Plan, engine: Path, train: Path, host: Path | None = None) -> Plan:
    """The same plan with every generation pool and the trainer on the measured profiles, and
    the env pools' call overheads as measured (``host.yaml``)."""
    data = plan.model_dump(mode="json", exclude_unset=True)
    for g in plan.placement.generation:
        data["cluster"]["gpu_pools"][g.pool]["profile"] = str(engine)
    # the engine profile measured its engine's own step overhead: a stated one would be counted twice
    for g in data["placement"].get("generation") or []:
        g.pop("step_overhead_ms", None)
    reward = data["placement"].get("reward") or {}
    if reward.get("pool") in {g.pool for g in plan.placement.generation}:
        reward.pop("step_overhead_ms", None)
    data["placement"]["trainer"]["profile"] = str(train)
    if host is not None and host.is_file():
        measured = yaml.safe_load(host.read_text())
        for pool in data["cluster"]["cpu_pools"].values():
            pool["reset_overhead_s"] = measured["env_reset_overhead_s"]
            pool["step_overhead_s"] = measured["env_step_overhead_s"]
    return plan_from_dict(data, [])


@dataclass
class Validation:
    plan: Plan
    real: RunResult
    sim: RunResult
    figures: list[Figure]
    profile: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    warmup: int = 1
    sim_seeds: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.plan.name, "mode": self.real.mode, "seed": self.real.seed,
                "steps": len(self.real.steps), "warmup_steps": self.warmup, "sim_seeds": self.sim_seeds,
                "profile": self.profile,
                "figures": [f.to_dict() for f in self.figures], "files": self.files,
                "real_error": self.real.error, "sim_error": self.sim.error}


def validate(plan: Plan, out: Path, *, mode: Optional[str] = None, profile_dir: Optional[Path] = None,
             reprofile: bool = False, max_profile_age_h: float = 24.0, warmup: int = 1, sim_seeds: int = 16,
             progress: Optional[Progress] = None, on_step: Optional[Callable[[Any], None]] = None) -> Validation:
    """Profile (or reuse a fresh profile), run ``plan`` for real, simulate it calibrated, compare,
    and write everything under ``out``. ``sim_seeds``: simulate the plan's seed and the
    ``sim_seeds − 1`` next ones and compare the real run with their mean (``sim.json`` and its
    trace are the plan's own seed)."""
    import ray

    from rollart.core.modes import mode_config
    from rollart.runtime.backend import RuntimeBackend
    from rollart.runtime.cluster import start_ray
    from rollart.sim import simulate_plan
    from rollart.trace import Tracer
    from rollart.validate.profile import LocalProfiler

    say = progress or (lambda _m: None)
    out.mkdir(parents=True, exist_ok=True)
    profile_dir = profile_dir or default_profile_dir(plan)
    cfg = mode_config(plan, mode)
    started = not ray.is_initialized()
    start_ray(plan)  # one Ray for the profile and the run
    try:
        profile_info: dict[str, Any] = {"dir": str(profile_dir)}
        if not reprofile and fresh_profile(profile_dir, plan, max_profile_age_h):
            say(f"reusing the profile in {profile_dir}")
            profile_info["reused"] = True
        else:
            measured = LocalProfiler(plan, seed=plan.algorithm.seed, progress=say).run(profile_dir)
            profile_info.update(reused=False, **measured.figures)
        engine_yaml, train_yaml = profile_dir / "engine.yaml", profile_dir / "train.yaml"
        say("real run")
        real_tracer = Tracer()
        outcome = RuntimeBackend(plan, cfg, plan.algorithm.seed, tracer=real_tracer, on_step=on_step,
                                 record_engine_steps=True).run()
        real = outcome.to_result()
        step_log = [st for w in outcome.worker_stats for st in w.get("step_log", [])]
        request_log = [{"worker": i, **r} for i, w in enumerate(outcome.worker_stats) for r in w.get("request_log", [])]
    finally:
        if started:
            ray.shutdown()
    say("simulation")
    sim_plan = calibrated_plan(plan, engine_yaml, train_yaml, profile_dir / "host.yaml")
    sim_tracer = Tracer()
    sim_mode = mode_config(sim_plan, mode)
    sim = simulate_plan(sim_plan, sim_mode, sim_plan.algorithm.seed, sim_tracer).to_result()
    seeds, sims = [sim_plan.algorithm.seed], [sim]
    for k in range(sim_plan.algorithm.seed + 1, sim_plan.algorithm.seed + max(1, sim_seeds)):
        other = simulate_plan(sim_plan, sim_mode, k).to_result()
        if other.steps:
            seeds.append(k)
            sims.append(other)
        else:  # the plan's own seed stands; a failed extra seed is reported, not averaged
            say(f"simulated seed {k} stopped without steps: {other.error}")
    figures = compare_seeds(real, sims, warmup) if real.steps and sim.steps else []
    if figures and step_log:
        figures.append(engine_in_run(step_log, load_profile(engine_yaml)))
    files = {"real_json": "real.json", "sim_json": "sim.json", "real_trace": "real.trace.json",
             "sim_trace": "sim.trace.json", "plot": "validation.png", "summary": "validation.json"}
    real.write_json(out / files["real_json"])
    if step_log:
        files["engine_steps"] = "real.engine-steps.json"
        (out / files["engine_steps"]).write_text(json.dumps(step_log) + "\n")
    if request_log:
        files["engine_requests"] = "real.engine-requests.json"
        (out / files["engine_requests"]).write_text(json.dumps(request_log) + "\n")
    sim.write_json(out / files["sim_json"])
    real_tracer.write(out / files["real_trace"])
    sim_tracer.write(out / files["sim_trace"])
    for name in ("engine.yaml", "train.yaml", "host.yaml", "engine.csv"):
        if (profile_dir / name).is_file():
            (out / f"profile-{name}").write_text((profile_dir / name).read_text())
    result = Validation(plan, real, sim, figures, profile_info, files, warmup, seeds)
    if figures:
        from rollart.validate.plots import plot_validation

        plot_validation(result, out / files["plot"], warmup)
    else:
        files.pop("plot")
    (out / files["summary"]).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result
