"""`rollart validate`: measured profiles feed the simulator; real and simulated runs side by side.

The end-to-end test runs one small validation for real (Ray, the torch engine, Mooncake) and
asserts the step-time and throughput errors stay under the bound calibration/VALIDATION.md
establishes for CI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollart.calibration.engine_fit import fit_linear
from rollart.calibration.profiles import ComponentFit, TrainProfile, load_profile, save_profile
from rollart.core.stats import StepRecord
from rollart.plan import PlanError, load_plan
from rollart.report import RunResult
from rollart.scenarios_catalog import resolve
from rollart.validate.compare import Figure, compare, step_figures
from tests.conftest import run_sim

ROOT = Path(__file__).parents[1]
LOCAL = ROOT / "scenarios" / "local"
VALIDATE_SCENARIOS = sorted(p.stem for p in LOCAL.glob("validate-*.yaml"))
ROLLART = str(Path(sys.executable).parent / "rollart")

# The CI bound on |step-time error| and |throughput error| of the small validation below. The
# acceptance target for the full runs is 10 % (VALIDATION.md); CI machines are shared and the
# run is short (5 steps, 4 compared), so it gets more room — but a model that lost the
# overheads or the contention it measures misses it (see VALIDATION.md, "before the fixes").
CI_BOUND = 0.25


def _train_profile(tmp_path: Path, a: float = 0.5, b: float = 1e-3, c: float = 0.0) -> Path:
    fit = ComponentFit(formula="a + b·T + c·S", params={"a": a, "b": b, "c": c})
    path = tmp_path / "train.yaml"
    save_profile(TrainProfile(gpu="cpu", model="Qwen3-tiny", trainer="torch", step=fit, publish_pull_s=0.25,
                              broadcast_s=0.5, swap_s=0.125), path)
    return path


def test_at_least_six_local_validation_scenarios_differ_where_it_matters() -> None:
    plans = {name: load_plan(resolve(f"local/{name}")) for name in VALIDATE_SCENARIOS}
    assert len(plans) >= 6
    modes = {p.algorithm.mode for p in plans.values()}
    alphas = {p.algorithm.alpha for p in plans.values() if p.algorithm.mode == "rollart"}
    sigmas = {p.tasks[0].env.step.std for p in plans.values()}
    assert {"sync", "rollart"} <= modes and {0, 1, 2} <= alphas
    assert max(sigmas) >= 5 * min(sigmas)
    assert {0.0, 0.25} <= {p.algorithm.redundancy for p in plans.values()}
    assert any(len(set(p.placement.hw_affinity.values())) == 2 for p in plans.values())
    for p in plans.values():  # the torch engine has no prefix cache: the plans must not assume one
        assert p.placement.prefix_cache is False


def test_train_profile_drives_the_simulated_trainer(tmp_path: Path) -> None:
    path = _train_profile(tmp_path)
    assert load_profile(path) == load_profile(path)  # round trip
    base = ["algorithm.steps=2"]
    plan = load_plan(resolve("local/validate-sync"), [*base, f"placement.trainer.profile={path}"])
    out = run_sim(plan).to_result()
    assert "measured train profile cpu/Qwen3-tiny" in out.calibration["trainer"]
    step = out.steps[-1]
    tokens = step.tokens
    assert step.breakdown_s["train"] == pytest.approx(0.5 + 1e-3 * tokens, rel=1e-6)
    assert step.breakdown_s["weight_sync"] == pytest.approx(0.5, rel=1e-6)  # the measured broadcast


def test_wrong_profile_kinds_are_plan_errors(tmp_path: Path) -> None:
    train = _train_profile(tmp_path)
    with pytest.raises(PlanError, match="cluster.gpu_pools.pool_a.profile: .*train profile"):
        run_sim(load_plan(resolve("local/validate-rollart"), [f"cluster.gpu_pools.pool_a.profile={train}"]))
    kernel = ROOT / "calibration" / "profiles" / "h20.yaml"
    with pytest.raises(PlanError, match="placement.trainer.profile: .*kernel profile, not a train profile"):
        run_sim(load_plan(resolve("local/validate-rollart"), [f"placement.trainer.profile={kernel}"]))


def _engine_csv(tmp_path: Path) -> Path:
    """A linear engine profile's rows: prefill 1 ms + 5 µs/token, decode 0.8 ms + 50 µs/row."""
    rows = tmp_path / "p.csv"
    lines = ["phase,batch_size,kv_len,new_tokens,latency_us"]
    for b in (1, 2, 4, 8, 16):
        for n in (16, 64, 256):
            lines.append(f"prefill,{b},0,{n},{1000 + 5 * b * n}")
            lines.append(f"decode,{b},{n},1,{800 + 50 * b + 0.1 * b * n}")
    rows.write_text("\n".join(lines) + "\n")
    return rows


