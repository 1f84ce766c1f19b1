"""Scale-out approximation (sim/scale.py): 1/m of a large cluster simulated in full detail, the
rest accounted for by symmetry, against full simulation at 128, 512 and 1,024 GPUs."""

from __future__ import annotations

import os

import numpy as np
import pytest

from benchmarks.sim_speed import scaled_overrides
from rollart.core import mode_config
from rollart.plan import PlanError, load_plan
from rollart.scenarios_catalog import resolve
from rollart.sim import SimBackend, simulate_plan
from rollart.sim.scale import GroupTail, auto_factor, cohort_done_s, min_groups, shrink_plan
from tests.conftest import small_plan

PAPER = "paper/qwen3-32b-128gpu"
STEPS = 4  # the first step fills the pipeline; the steady ones are compared


def _paper(k: int, steps: int = STEPS):
    return load_plan(resolve(PAPER), [*scaled_overrides(k), f"algorithm.steps={steps}"])


def test_auto_factor_keeps_a_representative_subset() -> None:
    assert auto_factor(_paper(24)) == 48          # 3,072 GPUs, 4 steps: 4 workers per group, 32 groups per batch
    assert auto_factor(_paper(8)) == 16
    assert auto_factor(small_plan()) == 1         # too small to approximate
    # a long run averages the subset's sample over its steps: 16 groups per batch, 2 workers per group
    assert auto_factor(_paper(24, steps=20)) == 96 and auto_factor(_paper(8, steps=20)) == 32
    # modes that launch whole batches wait for the full batch's slowest trajectory: never approximated
    assert auto_factor(_paper(24, steps=20), batch_level=True) == 1
    sub = shrink_plan(_paper(8), 16)
    assert [g.workers for g in sub.placement.generation] == [4, 4]
    assert sub.algorithm.batch_size == 8 * 512 // 16 and sub.placement.trainer.gpus == 8 * 64 // 16


def test_a_longer_run_may_simulate_fewer_groups_per_batch_but_never_below_the_validated_floor() -> None:
    assert [min_groups(s) for s in (1, 2, 4)] == [32, 32, 32]     # short runs: as validated at 4 steps
    assert [min_groups(s) for s in (5, 6, 7, 20, 10_000)] == [24, 20, 16, 16, 16]  # 96 over the steady steps
    assert all(min_groups(s) >= min_groups(s + 1) for s in range(1, 50))


def test_refuses_what_is_not_symmetric_or_not_divisible() -> None:
    with pytest.raises(PlanError, match="not a multiple of 3"):
        shrink_plan(_paper(1), 3)


@pytest.mark.parametrize("mode", ["sync", "sync+", "one-off"])
def test_modes_that_launch_whole_batches_are_simulated_in_full(mode: str) -> None:
    """A review measured the approximation 12-33 % fast for sync, sync+ and one-off at 1,024 GPUs (the
    step waits for the slowest of the full batch, which a 1/m subset under-samples): refused, and the
    CLI's --scale-approx simulates them in full and says why."""
    from rollart.core import mode_config
    from rollart.sim import simulate_plan

    plan = _paper(8)
    with pytest.raises(PlanError, match="launches whole batches"):
        simulate_plan(plan, mode_config(plan, mode), 0, scale_approx=2)


def test_batching_serverless_instances_shrink_by_count_not_by_their_concurrency() -> None:
    """--scale-approx keeps 1/m of the serverless instances, each taking instance_concurrency calls
    (shrinking max_concurrency alone left it below instance_concurrency: 'the 1/16 plan is not valid')."""
    def shrunk(*serverless: str) -> tuple[int, int]:
        plan = load_plan(resolve(PAPER), [*scaled_overrides(8), f"algorithm.steps={STEPS}", *serverless])
        sub = shrink_plan(plan, 16).cluster.serverless
        return sub.instance_concurrency, sub.max_concurrency

    assert shrunk("cluster.serverless.instance_concurrency=8") == (8, 32)  # 64 instances of 8 → 4
    assert shrunk("cluster.serverless.instance_concurrency=8", "cluster.serverless.max_concurrency=64") == (8, 8)
    assert shrunk() == (1, 32)  # one call per instance: as before, ⌈512 / 16⌉


