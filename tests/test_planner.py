"""``rollart plan``: the search space, successive halving against the full grid of a small,
enumerable problem, budgets, and the written plan simulating unchanged."""

from __future__ import annotations

import json
import random
import re

import pytest
import typer
from typer.testing import CliRunner

from rollart.core import mode_config
from rollart.plan import PlanError, apply_overrides, load_plan, plan_from_dict, read_yaml
from rollart.planner import Budget, Space, grid_optimum, grid_ranked, plan_data, rung_steps, search, write_plan
from rollart.planner.search import THROUGHPUT_TIE, score
from rollart.planner.space import SERVERLESS
from rollart.report import plan_rates
from rollart.scenarios_catalog import default_scenario
from rollart.sim import simulate_plan
from rollart.sim.costs.price import hourly_fixed_usd
from rollart.sweep.runner import SerialPool

TINY = ["algorithm.batch_size=16", "algorithm.steps=2"]


def _base(extra: list[str] = ()) -> tuple[dict, object]:
    overrides = [*TINY, *extra]
    return apply_overrides(read_yaml(default_scenario()), overrides), load_plan(default_scenario(), overrides)


def small_space(budget: Budget = Budget(gpus=12), extra: list[str] = ()) -> tuple[Space, dict]:
    """192 candidates: trainer 4/8 H800, 0–12 generation GPUs per pool in steps of 4 at tp 1/2,
    every task→pool affinity map, α 1/2, redundancy 0/0.25, serverless or 2 dedicated H20 judges."""
    base, plan = _base(extra)
    space = Space.from_plan(plan, budget, step=4, tps=[1, 2], alphas=[1, 2], redundancies=[0.0, 0.25],
                            reward_gpus=[2])
    space.rewards = [SERVERLESS, ("dedicated", "h20", 2)]
    return space, base


def test_space_from_the_default_scenario():
    space, _ = small_space()
    assert space.trainer_pool == "h800" and space.trainer_gpus == [4, 8]
    assert space.gen_gpus == {"h800": [0, 4, 8, 12], "h20": [0, 4, 8, 12]}
    assert space.gen_tp == {"h800": [1, 2], "h20": [1, 2]}
    # hardware affinity heuristic: prefill-heavy (many turns, long observations) → compute GPUs
    assert space.compute_rank == ["h800", "h20"]
    assert space.heuristic_affinity == {"FrozenLake": "compute", "CodeExec": "compute", "GEM-Math": "bandwidth"}
    assert space.heuristic_map(["h800", "h20"]) == (("FrozenLake", "h800"), ("GEM-Math", "h20"), ("CodeExec", "h800"))
    # the scenario's own placement is a candidate: trainer 4, h800 2×tp2, h20 8×tp1
    assert space.baseline.gen == (("h800", 4, 2), ("h20", 8, 1)) and space.baseline.trainer_gpus == 4
    cands = list(space.enumerate())
    assert len(cands) == len(set(cands)) == 192
    assert all(c.total_gpus <= 12 and space.valid(c) for c in cands)


def test_candidates_apply_to_valid_plans_sized_to_what_they_place():
    space, base = small_space()
    rng = random.Random(1)
    for c in rng.sample(list(space.enumerate()), 12):
        plan = plan_from_dict(c.apply(base))
        used = c.gpus_by_pool()
        assert {p: pool.count for p, pool in plan.cluster.gpu_pools.items()} == {p: n for p, n in used.items() if n}
        assert plan.algorithm.alpha == c.alpha and plan.algorithm.redundancy == c.redundancy
        assert all(plan.placement.hw_affinity[tag] == pool for tag, pool in c.affinity)


def test_a_candidate_keeps_the_scenarios_judge_engine_settings():
    """Where the judge runs is the planner's choice; what its engine is (verdict tokens, calls batched, step
    overhead) is the scenario's and survives into every candidate, serverless or dedicated. Before, apply
    rebuilt placement.reward from where/pool/gpus/tp alone and dropped the rest."""
    judge = ["placement.reward.output_tokens=2", "placement.reward.max_num_seqs=1",
             "placement.reward.step_overhead_ms=1.5"]
    space, base = small_space(extra=judge)
    for c in space.enumerate():
        if c.reward in (SERVERLESS, ("dedicated", "h20", 2)) and c.alpha == 1 and c.redundancy == 0:
            r = plan_from_dict(c.apply(base)).placement.reward
            assert (r.output_tokens, r.max_num_seqs, r.step_overhead_ms) == (2, 1, 1.5), c.label()


def test_neighbours_and_random_candidates_stay_within_the_budget():
    space, _ = small_space()
    rng = random.Random(0)
    for _ in range(20):
        c = space.random(rng)
        assert c is not None and space.valid(c) and space.fits(c) and c.total_gpus > 12 - 4  # the budget, to a step
        for n in space.neighbours(c):
            assert space.valid(n) and space.fits(n) and n != c
    space, _ = small_space(Budget(gpus=16))  # the scenario's placement uses 16 GPUs
    moves = space.neighbours(space.baseline)
    assert any(n.alpha != space.baseline.alpha for n in moves)
    assert any(n.affinity != space.baseline.affinity for n in moves)
    assert any(n.reward != space.baseline.reward for n in moves)
    assert any(dict((p, tp) for p, _, tp in n.gen) != dict((p, tp) for p, _, tp in space.baseline.gen) for n in moves)


MOE_MODEL = {"name": "Qwen3-30B-A3B", "layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128,
             "intermediate": 768, "vocab": 151936, "moe_experts": 128, "moe_active_experts": 8}


