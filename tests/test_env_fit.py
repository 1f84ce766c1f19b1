"""Env latency calibration: the ``spliced`` distribution, fitting traces (``calibrate env``),
the task blocks it writes, and the default task profiles under ``calibration/tasks/``."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import typer
import yaml
from pydantic import TypeAdapter, ValidationError
from rich.console import Console
from typer.testing import CliRunner

import rollart.calibration
from rollart.calibration.env_fit import (
    EMPIRICAL_LEVELS,
    fit_env_trace,
    fit_latency,
    goodness_of_fit,
    render_env_report,
    synthetic_trace,
    write_task_block,
)
from rollart.cli_env import calibrate_env
from rollart.plan import load_plan, plan_from_dict, read_yaml
from rollart.plan.distributions import Distribution, Empirical, LogNormal, Spliced
from rollart.plan.schema import TaskSpec
from rollart.scenarios_catalog import default_scenario, scenarios_root

DIST = TypeAdapter(Distribution)
TASKS_DIR = Path(rollart.calibration.__file__).parent / "tasks"

TRUE_RESET = Spliced(median=20.0, sigma=0.5, threshold=37.0, tail_prob=0.1, tail_shape=0.25, tail_scale=15.0)
TRUE_STEP = Spliced(median=1.2, sigma=0.6, threshold=2.6, tail_prob=0.1, tail_shape=0.2, tail_scale=1.5)
N = 20_000


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("env")(calibrate_env)
    return app


def invoke(args: list[str], **kw):
    return CliRunner().invoke(cli(), [str(a) for a in args], env={"SOURCE_DATE_EPOCH": "1767225600"}, **kw)


def draws(dist, n: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([dist.sample(rng) for _ in range(n)])


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """20k reset + 20k step calls of CodeExec (1 % errors) plus 100 rows of another task."""
    path = tmp_path_factory.mktemp("trace") / "codeexec.csv"
    return synthetic_trace(path, "CodeExec", N, seed=11, reset=TRUE_RESET, step=TRUE_STEP, failure_prob=0.01)


@pytest.fixture(scope="module")
def cli_block(trace, tmp_path_factory) -> tuple[Path, dict, str]:
    out = tmp_path_factory.mktemp("out") / "CodeExec.env.yaml"
    res = invoke([trace, "--task", "CodeExec", "--out", out])
    assert res.exit_code == 0, res.output
    return out, yaml.safe_load(out.read_text()), res.stdout


# ---------------------------------------------------------------- the spliced distribution


MEAN_CASES = {
    "heavy tail": Spliced(median=10, sigma=0.5, threshold=18, tail_prob=0.1, tail_shape=0.3, tail_scale=8),
    "exponential tail, capped": Spliced(median=10, sigma=0.5, threshold=18, tail_prob=0.1, tail_shape=0.0,
                                        tail_scale=8, max=30),
    "bounded tail": Spliced(median=10, sigma=0.8, threshold=25, tail_prob=0.05, tail_shape=-0.4, tail_scale=10),
    "heavy tail, capped": Spliced(median=10, sigma=0.5, threshold=18, tail_prob=0.2, tail_shape=0.6,
                                  tail_scale=8, max=60),
    "cap below threshold": Spliced(median=10, sigma=0.5, threshold=18, tail_prob=0.1, tail_shape=0.3,
                                   tail_scale=8, max=12),
    "no tail": Spliced(median=10, sigma=0.5, threshold=14, tail_prob=0.0, tail_shape=0.5, tail_scale=1),
}


@pytest.mark.parametrize("name", list(MEAN_CASES))
def test_spliced_sample_mean_matches_mean(name):
    dist = MEAN_CASES[name]
    xs = draws(dist, 60_000)
    assert math.isfinite(dist.mean())
    assert xs.mean() == pytest.approx(dist.mean(), rel=0.015)


def test_spliced_samples_respect_max_and_threshold():
    capped = MEAN_CASES["heavy tail, capped"]
    xs = draws(capped, 20_000)
    assert xs.max() == capped.max  # the cap binds (the uncapped tail goes far beyond it)
    assert (xs > 0).all() and (xs <= capped.max).all()
    assert draws(MEAN_CASES["heavy tail"], 20_000).max() > 60
    no_tail = MEAN_CASES["no tail"]
    assert draws(no_tail, 5_000).max() <= no_tail.threshold  # body truncated at u


def test_spliced_sampler_matches_its_cdf_and_quantiles():
    from scipy.stats import kstest

    dist = MEAN_CASES["bounded tail"]
    xs = draws(dist, 20_000)
    assert kstest(xs, dist.cdf).statistic < 0.015
    qs = np.array([0.01, 0.3, 0.5, 0.9, 0.95, 0.99, 0.999])
    assert dist.cdf(dist.ppf(qs)) == pytest.approx(qs, abs=1e-9)
    assert float(dist.cdf(dist.threshold)) == pytest.approx(1 - dist.tail_prob)
    # ξ < 0: the tail ends at u − β/ξ
    assert dist.ppf(1.0) == pytest.approx(dist.threshold - dist.tail_scale / dist.tail_shape)
    assert xs.max() <= dist.threshold - dist.tail_scale / dist.tail_shape


def test_spliced_parses_and_validates():
    ok = {"kind": "spliced", "median": 40, "sigma": 0.5, "threshold": 80, "tail_prob": 0.1,
          "tail_shape": 0.3, "tail_scale": 50}
    assert isinstance(DIST.validate_python(ok), Spliced)
    assert DIST.validate_python(DIST.validate_python(ok).model_dump()) == DIST.validate_python(ok)
    for field, bad in [("tail_shape", 1.0), ("tail_shape", 1.5), ("tail_prob", 1.0), ("tail_prob", -0.1),
                       ("threshold", 0), ("tail_scale", 0), ("sigma", 0), ("median", -1)]:
        with pytest.raises(ValidationError, match=field):
            DIST.validate_python({**ok, field: bad})
    with pytest.raises(ValidationError, match="no mass below"):
        DIST.validate_python({**ok, "median": 1e6, "sigma": 0.1})
    # the existing kinds still parse the same way
    assert isinstance(DIST.validate_python({"kind": "lognormal", "median": 2, "sigma": 0.5}), LogNormal)
    plan = load_plan(default_scenario(), ["tasks.CodeExec.env.reset=" + json.dumps(ok)])
    assert isinstance(plan.task("CodeExec").env.reset, Spliced)


# ---------------------------------------------------------------- fitting


def test_calibrate_env_recovers_synthetic_parameters(cli_block):
    _, block, _ = cli_block
    assert block["name"] == "CodeExec"
    for phase, truth in (("reset", TRUE_RESET), ("step", TRUE_STEP)):
        got = block["env"][phase]
        assert got["kind"] == "spliced"
        assert got["median"] == pytest.approx(truth.median, rel=0.05), phase
        assert got["sigma"] == pytest.approx(truth.sigma, rel=0.10), phase
        assert got["threshold"] == pytest.approx(truth.threshold, rel=0.05), phase
        assert got["tail_prob"] == pytest.approx(truth.tail_prob, abs=0.02), phase
        assert got["tail_shape"] == pytest.approx(truth.tail_shape, abs=0.15), phase
        assert got["tail_scale"] == pytest.approx(truth.tail_scale, rel=0.25), phase
    assert block["env"]["failure_prob"] == pytest.approx(0.01, abs=0.003)


def test_body_fit_accounts_for_truncation():
    """The body is fitted as a lognormal truncated at u: a plain lognormal fit of the values
    below u would shrink sigma by ~15 % and the median by ~9 % here."""
    xs = draws(TRUE_RESET, N, seed=5)
    fit = fit_latency(xs)
    assert fit.spliced.sigma == pytest.approx(0.5, rel=0.05)
    body = np.log(xs[xs <= fit.spliced.threshold])
    assert body.std() < 0.45  # what ignoring the truncation would give


def test_ks_small_on_own_data_large_on_wrong_model():
    xs = draws(TRUE_STEP, N, seed=9)
    fit = fit_latency(xs)
    assert fit.ks < 0.02
    assert fit.gof_empirical.ks < 0.05
    wrong = [fit.spliced.model_copy(update={"median": fit.spliced.median * 1.6}),
             LogNormal(median=float(np.median(xs)), sigma=0.15),
             Empirical(quantiles={0: 0.1, 0.5: 3.0, 1: 10.0})]
    for model in wrong:
        assert goodness_of_fit(model, xs).ks > 0.1, model


def test_fit_reports_measured_vs_fitted_quantiles():
    xs = draws(TRUE_RESET, N, seed=21)
    gof = fit_latency(xs).gof
    for key in ("p50", "p90", "p99"):
        assert gof.measured[key] == pytest.approx(np.quantile(xs, {"p50": .5, "p90": .9, "p99": .99}[key]))
        assert abs(gof.rel_error(key)) < 0.05, key
    assert gof.measured["max"] == xs.max()
    assert 0.3 < gof.fitted["max"] / gof.measured["max"] < 3


def test_empirical_alternative(trace, tmp_path):
    report = fit_env_trace(trace, "CodeExec", empirical=True)
    reset = report.phases["reset"].fit
    assert isinstance(reset.dist, Empirical)
    assert tuple(reset.dist.quantiles) == EMPIRICAL_LEVELS
    block = report.task_block()
    out = write_task_block(report, tmp_path / "emp.yaml", date="2026-01-01")
    task = {**yaml.safe_load(out.read_text()), "share": 1, "turns": 3, "obs_tokens": 10, "response_tokens": 10}
    spec = TaskSpec.model_validate(task)
    assert isinstance(spec.env.reset, Empirical)
    assert spec.env.reset.quantiles[0.5] == block["env"]["reset"]["quantiles"][0.5]


def test_timeouts_are_fitted_as_censored_tail(tmp_path):
    truth = Spliced(median=45, sigma=0.45, threshold=80, tail_prob=0.1, tail_shape=0.3, tail_scale=48.4)
    path = synthetic_trace(tmp_path / "swe.csv", "SWE", N, seed=4, reset=truth, timeout_s=300)
    report = fit_env_trace(path, "SWE")
    reset = report.phases["reset"]
    assert reset.timeouts > 50 and reset.fit.n_censored == reset.timeouts
    assert report.timeout_s == 300
    assert "timeout row" in report.timeout_rule
    predicted = 1 - float(reset.fit.dist.cdf(300))
    assert predicted == pytest.approx(reset.timeout_rate, rel=0.25)
    assert reset.fit.dist.tail_shape == pytest.approx(0.3, abs=0.15)
    assert reset.fit.ks < 0.02  # against the model conditioned on finishing before 300 s
    # dropping the timeouts instead would lose them: the ok-only fit predicts far fewer
    ok_only = fit_latency(np.array([x for x in draws(truth, N, seed=4) if x <= 300]))
    assert 1 - float(ok_only.dist.cdf(300)) < 0.5 * reset.timeout_rate


def test_rates_and_suggested_timeout(tmp_path, trace):
    report = fit_env_trace(trace, "CodeExec")
    assert report.rows_task == 2 * N and report.rows_total == 2 * N + 100  # "Other" rows ignored
    assert report.timeout_rate == 0
    assert report.failure_rate == pytest.approx(0.01, abs=0.003)
    import csv

    ok = {ph: [float(r["latency_s"]) for r in csv.DictReader(trace.open())
               if r["task"] == "CodeExec" and r["phase"] == ph and r["status"] == "ok"] for ph in ("reset", "step")}
    assert report.timeout_s == math.ceil(max(np.quantile(ok[ph], 0.999) for ph in ok))
    flaky = synthetic_trace(tmp_path / "flaky.csv", "X", 2_000, seed=1, failure_prob=0.1, other_tasks=())
    assert fit_env_trace(flaky, "X").failure_rate == pytest.approx(0.1, abs=0.015)


# ---------------------------------------------------------------- task blocks and the CLI


def test_cli_task_block_validates_in_default_scenario(cli_block):
    out, block, stdout = cli_block
    text = out.read_text()
    assert text.startswith("# provenance")
    assert "codeexec.csv" in text and "40,100 rows, 40,000 of task CodeExec" in text
    assert "fitted: 2026-01-01" in text  # SOURCE_DATE_EPOCH, not the wall clock
    assert "KS" in stdout and "p99" in stdout and "rel. error" in stdout
    data = read_yaml(default_scenario())
    names = [t["name"] for t in data["tasks"]]
    i = names.index("CodeExec")
    merged = copy.deepcopy(data)
    merged["tasks"][i] = {**data["tasks"][i], **block,
                          "env": {**data["tasks"][i]["env"], **block["env"]}}
    plan = plan_from_dict(merged)
    env = plan.task("CodeExec").env
    assert isinstance(env.reset, Spliced) and isinstance(env.step, Spliced)
    assert env.reset.median == block["env"]["reset"]["median"]
    assert env.timeout_s == block["env"]["timeout_s"] and env.failure_prob == block["env"]["failure_prob"]
    assert env.max_retries == data["tasks"][i]["env"]["max_retries"]  # merged, not replaced
    # the same block through --set
    sets = [f"tasks.CodeExec.env.{k}={json.dumps(v)}" for k, v in block["env"].items()]
    assert load_plan(default_scenario(), sets).task("CodeExec").env == env


def test_fitted_block_simulates(cli_block):
    from tests.conftest import run_sim, small_plan

    _, block, _ = cli_block
    sets = [f"tasks.CodeExec.env.{k}={json.dumps(v)}" for k, v in block["env"].items()]
    plan = small_plan(sets)
    assert isinstance(plan.task("CodeExec").env.reset, Spliced)
    result = run_sim(plan).to_result()
    assert result.error is None and len(result.steps) == plan.algorithm.steps
    assert sum(s.breakdown_s["env_reset"] for s in result.steps) > 0


def test_cli_default_output_name(trace, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke([trace, "--task", "CodeExec", "--empirical"])
    assert res.exit_code == 0, res.output
    block = yaml.safe_load((tmp_path / "CodeExec.env.yaml").read_text())
    assert block["env"]["reset"]["kind"] == "empirical"


def _csv(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def bad_inputs(tmp: Path) -> dict[str, tuple[Path, str, str]]:
    """name: (trace, task, text the error must contain)."""
    ok_rows = [f"T,reset,{1 + i / 10},ok" for i in range(30)] + [f"T,step,{0.1 + i / 100},ok" for i in range(30)]
    return {
        "missing file": (tmp / "nope.csv", "T", "no such trace file"),
        "missing columns": (_csv(tmp / "cols.csv", "task,phase,latency_s", ["T,reset,1"]), "T",
                            "missing column status"),
        "empty file": (_csv(tmp / "empty.csv", "", []), "T", "missing columns task, phase, latency_s, status"),
        "no rows for the task": (_csv(tmp / "other.csv", "task,phase,latency_s,status", ok_rows), "SWE",
                                 "no rows for task 'SWE'; tasks in the trace: T"),
        "too few ok samples": (_csv(tmp / "few.csv", "task,phase,latency_s,status",
                                    ok_rows[:30] + ok_rows[30:49] + ["T,step,,timeout"] * 5),
                               "T", "19 ok step calls; at least 20"),
        "bad phase": (_csv(tmp / "phase.csv", "task,phase,latency_s,status", ok_rows + ["T,rest,1,ok"]), "T",
                      "line 62: phase 'rest' is not one of reset, step"),
        "bad latency": (_csv(tmp / "lat.csv", "task,phase,latency_s,status", ["T,reset,1.5s,ok"] + ok_rows), "T",
                        "line 2: latency_s '1.5s' is not a number"),
    }


@pytest.mark.parametrize("case", ["missing file", "missing columns", "empty file", "no rows for the task",
                                  "too few ok samples", "bad phase", "bad latency"])
def test_bad_inputs_exit_2_with_one_line(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, task, expected = bad_inputs(tmp_path)[case]
    res = invoke([path, "--task", task])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert expected in lines[0]
    assert "Traceback" not in res.output
    assert not (tmp_path / f"{task}.env.yaml").exists()


def test_render_env_report(trace):
    report = fit_env_trace(trace, "CodeExec")
    console = Console(record=True, width=80)
    render_env_report(report, console)
    text = console.export_text()
    for phrase in ("CodeExec · env.reset", "CodeExec · env.step", "measured s", "fitted s", "rel. error",
                   "p50", "p90", "p99", "max", "KS", "spliced · body LN(median", "timeout_s", "failure rate"):
        assert phrase in text, phrase
    gof = report.phases["reset"].fit.gof
    assert f"{gof.ks:.4f}" in text
    assert f"{gof.rel_error('p99'):+.1%}" in text
    assert max(len(line) for line in text.splitlines()) <= 80


# ---------------------------------------------------------------- default task profiles


PROFILES = sorted(TASKS_DIR.glob("*.yaml"))


def load_profile(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data.setdefault("share", 1)
    return data


def test_profiles_cover_the_paper_tasks():
    assert {load_profile(p)["name"] for p in PROFILES} == {"SWE", "FrozenLake", "WebShop", "GEM-Math", "GEM-Game"}
    assert (TASKS_DIR / "README.md").is_file()


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_profile_validates_and_states_provenance(path):
    text = path.read_text()
    head = text.split("\nname:")[0]
    # Each profile says what comes from the paper (quoted, or FITTED to its measured profile) and
    # what is ASSUMED.
    assert text.startswith("# ") and ("From the paper" in head or "FITTED" in head) and "ASSUMED" in head
    spec = TaskSpec.model_validate(load_profile(path))
    for field in ("turns", "obs_tokens", "response_tokens", "env", "reward"):
        assert field in yaml.safe_load(text), field
    assert math.isfinite(spec.env.reset.mean()) and math.isfinite(spec.env.step.mean())


def test_profiles_make_a_valid_plan():
    data = read_yaml(scenarios_root() / "paper" / "qwen3-8b-128gpu.yaml")
    data["tasks"] = [{**load_profile(p), "share": 0.2} for p in PROFILES]
    plan = plan_from_dict(data)
    assert len(plan.tasks) == 5


def test_swe_reset_matches_the_paper_statements():
    spec = TaskSpec.model_validate(load_profile(TASKS_DIR / "swe.yaml"))
    reset, timeout = spec.env.reset, spec.env.timeout_s
    assert isinstance(reset, Spliced)
    p_timeout = 1 - float(reset.cdf(timeout))
    assert 1 - (1 - p_timeout) ** 128 == pytest.approx(0.10, abs=0.02)  # ~1 in 10 steps of 128 resets
    # On the success path the lockstep step waits for the slowest of its 128 resets, and that
    # wait is env init's ~15 % of the 366 s step (calibration/tasks/swe-fit.md): E[max of 128
    # resets, none timed out] = ∫ 1 − (F(x)/F(timeout))^128 dx over [0, timeout].
    xs = np.linspace(0.0, timeout, 4001)
    cdf = np.array([float(reset.cdf(x)) for x in xs])
    slowest = np.trapezoid(1 - (cdf / cdf[-1]) ** 128, xs)
    # ±15 % (the paper figures' tolerance): the body's slowest of 128 is ≈ 55 s, and the stall tail's
    # rare reset that finishes just inside the timeout (≈ 1 % of steps, ~500 s) adds ≈ 6 s
    assert slowest == pytest.approx(0.15 * 366, rel=0.15)
    body = reset.model_copy(update={"tail_prob": 0.0})
    body_cdf = np.array([float(body.cdf(x)) for x in xs])
    assert np.trapezoid(1 - body_cdf ** 128, xs) == pytest.approx(0.15 * 366, rel=0.05)
    assert float(reset.ppf(0.9999)) > 300  # the tail reaches hundreds of seconds