def test_result_says_so_and_scales_counts_back() -> None:
    plan = _paper(4, steps=2)
    sim = simulate_plan(plan, mode_config(plan), 0, scale_approx=8)
    out = sim.to_result()
    assert out.summary["scale_approx"]["factor"] == 8 and "1/8" in out.summary["scale_approx"]["note"]
    platform = sim.backend.serverless  # the subset's serverless bill, its serving part too, × m
    assert out.summary["serverless_gpu_seconds"] == pytest.approx(8 * platform.billed_s)
    assert out.summary["serverless_serving_s"] == pytest.approx(8 * platform.busy_s)
    assert [s.trajectories for s in out.steps] == [plan.algorithm.batch_size] * 2
    # the per-task counts are the full plan's too: they add up to the step's trajectories
    assert all(sum(s.task_trajectories.values()) == s.trajectories for s in out.steps)
    assert out.scenario == plan.name


def _cohort(rng: np.random.Generator, groups: int) -> tuple[list[GroupTail], np.ndarray]:
    """Groups of 10 members of which 8 must score; a member's duration is uniform (its turn count)
    plus noise (its per-turn latencies), the shape of the paper's long-horizon tasks."""
    d = np.sort(rng.uniform(100, 300, (groups, 10)) + rng.normal(0, 5, (groups, 10)), axis=1)
    return [GroupTail("t", 0.0, 8, list(r[:8]), [r[7], r[7]]) for r in d], d[:, 7]


def test_cohort_done_matches_the_order_statistics_it_estimates() -> None:
    rng = np.random.default_rng(7)
    # the truth by Monte Carlo: E[slowest of 32 m groups]
    slowest = {m: np.mean([_cohort(rng, 32 * m)[1].max() for _ in range(300)]) for m in (1, 4, 16)}
    estimates: dict[int, list[float]] = {m: [] for m in slowest}
    for _ in range(6):  # one estimate is a sample: its mean over cohorts is what must be right
        cohort, _ = _cohort(rng, 32)
        history = [g for _ in range(8) for g in _cohort(rng, 32)[0]]
        for m in estimates:
            estimates[m].append(cohort_done_s(cohort, m, history))
        assert estimates[1][-1] < estimates[4][-1] < estimates[16][-1]
    for m, est in estimates.items():  # within a fifth of the growth past the slowest of 32
        assert abs(np.mean(est) - slowest[m]) < 0.2 * (slowest[16] - slowest[1]), m


def test_only_batches_that_wait_for_their_slowest_group_are_corrected() -> None:
    """A batch formed while groups it could use still run is an inner quantile of their finish times
    (the same in the subset and the full cluster): no correction. One that waited for all it could be
    formed from sits on the tail: corrected. Which kind a step is depends on which side bounds it, so
    the two kinds come from the two extremes of the trainer's speed (not from the shipped calibration,
    which moves the boundary): a fast trainer (MFU 0.5) asks for each batch while the next groups
    still run; a slow one (0.05) finds the batch's whole cohort done, every steady step."""
    delays = {}
    for mfu in (0.5, 0.05):
        plan = load_plan(resolve(PAPER), [*scaled_overrides(4), "algorithm.steps=5", "algorithm.env_groups=false",
                                          f"placement.trainer.mfu={mfu}"])
        b = SimBackend(plan, mode_config(plan), 0, keep_history=False, scale_approx=8)
        out = b.run().to_result()
        delays[mfu] = [t.delay_s for t in b.tail.steps]
        assert delays[mfu][0] == 0.0  # step 0: the first groups of 1.25 batches' to finish (an inner quantile)
        added = out.summary["scale_approx"]["tail_s"]
        assert added >= 0 and out.steps[-1].end_s == pytest.approx(b.ctl.stats.steps[-1].end_s + added)
    assert all(d == 0 for d in delays[0.5][1:]) and all(d != 0 for d in delays[0.05][1:])


