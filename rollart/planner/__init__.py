"""The placement planner: within a budget (GPUs or US$/hour), search GPU counts per pool, the
hardware-affinity map, generation tp, α, redundancy and reward placement for the best plan —
successive halving on short simulations, then full simulations of the finalists, the best of them
re-run at further seeds and ranked by the mean — and write
the winner as a plan file ``rollart simulate`` accepts unchanged."""

from rollart.planner.report import (affinity_note, bottleneck, held_fixed_line, plan_data, reason, serverless_billing_line,
                                    spread_line, top_table, trainer_pools_table, why_lines, write_plan)
from rollart.planner.search import (OBJECTIVES, Evaluation, PlanSearch, SeedSpread, best_of, grid_optimum, grid_ranked,
                                    rung_steps, score, search, seed_mean)
from rollart.planner.space import Budget, Candidate, Space

__all__ = ["OBJECTIVES", "Budget", "Candidate", "Evaluation", "PlanSearch", "Space", "affinity_note", "best_of", "bottleneck", "grid_optimum",
           "grid_ranked", "held_fixed_line", "plan_data", "reason", "rung_steps", "score", "search", "seed_mean",
           "SeedSpread", "serverless_billing_line", "spread_line", "top_table", "trainer_pools_table", "why_lines", "write_plan"]