def test_expert_parallelism_is_searched_for_moe_models_only():
    space, _ = small_space()  # dense Qwen3-8B: no ep dimension, the space is what it was
    assert space.gen_ep == {} and all(c.ep == () for c in space.enumerate())
    assert all(n.ep == () for n in space.neighbours(space.baseline))
    base, _ = _base()
    base["model"] = dict(MOE_MODEL)
    plan = plan_from_dict(base)
    # 16 trainer GPUs: 8 cannot hold a 30B MoE with its 32K-token activations
    space = Space.from_plan(plan, Budget(gpus=20), step=4, tps=[1, 2, 4], alphas=[1], redundancies=[0.0])
    space.rewards = [SERVERLESS]
    # ep options, kept small: 1, or one rank per GPU (ep = tp, which divides the 128 experts)
    assert space.gen_ep and all(space.eps(p, tp) == ([1, tp] if tp > 1 else [1])
                                for p, tps in space.gen_tp.items() for tp in tps)
    cands = list(space.enumerate())
    with_ep = [c for c in cands if c.ep]
    assert with_ep and len(cands) == len(set(cands))
    for c in random.Random(0).sample(with_ep, min(6, len(with_ep))):  # 4-GPU trainers cannot hold a 30B model
        plan_c = plan_from_dict(c.apply(base))  # the schema accepts it: ep divides tp and the experts
        got = {g.pool: g.ep for g in plan_c.placement.generation}
        assert got == {pool: c.ep_of(pool) for pool, _, _ in c.gen}
        assert all(c.ep_of(pool) in (1, tp) for pool, _, tp in c.gen)
        assert f"ep {max(e for _, e in c.ep)}" in " ".join(c.dims().values())
        moves = space.neighbours(c)
        assert all(space.valid(n) for n in moves)
        assert any(n.ep != c.ep and n.gen == c.gen for n in moves)  # the ep move
    rng = random.Random(3)
    drawn = [space.random(rng) for _ in range(30)]
    assert all(c is not None and space.valid(c) for c in drawn) and any(c.ep for c in drawn)
    # the scenario's own ep comes back as a candidate
    base["placement"]["generation"] = [{"pool": "h800", "workers": 1, "tp": 4, "ep": 4},
                                       {"pool": "h20", "workers": 2, "tp": 2}]
    assert Space.from_plan(plan_from_dict(base), Budget(gpus=24), step=4, tps=[1, 2, 4]).baseline.ep == (("h800", 4),)


def test_rung_schedule():
    assert rung_steps(4, 1) == [1, 2, 4]
    assert rung_steps(2, 1) == [1, 2]
    assert rung_steps(6, 2) == [2, 4, 6]
    assert rung_steps(1, 3) == [1]


def test_successive_halving_finds_one_of_the_grids_best_plans():
    # 4 steps, so that the rungs (2 steps, then 4) halve. The grid's best of 192 plans is an α 2 H800
    # + H20 mix with one affinity map (CodeExec on the H20, the rest on the H800: 0.546 traj/s); the
    # next five lie 7–11 % behind it (an α 1 8-GPU trainer, all-H800 rollout, other maps of that mix, a
    # dedicated judge). The search misses that best plan at every seed: not for its α (it ranks 10th of
    # 192 on two steps, and rungs of α + 2 steps ranked on their steady steps found it no more often),
    # but because 24 starting points rarely draw its map and it lies three affinity moves from the
    # leaders the local search explores. Its answers are the runner-up (7 % behind) or near it. Every
    # answer is within 11 % of the grid's best in throughput, and at least half within 7.5 %.
    space, base = small_space(extra=["algorithm.steps=4"])
    ranked, n_grid = grid_ranked(space, base, SerialPool())
    assert n_grid == 192
    best = plan_rates(ranked[0].summary)[0]
    # one seed per plan, as the grid ran (the finalists' seed means are tested below)
    found = [search(space, base, SerialPool(), candidates=24, finalists=4, seed=seed, confirm_seeds=0)
             for seed in range(4)]
    assert all(r.best.steps == 4 for r in found)  # the answers ran as long as the grid's plans
    shortfall = [1 - plan_rates(r.best.summary)[0] / best for r in found]
    assert all(s < 0.11 for s in shortfall), shortfall
    assert sum(s < 0.075 for s in shortfall) >= 2, shortfall
    result = found[0]
    assert not result.exhaustive
    # ... with fewer simulated steps than the grid, and far fewer full-length simulations
    full = sum(n for steps, n in result.rungs if steps == 4)
    assert result.simulated_steps < n_grid * 4 / 2 and full < n_grid / 4
    # the ranking is best first, in blocks: the plans within THROUGHPUT_TIE of the best throughput not yet
    # listed tie and the cheaper per 1k trajectories leads them, at every position; the scenario's own
    # placement (16 GPUs) is over this budget
    keys = [score(e, "throughput", space.budget) for e in result.ranked]
    i = 0
    while i < len(keys):
        best = -min(k[0] for k in keys[i:])
        n_tied = sum(-k[0] >= best / (1 + THROUGHPUT_TIE) for k in keys[i:])
        block = keys[i:i + n_tied]
        assert all(-k[0] >= best / (1 + THROUGHPUT_TIE) for k in block)  # the ties come next, none later
        assert block == sorted(block, key=lambda k: (k[1], k[0]))
        i += n_tied
    tps = [plan_rates(e.summary)[0] for e in result.ranked]
    assert all(a >= b * (1 - THROUGHPUT_TIE) for a, b in zip(tps, tps[1:]))
    assert result.baseline is None


def test_throughputs_within_the_noise_band_rank_the_cheaper_plan_first():
    # 0.04 % more throughput for half again the price is not a better plan (a review's $55 vs $80 budgets)
    from rollart.planner.search import Evaluation

    def ev(tps: float, c1k: float) -> Evaluation:
        return Evaluation(None, 4, {"summary": {"trajectories_per_s": tps, "cost_per_1k_trajectories_usd": c1k,
                                                "cost_usd_per_hour": 1.0}})

    from rollart.planner.search import rank_evaluations

    def ranked(*evs: Evaluation, objective: str = "throughput") -> list[Evaluation]:
        for i, e in enumerate(evs):  # distinct labels for the tie-break
            e.candidate = type("C", (), {"label": lambda self, i=i: str(i)})()
        return rank_evaluations(list(evs), objective, Budget(gpus=16))

    dear, cheap, faster = ev(2.3470, 9.5), ev(2.3461, 6.4), ev(2.40, 9.0)
    assert ranked(dear, cheap) == [cheap, dear]
    assert ranked(dear, cheap, faster)[0] is faster  # 2.3 % more: a real gain
    assert ranked(cheap, faster, objective="cost")[0] is cheap
    # within 1 % of the best is a tie wherever the two fall (a review: 2.819 vs 2.806 traj/s split by a
    # fixed logarithmic bin let the dearer plan win)
    a, b = ev(2.819, 28.61), ev(2.806, 27.84)
    assert ranked(a, b) == [b, a]
    # but a plan more than 1 % behind the best is ranked by throughput, however cheap
    assert ranked(ev(2.0, 1.0), a)[0] is a