def test_env_group_batches_on_the_paper_plans_hardly_move() -> None:
    """On env groups (the default) a batch's round 0 waits for every env group's oldest episode; the
    correction for the slowest of all of them (sim/scale.py, env_batch_done_s) estimates each batch, and
    on a paper plan (longest response 2-3× the mean) it does not move the steps: the subset's own waits
    already reach it (the figures below were measured without it)."""
    plan = _paper(4, steps=4)
    b = SimBackend(plan, mode_config(plan), 0, keep_history=False, scale_approx=8)
    out = b.run().to_result()
    assert sorted(b.tail.env_batches) == [0, 1, 2, 3]  # every batch was estimated
    assert abs(out.summary["scale_approx"]["tail_s"]) < 0.01 * out.steps[-1].end_s
    assert "estimated member by member" in out.summary["scale_approx"]["note"]


def test_a_long_tailed_env_groups_approximation_says_it_overstates() -> None:
    """The env-groups approximation does not scale a batch's wait for the slowest of all env groups: on the
    paper plans (longest response ~2-3× the mean) that is within the validated bounds below and nothing is
    said; a trained batch whose longest response is 5× its mean or more carries a warning naming the fix."""
    from rollart.core.stats import StepRecord
    from rollart.sim.scale import env_groups_tail_warning

    plan = _paper(4, steps=4)
    out = SimBackend(plan, mode_config(plan), 0, keep_history=False, scale_approx=8).run().to_result()
    assert "WARNING" not in out.summary["scale_approx"]["note"]
    def record(longest: int, mean: float) -> StepRecord:
        return StepRecord(step=0, start_s=0.0, end_s=1.0, breakdown_s={}, trajectories=1, tokens=1, mean_staleness=0.0,
                          response_tokens_max=longest, response_tokens_mean=mean)

    light, heavy = [record(6_000, 2_500)], [record(27_000, 3_000)]
    assert env_groups_tail_warning(light) == ""
    warning = env_groups_tail_warning(heavy)
    assert "9×" in warning and "overstated" in warning and "without --scale-approx" in warning


def _steady(result) -> tuple[float, float]:
    steps = result.steps[1:]
    time = sum(s.time_s for s in steps)
    return time / len(steps), sum(s.tokens for s in steps) / time


