"""benchmarks/week.py: the 3,072-GPU plan under the scale-out approximation, run short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import week


def test_a_short_run_reports_its_figures_and_says_the_approximation_is_on(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "week.json"
    # 30 simulated minutes: a few steps (the first is the pipeline's fill); its budget of 8 steps (one per 240 s) is a
    # long run for the approximation (sim/scale.py, min_groups): 16 groups per batch, 1/96
    assert week.main(["--sim-hours", "0.5", "-q", "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    assert "3,072 GPUs" in printed and "--scale-approx on (1/96" in printed
    assert "scale-out approximation: simulated 1/96 of the cluster" in printed
    assert "wall" in printed and "CPU" in printed and "peak RSS" in printed
    out = json.loads(out_json.read_text())
    assert out["gpus"] == 3072 and out["scale_factor"] == 96 and out["scale_approx"]["factor"] == 96
    assert 1 <= out["steps"] <= 10 and 0 < out["simulated_s"] <= 0.5 * 3600
    assert out["wall_s"] > 0 and out["cpu_s"] > 0 and out["peak_rss_mb"] > 0
    assert "extrapolated, not measured" in printed and out["week_extrapolated"]["wall_min"] > 0


@pytest.mark.parametrize("argv", [["--sim-hours", "0"], ["--sim-hours", "-1"], ["--k", "0"]])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert week.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(argv[0])
