"""Kernel timings (``calibrate profile --engine kernels``): the tiny-shape run on CPU, the
folder it writes, ``calibrate fit`` on it, the roofline comparison and the provenance."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from rollart.calibration import gpu_kernels as gk  # noqa: E402
from rollart.calibration import kernels as K  # noqa: E402
from rollart.calibration import generation_cost  # noqa: E402
from rollart.calibration.profiles import KernelProfile, load_profile  # noqa: E402
from rollart.cli import app  # noqa: E402
from rollart.plan.schema import GpuType, ModelSpec  # noqa: E402

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kernels") / "cpu"
    result = _cli("calibrate", "profile", "--engine", "kernels", "--device", "cpu", "--out", str(out),
                  "--repeats", "3", "--peak-tflops", "0.05")
    assert result.exit_code == 0, result.output
    return out


def test_the_grids_cover_the_qwen3_layers():
    shapes = gk.FULL.gemm_shapes()
    # 8B: QKV 4096 → (32 + 16)·128, gate+up 4096 → 2·12288; 32B: O 64·128 → 5120
    assert ("Qwen3-8B", "qkv", 4096, 6144) in shapes and ("Qwen3-8B", "gate_up", 4096, 24576) in shapes
    assert ("Qwen3-32B", "o", 8192, 5120) in shapes
    assert len({(k, n) for _, _, k, n in shapes}) == len(shapes)  # each distinct shape once
    assert gk.FULL.geometries() == [(32, 8, 128), (40, 8, 128), (64, 8, 128)]
    assert all(b * length <= gk.FULL.max_decode_tokens for b, length in gk.FULL.decode_points())
    assert len(gk.TINY) == 25 + 7 + 12 + 3


def test_cpu_run_writes_every_file_in_the_fitted_format(tiny_dir):
    for kind, name in gk.FILES.items():
        with (tiny_dir / name).open() as fh:
            rows = list(csv.DictReader(fh))
        assert tuple(rows[0]) == gk.COLUMNS[kind]
        assert all(float(r["latency_us"]) > 0 and math.isfinite(float(r["latency_us"])) for r in rows)
    data = gk.load_dir(tiny_dir)
    assert data.gemm[0].shape == (25, 3) and data.prefill[0].shape == (7, 3) and data.decode[0].shape == (12, 6)
    # fp32 on CPU: 4 bytes per KV element in the decode model's last column
    assert set(data.decode[0][:, 5]) == {4.0}
    # the formulas of calibration/kernels.py evaluate on these arrays as they are
    p = {"t0": 1e-6, "e_max": 0.5, "m_half": 10.0, "e_mem": 0.5}
    assert np.isfinite(K.gemm_time(data.gemm[0], p, 1e11, 1e10)).all()


def test_provenance_names_the_device_and_the_method(tiny_dir):
    prov = json.loads((tiny_dir / gk.PROVENANCE).read_text())
    for key in ("date", "gpu", "driver", "torch", "cuda", "python", "method", "peak_tflops", "copy_tbps", "grid"):
        assert key in prov, key
    assert prov["torch"] == torch.__version__ and prov["driver"] == "none" and prov["peak_source"] == "given"
    assert prov["rows"] == {"gemm": 25, "attn_prefill": 7, "attn_decode": 12, "copy": 3}
    assert "perf_counter" in prov["method"] and prov["copy_tbps"] > 0
    assert "calibrate profile" in prov["command"]


def test_calibrate_fit_on_the_folder_writes_a_usable_kernel_profile(tiny_dir, tmp_path):
    out = tmp_path / "cpu.yaml"
    result = _cli("calibrate", "fit", str(tiny_dir), "--gpu", "cpu-local", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "held-out MAPE" in result.output and "| attention decode |" in result.output
    profile = load_profile(out)
    assert isinstance(profile, KernelProfile) and profile.gpu == "cpu-local"
    for c in (profile.gemm, profile.attn_prefill, profile.attn_decode):
        assert c.heldout_rows >= 1 and c.mape_heldout is not None and math.isfinite(c.mape_heldout)
        assert c.derived is None  # measured here, not derived
    assert profile.allreduce.derived  # one device: all-reduce is not measured
    # a non-preset device is referenced to what it measured
    prov = json.loads((tiny_dir / gk.PROVENANCE).read_text())
    assert profile.peak_tflops_bf16 == pytest.approx(0.05) and profile.hbm_tbps == pytest.approx(prov["copy_tbps"])
    # the simulator composes it for a model (finite times)
    gpu = GpuType(tflops_bf16=0.05, hbm_tbps=prov["copy_tbps"], memory_gb=16, nvlink_gbps=1)
    gen = generation_cost(ModelSpec.model_validate("Qwen3-tiny"), "cpu-local", gpu, 1, profile=str(out))
    assert "calibrated kernel profile cpu-local" in gen.source
    assert 0 < gen.prefill_time(64, 64 * 32) < 10 and 0 < gen.decode_line(4).total(256, 4, 8) < 10
    shown = _cli("calibrate", "show", str(out))
    assert shown.exit_code == 0, shown.output


def test_a_preset_gpu_is_referenced_to_its_datasheet(tiny_dir):
    data = gk.load_dir(tiny_dir)
    from rollart.plan.presets import GPU_PRESETS

    peak, bw, _, basis = gk.reference_rates(data, "h200")
    sheet = GPU_PRESETS["H200"]
    assert (peak, bw) == (sheet["tflops_bf16"] * 1e12, sheet["hbm_tbps"] * 1e12) and basis == "H200 datasheet"
    assert gk.fit_profile(tiny_dir, "h200").gpu == "H200"


def test_roofline_comparison_per_family(tiny_dir):
    data = gk.load_dir(tiny_dir)
    peak, bw, _, _ = gk.reference_rates(data, "cpu-local")
    preds = gk.roofline_predictions(data, peak, bw)
    # the decode-attention roofline by hand for the first row: max(compute, KV bytes) at 0.45 / 0.80
    b, length, h, hkv, d, nb = data.decode[0][0]
    want = max(4 * h * d * b * length / (peak * 0.45), b * length * 2 * hkv * d * nb / (bw * 0.80))
    assert preds["attention decode"][0][0] == pytest.approx(want)
    rows = gk.compare_roofline(tiny_dir, "cpu-local", gk.fit_profile(tiny_dir, "cpu-local"))
    fams = {r.family: r for r in rows}
    assert {"gemm, < 512 tokens", "attention prefill", "attention decode", "device copy"} <= set(fams)
    for r in rows:
        pred, meas = preds[r.family]
        err = (pred - meas) / meas
        assert r.rows == len(meas) and r.roofline_mape == pytest.approx(np.mean(np.abs(err)), abs=1e-4)
        assert r.roofline_min_error <= r.roofline_median_error <= r.roofline_max_error
    assert fams["attention decode"].fitted_mape_heldout is not None and fams["device copy"].fitted_mape_heldout is None
    table = gk.format_table(rows, "t")
    assert table.count("\n|") == len(rows) + 2 and "error = (predicted − measured) / measured" in table


def test_bad_folders_fail_with_one_line(tmp_path, tiny_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _cli("calibrate", "fit", str(empty), "--gpu", "H200")
    assert result.exit_code == 2 and "gemm.csv: no such file" in result.output
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in [*gk.FILES.values(), gk.PROVENANCE]:
        (bad / name).write_bytes((tiny_dir / name).read_bytes())
    text = (bad / "gemm.csv").read_text().splitlines()
    text[1] = ",".join(text[1].split(",")[:-2] + ["nan", "0.1"])
    (bad / "gemm.csv").write_text("\n".join(text) + "\n")
    result = _cli("calibrate", "fit", str(bad), "--gpu", "H200")
    assert result.exit_code == 2 and "gemm.csv:2: latency_us must be a positive number" in result.output
    assert "Traceback" not in result.output


def test_profile_cli_input_errors_exit_2(tmp_path):
    r = _cli("calibrate", "profile", "--engine", "kernels", "--out", str(tmp_path / "x"), "--shapes", "huge")
    assert r.exit_code == 2 and "--shapes" in r.output
    if not torch.cuda.is_available():
        r = _cli("calibrate", "profile", "--engine", "kernels", "--device", "cuda", "--out", str(tmp_path / "x"))
        assert r.exit_code == 2 and "no CUDA GPU" in r.output
    f = tmp_path / "file"
    f.write_text("")
    r = _cli("calibrate", "profile", "--engine", "kernels", "--out", str(f))
    assert r.exit_code == 2 and "is a file" in r.output
    r = _cli("calibrate", "profile", "--engine", "kernels", "--out", str(tmp_path / "x"), "--model", "Qwen3-8B")
    assert r.exit_code == 2 and "--model: --engine kernels times" in r.output
    r = _cli("calibrate", "profile", "--engine", "torch", "--out", str(tmp_path / "a.csv"), "--shapes", "tiny")
    assert r.exit_code == 2 and "only for --engine kernels" in r.output


def test_timer_blocks_short_calls_and_takes_the_median():
    calls = []
    timer = gk.Timer(device="cpu", warmup=1, repeats=3, min_block_s=1e-3)
    t = timer.time([lambda: calls.append(1)])
    # a call of well under a microsecond is repeated within each of the 3 blocks (at most max_inner times)
    inner = (len(calls) - 1) // 3
    assert 0 < t < 1e-3 and len(calls) == 1 + 3 * inner and 1 < inner <= timer.max_inner
    assert gk.copies_for(10, "cpu") == 1


def test_device_names_map_to_presets():
    assert gk.preset_for_name("NVIDIA H200") == "H200" and gk.preset_for_name("NVIDIA H20") == "H20"
    assert gk.preset_for_name("NVIDIA H100 80GB HBM3") == "H100"
    assert gk.preset_for_name("NVIDIA GeForce RTX 4090") == "NVIDIA-GeForce-RTX-4090"
    assert gk.preset_name("cpu") == "cpu-local"
