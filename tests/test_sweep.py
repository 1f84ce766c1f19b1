"""``rollart sweep``: grid parsing, Latin-hypercube samples, point keys, the Pareto frontier,
results files, and sweeps run as Ray tasks on a local Ray (one Ray for the module), resumed."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rollart.plan import PlanError, apply_overrides, read_yaml
from rollart.scenarios_catalog import default_scenario
from rollart.sweep import grid_points, lhs_points, pareto_front, parse_grid, point_key, write_results
from rollart.sweep.run import run_sweep
from rollart.sweep.runner import RayPool, SerialPool, evaluate_point

TINY = ["algorithm.batch_size=16", "algorithm.steps=2"]


# ---------------------------------------------------------------- grid and samples


def test_grid_values_parse_like_set_values():
    dims = parse_grid(["algorithm.alpha=0,1,2", "algorithm.redundancy=0, 0.25",
                       "placement.reward={where: serverless},{where: dedicated, pool: h20, gpus: 2}",
                       "tasks.FrozenLake.turns=[1, 2],3"])
    assert [d.values for d in dims] == [
        (0, 1, 2), (0, 0.25), ({"where": "serverless"}, {"where": "dedicated", "pool": "h20", "gpus": 2}),
        ([1, 2], 3)]
    assert dims[2].override(1) == "placement.reward={where: dedicated, pool: h20, gpus: 2}"
    points = grid_points(dims)
    assert len(points) == 3 * 2 * 2 * 2
    assert points[0].overrides[:2] == ("algorithm.alpha=0", "algorithm.redundancy=0")
    assert points[1].overrides[:2] == ("algorithm.alpha=0", "algorithm.redundancy=0")  # last dimension fastest
    assert points[-1].as_dict(dims)["algorithm.alpha"] == 2
    # every grid point is a --set list that apply_overrides accepts
    data = read_yaml(default_scenario())
    assert apply_overrides(data, points[-1].overrides)["placement"]["reward"]["gpus"] == 2


@pytest.mark.parametrize("spec, needle", [
    ("algorithm.alpha", "expected PATH=v1,v2"),
    ("algorithm.alpha=1,,2", "empty path or value"),
    ("algorithm.alpha=1,1", "a value is listed twice"),
    ("algorithm.alpha=[1", "not valid YAML"),
])
def test_bad_grid_specs_name_the_option(spec, needle):
    with pytest.raises(PlanError) as err:
        parse_grid([spec])
    assert any(p.startswith("--grid") and needle in p for p in err.value.problems), err.value.problems


def test_same_path_twice_is_an_error():
    with pytest.raises(PlanError, match="given twice"):
        parse_grid(["algorithm.alpha=0,1", "algorithm.alpha=2"])


def test_latin_hypercube_is_seeded_stratified_and_deduplicated():
    dims = parse_grid(["a.x=" + ",".join(map(str, range(10))), "a.y=" + ",".join(map(str, range(10))),
                       "a.z=0,1"])
    pts = lhs_points(dims, 10, seed=3)
    assert pts == lhs_points(dims, 10, seed=3)
    assert pts != lhs_points(dims, 10, seed=4)
    # with as many samples as levels, every level of a 10-level dimension appears exactly once
    assert sorted(p.values[0] for p in pts) == list(range(10))
    assert sorted(p.values[1] for p in pts) == list(range(10))
    assert sorted(p.values[2] for p in pts) == [0] * 5 + [1] * 5
    small = parse_grid(["a.x=0,1"])
    assert len(lhs_points(small, 20, seed=0)) == 2  # only 2 distinct points exist


def test_point_key_is_stable_and_sensitive():
    data = read_yaml(default_scenario())
    k = point_key(data, ["algorithm.alpha=1"], 0, None)
    assert k == point_key(read_yaml(default_scenario()), ["algorithm.alpha=1"], 0, None)
    assert k != point_key(data, ["algorithm.alpha=2"], 0, None)
    assert k != point_key(data, ["algorithm.alpha=1"], 1, None)
    assert k != point_key(data, ["algorithm.alpha=1"], 0, "areal")
    edited = apply_overrides(data, ["algorithm.group_size=4"])
    assert k != point_key(edited, ["algorithm.alpha=1"], 0, None)


def test_a_changed_simulator_recomputes_a_resumed_point(tmp_path, monkeypatch):
    # a point finished by an older model (other code or calibration) is not served after an upgrade
    from rollart.sweep import store

    data = read_yaml(default_scenario())
    old = point_key(data, ["algorithm.alpha=1"], 0, None)
    digest = store.simulator_digest()
    assert len(digest) == 16 and digest == store.simulator_digest()
    monkeypatch.setattr(store, "simulator_digest", lambda: "0" * 16)
    assert point_key(data, ["algorithm.alpha=1"], 0, None) != old
    # the digest reads the cost models and the calibration they compose, so editing either changes it
    labels = {label for label, _ in store.simulator_files()}
    assert {"calibration/profiles/h20.yaml", "calibration/cost.py", "sim/engine.py", "rollart/core/controller.py"} <= labels


# ---------------------------------------------------------------- frontier and files


def test_pareto_front_keeps_only_undominated_points():
    rows = [
        {"key": "a", "cost_per_1k_trajectories_usd": 10.0, "trajectories_per_s": 1.0, "error": ""},
        {"key": "b", "cost_per_1k_trajectories_usd": 12.0, "trajectories_per_s": 0.9, "error": ""},  # dominated
        {"key": "c", "cost_per_1k_trajectories_usd": 15.0, "trajectories_per_s": 2.0, "error": ""},
        {"key": "d", "cost_per_1k_trajectories_usd": 8.0, "trajectories_per_s": 0.5, "error": ""},
        {"key": "e", "cost_per_1k_trajectories_usd": 1.0, "trajectories_per_s": 5.0, "error": "failed"},
        {"key": "f", "cost_per_1k_trajectories_usd": None, "trajectories_per_s": 3.0, "error": ""},
        {"key": "g", "cost_per_1k_trajectories_usd": 15.0, "trajectories_per_s": 1.5, "error": ""},  # dominated by c
    ]
    assert [r["key"] for r in pareto_front(rows)] == ["d", "a", "c"]


def test_results_csv_round_trips(tmp_path):
    rows = [{"key": "a", "algorithm.alpha": 1, "trajectories_per_s": 0.5, "gpus_by_pool": '{"h20":8}', "error": ""},
            {"key": "b", "algorithm.alpha": 2, "trajectories_per_s": None, "error": "boom"}]
    written = write_results(rows, tmp_path)
    assert written[0] == tmp_path / "results.csv"
    got = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [r["key"] for r in got] == ["a", "b"]
    assert got[0]["gpus_by_pool"] == '{"h20":8}' and got[1]["trajectories_per_s"] == "" and got[1]["error"] == "boom"
    try:
        import pyarrow.parquet as pq
    except ImportError:
        assert len(written) == 1
    else:
        assert pq.read_table(tmp_path / "results.parquet").column("key").to_pylist() == ["a", "b"]


def test_evaluate_point_reports_bad_points_instead_of_raising():
    data = read_yaml(default_scenario())
    rec = evaluate_point(data, [*TINY, "placement.hw_affinity.FrozenLake=H900"])
    assert rec["summary"] is None and "unknown pool 'H900'" in rec["error"]
    ok = evaluate_point(data, TINY)
    assert ok["error"] is None and ok["summary"]["trajectories_per_s"] > 0 and ok["seed"] == 0
    assert ok["placed_gpus"] == {"h800": 8, "h20": 8}


# ---------------------------------------------------------------- on Ray


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module (init takes seconds); RayPool reuses it and leaves it up."""
    ray = pytest.importorskip("ray")
    from rollart.runtime.cluster import init_local_ray

    init_local_ray(2, object_store_memory=200 * 1024 * 1024)
    yield ray
    ray.shutdown()