def test_whole_space_in_the_first_rung_when_it_is_small():
    space, base = small_space()
    space.alphas, space.redundancies, space.rewards, space.affinity_maps = [1], [0.0], [SERVERLESS], []
    n = space.count(100)
    assert n < 24
    best, _ = grid_optimum(space, base, SerialPool())
    result = search(space, base, SerialPool(), candidates=24, finalists=3)
    assert result.exhaustive and result.best.candidate == best.candidate


def test_cost_objective_and_a_dollar_budget():
    base, plan = _base()
    fixed = hourly_fixed_usd(plan)  # the scenario's placement: 8 H800 + 8 H20 + 256 cores
    budget = Budget(usd_per_hour=fixed)
    space = Space.from_plan(plan, budget, step=4, tps=[1, 2], alphas=[1], redundancies=[0.0], search_affinity=False)
    assert all(space.fixed_usd_per_hour(c) <= fixed + 1e-9 for c in space.enumerate())
    result = search(space, base, SerialPool(), objective="cost", candidates=12, finalists=3)
    # the scenario's own placement fits this budget: it is simulated in full as the reference
    assert result.baseline is not None and result.baseline.candidate == space.baseline and result.baseline.steps == 2
    # ... but its redundancy (0.25) is outside --redundancies 0: it is never a plan the search returns
    assert space.baseline.redundancy == 0.25 and not space.valid(space.baseline)
    assert all(e.candidate.redundancy == 0.0 and e.candidate.alpha == 1 for e in result.ranked)
    best = result.best.summary
    assert best["cost_usd_per_hour"] <= fixed  # serverless spend included
    finals = [plan_rates(e.summary)[1] for e in result.ranked]
    assert finals[0] == min(finals)
    grid_best, _ = grid_optimum(space, base, SerialPool(), objective="cost")
    assert plan_rates(best)[1] <= plan_rates(grid_best.summary)[1] * 1.05


def test_written_plan_simulates_unchanged(tmp_path):
    space, base = small_space()
    space.alphas, space.redundancies = [2], [0.25]
    result = search(space, base, SerialPool(), candidates=12, finalists=2, seed=1)
    path = write_plan(plan_data(result.best, base, "tiny-plan"), tmp_path / "plan.yaml", ["a header comment"])
    plan = load_plan(path)
    assert plan.name == "tiny-plan" and plan.algorithm.steps == 2
    again = simulate_plan(plan, mode_config(plan), plan.algorithm.seed).to_result().summary
    for key in ("trajectories_per_s", "step_time_s_mean", "cost_usd_per_hour", "cost_per_1k_trajectories_usd",
                "aborted_redundant", "breakdown_s_mean"):
        assert again[key] == result.best.summary[key], key


def test_pd_disaggregated_scenarios_are_refused():
    _, plan = _base(["placement.pd_disaggregation=true", "placement.generation.0.role=prefill",
                     "placement.generation.1.role=decode"])
    with pytest.raises(PlanError, match="pd_disaggregation"):
        Space.from_plan(plan, Budget(gpus=16))


# ---------------------------------------------------------------- the command


def test_a_colocated_scenario_is_refused_with_the_fix():
    # the search sizes trainer and engines as separate GPUs; a colocated base would be mis-sized
    from rollart.scenarios_catalog import resolve

    plan = load_plan(resolve("paper/experiments/swe-step-breakdown"))
    with pytest.raises(PlanError, match="placement.colocated: the planner searches disaggregated placements"):
        Space.from_plan(plan, Budget(gpus=32))


def _app() -> typer.Typer:
    from rollart.cli_sweep import plan, sweep

    app = typer.Typer(add_completion=False)
    app.command()(sweep)
    app.command()(plan)
    return app