def test_request_overhead_delays_every_generate_call(tmp_path: Path) -> None:
    rows = _engine_csv(tmp_path)
    from rollart.calibration.engine_fit import fit_engine_csv

    times = {}
    for overhead in (0.0, 0.05):
        profile = fit_engine_csv(rows, gpu="cpu", model="Qwen3-tiny")
        profile.request_overhead_s = overhead
        save_profile(profile, tmp_path / f"e{overhead}.yaml")
        sets = [f"cluster.gpu_pools.{p}.profile={tmp_path / f'e{overhead}.yaml'}" for p in ("pool_a", "pool_b")]
        plan = load_plan(resolve("local/validate-sync"), [*sets, "algorithm.steps=2"])
        times[overhead] = run_sim(plan).to_result().steps[-1].time_s
    # Sync: three turns in lockstep, each one generate call later by the overhead
    assert times[0.05] - times[0.0] == pytest.approx(3 * 0.05, rel=0.05)


def test_fit_linear_recovers_a_train_line() -> None:
    import numpy as np

    # n sequences of length L: T = n·L tokens, S = n·L²
    X = np.array([[1.0, n * L, n * L * L] for n in (4, 8, 16, 32) for L in (32, 128, 384)])
    y = 0.02 + 3e-5 * X[:, 1] + 1e-9 * X[:, 2]
    fit = fit_linear(X, y, "a + b·T + c·S", "synthetic")
    assert fit.params["a"] == pytest.approx(0.02, rel=1e-3)
    assert fit.params["b"] == pytest.approx(3e-5, rel=1e-3)
    assert fit.params["c"] == pytest.approx(1e-9, rel=1e-2)


def test_fit_engine_steps_prices_mixed_steps_with_both_fixed_costs() -> None:
    import random

    from rollart.calibration.engine_fit import fit_engine_steps

    rnd = random.Random(0)
    truth = {"ap": 2e-3, "bp": 1e-5, "cp": 2e-9, "ad": 1.5e-3, "bd": 8e-5, "cd": 2e-7}
    steps = []
    for _ in range(400):
        n = rnd.choice([0, 0, 1, 2, 4, 8])
        rows = rnd.choice([0, 1, 4, 8, 16]) if n else rnd.choice([1, 4, 8, 16])
        per = rnd.choice([16, 64, 192])
        kv = rows * rnd.choice([20, 80, 200])
        t = (truth["ap"] + truth["bp"] * n * per + truth["cp"] * n * per * per / 2 if n else 0.0) + \
            (truth["ad"] + truth["bd"] * rows + truth["cd"] * kv if rows else 0.0)
        steps.append({"prefill_requests": n, "prefill_tokens": n * per, "decode_rows": rows, "decode_kv": kv,
                      "seconds": t})
    profile = fit_engine_steps(steps, gpu="cpu", model="Qwen3-tiny", engine="torch", source="synthetic")
    assert profile.mixed_step == "both_fixed_costs"
    assert profile.prefill.params["a"] == pytest.approx(truth["ap"], rel=1e-3)
    assert profile.decode.params["b"] == pytest.approx(truth["bd"], rel=1e-3)
    assert profile.fit_error.decode_mape_heldout < 1e-3