def test_sweep_on_ray_resumes_and_matches_in_process_results(local_ray, tmp_path):
    data = read_yaml(default_scenario())
    dims = parse_grid(["algorithm.alpha=0,2", "placement.generation.1.workers=4,8"])
    points = grid_points(dims)
    out = tmp_path / "sweep"
    first = run_sweep(data, dims, points, out, RayPool(), base_overrides=TINY, progress=False, title="t")
    assert (first.ran, first.skipped, first.failed, first.lost) == (4, 0, 0, 0)
    assert len(list((out / "points").glob("*.json"))) == 4
    assert (out / "results.csv").is_file() and (out / "pareto.png").stat().st_size > 10_000
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["algorithm.alpha"], r["placement.generation.1.workers"]) for r in rows] == \
        [("0", "4"), ("0", "8"), ("2", "4"), ("2", "8")]
    assert all(float(r["trajectories_per_s"]) > 0 and float(r["cost_per_1k_trajectories_usd"]) > 0 for r in rows)
    assert {r["gpus"] for r in rows} == {"12", "16"}
    # the serverless bill and the part of it that served calls (the rest is cold starts)
    assert all(0 < float(r["serverless_serving_s"]) <= float(r["serverless_gpu_seconds"]) for r in rows)
    assert 1 <= len(first.front) <= 4
    # a Ray task computes what the simulator computes in-process (deterministic)
    local = evaluate_point(data, [*TINY, *points[3].overrides])
    assert float(rows[3]["trajectories_per_s"]) == pytest.approx(local["summary"]["trajectories_per_s"], rel=1e-12)

    # rerun: nothing is simulated again, results are identical
    again = run_sweep(data, dims, points, out, RayPool(), base_overrides=TINY, progress=False, title="t")
    assert (again.ran, again.skipped) == (0, 4)
    assert again.rows == first.rows

    # a wider grid only runs the new points
    wider = parse_grid(["algorithm.alpha=0,1,2", "placement.generation.1.workers=4,8"])
    grown = run_sweep(data, wider, grid_points(wider), out, RayPool(), base_overrides=TINY, progress=False)
    assert (grown.ran, grown.skipped) == (2, 4)

    # a torn point file (an interrupted write) is redone, not trusted
    victim = next((out / "points").glob("*.json"))
    victim.write_text('{"summary": ')
    fixed = run_sweep(data, wider, grid_points(wider), out, RayPool(), base_overrides=TINY, progress=False)
    assert (fixed.ran, fixed.skipped) == (1, 5)
    assert json.loads(victim.read_text())["summary"]["trajectories_per_s"] > 0


