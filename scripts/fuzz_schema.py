#!/usr/bin/env python
"""Fuzz the plan schema with N mutated scenarios and print the outcome counts.

    python scripts/fuzz_schema.py 10000 [--seed S] [--show 5]

The cases are tests/test_fuzz_schema.py's (hypothesis, no shrinking): each is refused with
one line per problem naming the field (`refused`), simulated to a finite, self-consistent
result (`simulated`, or `stopped` when the run ended early with its error), or a failure
(`bad-error`, `traceback`, `hang`, `invalid-output`), whose first examples are printed."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from tests.test_fuzz_schema import GOOD, mutated_plans, run_case  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, nargs="?", default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=5, help="examples printed per failure outcome")
    args = ap.parse_args()
    counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    t0 = time.perf_counter()

    @seed(args.seed)
    @settings(max_examples=args.n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(mutated_plans())
    def one(case):  # noqa: ANN001
        name, data, done = case
        outcome, detail = run_case(data)
        counts[outcome] += 1
        if outcome == "refused":
            reasons[detail.split(":")[0]] += 1
        if outcome not in GOOD and len(examples.setdefault(outcome, [])) < args.show:
            examples[outcome].append(f"{name} after {done}: {detail}")
        total = sum(counts.values())
        if total % 500 == 0:
            print(f"  {total} cases, {time.perf_counter() - t0:.0f} s: {dict(counts)}", file=sys.stderr, flush=True)

    one()
    total = sum(counts.values())
    print(f"{total} mutated scenarios in {time.perf_counter() - t0:.0f} s (seed {args.seed})")
    for outcome in (*GOOD, "bad-error", "traceback", "hang", "invalid-output"):
        print(f"  {outcome:15s} {counts.get(outcome, 0)}")
    print("most frequent refusals: " + ", ".join(f"{k} {v}" for k, v in reasons.most_common(8)))
    for outcome, lines in examples.items():
        print(f"{outcome}:")
        for line in lines:
            print(f"  {line}")
    return 0 if all(k in GOOD for k in counts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