def test_fit_engine_steps_prices_the_gil_hand_off_of_generate_calls() -> None:
    """Steps during which generate calls arrived or returned (``call_events``) pay ``call_step_s``
    once, whatever their number; the other coefficients are recovered as without calls."""
    import random

    from rollart.calibration.engine_fit import fit_engine_steps, predict_step

    rnd = random.Random(1)
    steps = []
    for _ in range(400):
        rows, calls = rnd.choice([1, 4, 8, 16]), rnd.choice([0, 0, 0, 1, 2, 5])
        kv = rows * rnd.choice([20, 80, 200])
        steps.append({"prefill_requests": 0, "prefill_tokens": 0, "decode_rows": rows, "decode_kv": kv,
                      "call_events": calls, "seconds": 1.5e-3 + 8e-5 * rows + 2e-7 * kv + (4e-3 if calls else 0.0)})
    profile = fit_engine_steps(steps, gpu="cpu", model="Qwen3-tiny", engine="torch", source="synthetic")
    assert profile.call_step_s == pytest.approx(4e-3, rel=1e-3)
    assert profile.decode.params["a"] == pytest.approx(1.5e-3, rel=1e-3)
    assert predict_step(profile, steps[0]) == pytest.approx(steps[0]["seconds"], rel=1e-3)
    # logs without the count (older runs, other engines) fit as before, with no call cost
    bare = [{k: v for k, v in s.items() if k != "call_events"} for s in steps]
    assert fit_engine_steps(bare, gpu="cpu", model="Qwen3-tiny", engine="torch", source="s").call_step_s == 0.0
    # calls in every step: indistinguishable from a fixed cost, so not split off as one
    busy = [{**s, "call_events": 1} for s in steps]
    assert fit_engine_steps(busy, gpu="cpu", model="Qwen3-tiny", engine="torch", source="s").call_step_s == 0.0


def _result(times: list[float], trajs: int = 8, backend: str = "sim", stale: int = 0) -> RunResult:
    steps, t = [], 0.0
    for i, dt in enumerate(times):
        steps.append(StepRecord(step=i, start_s=t, end_s=t + dt, breakdown_s={"generation": dt}, trajectories=trajs,
                                tokens=100, mean_staleness=0.0))
        t += dt
    return RunResult(scenario="x", mode="sync", seed=0, backend=backend, steps=steps,
                     summary={"gpu_busy_fraction": {"a": 0.5}, "aborted_stale": stale})


def test_compare_skips_warmup_and_signs_errors() -> None:
    real, sim = _result([9.0, 2.0, 2.0, 2.0], stale=1), _result([1.0, 1.8, 1.8, 1.8])
    figs = {f.name: f for f in compare(real, sim, warmup=1)}
    assert figs["step time, mean"].real == pytest.approx(2.0)
    assert figs["step time, mean"].error == pytest.approx(-0.1)
    assert figs["trajectories/s"].error == pytest.approx(2.0 / 1.8 - 1)
    assert figs["aborted: stale"].error == -1  # counts compare as differences
    assert step_figures(real, 0)["step_time_mean"] == pytest.approx(3.75)
    assert Figure("x", 0.0, 0.0).error == 0.0 and Figure("x", 0.0, 1.0).error is None