def test_plan_command_writes_a_plan_that_simulate_reproduces(tmp_path):
    from rollart.cli import app as main_app

    out = tmp_path / "plan.yaml"
    runner = CliRunner()
    res = runner.invoke(_app(), ["plan", str(default_scenario()), "--budget-gpus", "12", "--gpu-step", "4",
                                 "--tp", "1,2", "--alphas", "1,2", "--redundancies", "0,0.25", "--candidates", "16",
                                 "--finalists", "3", "--set", "algorithm.batch_size=16", "--steps", "2", "--out",
                                 str(out), "-q"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "top plans" in res.output and "#1 vs #2:" in res.output and "critical path" in res.output
    # what the search held fixed is said (helper-76: the trainer's GPU type and colocation were silent blind spots)
    assert "held as the scenario has them: the trainer on pool 'h800' (H800, tp 2, pp 1)" in " ".join(res.output.split())
    header = out.read_text().splitlines()[:4]
    # 2 steps: too short to pass the cold first step, so plans are ranked (and written) by the whole run
    tps = float(re.search(r"simulated \(whole run\): ([0-9.]+) trajectories/s", "\n".join(header)).group(1))
    sim = runner.invoke(main_app, ["simulate", str(out), "-q", "--json", str(tmp_path / "r.json")],
                        env={"COLUMNS": "200"})
    assert sim.exit_code == 0, sim.output
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert not summary["steady"]["settled"] and round(summary["trajectories_per_s"], 4) == tps
    assert sum(load_plan(out).cluster.gpu_pools[p].count for p in load_plan(out).cluster.gpu_pools) <= 12


def test_the_kept_trainer_pool_is_the_one_whose_plan_ranks_first_among_all_pools():
    """best_of ranks every search's plans together: by winners alone, a pool whose winner beat its own
    1 %-faster but dearer plan on the tie rule would lose to another pool's plan that its faster plan beats
    (helper-77: B 1.02 and 1.0101, A 1.0098 kept A)."""
    from rollart.planner import Candidate, Evaluation
    from rollart.planner.search import PlanSearch, best_of, rank_evaluations

    def ev(pool: str, tps: float, c1k: float) -> Evaluation:
        c = Candidate(pool, int(tps * 1e4), (("g", 4, 1),), (), 1, 0.25, ("serverless", None, 0))
        return Evaluation(c, 3, {"summary": {"steady": {"settled": True, "trajectories_per_s": tps,
                                                        "cost_per_1k_trajectories_usd": c1k}}})

    b = Budget(gpus=16)
    ranked = {"B": rank_evaluations([ev("B", 1.02, 20.0), ev("B", 1.0101, 15.0)], "throughput", b),
              "A": rank_evaluations([ev("A", 1.0098, 1.0)], "throughput", b)}
    assert ranked["B"][0].summary["steady"]["trajectories_per_s"] == 1.0101  # B's winner: the cheaper tie
    searches = {k: PlanSearch(r, None, [], 0, 0, 0.0, "throughput", b, False) for k, r in ranked.items()}
    together = rank_evaluations([*ranked["A"], *ranked["B"]], "throughput", b)[0].candidate.trainer_pool
    assert best_of(searches, "throughput", b) == together == "B"


def _small_plan_run(out, *args: str):
    return CliRunner().invoke(_app(), ["plan", str(default_scenario()), "--budget-gpus", "12", "--gpu-step", "4",
                                       "--tp", "1,2", "--alphas", "1", "--redundancies", "0.25", "--candidates", "8",
                                       "--finalists", "2", "--set", "algorithm.batch_size=16", "--steps", "3",
                                       "--out", str(out), "-q", *args], env={"COLUMNS": "200"})


def test_plan_tries_the_trainer_on_each_pool_it_is_given(tmp_path):
    """--trainer-pools: one search per trainer pool, the best winner kept (by the finalists' seed mean) and
    written; the table lists each pool's best (helper-76: the trainer's GPU type was never searched)."""
    from rollart.planner.search import best_of

    out = tmp_path / "plan.yaml"
    res = _small_plan_run(out, "--confirm-seeds", "1", "--trainer-pools", "all")
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "best plan per trainer pool" in text and "its pool tried: h800, h20" in text
    rows = {ln.split()[0]: float(ln.split()[1]) for ln in res.output.splitlines()
            if ln.strip().split()[:1] in (["h800"], ["h20"]) and len(ln.split()) > 2 and "train" in ln}
    assert set(rows) == {"h800", "h20"}
    written = load_plan(out)
    assert rows[written.placement.trainer.pool] == max(rows.values())  # the kept pool's mean is the best one
    assert best_of({}, "throughput", Budget(gpus=12)) is None
    # only another pool tried: the scenario's own placement was not simulated, so nothing is said "vs" it
    res = _small_plan_run(out, "--confirm-seeds", "0", "--trainer-pools", "h20")
    assert res.exit_code == 0, res.output
    moved = load_plan(out)
    assert moved.placement.trainer.pool == "h20" and "vs the scenario placement" not in res.output
    # the scenario's MFU is the default, an H800 fit wherever the trainer goes: on H20 it moves by the GEMM
    # rule, as the same scenario written on H20 prices it (not pinned to H800, nor read as H20's own)
    from rollart.sim.costs.train import effective_mfu

    tr = moved.placement.trainer
    assert tr.mfu_measured_on is None and "mfu" not in tr.model_fields_set
    on_h20, how = effective_mfu(tr, moved.gpu_of_pool("h20"), "H20")
    assert on_h20 == pytest.approx(0.16 * 0.950623 / 0.772048) and "the default, fitted on H800" in how
    # a stated MFU (the trainer GPU's own) is pinned to the scenario's GPU when the trainer moves
    res = _small_plan_run(out, "--confirm-seeds", "0", "--trainer-pools", "h20", "--set", "placement.trainer.mfu=0.3")
    assert res.exit_code == 0, res.output
    assert load_plan(out).placement.trainer.mfu_measured_on == "H800"
    # an owned pool (priced 0) can take the trainer within the GPUs it has (it was refused: the scenario's
    # generation already filled it)
    res = _small_plan_run(out, "--confirm-seeds", "0", "--trainer-pools", "h20", "--set",
                          "prices.gpu_usd_per_hour.H20=0")
    assert res.exit_code == 0, res.output
    owned = load_plan(out)
    assert owned.placement.trainer.pool == "h20" and owned.cluster.gpu_pools["h20"].count <= 8


@pytest.mark.parametrize("args, needle", [
    ([], "give exactly one budget"),
    (["--budget-gpus", "8", "--budget-usd-per-hour", "10"], "give exactly one budget"),
    (["--budget-gpus", "8", "--objective", "speed"], "--objective: unknown objective 'speed'"),
    (["--budget-gpus", "2"], "cannot hold"),
    (["--budget-usd-per-hour", "100", "--set", "cluster.custom_gpus.X9={tflops_bf16: 500, hbm_tbps: 3, memory_gb: 80}",
      "--set", "cluster.gpu_pools.h20.gpu=X9"], "prices.gpu_usd_per_hour.X9: no price"),
    # a review found these accepted (the invalid points failing silently) or a traceback
    (["--budget-gpus", "8", "--tp", "0"], "--tp: 0 outside 1–1024"),
    (["--budget-gpus", "8", "--alphas", "-1"], "--alphas: -1 outside 0–1000"),
    (["--budget-gpus", "8", "--redundancies", "nan"], "--redundancies: nan outside 0–16"),
    (["--budget-gpus", "8", "--redundancies", "99"], "--redundancies: 99.0 outside 0–16"),
    (["--budget-usd-per-hour", "inf"], "--budget-usd-per-hour: inf is not a finite amount"),
    (["--budget-usd-per-hour", "nan"], "--budget-usd-per-hour: nan is not a finite amount"),  # was typer's "≥ 0" box
    (["--budget-usd-per-hour", "-1"], "--budget-usd-per-hour: -1 is below 0"),
    # a review found this blamed the context length ("allow a larger --tp") where 3 does not divide the heads
    (["--budget-gpus", "16", "--tp", "3"], "--tp: Qwen3-8B's 32 attention heads do not split evenly over 3 GPUs"),
    (["--budget-gpus", "16", "--trainer-pools", "h900"], "--trainer-pools: unknown pool 'h900'; pools are: h800, h20"),
    (["--budget-gpus", "16", "--trainer-pools", "all,h20"], "--trainer-pools: all stands alone"),
    (["--budget-gpus", "16", "--trainer-pools", " , "], "--trainer-pools: give pool names or all"),
])
def test_plan_usage_errors_exit_2_with_one_line(args, needle, tmp_path):
    res = CliRunner().invoke(_app(), ["plan", str(default_scenario()), "--out", str(tmp_path / "p.yaml"), *args],
                             env={"COLUMNS": "300"})
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], res.output


def test_a_huge_budget_buys_only_gpus_the_batch_can_use():
    """A data-parallel rank needs a sequence, an engine a trajectory in flight: beyond those the space
    stops (a review's 100,000-GPU budget came back as 12,500 ranks for 64 sequences, H800 2 % busy)."""
    _, plan = _base()
    space = Space.from_plan(plan, Budget(gpus=100_000), tps=[1, 2], alphas=[1], redundancies=[0.25])
    tr = plan.placement.trainer
    assert max(space.trainer_gpus) <= plan.algorithm.batch_size * tr.tp * tr.pp
    in_flight = plan.algorithm.batch_size * 1.25 * 2
    assert all(max(v) <= in_flight * 2 for v in space.gen_gpus.values())


def test_why_names_an_idle_cpu_pool_and_lists_the_bottleneck_once():
    from rollart.planner.report import why_lines
    from rollart.planner.search import Evaluation, PlanSearch

    ev = Evaluation(None, 4, {"summary": {"trajectories_per_s": 1.0, "breakdown_s_mean": {"generation": 1.0},
                                          "env_cores": {"env": {"cores": 4096, "peak_held_share": 0.12,
                                                                "mean_wait_s": 0.0}}}})
    result = PlanSearch(ranked=[ev], baseline=None, rungs=[], simulations=1, simulated_steps=4, wall_s=0.0,
                        objective="throughput", budget=Budget(gpus=8), exhaustive=True)
    lines = why_lines(result)
    assert sum(ln.startswith("#1 ") and "critical path" in ln for ln in lines) <= 1
    cores = [ln for ln in lines if "env cores" in ln]
    assert cores and "cluster.cpu_pools.env.cores=615" in cores[0]  # ⌈0.12 × 4096 × 1.25⌉


def test_a_small_dollar_budget_leaves_room_for_generation_on_the_cheapest_pool():
    # $30/h holds 4 H800 training + 4 H20 generating + 256 env cores ($25.0/h); reserving the generation
    # step at the trainer pool's H800 price refused it ("cannot hold a 4-GPU trainer")
    _, plan = _base()
    space = Space.from_plan(plan, Budget(usd_per_hour=30.0), tps=[1, 2], alphas=[1], redundancies=[0.0])
    assert 4 in space.trainer_gpus
    assert any(space.fits(c) and c.trainer_gpus == 4 for c in space.enumerate())


def test_default_tp_degrees_span_each_pools_nvlink_domain():
    """Without --tp the search tries the powers of two inside each pool's NVLink domain: 1-8 on an HGX
    board (the presets), up to 64 on an NVL72-class type, whose wider workers stay on NVLink."""
    nvl = ("cluster.custom_gpus.NVL={tflops_bf16: 2250, hbm_tbps: 8, memory_gb: 186, nvlink_gbps: 1800, "
           "tflops_fp8: 4500, nvlink_domain: 72}")
    _, plan = _base()
    assert Space.from_plan(plan, Budget(gpus=64)).gen_tp["h800"] == [1, 2, 4, 8]
    _, plan = _base([nvl, "cluster.gpu_pools.h20.gpu=NVL"])
    space = Space.from_plan(plan, Budget(gpus=160))
    assert space.gen_tp["h800"] == [1, 2, 4, 8]
    # Qwen3-8B has 32 query heads: tp 64 cannot split them
    assert space.gen_tp["h20"] == [1, 2, 4, 8, 16, 32]


def test_gpus_already_owned_price_zero_and_cap_at_their_count():
    """A pool priced 0 (GPUs the buyer owns), under a US$ or a GPU budget: the space no longer divides by its price
    (a review's ZeroDivisionError traceback) and holds its count, not as many free GPUs as the search
    likes (2,272 H20 before the cap)."""
    _, plan = _base(["prices.gpu_usd_per_hour.H20=0"])
    space = Space.from_plan(plan, Budget(usd_per_hour=50.0), tps=[1, 2], alphas=[1], redundancies=[0.0])
    owned = plan.cluster.gpu_pools["h20"].count
    assert space.owned == {"h20": owned} and max(space.gen_gpus["h20"]) <= owned
    rng = random.Random(0)
    drawn = [c for c in (space.random(rng) for _ in range(40)) if c is not None]
    assert drawn and all(space.fits(c) and c.gpus_by_pool().get("h20", 0) <= owned for c in drawn)
    assert any(c.gpus_by_pool().get("h20", 0) == owned for c in drawn)  # the free GPUs are used
    # under a GPU budget too: the cost objective counted 18 H20 as free where 8 are owned (helper-76: $2.05 per
    # 1k trajectories quoted against $2.59 with the cap)
    by_count = Space.from_plan(plan, Budget(gpus=24), tps=[1, 2], alphas=[1], redundancies=[0.0])
    assert by_count.owned == {"h20": owned} and max(by_count.gen_gpus["h20"]) <= owned


def test_finalists_rank_by_their_mean_over_seeds():
    """The search ranks a few hundred single-seed runs, so its best single draw is partly luck (a
    review: 2.77 trajectories/s printed, 2.45 over six seeds and over 30 steps). The finalists re-run at
    further seeds and rank by their mean; the rest follow in single-seed order, and the winner's seed-0
    run is still what ``rollart simulate`` reproduces."""
    from rollart.planner import seed_mean

    space, base = small_space(extra=["algorithm.steps=4"])
    one = search(space, base, SerialPool(), candidates=24, finalists=4, seed=1, confirm_seeds=0)
    three = search(space, base, SerialPool(), candidates=24, finalists=4, seed=1, confirm_seeds=2)
    assert not one.spreads and three.spreads
    head = [e for e in three.ranked if e.candidate in three.spreads]
    assert head == three.ranked[:len(head)] and 2 <= len(head) <= 4  # the confirmed lead, in their mean order
    means = [three.spreads[e.candidate].mean_throughput for e in head]
    # in mean order, up to the tie each pair's seeds measured (at least THROUGHPUT_TIE), inside which the
    # cheaper leads
    from rollart.planner.search import pair_tie

    spreads = [three.spreads[e.candidate] for e in head]
    assert all(pair_tie(x, y) >= THROUGHPUT_TIE for x, y in zip(spreads, spreads[1:]))
    assert all(a >= b / (1 + pair_tie(x, y)) for a, b, x, y in zip(means, means[1:], spreads, spreads[1:]))
    spread = three.spreads[head[0].candidate]
    assert spread.seeds == (0, 1, 2) and spread.throughputs[0] == plan_rates(head[0].summary)[0]
    plan = plan_from_dict(head[0].candidate.apply(base, 4))
    again = simulate_plan(plan, mode_config(plan), 2).to_result()
    assert plan_rates(again.summary)[0] == spread.throughputs[2]  # each seed's figure is reproducible
    assert seed_mean([head[0]]).summary["steady"]["trajectories_per_s"] == spread.throughputs[0]
    assert three.simulations > one.simulations


def _deepseek_v3(generation: list[dict]) -> object:
    """DeepSeek-V3 (FP8, ~680 GB) with an H800 trainer of ep 32; a worker of 8 H800 cannot hold it."""
    base, _ = _base(["algorithm.batch_size=64"])
    base["model"] = {"preset": "DeepSeek-V3", "weight_dtype": "fp8"}
    base["placement"]["trainer"] = {"pool": "h800", "gpus": 512, "tp": 1, "pp": 16, "ep": 32}
    base["cluster"]["gpu_pools"]["h800"]["count"] = 768
    base["cluster"]["gpu_pools"]["h20"]["count"] = 16
    base["placement"]["generation"] = generation
    base["placement"]["hw_affinity"] = {"default": generation[0]["pool"]}
    return plan_from_dict(base)


def test_a_model_no_worker_of_one_nvlink_domain_holds_is_searched_across_domains_and_said():
    """A helper found the planner recommending all-H20 for DeepSeek-V3 with H800 silently dropped: it tried
    tp ≤ 8 only, where the model leaves no KV. Wider workers (across nodes, as DeepSeek and LMSYS serve it) are
    tried when nothing inside a domain fits, the scenario's own tp always, and a pool left out is said."""
    plan = _deepseek_v3([{"pool": "h20", "workers": 2, "tp": 8}])
    space = Space.from_plan(plan, Budget(gpus=1024), alphas=[1], redundancies=[0.0])
    assert space.gen_tp["h800"] == [16, 32, 64] and space.gen_tp["h20"] == [8]
    assert space.eps("h800", 32) == [1, 32]
    assert any("fits no worker inside one 8-GPU NVLink domain" in n and "tp 16, 32, 64" in n for n in space.notes)
    only_one_node = Space.from_plan(plan, Budget(gpus=1024), alphas=[1], redundancies=[0.0], tps=[1, 2, 4, 8])
    assert only_one_node.gen_tp["h800"] == [] and any("no generation planned there" in n for n in only_one_node.notes)
    own = Space.from_plan(_deepseek_v3([{"pool": "h800", "workers": 8, "tp": 32, "ep": 32}]), Budget(gpus=1024),
                          alphas=[1], redundancies=[0.0])
    assert own.gen_tp["h800"] == [16, 32, 64] and own.baseline is not None  # the scenario's own is a candidate


def test_trainer_sizes_are_multiples_of_an_explicit_ep_per_stage():
    """ep 32 at pp 16 needs 512-GPU steps; the search stepped by lcm(8, tp·pp) = 16 and met sizes ep could not
    divide ("ep 32 does not divide the trainer's 29 GPUs a pipeline stage" as the budget's fault)."""
    space = Space.from_plan(_deepseek_v3([{"pool": "h20", "workers": 2, "tp": 8}]), Budget(gpus=1024),
                            alphas=[1], redundancies=[0.0])
    assert space.trainer_gpus == [512]


def test_a_winner_with_a_wide_window_says_staleness_is_not_priced():
    """Speed alone ranks the widest α first (helper-83: α 4 at 1.93 against 1.26 trajectories/s at α 1, every
    batch trained 4 versions stale): the plan says what the ranking leaves out and how to keep α narrow. The
    staleness is the steady window's, where the rate is read (helper-93: the whole run's, cold first step
    included, said 1.25 for α 2 batches trained 2.0 stale)."""
    from rollart.planner import Candidate, Evaluation
    from rollart.planner.report import why_lines
    from rollart.planner.search import PlanSearch

    def ev(alpha: int) -> Evaluation:
        c = Candidate("h800", 8, (("h20", 8, 1),), (), alpha, 0.25, SERVERLESS)
        return Evaluation(c, 3, {"summary": {"mean_staleness": alpha / 2, "steady": {
            "settled": True, "trajectories_per_s": 1.0 + alpha, "breakdown_s_mean": {"generation": 1.0},
            "mean_staleness": float(alpha)}}})

    for alpha, said in ((4, True), (1, False)):
        result = PlanSearch([ev(alpha)], None, [], 1, 3, 0.0, "throughput", Budget(gpus=16), False)
        lines = [line for line in why_lines(result) if "ranked by speed alone" in line]
        assert bool(lines) == said
        if said:
            assert "4.00 versions stale" in lines[0] and "--alphas 0,1" in lines[0]


LOW_MEMORY = ["model=Qwen3-14B", "placement.generation=[{pool: h800, workers: 2, tp: 2, gpu_memory_utilization: 0.3}, "
              "{pool: h20, workers: 4, tp: 2, gpu_memory_utilization: 0.3}]"]


def test_tp_degrees_fit_the_context_at_the_scenarios_gpu_memory_utilization():
    """A candidate's engines keep the scenario's gpu_memory_utilization (Candidate.apply), so the degrees the
    search tries are the ones that hold a 32K context there: at 0.3 a tp-1 Qwen3-14B engine on an 80 GB H800
    has 0.3 × 79.2 − 27.5 GiB of weights − 4 GiB, no room for KV; at tp 2 it has ~12 GiB (~78K tokens)."""
    _, plan = _base(["model=Qwen3-14B"])
    assert 1 in Space.from_plan(plan, Budget(gpus=16)).gen_tp["h800"]
    _, plan = _base(LOW_MEMORY)
    space = Space.from_plan(plan, Budget(gpus=16))
    assert space.gen_tp["h800"][0] == 2 and 1 not in space.gen_tp["h20"]


def test_a_search_whose_every_candidate_fails_says_why():
    """Candidates that all fail at the first rung leave no finalist; the search still carries their errors, so
    `rollart plan` prints the cause, not only that nothing fitted."""
    base, plan = _base(LOW_MEMORY)
    space = Space.from_plan(plan, Budget(gpus=16), tps=[2])
    space.gen_tp = {pool: [1] for pool in space.gen_tp}  # every engine left without KV room: each run fails
    result = search(space, base, SerialPool(), candidates=4, finalists=1, min_steps=1, local_rounds=0,
                    polish_rounds=0, confirm_seeds=0)
    assert result.best is None and result.infeasible
    assert "KV tokens" in result.infeasible[0].error


def _costed(candidate, cph: float, tps: float, **summary):
    from rollart.planner import Evaluation

    return Evaluation(candidate, 4, {"seed": 0, "summary": {
        "cost_usd_per_hour": cph, "simulated_s": 3600.0, "mean_staleness": 1.0, **summary,
        "steady": {"settled": True, "trajectories_per_s": tps, "breakdown_s_mean": {"generation": 1.0},
                   "cost_per_1k_trajectories_usd": 1000 * cph / 3600 / tps, "mean_staleness": 1.0}}})


def test_a_scenario_placement_over_the_dollar_budget_is_said_to_be():
    """The scenario's own placement can run faster than the winner and still be left out: its billed serverless
    time put it over the US$ budget (helper-93: -69 % traj/s against it, no reason given, at $507.63/h on a
    $507 budget). The line against it says so; within the budget it says nothing more."""
    from rollart.planner import Candidate
    from rollart.planner.report import why_lines
    from rollart.planner.search import PlanSearch

    win = _costed(Candidate("h800", 8, (("h20", 8, 1),), (), 1, 0.0, SERVERLESS), 500.0, 1.0)
    own = Candidate("h800", 8, (("h20", 16, 1),), (), 1, 0.0, SERVERLESS)
    for cph, tps, said in ((507.63, 3.2, True), (506.0, 3.2, False), (507.63, 0.9, False)):  # last: slower anyway
        base = _costed(own, cph, tps, serverless_gpu_seconds=100.0)
        result = PlanSearch([win], base, [], 2, 8, 0.0, "throughput", Budget(usd_per_hour=507.0), False)
        line = next(line for line in why_lines(result) if "vs the scenario placement" in line)
        assert ("costs $507.63/h, over the $507.00/h budget, its serverless reward billed as it ran" in line) == said


def test_a_serverless_winner_billed_per_request_shows_its_instance_time_price():
    """The price table's serverless rate is Modal's, and Modal bills container time: a winner billed per
    request also shows what its run costs billed by instance time, from the same run's instance GPU·s
    (helper-93: $38/h → $50/h, past the budget and dearer per trajectory than 2 dedicated GPUs)."""
    from rollart.planner import Candidate, serverless_billing_line

    c = Candidate("h800", 8, (("h20", 8, 1),), (), 1, 0.0, SERVERLESS)
    ev = _costed(c, 38.0, 2.0, serverless_gpu_seconds=1000.0, serverless_instance_s=4000.0)
    line = serverless_billing_line(ev, 0.001)  # 3,000 idle GPU·s in an hour at $0.001: +$3/h
    assert "$38.00/h in all" in line and "$41.00/h" in line and "at seed 0" in line
    per_1k = 1000 * 38.0 / 3600 / 2.0 * 41.0 / 38.0
    assert f"${per_1k:,.2f} per 1k" in line
    assert serverless_billing_line(ev, None) is None
    assert "over the $40.00/h budget" in serverless_billing_line(ev, 0.001, 40.0)
    assert "budget" not in serverless_billing_line(ev, 0.001, 42.0)
    assert serverless_billing_line(_costed(c, 38.0, 2.0, serverless_billing="instance_time",
                                           serverless_gpu_seconds=4000.0, serverless_instance_s=4000.0), 0.001) is None
    assert serverless_billing_line(_costed(c, 38.0, 2.0), 0.001) is None  # a dedicated judge: no line


def test_the_top_table_shows_the_seed_mean_cost_where_it_ranks_by_it():
    """A confirmed finalist ranks by its seeds' mean: its $/1k column is that mean too, not seed 0's alone
    (helper-93: $3.87 at seed 0 beside a 3-seed mean rank; the mean was $4.39)."""
    from rich.console import Console

    from rollart.planner import Candidate, SeedSpread, top_table
    from rollart.planner.search import PlanSearch

    c = Candidate("h800", 8, (("h20", 8, 1),), (), 1, 0.0, SERVERLESS)
    ev = _costed(c, 36.0, 2.5)  # seed 0: $4.00 per 1k
    spread = SeedSpread((0, 1, 2), (2.5, 2.0, 2.3), (4.0, 5.0, 4.6), 36.0)
    result = PlanSearch([ev], None, [], 1, 4, 0.0, "throughput", Budget(gpus=16), False, spreads={c: spread})
    console = Console(width=200, record=True)
    console.print(top_table(result))
    text = console.export_text()
    assert f"{spread.mean_cost_per_1k:,.2f}" in text and "4.00 " not in text


def test_finalists_inside_the_seeds_noise_rank_cheaper_first_and_say_so():
    """Confirmed finalists tie within their own pair's seed noise (twice the standard error of their per-seed
    difference) where it is wider than THROUGHPUT_TIE (helper-93: #1 ranked 1.9 % above #2 at 18 % more per
    trajectory; over 8 seeds they were 0.3 % apart): the cheaper plan leads, and the line between them says it
    is a tie. Read per pair (helper-94): a third plan whose draws swing differently does not widen the tie of
    the close pair, and under the cost objective nothing is called a tie."""
    from rollart.planner import Candidate, Evaluation, SeedSpread
    from rollart.planner.report import why_lines
    from rollart.planner.search import PlanSearch, pair_tie, rank_evaluations, spread_ties

    def run(tps: float, c1k: float, gen: int = 8) -> Evaluation:
        return Evaluation(Candidate("h800", 8, (("h20", gen, 1),), (), 1, 0.0, SERVERLESS), 4, {"summary": {
            "steady": {"settled": True, "trajectories_per_s": tps, "cost_per_1k_trajectories_usd": c1k,
                       "breakdown_s_mean": {"generation": 1.0}}}})

    seeds = (0, 1, 2, 3)
    # two plans over 4 seeds: a common swing of ±15 %, and per-seed differences of ±3 % around +1.9 %
    fast = [run(t, 5.0) for t in (2.04, 1.75, 2.30, 1.93)]
    cheap = [run(t, 4.0, 12) for t in (1.94, 1.76, 2.20, 1.92)]
    odd = [run(t, 6.0, 16) for t in (1.40, 2.10, 1.30, 2.20)]  # draws that swing against the others'
    sf, sc, so = (SeedSpread.of(x, seeds) for x in (fast, cheap, odd))
    tie = pair_tie(sf, sc)
    assert THROUGHPUT_TIE < tie < 0.1 < pair_tie(sf, so)
    means = [sp.evaluation(x[0]) for sp, x in ((sf, fast), (sc, cheap), (so, odd))]
    spreads = {fast[0].candidate: sf, cheap[0].candidate: sc, odd[0].candidate: so}
    assert rank_evaluations(means[:2], "throughput", Budget(gpus=16))[0] is means[0]  # the 1 % tie: faster first
    ranked = rank_evaluations(means, "throughput", Budget(gpus=16), spread_ties(spreads))
    assert ranked[:2] == [means[1], means[0]]  # the pair's own tie: cheaper first
    result = PlanSearch([cheap[0], fast[0]], None, [], 8, 32, 0.0, "throughput", Budget(gpus=16), False,
                        spreads=spreads)
    assert f"a tie within the seeds' ±{tie:.1%}" in why_lines(result)[0]
    result.objective = "cost"
    assert "a tie" not in why_lines(result)[0]
    # different seeds: no pairing, the fixed tie
    assert pair_tie(sf, SeedSpread.of(cheap[:3], seeds[:3])) == THROUGHPUT_TIE


@pytest.mark.parametrize("alpha, train, weights, said", [
    (2, 0.77, 0.0, "rollout-bound"), (2, 0.85, 0.0, "trainer-bound"), (0, 0.77, 0.0, None),
    (1, 0.18, 0.80, "bound by the weight transfer")])  # helper-94: 1 Gb/s link, "rollout-bound" before
def test_the_bottleneck_line_says_which_side_bounds_an_overlapping_step(alpha: int, train: float, weights: float,
                                                                         said: str | None):
    """Where training overlaps the rollout (α ≥ 1) the critical path's train share is not the lever by
    itself: below TRAINER_BOUND the trainer waits for batches (helper-93 doubled the trainer of a plan whose
    line read "train 77 %" and gained nothing). At α 0 a step is its rollout plus its train step: no side."""
    from rollart.planner import Candidate, Evaluation
    from rollart.planner.report import bottleneck

    c = Candidate("h800", 8, (("h20", 8, 1),), (), alpha, 0.0, SERVERLESS)
    ev = Evaluation(c, 8, {"summary": {"steady": {"settled": True, "trajectories_per_s": 1.0, "breakdown_s_mean": {
        "train": 100 * train, "weight_sync": 100 * weights, "generation": 100 * (1 - train - weights)}}}})
    line = bottleneck(ev)
    assert f"train {train:.0%}" in line
    if said is None:
        assert "bound" not in line
    else:
        assert said in line and ("more rollout capacity" in line) == (said == "rollout-bound")
        assert ("faster cross-cluster link" in line) == (weights > 0)


def test_a_winner_routing_prefill_heavy_work_off_the_compute_gpus_says_why():
    """The paper routes prefill-heavy tasks to compute-optimised GPUs; a winner that puts them on H20 says
    so, why the simulator finds it faster (decode-bound turns with the prefix cache), and how to hold the
    paper's map (helper-93: only CHANGES.md said it)."""
    from rollart.planner import Candidate, Evaluation, affinity_note

    heuristic = {"FrozenLake": "compute", "GEM-Math": "bandwidth"}
    def ev(frozen: str) -> Evaluation:
        c = Candidate("h800", 8, (("h800", 4, 1), ("h20", 8, 1)), (("FrozenLake", frozen), ("GEM-Math", "h20")),
                      1, 0.0, SERVERLESS)
        return Evaluation(c, 4, {"summary": {}})

    line = affinity_note(ev("h20"), heuristic, ["h800", "h20"])
    assert "prefill-heavy FrozenLake on h20, not h800" in line and "--fixed-affinity" in line
    assert "prefix cache" in line and "prefix cache" not in affinity_note(ev("h20"), heuristic, ["h800", "h20"], False)
    assert affinity_note(ev("h800"), heuristic, ["h800", "h20"]) is None  # the paper's map
    assert affinity_note(ev("h20"), heuristic, ["h20"]) is None  # one pool: no routing to question
    # no generation GPUs bought on the compute pool: a purchase, not a routing the cache explains (helper-96)
    bought = Evaluation(Candidate("h800", 8, (("h20", 8, 1),), (("FrozenLake", "h20"), ("GEM-Math", "h20")), 1, 0.0,
                                  SERVERLESS), 4, {"summary": {}})
    line = affinity_note(bought, heuristic, ["h800", "h20"])
    assert "buys no h800 generation GPUs" in line and "prefix cache" not in line


def test_a_redundant_winner_says_its_trajectories_are_the_first_finishers():
    """Redundant rollout trains each group's first finishers, shorter trajectories, so trajectories/s flatters
    it (helper-95: 13.2K → 11.7K tokens a trajectory at redundancy 0 → 0.25, trained tokens/s flat): the winner
    says so, beside the best listed plan without redundancy."""
    from rollart.planner import Candidate, Evaluation
    from rollart.planner.report import redundancy_note
    from rollart.planner.search import PlanSearch

    def ev(r: float, tps: float, tokens: float) -> Evaluation:
        return Evaluation(Candidate("h800", 8, (("h20", 8, 1),), (), 1, r, SERVERLESS), 4, {"seed": 0, "summary": {
            "steady": {"settled": True, "trajectories_per_s": tps, "trained_tokens_per_s": tokens,
                       "breakdown_s_mean": {"generation": 1.0}}}})

    result = PlanSearch([ev(0.25, 2.99, 35_000), ev(0.5, 3.06, 32_900), ev(0.0, 2.67, 35_200)], None, [], 3, 12, 0.0,
                        "throughput", Budget(gpus=16), False)
    line = redundancy_note(result)
    assert "redundancy 0.25 trains each group's first finishers, 11,706 tokens a trajectory" in line
    assert "against 13,184 on #3 (redundancy 0): +12% traj/s, -0.6% trained tokens/s" in line
    wider = Evaluation(Candidate("h800", 8, (("h20", 16, 1),), (), 2, 0.0, SERVERLESS), 4, {"seed": 0, "summary": {
        "steady": {"settled": True, "trajectories_per_s": 2.67, "trained_tokens_per_s": 35_200}}})
    other = redundancy_note(PlanSearch([ev(0.25, 2.99, 35_000), wider], None, [], 2, 8, 0.0, "throughput",
                                       Budget(gpus=16), False))
    assert "(redundancy 0, and 2 other choices)" in other  # not redundancy's effect alone
    assert redundancy_note(PlanSearch([ev(0.0, 2.67, 35_200)], None, [], 1, 4, 0.0, "throughput", Budget(gpus=16),
                                      False)) is None
    alone = redundancy_note(PlanSearch([ev(0.25, 2.99, 35_000)], None, [], 1, 4, 0.0, "throughput", Budget(gpus=16),
                                       False))
    assert "counts smaller work (none listed)" in alone
