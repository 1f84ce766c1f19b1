"""Speed and memory work must not change results: fixed-seed simulations give identical JSON
(floats to a part in 1e9) to the outputs captured on the reference tree (``benchmarks/golden.py``),
as long as the model (cost models, calibration, scenarios, plan schema, modes, trainer protocol, report) is
the one they were captured with. When a model file changed, the outputs may rightly differ:
the test says which files and skips; recapture with
``python benchmarks/golden.py --write tests/data/golden_sim.json`` on a tree whose engine is
known good."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.golden import CASES, model_fingerprint, run_case, same

GOLDEN = Path(__file__).parent / "data" / "golden_sim.json"


@pytest.fixture(scope="module")
def golden() -> dict:
    data = json.loads(GOLDEN.read_text())
    now = model_fingerprint()
    changed = sorted(k for k in set(data["model"]) | set(now) if data["model"].get(k) != now.get(k))
    if changed:
        pytest.skip(f"the model changed since the golden capture ({', '.join(changed[:4])}"
                    f"{', …' if len(changed) > 4 else ''}); outputs may rightly differ")
    return data["outputs"]


@pytest.mark.slow
@pytest.mark.parametrize("name,scenario,overrides,mode,seed", CASES, ids=[c[0] for c in CASES])
def test_outputs_are_identical(golden: dict, name: str, scenario: str, overrides: list[str],
                                    mode: str | None, seed: int) -> None:
    diff = same(json.loads(json.dumps(run_case(scenario, overrides, mode, seed))), json.loads(golden[name]))
    assert diff is None, diff