def test_compare_seeds_takes_the_mean_of_the_simulated_seeds_and_keeps_their_range() -> None:
    from rollart.validate.compare import compare_seeds

    real = _result([9.0, 2.0, 2.0, 2.0], stale=1)
    sims = [_result([1.0, 1.8, 1.8, 1.8]), _result([1.0, 2.4, 2.4, 2.4], stale=3)]
    figs = {f.name: f for f in compare_seeds(real, sims, warmup=1)}
    assert figs["step time, mean"].sim == pytest.approx(2.1)
    assert figs["step time, mean"].sim_range == pytest.approx((1.8, 2.4))
    assert figs["step time, mean"].error == pytest.approx(0.05)
    assert figs["aborted: stale"].sim == pytest.approx(1.5)
    # the rate of both seeds' work over both their times (8 trajectories in 1.8 s and in 2.4 s),
    # which agrees with the mean step time; the mean of the two rates would say 3.89/s
    assert figs["trajectories/s"].sim == pytest.approx(8 / 2.1)
    assert figs["trajectories/s"].error == pytest.approx(2.0 / 2.1 - 1)
    # pooled over the seeds' whole runs (6.4 s and 8.2 s): a seed that generated nothing counts
    sims[1].summary["tokens_per_s"] = 10.0
    pooled = {f.name: f for f in compare_seeds(real, sims, warmup=1)}["generated tokens/s"]
    assert pooled.sim == pytest.approx(10.0 * 8.2 / (6.4 + 8.2)) and pooled.sim_range == (0.0, 10.0)
    one = {f.name: f for f in compare_seeds(real, sims[:1], warmup=1)}
    assert one["step time, mean"].sim_range is None and one["step time, mean"].sim == pytest.approx(1.8)


def test_in_run_parallelism_reads_how_much_engines_slow_each_other_down() -> None:
    from rollart.validate.profile import busy_engines, in_run_parallelism

    def logs(shared_s: float) -> list[list[dict[str, float]]]:
        alone = [{"started": i * 0.01, "seconds": 0.01} for i in range(10)]
        both = [{"started": 0.1 + j * shared_s, "seconds": shared_s} for j in range(10)]
        return [alone + both, [dict(st) for st in both]]

    assert busy_engines(logs(0.0125)) == [[1] * 10 + [2] * 10, [2] * 10]
    predict = lambda st: 0.01  # noqa: E731 - every step is the same work
    # 25 % slower side by side: slowdown(2) / slowdown(1) = 2 / P = 1.25
    assert in_run_parallelism(logs(0.0125), predict, probe=2.1) == pytest.approx(1.6)
    assert in_run_parallelism(logs(0.0125), predict, probe=1.5) == 1.5   # never above the probe
    assert in_run_parallelism(logs(0.01), predict, probe=2.1) == 2.1     # no interference seen
    assert in_run_parallelism([logs(0.01)[0]], predict, probe=2.1) == 2.1  # one engine: cannot tell


