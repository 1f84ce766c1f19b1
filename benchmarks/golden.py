"""Golden outputs: the result JSON of a few fixed-seed simulations, to check that a speed or
memory change leaves every figure identical (floats to a part in 1e9) where the model did not change.

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
import math
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


# How close two floats must be: the last bits of a sum or of a library routine move between
# numpy/scipy releases and CPUs (a fresh install moved busy_s in its 16th digit with no change to
# the code); an engine or scheduling change moves far more than a part in 1e9.
REL_TOL = 1e-9


def same(a: Any, b: Any, where: str = "") -> str | None:
    """Where two results differ (None: equal), floats compared to ``REL_TOL``."""
    if isinstance(a, float) or isinstance(b, float):
        ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(
            a, b, rel_tol=REL_TOL, abs_tol=1e-12)
        return None if ok else f"{where or '/'}: {a!r} != {b!r}"
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{where or '/'}: keys {sorted(a.keys() ^ b.keys())}"
        return next((d for k in sorted(a) if (d := same(a[k], b[k], f"{where}/{k}"))), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where or '/'}: {len(a)} != {len(b)} items"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := same(x, y, f"{where}[{i}]"))), None)
    return None if a == b else f"{where or '/'}: {a!r} != {b!r}"


def outputs() -> dict[str, str]:
    """Each case's result as JSON text (sorted keys, floats as repr)."""
    return {name: json.dumps(run_case(sc, ov, m, seed), sort_keys=True) for name, sc, ov, m, seed in CASES}


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
    bad = {k: same(json.loads(got[k]), json.loads(v)) if k in got else "missing" for k, v in want["outputs"].items()}
    bad = {k: d for k, d in bad.items() if d}
    print("identical" if not bad else "differ:\n" + "\n".join(f"  {k}: {d}" for k, d in bad.items()))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