def test_failed_points_are_kept_and_reported(local_ray, tmp_path):
    data = read_yaml(default_scenario())
    dims = parse_grid(["placement.generation.1.workers=8,64"])  # 64 H20 workers do not fit 8 H20
    res = run_sweep(data, dims, grid_points(dims), tmp_path, RayPool(), base_overrides=TINY, progress=False)
    assert res.failed == 1 and res.ran == 2
    bad = [r for r in res.rows if r["error"]]
    assert "cluster.gpu_pools.h20.count" in bad[0]["error"]
    assert [r["placement.generation.1.workers"] for r in res.front] == [8]


def _app() -> typer.Typer:
    from rollart.cli_sweep import plan, sweep

    app = typer.Typer(add_completion=False)
    app.command()(sweep)
    app.command()(plan)
    return app


def test_sweep_command(local_ray, tmp_path):
    runner = CliRunner()
    args = ["sweep", str(default_scenario()), "--grid", "algorithm.alpha=0,2", "--grid",
            "algorithm.redundancy=0,0.5", "--set", "algorithm.batch_size=16", "--steps", "2", "--out",
            str(tmp_path), "-q"]
    res = runner.invoke(_app(), args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "Pareto frontier" in res.output and "4 simulated, 0 already done, 0 failed" in res.output
    # 2 steps cannot pass the cold first step: every point is read over its whole run, and told so
    text = " ".join(res.output.split())
    assert "rates, step s and stale (the trained trajectories' mean policy lag, versions) over the whole run" in text
    assert "--steps 3 or more reads them past it" in text
    # the stale column (helper-94: the printed sweep showed no lag): each point's row ends with it
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert any(line.split()[-1:] == ["stale"] for line in res.output.splitlines())
    lasts = [line.split()[-1] for line in res.output.splitlines() if line.split()[:1] in (["*"], ["0"], ["2"])]
    assert sorted(f"{float(r['mean_staleness']):.2f}" for r in rows) == sorted(x for x in lasts if x != "stale")
    assert any(float(r["mean_staleness"]) > 0 for r in rows)
    rerun = runner.invoke(_app(), args, env={"COLUMNS": "200"})
    assert rerun.exit_code == 0 and "0 simulated, 4 already done" in rerun.output
    sampled = runner.invoke(_app(), [*args, "--samples", "3", "--grid", "algorithm.group_size=4,8"],
                            env={"COLUMNS": "200"})
    assert sampled.exit_code == 0, sampled.output
    assert len(list(csv.DictReader((tmp_path / "results.csv").open()))) == 3


@pytest.mark.parametrize("extra, needle", [
    ([], "--grid: give at least one"),
    (["--grid", "algorithm.alpha"], "--grid algorithm.alpha: expected PATH=v1,v2"),
    (["--grid", "algorithm.nope.x=1,2"], "algorithm.nope"),
    (["--grid", "algorithm.alpha=1", "--set", "placement.hw_affinity.FrozenLake=H900"], "unknown pool 'H900'"),
])
def test_sweep_usage_errors_exit_2_with_one_line(extra, needle, tmp_path):
    res = CliRunner().invoke(_app(), ["sweep", str(default_scenario()), "--out", str(tmp_path), *extra],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], res.output


def test_sweep_without_ray_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    res = CliRunner().invoke(_app(), ["sweep", str(default_scenario()), "--grid", "algorithm.alpha=0,1",
                                      "--out", str(tmp_path)], env={"COLUMNS": "300"})
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Ray is not installed" in lines[0] and "rollart[runtime]" in lines[0]
    assert not (tmp_path / "points").exists()


def test_simulate_and_the_new_modules_do_not_import_ray():
    code = ("import sys\n"
            "import rollart.cli, rollart.cli_sweep, rollart.sweep, rollart.sweep.run, rollart.planner\n"
            "from typer.testing import CliRunner\n"
            "res = CliRunner().invoke(rollart.cli.app, ['simulate', '-q', '--set', 'algorithm.batch_size=16', "
            "'--steps', '1'])\n"
            "assert res.exit_code == 0, res.output\n"
            "assert 'ray' not in sys.modules, 'ray was imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parent)
    assert proc.returncode == 0, proc.stderr


def test_serial_pool_runs_the_same_jobs():
    data = read_yaml(default_scenario())
    with SerialPool() as pool:
        got = dict(pool.imap_unordered([("a", data, TINY, None, None), ("b", data, [*TINY, "algorithm.alpha=2"], 1,
                                                                            "areal")]))
    assert set(got) == {"a", "b"} and got["b"]["mode"] == "areal" and got["b"]["seed"] == 1


def test_sweep_lists_every_point_marks_the_front_and_fails_when_a_point_failed(local_ray, tmp_path):
    args = ["sweep", str(default_scenario()), "--grid", "algorithm.alpha=0,1,x", "--set", "algorithm.batch_size=16",
            "--steps", "1", "--out", str(tmp_path), "-q"]
    res = CliRunner().invoke(_app(), args, env={"COLUMNS": "200"})
    assert res.exit_code == 1, res.output
    assert "3 points, fastest first; * the Pareto frontier" in res.output
    cells = [ln.split() for ln in res.output.splitlines()]
    rows = {c[1] if c[0] == "*" else c[0]: c for c in cells if c and c[0] in ("0", "1", "x", "*")}
    rows.pop("algorithm.alpha", None)  # the header
    assert set(rows) == {"0", "1", "x"}, res.output  # every point, failed ones too
    assert any(c[0] == "*" for c in rows.values()) and rows["x"][1] == "failed"
    assert "failed algorithm.alpha=x: algorithm.alpha:" in res.output


def test_process_pool_gives_the_serial_results():
    from rollart.plan import read_yaml
    from rollart.sweep.runner import ProcessPool, SerialPool

    data = read_yaml(default_scenario())
    jobs = [(f"k{a}", data, ["algorithm.steps=1", "algorithm.batch_size=16", f"algorithm.alpha={a}"], None, None)
            for a in (0, 1, 2)]
    with SerialPool() as serial:
        want = {k: r["summary"]["trajectories_per_s"] for k, r in serial.imap_unordered(jobs)}
    with ProcessPool(2) as pool:
        got = {k: r["summary"]["trajectories_per_s"] for k, r in pool.imap_unordered(jobs)}
    assert got == want
