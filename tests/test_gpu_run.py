"""``benchmarks/gpu/run.sh`` in its CPU dry-run mode (device cpu, tiny shapes): the same stages
the GPU machine runs, the files it returns, and the importable copy of rollart it builds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "gpu" / "run.sh"
NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # what the device tool brings back


@pytest.mark.slow
def test_dry_run_does_every_stage_and_returns_at_most_eight_files(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "ROLLART_GPU_DRYRUN": "1", "PYTHON": sys.executable, "ROLLART_GPU_STEPS": "1",
           "COLUMNS": "200"}
    proc = subprocess.run(["bash", str(RUN), str(out)], capture_output=True, text=True, env=env, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    # rollart came from the copy setup_env.py built, not from the tree or the editable install
    assert re.search(r"rollart from \S*/rollart-gpu-\w+/src/rollart/__init__\.py", proc.stdout), proc.stdout[:2000]
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert [str(f) for f in files] == ["checks.json", "cpu-local.yaml", "kernels/attn_decode.csv",
                                       "kernels/attn_prefill.csv", "kernels/copy.csv", "kernels/gemm.csv",
                                       "kernels/provenance.json", "summary.md"]
    assert len(files) <= 8 and all(NAME.match(part) for f in files for part in f.parts)
    checks = json.loads((out / "checks.json").read_text())
    assert checks["digits"]["ok"] and len(checks["digits"]["steps"]) == 1
    assert checks["megatron"].get("skipped") or checks["megatron"].get("ok")
    summary = (out / "summary.md").read_text()
    assert "| attention decode |" in summary and "held-out MAPE" in summary and "digits: ok" in summary
    assert "== summary" in proc.stdout and "megatron:" in proc.stdout and "digits (cpu): ok" in proc.stdout


def test_run_sh_needs_an_output_folder():
    proc = subprocess.run(["bash", str(RUN)], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_setup_env_builds_an_importable_package(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "setup_env.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert line == f"PYTHONPATH={tmp_path.resolve()}/src:{tmp_path.resolve()}/lib"
    code = ("import rollart, rollart.sim.costs.gpu, rollart.calibration.gpu_kernels as g, rollart.scenarios as s; "
            "import pathlib; print(rollart.__file__); print(g.__file__); "
            "print(len(list(pathlib.Path(s.__file__).parent.glob('*.yaml'))) > 0)")
    env = {**os.environ, "PYTHONPATH": line.split("=", 1)[1]}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.split()
    assert lines[0].startswith(str(tmp_path.resolve() / "src" / "rollart"))
    assert lines[1] == str(tmp_path.resolve() / "src" / "rollart" / "calibration" / "gpu_kernels.py")
    assert lines[2] == "True"