def test_in_run_request_overhead_is_the_round_trip_beyond_the_workers_time() -> None:
    from rollart.validate.profile import MIN_MATCHED_CALLS, in_run_request_overhead

    def entry(i: int, reason: str = "length") -> dict:
        # 3 ms waiting for the step boundary + 100 ms of steps (the engine's) + 1 ms replying
        return {"request": f"{i}-0.0", "finish_reason": reason, "called": 10.0 + i, "added": 10.003 + i,
                "done": 10.103 + i, "returned": 10.104 + i}

    n = MIN_MATCHED_CALLS
    logs = [[entry(i) for i in range(n // 2)], [entry(i) for i in range(n // 2, n)]]
    trips = {f"{i}-0.0": 0.103 + 0.007 for i in range(n)}  # the driver sees 7 ms more than the engine's part
    assert in_run_request_overhead(trips, logs) == (pytest.approx(0.007), n)
    # aborted calls return early and say nothing about the overhead; calls the driver has no
    # round trip for (a reissued one, say) are skipped
    logs[0].append(entry(n, "abort"))
    trips[f"{n}-0.0"] = 0.5
    logs[1].append(entry(n + 1))
    assert in_run_request_overhead(trips, logs) == (pytest.approx(0.007), n)
    assert in_run_request_overhead(trips, [logs[0]]) == (None, n // 2)  # too few calls to tell


def test_a_profile_is_reused_only_when_fresh_and_of_this_format(tmp_path: Path) -> None:
    import yaml

    from rollart.calibration.engine_fit import fit_engine_csv
    from rollart.validate.main import fresh_profile
    from rollart.validate.profile import PROFILE_FORMAT

    save_profile(fit_engine_csv(_engine_csv(tmp_path), gpu="cpu", model="Qwen3-tiny"), tmp_path / "engine.yaml")
    _train_profile(tmp_path)
    host = tmp_path / "host.yaml"
    plan = load_plan(resolve("local/validate-rollart"))
    host.write_text(yaml.safe_dump({"env_reset_overhead_s": 0.01, "env_step_overhead_s": 0.005,
                                    "format": PROFILE_FORMAT}))
    assert fresh_profile(tmp_path, plan, max_age_h=24)
    assert not fresh_profile(tmp_path, plan, max_age_h=0)  # too old
    host.write_text(yaml.safe_dump({"env_reset_overhead_s": 0.01, "env_step_overhead_s": 0.005}))
    assert not fresh_profile(tmp_path, plan, max_age_h=24)  # measured by an earlier version


def test_validate_rejects_a_warmup_that_leaves_nothing() -> None:
    proc = subprocess.run([ROLLART, "validate", "local/validate-rollart", "--steps", "2", "--warmup-steps", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--warmup-steps: 2 leaves none of the 2 steps to compare" in proc.stderr


@pytest.mark.exclusive
@pytest.mark.slow
def test_validate_end_to_end_within_the_ci_bound(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    from tests.test_readme import readme_command, run_command

    # the README's command as printed (its --out v/ in this folder), 5 steps, the profile kept here
    command, spec = readme_command("rollart validate")
    out = tmp_path / "v"
    proc = run_command(command, spec, tmp_path, ("--profile-dir", str(tmp_path / "profile"), "-q"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "step time, mean" in proc.stdout and "trajectories/s" in proc.stdout
    for name in ("real.json", "sim.json", "real.trace.json", "sim.trace.json", "validation.png", "validation.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "validation.json").read_text())
    errors = {f["name"]: f["error"] for f in summary["figures"]}
    assert summary["profile"]["reused"] is False and summary["profile"]["call_step_s"] >= 0
    # the generate call overhead comes from the reference run, the idle figure stays beside it
    assert summary["profile"]["request_overhead_s"] > 0 and summary["profile"]["idle_request_overhead_s"] > 0
    assert summary["profile"]["request_overhead_calls"] >= 20  # measured in the run, not the idle fallback
    assert len(summary["sim_seeds"]) == 16  # the default: the real run against sixteen simulated seeds
    headline = next(f for f in summary["figures"] if f["name"] == "step time, mean")
    assert headline["sim_range"][0] <= headline["sim"] <= headline["sim_range"][1]
    assert abs(errors["step time, mean"]) <= CI_BOUND, summary["figures"]
    assert abs(errors["trajectories/s"]) <= CI_BOUND, summary["figures"]
    real = json.loads((out / "real.json").read_text())
    assert real["backend"] == "runtime" and len(real["steps"]) == 5
    sim = json.loads((out / "sim.json").read_text())
    assert "measured train profile" in sim["calibration"]["trainer"]


def test_host_contention_formula() -> None:
    from rollart.sim.contention import HostContention

    hc = HostContention(parallelism=2.0, engine_ref=2)
    assert hc._load(1) == 1.0 and hc._load(2) == 1.0 and hc._load(4) == 2.0
    assert hc.trainer_factor() == 1.0          # no engine busy: the trainer alone
    hc.trainer_jobs = 1
    assert hc.engine_factor() == 1.0           # 1 busy actor, the engines' profile had 2
    assert HostContention(1.0, engine_ref=1).trainer_factor() == 1.0


def test_host_contention_counts_overlapping_trainer_jobs() -> None:
    """A publish still running when the next training step starts: two jobs, and the end of one
    leaves the other counted."""
    from types import SimpleNamespace

    from rollart.sim.contention import HostContention

    seen: list[float] = []
    hc = HostContention(parallelism=1.0, engine_ref=1)
    hc.engines.append(SimpleNamespace(busy=True, set_slowdown=seen.append))
    hc.trainer_job(started=True)
    hc.trainer_job(started=True)
    hc.trainer_job(started=False)
    assert hc.trainer_jobs == 1 and seen == [2.0, 3.0, 2.0]  # the engine plus one or two jobs on one core
    hc.trainer_job(started=False)
    assert hc.trainer_jobs == 0 and seen[-1] == 1.0


def test_host_contention_counts_the_driver_load_at_the_effect_rate() -> None:
    import math

    from rollart.sim.contention import HostContention

    clock = {"t": 0.0}
    hc = HostContention(parallelism=2.0, engine_ref=1, effect_cpu_s=0.002, tau_s=0.1, clock=lambda: clock["t"])
    for i in range(200):                       # 1 000 effects/s for 0.2 s: the moving average nears 1 000/s
        clock["t"] = i * 0.001
        hc.note_effect()
    rate = sum(math.exp(-k * 0.001 / 0.1) for k in range(200)) / 0.1
    assert math.isclose(hc.background_cores(), 0.002 * rate)
    assert 1.7 < hc.background_cores() < 2.0
    # the trainer plus ~1.7 cores of driver on a 2-way host
    assert math.isclose(hc.trainer_factor(), (1 + hc.background_cores()) / 2)
    clock["t"] += 1.0                          # a second without effects: the load is gone
    assert hc.background_cores() < 1e-3 and hc.trainer_factor() == 1.0
    assert HostContention(2.0, engine_ref=1).background_cores() == 0.0   # not measured: no load


def test_engines_sharing_a_host_slow_down_with_the_measured_parallelism(tmp_path: Path) -> None:
    from rollart.calibration.engine_fit import fit_engine_csv

    rows = _engine_csv(tmp_path)
    gen = {}
    for parallelism in (None, 1.0):
        profile = fit_engine_csv(rows, gpu="cpu", model="Qwen3-tiny")
        profile.host_parallelism, profile.side_by_side = parallelism, 1
        path = tmp_path / f"e{parallelism}.yaml"
        save_profile(profile, path)
        sets = [f"cluster.gpu_pools.{p}.profile={path}" for p in ("pool_a", "pool_b")]
        plan = load_plan(resolve("local/validate-sync"), [*sets, "algorithm.steps=2"])
        out = run_sim(plan)
        gen[parallelism] = sum(e.busy_s for e in out.backend.engines)
        if parallelism:
            assert out.backend.contention is not None
    # one core for two engines that decode at the same time: their busy time about doubles
    assert 1.6 < gen[1.0] / gen[None] <= 2.0 + 1e-9


@pytest.mark.parametrize("kind", ["publish", "broadcast"])
def test_a_weight_transfer_on_a_shared_host_slows_the_engines_down_as_training_does(tmp_path: Path, kind: str) -> None:
    """In a CPU run the publish, the workers' pulls and the broadcast are CPU work on the
    engines' host: engines step 35–55 % slower during a publish + pull, as during a training step."""
    from rollart.calibration.engine_fit import fit_engine_csv
    from rollart.core import mode_config
    from rollart.core.effects import BroadcastWeights, PublishWeights
    from rollart.sim import SimBackend

    profile = fit_engine_csv(_engine_csv(tmp_path), gpu="cpu", model="Qwen3-tiny")
    profile.host_parallelism, profile.side_by_side = 1.0, 1
    engine = tmp_path / "engine.yaml"
    save_profile(profile, engine)
    sets = [f"cluster.gpu_pools.{p}.profile={engine}" for p in ("pool_a", "pool_b")]
    train = _train_profile(tmp_path)  # publish + pull 0.25 s, broadcast 0.5 s
    plan = load_plan(resolve("local/validate-rollart"), [*sets, f"placement.trainer.profile={train}"])
    backend = SimBackend(plan, mode_config(plan, None), 0)
    hc, env = backend.contention, backend.env
    backend.engines[0].busy = True  # one engine decoding on a host that runs one actor at full speed
    seen = []

    def watch():  # noqa: ANN202 - a SimPy process
        for t in (0.05, 1.0):  # during the transfer, after it
            yield env.timeout(t - env.now)
            seen.append((hc.trainer_jobs, hc.engine_factor()))

    workers = backend.ctl.proxy.worker_ids
    transfer = backend._publish(PublishWeights(1, workers)) if kind == "publish" else \
        backend._broadcast(BroadcastWeights(1, workers))
    env.process(transfer)
    env.process(watch())
    env.run(until=1.5)
    assert seen == [(1, 2.0), (0, 1.0)]


def test_calibrate_show_reads_train_and_step_fitted_engine_profiles(tmp_path: Path) -> None:
    from rollart.calibration.engine_fit import fit_engine_steps

    train = _train_profile(tmp_path)
    proc = subprocess.run([ROLLART, "calibrate", "show", str(train)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "train step" in proc.stdout and "broadcast 0.500 s" in proc.stdout
    proc = subprocess.run([ROLLART, "calibrate", "show", str(train), "--plot", str(tmp_path / "t.png")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--plot: no measured rows to plot for this train profile" in proc.stderr

    csv_path = _engine_csv(tmp_path)
    steps = [{"prefill_requests": b, "prefill_tokens": b * n, "decode_rows": 0, "decode_kv": 0, "decode_padded": 0,
              "seconds": 1e-3 + 5e-6 * b * n} for b in (1, 2, 4, 8) for n in (16, 64, 256)]
    steps += [{"prefill_requests": 0, "prefill_tokens": 0, "decode_rows": b, "decode_kv": b * n,
               "decode_padded": b * n, "seconds": 8e-4 + 5e-5 * b + 1e-7 * b * n} for b in (1, 2, 4, 8) for n in (16, 64)]
    profile = fit_engine_steps(steps, gpu="cpu", model="Qwen3-tiny", engine="torch", source="a grid and a run",
                               data=[str(csv_path)])
    assert profile.prefill.data == [str(csv_path)] and profile.source == "a grid and a run"
    save_profile(profile, tmp_path / "engine.yaml")
    proc = subprocess.run([ROLLART, "calibrate", "show", str(tmp_path / "engine.yaml"), "--plot",
                           str(tmp_path / "e.png")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "e.png").stat().st_size > 0


def test_the_calibrated_plan_drops_a_stated_engine_step_overhead(tmp_path: Path) -> None:
    """`validate` prices every generation pool with the measured engine profile, which holds its engine's own
    step overhead: a plan's `step_overhead_ms` (generation groups, and the judge on a swapped pool) is dropped,
    not refused by the simulator nor counted twice. Before, such a plan could not be validated."""
    from rollart.calibration.engine_fit import fit_engine_csv
    from rollart.validate.main import calibrated_plan
    from tests.test_calibration import _engine_csv

    plan = load_plan(resolve("local/validate-sync"), ["algorithm.steps=2", "placement.generation.0.step_overhead_ms=1.5"])
    _engine_csv(tmp_path / "e.csv")
    save_profile(fit_engine_csv(tmp_path / "e.csv", gpu="cpu", model=plan.run_model.name), tmp_path / "e.yaml")
    sim_plan = calibrated_plan(plan, tmp_path / "e.yaml", _train_profile(tmp_path))
    assert all(g.step_overhead_ms is None for g in sim_plan.placement.generation)
    assert run_sim(sim_plan).to_result().error is None
