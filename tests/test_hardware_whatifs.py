"""Hardware what-ifs keep their direction end to end: a buyer reads these answers off whole runs, not
off a cost model, so each is checked through the simulator (scheduling, routing, trainer, weight
sync and all) on the default scenario at its own batch, Sync+ mode (rollout then train, no overlap
to hide a change), two seeds.

Each pair swaps one thing for something at least as good in every datasheet figure, so physics says
the run cannot get slower. What is not asserted, and why: more GPUs of a *slower* kind in a
heterogeneous pool (least-loaded routing then sends a critical trajectory to the slower GPU, a
real effect in a lockstep step), and ROLLART's small-margin pairs (a 4-step run's redundancy aborts
move its throughput by a few % from seed to seed)."""

from __future__ import annotations

import pytest

from rollart.core import mode_config
from rollart.plan import load_plan
from rollart.scenarios_catalog import default_scenario
from rollart.sim import simulate_plan

SEEDS = (0, 1)
# (what changes, the baseline's overrides, the better plan's overrides, the least gain physics leaves)
PAIRS = [
    ("the H20 rollout pool on H200s (more compute, HBM and memory in every figure)",
     [], ["cluster.gpu_pools.h20.gpu=H200"], 1.05),
    ("A100 rollout GPUs replaced by H800s (3.2× the BF16 peak, 1.6× the HBM)",
     ["cluster.gpu_pools.h20.gpu=A100"], ["cluster.gpu_pools.h20.gpu=H800"], 1.10),
    ("FP8 weights (half the bytes to read, twice the tensor-core peak on Hopper)",
     [], ["model.weight_dtype=fp8"], 1.05),
    ("a trainer twice as fast (MFU 0.4 against 0.2)",
     ["placement.trainer.mfu=0.2"], ["placement.trainer.mfu=0.4"], 1.02),
]


def _throughput(overrides: list[str], seed: int) -> float:
    plan = load_plan(default_scenario(), [*overrides, "algorithm.steps=4"])
    return simulate_plan(plan, mode_config(plan, "sync+"), seed).to_result().summary["trajectories_per_s"]


@pytest.mark.parametrize("what,worse,better,gain", PAIRS, ids=[p[0].split(" (")[0] for p in PAIRS])
def test_better_hardware_never_slows_a_run(what: str, worse: list[str], better: list[str], gain: float) -> None:
    for seed in SEEDS:
        base, up = _throughput(worse, seed), _throughput(better, seed)
        assert up >= gain * base, f"{what}, seed {seed}: {base:.3f} → {up:.3f} traj/s"
