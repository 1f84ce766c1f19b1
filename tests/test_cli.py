"""The ``rollart`` command line, run as a user would: the installed console script."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rollart.plan import read_yaml
from rollart.scenarios_catalog import default_scenario


def _rollart_exe() -> str:
    local = Path(sys.executable).parent / "rollart"
    if local.is_file():
        return str(local)
    found = shutil.which("rollart")
    if found is None:  # pragma: no cover - the package is installed editable in the venv
        pytest.skip("the rollart console script is not installed")
    return found


ROLLART = _rollart_exe()
DEFAULT_YAML = str(default_scenario())
SUMMARY_KEYS = ("step_time_s_mean", "trajectories_per_s", "tokens_per_s", "gpu_busy_fraction", "decode_batch_mean",
                "aborted_stale", "aborted_redundant", "env_failures")


def rollart(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # A wide console so rich does not elide table headers; no colours.
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([ROLLART, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def assert_clean_usage_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit code 2, exactly one error line on stderr containing every needle, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_console_script_exists():
    assert Path(ROLLART).is_file()
    assert os.access(ROLLART, os.X_OK)


# ---------------------------------------------------------------- simulate


def test_simulate_embedded_default(tmp_path: Path):
    proc = rollart("simulate", "--quiet", "--steps", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "step" in out
    assert "trajectories/s" in out
    # the step table has exactly steps 0 and 1
    # step rows: the step number, then the step time and the seven breakdown columns
    rows = [ln.split() for ln in out.splitlines() if re.match(r"^\s*\d+(\s+\d+(\.\d+)?){8}\s", ln)]
    assert [int(r[0]) for r in rows] == [0, 1]
    assert "default · mode rollart · seed 0" in out
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def seed1_json(tmp_path_factory) -> tuple[bytes, bytes]:
    work = tmp_path_factory.mktemp("seed1")
    outs = []
    for name in ("a.json", "b.json"):
        proc = rollart("simulate", DEFAULT_YAML, "--seed", "1", "--steps", "2", "--quiet", "--json", name, cwd=work)
        assert proc.returncode == 0, proc.stderr
        assert f"wrote {name}" in proc.stdout
        outs.append((work / name).read_bytes())
    return outs[0], outs[1]


def test_simulate_json_is_deterministic(seed1_json):
    a, b = seed1_json
    assert a == b


def test_simulate_json_contract(seed1_json):
    data = json.loads(seed1_json[0])
    for key in ("scenario", "mode", "seed", "steps", "summary"):
        assert key in data
    assert data["scenario"] == "default"
    assert data["mode"] == "rollart"
    assert data["seed"] == 1
    assert [s["step"] for s in data["steps"]] == [0, 1]
    for s in data["steps"]:
        assert s["time_s"] > 0
        assert isinstance(s["breakdown_s"], dict) and s["breakdown_s"]
        assert all(v >= 0 for v in s["breakdown_s"].values())
    summary = data["summary"]
    for key in SUMMARY_KEYS:
        assert key in summary, key
    assert summary["step_time_s_mean"] == pytest.approx(sum(s["time_s"] for s in data["steps"]) / 2)
    assert summary["trajectories_per_s"] > 0
    assert summary["tokens_per_s"] > 0
    assert set(summary["gpu_busy_fraction"]) == {"h800", "h20"}
    assert all(0 <= f <= 1 for f in summary["gpu_busy_fraction"].values())
    for key in ("aborted_stale", "aborted_redundant", "env_failures"):
        assert isinstance(summary[key], int) and summary[key] >= 0


def test_simulate_different_seed_differs(tmp_path: Path, seed1_json):
    proc = rollart("simulate", DEFAULT_YAML, "--seed", "2", "--steps", "2", "--quiet", "--json", "c.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    other = json.loads((tmp_path / "c.json").read_text())
    base = json.loads(seed1_json[0])
    assert other["seed"] == 2
    assert [s["time_s"] for s in other["steps"]] != [s["time_s"] for s in base["steps"]]


def test_simulate_mode_option(tmp_path: Path):
    proc = rollart("simulate", "--quiet", "--steps", "2", "--mode", "sync", "--json", "s.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["mode"] == "sync"
    assert "mode sync" in proc.stdout


# ---------------------------------------------------------------- bad input → exit 2, one line


def test_bad_set_value_exits_2(tmp_path: Path):
    proc = rollart("simulate", "--quiet", "--steps", "2", "--set", "algorithm.batch_size=-4", cwd=tmp_path)
    line = assert_clean_usage_error(proc, "algorithm.batch_size")
    assert "error" in line


def test_unknown_gpu_in_scenario_file_exits_2(tmp_path: Path):
    data = read_yaml(default_scenario())
    data["cluster"]["gpu_pools"]["h20"]["gpu"] = "H900"
    path = tmp_path / "bad_gpu.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = rollart("simulate", path, "--quiet", "--steps", "2", cwd=tmp_path)
    assert_clean_usage_error(proc, "cluster.gpu_pools.h20.gpu", "H900", "H800")


def test_unknown_mode_exits_2(tmp_path: Path):
    proc = rollart("simulate", "--quiet", "--steps", "2", "--mode", "bogus", cwd=tmp_path)
    assert_clean_usage_error(proc, "--mode", "bogus", "rollart")


def test_missing_scenario_file_exits_2(tmp_path: Path):
    proc = rollart("simulate", tmp_path / "nope.yaml", "--quiet", "--steps", "2", cwd=tmp_path)
    assert_clean_usage_error(proc, "nope.yaml", "no such scenario file")


def test_set_without_equals_exits_2(tmp_path: Path):
    proc = rollart("simulate", "--quiet", "--set", "algorithm.alpha", cwd=tmp_path)
    assert_clean_usage_error(proc, "algorithm.alpha", "KEY=VALUE")


def test_compare_unknown_mode_exits_2(tmp_path: Path):
    proc = rollart("compare", "default", "--modes", "sync,bogus", "--steps", "2", "--quiet", cwd=tmp_path)
    assert_clean_usage_error(proc, "bogus")


# ---------------------------------------------------------------- scenarios, compare, trace


def test_scenarios_lists_shipped(tmp_path: Path):
    proc = rollart("scenarios", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    names = {cells[1].strip() for ln in proc.stdout.splitlines() if (cells := ln.split("│")) and len(cells) > 2}
    assert "default" in names
    assert "paper/qwen3-32b-128gpu" in names
    assert "paper/qwen3-8b-128gpu" in names
    assert not any(n.endswith(".yaml") for n in names)


def test_simulate_by_shipped_name(tmp_path: Path):
    proc = rollart("simulate", "default", "--quiet", "--steps", "2", "--json", "d.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "d.json").read_text())["scenario"] == "default"


def test_compare_two_modes(tmp_path: Path):
    proc = rollart("compare", "default", "--modes", "sync,rollart", "--steps", "2", "--quiet", "--json", "c.json",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "× sync" in out  # the ratio column, normalised to the first mode
    results = json.loads((tmp_path / "c.json").read_text())
    assert [r["mode"] for r in results] == ["sync", "rollart"]
    tps = [r["summary"]["trajectories_per_s"] for r in results]
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.split()[:1] in (["sync"], ["rollart"])}
    assert rows["sync"][3] == "1.00"
    assert float(rows["rollart"][3]) == pytest.approx(tps[1] / tps[0], abs=0.006)
    assert float(rows["rollart"][2]) == pytest.approx(tps[1], abs=0.0006)
    assert tps[1] > tps[0]  # the async design beats the synchronous baseline


def test_compare_says_when_a_modes_affinity_map_overloads_a_pool(tmp_path: Path):
    """h800-vs-h20 prefers its 2 H800 for every task: ROLLART routes by that map and spills only when they
    are full, the baselines route least-loaded; the comparison says so rather than let the map pass for
    the mode (a review read ROLLART losing to AReaL-style there as the design losing)."""
    proc = rollart("compare", "h800-vs-h20", "--modes", "rollart,areal", "--steps", "1", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "rollart routing:" in out and "ran off h800" in out and "placement.hw_affinity={}" in out
    assert "areal routing:" not in out


def test_compare_exits_1_when_a_mode_stopped_early_and_keeps_the_results(tmp_path: Path):
    # a sim-time budget too short for 3 steps: every mode stops early, as simulate does it exits 1
    proc = rollart("compare", "default", "--modes", "sync,rollart", "--steps", "3", "--quiet",
                   "--set", "algorithm.max_sim_hours=0.01", "--json", "c.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "stopped early" in proc.stdout and "Traceback" not in proc.stderr
    results = json.loads((tmp_path / "c.json").read_text())  # what was computed is written all the same
    assert [r["mode"] for r in results] == ["sync", "rollart"] and all(r["error"] for r in results)


def test_trace_is_a_chrome_trace(tmp_path: Path):
    proc = rollart("simulate", "--quiet", "--steps", "2", "--trace", "t.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "wrote t.json" in proc.stdout
    trace = json.loads((tmp_path / "t.json").read_text())
    events = trace["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert "trainer" in tracks
    assert any(t.startswith("generation/") for t in tracks)
    assert any(t.startswith("env managers/") for t in tracks)
    assert {"generation/h800", "generation/h20"} <= tracks
    complete = [e for e in events if e.get("ph") == "X"]
    assert complete
    for e in complete:
        assert e["dur"] >= 0 and e["ts"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    pid_of = {e["args"]["name"]: e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    busy_pids = {e["pid"] for e in complete}
    assert pid_of["trainer"] in busy_pids
    assert any(pid_of[t] in busy_pids for t in tracks if t.startswith("env managers/"))


# ---------------------------------------------------------------- run / validate preflight


@pytest.mark.parametrize("command", ["run", "validate"])
def test_gpu_plan_fails_fast_on_a_machine_without_them(tmp_path: Path, command: str):
    import time

    from rollart.preflight import Machine

    if Machine.here().gpus >= 16:  # pragma: no cover - a GPU machine can run the default plan
        pytest.skip("this machine has the GPUs the default plan asks for")
    t0 = time.perf_counter()
    proc = rollart(command, "default", "--steps", "1", cwd=tmp_path)
    elapsed = time.perf_counter() - t0
    line = assert_clean_usage_error(proc, "runtime.pools", "16 GPUs", "Qwen3-tiny", "--address")
    assert "scenarios/local" in line
    assert elapsed < 30, elapsed  # no Ray was started


def test_preflight_memory_and_mapping():
    from rollart.plan import load_plan
    from rollart.preflight import Machine, problems
    from rollart.scenarios_catalog import resolve

    small = Machine(gpus=0, cpu_cores=2, memory_available_bytes=8 * 2**30)
    plan = load_plan(DEFAULT_YAML, ["runtime.pools.h800.devices=cpu", "runtime.pools.h20.devices=cpu"])
    (msg,) = problems(plan, machine=small)
    assert msg.startswith("model: Qwen3-8B") and "GiB" in msg and "runtime.model" in msg
    tiny = load_plan(DEFAULT_YAML, ["runtime.pools.h800.devices=cpu", "runtime.pools.h20.devices=cpu",
                                    "runtime.model=Qwen3-tiny"])
    assert problems(tiny, machine=small) == []
    assert problems(load_plan(DEFAULT_YAML), address="10.0.0.1:6379", machine=small) == []  # the cluster's job
    assert problems(load_plan(resolve("local/digits")), machine=small) == []
    gpus = load_plan(DEFAULT_YAML, ["runtime.pools.h800.devices=gpu", "runtime.pools.h800.count=8",
                                    "runtime.pools.h20.devices=gpu", "runtime.pools.h20.count=8"])
    assert problems(gpus, machine=Machine(gpus=16, cpu_cores=64, memory_available_bytes=2**40)) == []
    assert "16 GPUs" in problems(gpus, machine=Machine(gpus=8, cpu_cores=64, memory_available_bytes=2**40))[0]


# ---------------------------------------------------------------- the newcomer's path (issue 17)


def test_unwritable_output_fails_before_the_simulation(tmp_path: Path):
    import time

    t0 = time.perf_counter()
    proc = rollart("simulate", "--json", "/nonexistent/dir/out.json", cwd=tmp_path)
    assert_clean_usage_error(proc, "--json /nonexistent/dir/out.json", "does not exist")
    assert time.perf_counter() - t0 < 30 and "step" not in proc.stdout  # nothing was simulated
    proc = rollart("simulate", "--trace", str(tmp_path), cwd=tmp_path)
    assert_clean_usage_error(proc, "--trace", "is a folder")


def test_errors_suggest_the_closest_name(tmp_path: Path):
    assert_clean_usage_error(rollart("simulate", "paper/qwen3-8b", cwd=tmp_path), "did you mean 'paper/qwen3-8b-128gpu'")
    assert_clean_usage_error(rollart("simulate", "--set", "algorithm.alpah=2", cwd=tmp_path), "did you mean 'alpha'")
    assert_clean_usage_error(rollart("simulate", "--set", "tasks.Frozenlake.share=0.3", cwd=tmp_path),
                             "did you mean 'FrozenLake'", "tasks are: FrozenLake, GEM-Math, CodeExec")
    line = assert_clean_usage_error(rollart("compare", "default", "--modes", "sync,bogus", cwd=tmp_path),
                                    "modes are: sync, sync+, one-off, areal, rollart")
    assert line.startswith("error: --modes:")


def test_piped_stderr_has_no_blank_lines_and_help_shows_no_bool(tmp_path: Path):
    proc = rollart("simulate", "--steps", "1", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", repr(proc.stderr)
    help_text = rollart("simulate", "--help", cwd=tmp_path).stdout
    assert "--quiet" in help_text and "<bool>" not in help_text


def test_step_table_precision_follows_the_magnitudes(tmp_path: Path):
    proc = rollart("simulate", "local/digits", "--steps", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    row = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("0 "))
    assert re.search(r"\b0\.\d{3}\b", row), row  # CPU-scale seconds keep three decimals, not 0.0


def test_scale_approx_widens_the_simulated_requests_guard_by_its_factor(tmp_path: Path):
    # the paper cluster × 24 (3,072 GPUs) for 400 steps: refused in full (with the hint), accepted
    # under --scale-approx, which simulates 1/96 of the requests in a run this long (16 groups per batch; stopped
    # after 0.01 simulated hours)
    big = ["cluster.gpu_pools.h800.count=2304", "cluster.gpu_pools.h20.count=768", "cluster.cpu_pools.env.cores=98304",
           "cluster.serverless.max_concurrency=1536", "placement.trainer.gpus=1536",
           "placement.generation.0.workers=192", "placement.generation.1.workers=192", "algorithm.batch_size=12288",
           "algorithm.max_sim_hours=0.01"]
    sets = [a for o in big for a in ("--set", o)]
    full = rollart("simulate", "paper/qwen3-32b-128gpu", "--steps", "400", "-q", *sets, cwd=tmp_path)
    assert_clean_usage_error(full, "algorithm:", "generation requests", "--scale-approx")
    approx = rollart("simulate", "paper/qwen3-32b-128gpu", "--steps", "400", "-q", "--scale-approx", *sets,
                     cwd=tmp_path)
    assert approx.returncode == 1 and "max_sim_hours" in approx.stdout, approx.stdout + approx.stderr  # ran, then stopped
    huge = rollart("simulate", "paper/qwen3-32b-128gpu", "--steps", "8000", "-q", "--scale-approx", *sets, cwd=tmp_path)
    assert_clean_usage_error(huge, "with --scale-approx", "1/96")


def test_simulate_warns_when_pools_mix_a_calibrated_profile_with_the_datasheet_roofline(tmp_path: Path) -> None:
    # A pool priced on the datasheet roofline (`profile: datasheet`: assumed efficiencies) beside a
    # calibrated H800: a comparison of the two pools carries the assumption, and the summary says so.
    mixed = rollart("simulate", "h800-vs-h20", "--steps", "1", "-q", "--set", "cluster.gpu_pools.h20.profile=datasheet",
                    cwd=tmp_path)
    assert mixed.returncode == 0, mixed.stderr
    assert "H20 on the datasheet roofline (assumed efficiencies) beside calibrated profiles" in " ".join(mixed.stdout.split())
    # A GPU type without timings of its own (a custom type) is priced by the same composition, with the
    # measured efficiencies of the reference most like it on its datasheet: for this BF16 model chosen on the
    # BF16 figures, the nearest datasheet, the H100's. No mix, and its cost-model line says how.
    custom = rollart("simulate", "h800-vs-h20", "--steps", "1", "-q", "--set",
                     "cluster.custom_gpus.GX={tflops_bf16: 800, tflops_fp8: 1600, hbm_tbps: 4, memory_gb: 100}",
                     "--set", "cluster.gpu_pools.h20.gpu=GX", cwd=tmp_path)
    assert custom.returncode == 0, custom.stderr
    text = " ".join(custom.stdout.split())
    assert "H100 kernel profile on the GX datasheet (no GX timings" in text, text
    assert "datasheet roofline" not in text
    for gpu in ("H200", "A100"):  # shipped profiles (H200: the H800's efficiencies on its datasheet)
        same = rollart("simulate", "h800-vs-h20", "--steps", "1", "-q", "--set", f"cluster.gpu_pools.h20.gpu={gpu}",
                       cwd=tmp_path)
        assert same.returncode == 0, same.stderr
        assert f"calibrated kernel profile {gpu}" in same.stdout and "datasheet roofline" not in same.stdout


def test_a_judge_too_big_for_its_gpus_is_a_usage_error(tmp_path: Path):
    judge = ("reward_model={name: judge-70b, layers: 80, hidden: 8192, heads: 64, kv_heads: 8, head_dim: 128, "
             "intermediate: 28672, vocab: 128256}")
    proc = rollart("simulate", "--quiet", "--steps", "1", "--set", judge, cwd=tmp_path)
    assert_clean_usage_error(proc, "cluster.serverless.tp:", "judge-70b", "0 KV tokens on 1 × H800")


# ---------------------------------------------------------------- run --resume


def test_run_refuses_a_checkpoint_it_cannot_continue_before_starting_ray(tmp_path: Path) -> None:
    """--resume reads the checkpoint's meta.json first: a missing checkpoint, another model or another RoPE
    base is one error line (exit 2) within seconds, not a traceback from the trainer actor after Ray started."""
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    from rollart.plan.schema import ModelSpec
    from rollart.runtime.trainer.grpo import GRPOTrainer

    plan = "scenarios/local/digits.yaml"
    root = Path(__file__).resolve().parent.parent
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_clean_usage_error(rollart("run", root / plan, "--resume", empty, cwd=tmp_path), "--resume", "no checkpoint under")

    model = read_yaml(root / plan).get("runtime", {}).get("model") or read_yaml(root / plan).get("model")
    spec = ModelSpec.model_validate(model)
    ckpt = GRPOTrainer(spec, lr=1e-3, seed=0).save_checkpoint(tmp_path / "ck", step=1, version=1)
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "rope_theta"}))
    assert_clean_usage_error(rollart("run", root / plan, "--resume", tmp_path / "ck", cwd=tmp_path),
                             "--resume", "RoPE theta 10000")

    other = ModelSpec.model_validate({**spec.model_dump(), "name": "another", "layers": spec.layers + 1})
    (ckpt / "meta.json").write_text(json.dumps({**meta, "spec": other.model_dump()}))
    assert_clean_usage_error(rollart("run", root / plan, "--resume", tmp_path / "ck", cwd=tmp_path),
                             "--resume", "checkpoint is for model another")