def _mean(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return sum(r[0] for r in runs) / len(runs), sum(r[1] for r in runs) / len(runs)


# Measured (12:30 UTC, this tree, 4 steps; steady step time / trained tokens per second, the mean of the
# approximation's seeds 0-3 against the full simulation's seeds 0-1):
#                 before this tail correction       after
#   128 GPUs      -0.1 % / +0.3 %  (m = 2)           +0.7 % / +0.0 %
#   512 GPUs      -1.7 % / +1.3 %  (m = 8)           -0.0 % / +0.5 %
#   1,024 GPUs    -2.2 % / +1.7 %  (m = 16)          -0.3 % / +0.6 %
# Before, the bias grew with the cluster (the full batch waits for the slowest of 8, 32, 64 times the
# subset's 32 groups); after, it is flat. Over steps 2-5 of 6-step runs: before -0.1 / -2.2 / -3.3 %,
# after +0.6 / -0.5 / -1.0 % on the step time.
# After the fid-gpu/fid-sys merge (a064299 + ee6a0f0) the opt-in 1,024-GPU check failed: step time
# 420.1 s against 433.6 s (-3.1 %). That was the seeds, not a bias: one approximate run of 4 steps is a
# sample of 32 groups (256 trajectories) whatever the cluster, so its steady step spreads from seed to
# seed (sd 2.3 % then; 5 % since the env managers bound concurrency, which makes the steps alternate
# between training-bound and rollout-bound), and seeds 0-3 happened to be low (12 seeds against 3:
# -1.5 % / +1.3 %). With the env managers (algorithm.env_managers), steady step s / trained tokens per s:
#                 approximation, 12 seeds    full, 3 seeds      difference
#   128 GPUs      435.5 / 17,069 (m = 2)     436.3 / 17,095     -0.2 % / -0.1 %
#   512 GPUs      437.9 / 67,927 (m = 8)     438.7 / 67,917     -0.2 % / +0.0 %
#   1,024 GPUs    438.7 / 135,622 (m = 16)   444.9 / 134,133    -1.4 % / +1.1 %
# (standard errors: approximation 1.3-1.5 % / 0.9-1.2 %, full 0.5-2.5 %). The bound is on the
# approximation's expectation, so each check averages enough seeds for a 5 % per-seed spread: at 128 GPUs
# the approximation simulates half the cluster with the same trajectory draws, so the same seeds pair up
# (per-seed differences -0.6, +1.6, -0.2, -4.7 %); at 512 and 1,024 they do not, and 12 approximate seeds
# (~5 CPU-s each) are set against the full runs (~55 and ~140 CPU-s each); those two checks are opt-in
# (ROLLART_SCALE_FULL=1), the 128-GPU one runs in CI.
# Since ROLLART rolls out on env groups (ROLL's GroupQueues; before sim/scale.py's env-groups tail estimate), measured
# the same way (steady step s / trained tokens per s; approximation seeds 0-3, 0-11, 0-11; full 0-3, 0-1, 0-1):
#                 approximation               full                difference
#   128 GPUs      380.0 / 17,878 (m = 2)      374.9 / 17,865      +1.3 % / +0.1 %
#   512 GPUs      380.4 / 71,417 (m = 8)      378.7 / 71,485      +0.4 % / -0.1 %
#   1,024 GPUs    379.7 / 143,075 (m = 16)    381.8 / 141,535     -0.5 % / +1.1 %
# Since an env group's managers each take its oldest group short of members (ROLL's get_episode_id; session 37),
# the same way:
#   128 GPUs      380.0 / 17,974 (m = 2)      374.4 / 18,042      +1.5 % / -0.4 %
#   512 GPUs      381.4 / 71,631 (m = 8)      381.2 / 71,473      +0.1 % / +0.2 %
#   1,024 GPUs    381.0 / 143,473 (m = 16)    383.6 / 141,989     -0.7 % / +1.0 %
# Since small tensor-parallel all-reduces run the engine's custom kernel, capped at NCCL's price (session 38):
#   128 GPUs      371.9 / 18,371 (m = 2)      367.2 / 18,403      +1.3 % / -0.2 %
#   512 GPUs      372.9 / 73,354 (m = 8)      371.0 / 73,437      +0.5 % / -0.1 %
#   1,024 GPUs    373.2 / 146,656 (m = 16)    371.5 / 146,741     +0.4 % / -0.1 %
APPROX_SEEDS = {1: range(4), 4: range(12), 8: range(12)}
FULL_SEEDS = {1: range(4), 4: range(2), 8: range(3)}


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 4, 8])  # 128, 512, 1,024 GPUs
def test_matches_full_simulation(k: int) -> None:
    if k > 1 and not os.environ.get("ROLLART_SCALE_FULL"):
        # 12 approximate runs against 2-3 full 512- or 1,024-GPU ones: ~3 and ~8 CPU-min, more than the
        # suite's budget allows beside everything else; the figures they measured are recorded above
        pytest.skip(f"{128 * k:,} GPUs: set ROLLART_SCALE_FULL=1 (about {3 if k == 4 else 8} CPU-min)")
    plan = _paper(k)
    m = auto_factor(plan) if k > 1 else 2
    full = _mean([_steady(simulate_plan(plan, mode_config(plan), s).to_result()) for s in FULL_SEEDS[k]])
    approx = _mean([_steady(simulate_plan(plan, mode_config(plan), s, scale_approx=m).to_result())
                    for s in APPROX_SEEDS[k]])
    assert approx[0] == pytest.approx(full[0], rel=0.03), "steady step time"
    assert approx[1] == pytest.approx(full[1], rel=0.03), "steady trained tokens per second"


