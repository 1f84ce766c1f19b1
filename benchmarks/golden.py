"""Golden outputs: the result JSON of a few fixed-seed simulations, to check that a speed or
memory change leaves every figure byte-identical where the model did not change.

    python benchmarks/golden.py --write tests/data/golden_sim.json   # capture (on the reference tree)
    python benchmarks/golden.py --check tests/data/golden_sim.json   # compare this tree

The capture also records the git blob hash of every file that defines the *model* (cost models,
calibration, scenarios, plan schema, modes, trainer protocol, report): when one of them differs
the outputs may rightly change, and ``tests/test_golden.py`` says so and skips instead of failing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# (name, scenario, overrides, mode, seed)
CASES: list[tuple[str, str, list[str], str | None, int]] = [
    *[(f"default-{m}", "default", ["algorithm.batch_size=16", "algorithm.steps=3"], m, 3)
      for m in ("sync", "sync+", "one-off", "areal", "rollart")],
    ("default-failures", "default", ["algorithm.batch_size=32", "algorithm.steps=4", "algorithm.alpha=2",
                                     "tasks.CodeExec.env.failure_prob=0.3", "tasks.CodeExec.env.timeout_s=4",
                                     "tasks.CodeExec.env.step.sigma=1.5"], "rollart", 11),
    ("paper-32b", "paper/qwen3-32b-128gpu", ["algorithm.steps=2"], None, 0),
    ("pd-swe", "paper/experiments/pd-disaggregation-swe", ["algorithm.steps=2"], None, 0),
    ("reward-dedicated", "paper/experiments/reward-placement", ["algorithm.steps=2"], None, 0),
    ("validate-rollart", "local/validate-rollart", [], None, 0),
]

# Files whose change may legitimately change the outputs (everything the simulator reads that is
# not the engine/core mechanism this check guards).
MODEL_GLOBS = ["sim/costs/*.py", "sim/reward.py", "calibration/**/*.py", "calibration/**/*.yaml",
               "calibration/**/*.csv", "scenarios/**/*.yaml", "rollart/plan/*.py", "rollart/core/modes.py",
               "rollart/core/trainer.py", "rollart/report.py"]
NOT_MODEL = {"sim/costs/env.py"}  # the env sampler is part of the mechanism (its draws must not change)


def _blob_hash(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def model_fingerprint(root: Path = ROOT) -> dict[str, str]:
    files = sorted({p for g in MODEL_GLOBS for p in root.glob(g) if p.is_file()})
    return {str(p.relative_to(root)): _blob_hash(p) for p in files if str(p.relative_to(root)) not in NOT_MODEL}


def run_case(scenario: str, overrides: list[str], mode: str | None, seed: int) -> dict[str, Any]:
    from rollart.core import mode_config
    from rollart.plan import load_plan
    from rollart.scenarios_catalog import resolve
    from rollart.sim import simulate_plan

    plan = load_plan(resolve(scenario), overrides)
    return simulate_plan(plan, mode_config(plan, mode), seed).to_result().to_dict()


# Significant digits a float keeps in the canonical text: the last bits of a sum or of a library
# routine move between numpy/scipy releases and CPUs (a fresh install here changed busy_s in its
# 16th digit with no change to the code); an engine or scheduling change moves far more than 1e-12.
DIGITS = 12


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.{DIGITS}g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    return x


def canonical(result: dict[str, Any]) -> str:
    """A result as canonical JSON text: sorted keys, floats to ``DIGITS`` significant digits."""
    return json.dumps(_rounded(result), sort_keys=True)


def outputs() -> dict[str, str]:
    """Each case's result as canonical JSON text (equal text means equal results)."""
    return {name: canonical(run_case(sc, ov, m, seed)) for name, sc, ov, m, seed in CASES}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write")
    g.add_argument("--check")
    args = ap.parse_args(argv)
    if args.write:
        Path(args.write).parent.mkdir(parents=True, exist_ok=True)
        Path(args.write).write_text(json.dumps({"model": model_fingerprint(), "outputs": outputs()},
                                               indent=1, sort_keys=True) + "\n")
        return 0
    want = json.loads(Path(args.check).read_text())
    got = outputs()
    bad = [k for k in want["outputs"] if got.get(k) != want["outputs"][k]]
    print("identical" if not bad else f"differ: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