# A long run simulates fewer groups per batch (sim/scale.py, min_groups). Measured (2026-12-01 23:27-23:55 UTC,
# 1,024 GPUs, 20 steps; steady step s / trained tokens per s over steps 2-20; full: seeds 0-1, ~9 CPU-min each):
#   full, 2 seeds                           398.1 / 137,844   (399.2 / 137,312 and 396.9 / 138,377)
#   m = 16 (4 workers, 32 groups), 4 seeds  391.3 / 139,802   -1.7 % / +1.4 %
#   m = 32 (2 workers, 16 groups), 12 seeds 398.0 / 137,521   -0.0 % / -0.2 %   (sd per seed 4.1 %)
#   m = 64 (1 worker, 8 groups), 8 seeds    415.1 / 132,337   +4.3 % / -4.0 %
# One worker per generation group loses the pooling of least-loaded routing (its raw subset step is 416 s
# against 380 s at m = 16, before any tail correction); the 4-step check above does not show it (+0.7 % /
# -0.6 % at m = 64 over 24 seeds): the first steps are still the pipeline's fill. Hence MIN_WORKERS = 2.
LONG_STEPS, LONG_FULL_SEEDS, LONG_APPROX_SEEDS = 20, range(2), range(12)


@pytest.mark.slow
def test_a_long_run_matches_full_simulation_with_fewer_groups_per_batch() -> None:
    if not os.environ.get("ROLLART_SCALE_FULL"):
        pytest.skip("1,024 GPUs for 20 steps: set ROLLART_SCALE_FULL=1 (about 20 CPU-min)")
    plan = _paper(8, steps=LONG_STEPS)
    m = auto_factor(plan)
    assert m == 32  # 16 groups per batch, 2 workers per generation group
    full = _mean([_steady(simulate_plan(plan, mode_config(plan), s).to_result()) for s in LONG_FULL_SEEDS])
    approx = _mean([_steady(simulate_plan(plan, mode_config(plan), s, scale_approx=m).to_result())
                    for s in LONG_APPROX_SEEDS])
    assert approx[0] == pytest.approx(full[0], rel=0.03), "steady step time"
    assert approx[1] == pytest.approx(full[1], rel=0.03), "steady trained tokens per second"


def test_judge_busy_shares_follow_the_tail_corrected_steps() -> None:
    """The correction adds time in which the judges idle: the same busy seconds over the longer spans; where it
    moved the steady window's first step, the steady share (of another window) is dropped, not carried over."""
    from rollart.core.stats import StepRecord
    from rollart.sim.scale import _judge_busy_over_corrected_steps

    def rec(i: int, start: float, end: float) -> StepRecord:
        return StepRecord(i, start, end, {}, 8, 0, 0.0)

    before = [rec(0, 0, 100), rec(1, 100, 200), rec(2, 200, 300)]
    after = [rec(0, 0, 100), rec(1, 100, 250), rec(2, 250, 400)]  # 100 s added past the first step
    subset = {"reward_gpu_busy_fraction": 0.3, "reward_gpu_busy_steady_fraction": 0.2, "steady": {"from_step": 1}}
    summary = {"steady": {"from_step": 1}}
    _judge_busy_over_corrected_steps(summary, subset, before, after)
    assert summary["reward_gpu_busy_fraction"] == pytest.approx(0.3 * 300 / 400)
    assert summary["reward_gpu_busy_steady_fraction"] == pytest.approx(0.2 * 200 / 300)
    moved = {"steady": {"from_step": 2}}
    _judge_busy_over_corrected_steps(moved, subset, before, after)
    assert moved["reward_gpu_busy_steady_fraction"] is None
