"""What the planner chooses between: a :class:`Candidate` placement and the :class:`Space` of
them that a budget allows.

A candidate fixes the trainer's GPUs (in the scenario's trainer pool, with its tp/pp), the GPUs
and tensor-parallel degree of generation in each GPU pool (for a MoE model also its
expert-parallel ranks per worker, ``ep``), the hardware-affinity map (every task
tag → a generation pool), α, redundancy and where the LLM judge runs (serverless, or dedicated
GPUs in a pool). :meth:`Candidate.apply` turns it into scenario data that ``rollart simulate``
accepts: the GPU pools are sized to exactly what is placed (a pool left empty is dropped), so the
plan's cost is the cost of what it uses.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Any, Iterator

from rollart.core.modes import dedicated_reward_used, mode_config
from rollart.plan.loader import PlanError
from rollart.plan.schema import GenerationGroup, Plan, TrainerPlacement
from rollart.sim.costs.train import trainer_fits, trainer_memory_problems

SERVERLESS = ("serverless", None, 0)
# The widest generation worker tried across NVLink domains when no worker inside one holds the model and a
# context (DeepSeek serves V3's decode over 18 nodes; 64 GPUs covers tp 32–64 × ep as LMSYS and the paper do)
MAX_CROSS_DOMAIN_TP = 64


@dataclass(frozen=True)
class Budget:
    gpus: int | None = None            # placed GPUs (trainer + generation + dedicated reward, where used)
    usd_per_hour: float | None = None  # placed GPUs + env CPU cores (+ serverless, checked after simulating)

    def describe(self) -> str:
        parts = []
        if self.gpus is not None:
            parts.append(f"{self.gpus} GPUs")
        if self.usd_per_hour is not None:
            parts.append(f"${self.usd_per_hour:,.2f}/h")
        return " and ".join(parts) or "no budget"


def _powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, … up to ``limit``: the tensor-parallel degrees a worker inside one NVLink domain takes."""
    return [2 ** k for k in range(max(1, limit).bit_length()) if 2 ** k <= limit]


@dataclass(frozen=True)
class Candidate:
    trainer_pool: str
    trainer_gpus: int
    gen: tuple[tuple[str, int, int], ...]    # (pool, GPUs, tp) for each pool with generation GPUs
    affinity: tuple[tuple[str, str], ...]    # (task tag, generation pool), in task order
    alpha: int
    redundancy: float
    reward: tuple[str, str | None, int]      # ("serverless", None, 0) or ("dedicated", pool, GPUs)
    ep: tuple[tuple[str, int], ...] = ()     # (pool, expert-parallel ranks per worker) where > 1 (MoE only)

    def ep_of(self, pool: str) -> int:
        return dict(self.ep).get(pool, 1)

    def gpus_by_pool(self) -> dict[str, int]:
        used: dict[str, int] = {self.trainer_pool: self.trainer_gpus}
        for pool, n, _ in self.gen:
            used[pool] = used.get(pool, 0) + n
        if self.reward[0] == "dedicated" and self.reward[1] is not None:
            used[self.reward[1]] = used.get(self.reward[1], 0) + self.reward[2]
        return used

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus_by_pool().values())

    def gen_pools(self) -> list[str]:
        return [p for p, n, _ in self.gen if n > 0]

    def dims(self) -> dict[str, str]:
        """Each choice as readable text (what the reasons compare)."""
        out = {"trainer": f"{self.trainer_pool} ×{self.trainer_gpus}"}
        for pool, n, tp in self.gen:
            ep = self.ep_of(pool)
            out[f"gen {pool}"] = f"{n} GPUs (tp {tp}" + (f", ep {ep})" if ep > 1 else ")")
        by_pool: dict[str, list[str]] = {}
        for tag, pool in self.affinity:
            by_pool.setdefault(pool, []).append(tag)
        out["affinity"] = "; ".join(f"{','.join(tags)}→{pool}" for pool, tags in by_pool.items())
        out["α"] = str(self.alpha)
        out["redundancy"] = f"{self.redundancy:g}"
        out["reward"] = "serverless" if self.reward[0] == "serverless" else f"{self.reward[2]} {self.reward[1]} GPUs"
        return out

    def label(self) -> str:
        gen = " + ".join(f"{pool} {n}(tp{tp}" + (f"·ep{self.ep_of(pool)})" if self.ep_of(pool) > 1 else ")")
                         for pool, n, tp in self.gen)
        reward = "serverless" if self.reward[0] == "serverless" else f"{self.reward[1]}×{self.reward[2]}"
        return (f"train {self.trainer_pool}×{self.trainer_gpus} · gen {gen} · α{self.alpha} · "
                f"r{self.redundancy:g} · reward {reward}")

    def apply(self, base: dict[str, Any], steps: int | None = None) -> dict[str, Any]:
        """Scenario data for this candidate: ``base`` with its pools resized (empty ones dropped),
        the placement rewritten and α/redundancy (and ``steps``) set."""
        d = copy.deepcopy(base)
        used = self.gpus_by_pool()
        pools = d["cluster"]["gpu_pools"]
        d["cluster"]["gpu_pools"] = {name: {**spec, "count": used[name]} for name, spec in pools.items()
                                     if used.get(name)}
        runtime = d.get("runtime")
        if isinstance(runtime, dict) and isinstance(runtime.get("pools"), dict):  # `rollart run` pool settings
            runtime["pools"] = {k: v for k, v in runtime["pools"].items() if k in d["cluster"]["gpu_pools"]}
        pl = d["placement"]
        trainer = dict(pl["trainer"])
        trainer.update(pool=self.trainer_pool, gpus=self.trainer_gpus)
        templates: dict[str, dict[str, Any]] = {}
        for g in pl.get("generation") or []:
            templates.setdefault(g.get("pool"), {k: v for k, v in g.items()
                                                 if k not in ("pool", "workers", "tp", "role", "ep")})
        pl["trainer"] = trainer
        pl["generation"] = [{"pool": pool, "workers": n // tp, "tp": tp, **templates.get(pool, {}),
                             **({"ep": self.ep_of(pool)} if self.ep_of(pool) > 1 else {})}
                            for pool, n, tp in self.gen if n > 0]
        biggest = max(self.gen, key=lambda g: g[1])[0]
        pl["hw_affinity"] = {**{tag: pool for tag, pool in self.affinity}, "default": biggest}
        old_reward = pl.get("reward") or {}
        # what the judge's engine is (verdict tokens, batching, step overhead) stays the scenario's
        kept = {k: v for k, v in old_reward.items() if k not in ("where", "pool", "gpus", "tp")}
        if self.reward[0] == "serverless":
            pl["reward"] = {"where": "serverless", **kept}
        else:
            pl["reward"] = {"where": "dedicated", "pool": self.reward[1], "gpus": self.reward[2],
                            "tp": int(old_reward.get("tp", 1)) if old_reward.get("where") == "dedicated" else 1,
                            **kept}
        alg = d["algorithm"]
        alg["alpha"] = self.alpha
        alg["redundancy"] = self.redundancy
        if steps is not None:
            alg["steps"] = steps
        return d


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


@dataclass
class Space:
    """The choices per dimension and the budget. Build one with :meth:`from_plan`, or by hand
    for a small, enumerable problem."""

    pools: list[str]
    gpu_price: dict[str, float | None]       # $/GPU-hour per pool (None: no price)
    cpu_usd_per_hour: float                  # the env CPU pools' fixed $/hour
    trainer_pool: str
    trainer_gpus: list[int]
    gen_gpus: dict[str, list[int]]           # per pool, GPU counts for generation (0 = none)
    gen_tp: dict[str, list[int]]             # per pool, feasible tensor-parallel degrees
    tags: list[str]
    alphas: list[int]
    redundancies: list[float]
    rewards: list[tuple[str, str | None, int]]
    budget: Budget
    affinity_maps: list[tuple[tuple[str, str], ...]] | None = None  # None: every tag→pool map
    heuristic_affinity: dict[str, str] = field(default_factory=dict)  # tag → pool kind ("compute"/"bandwidth")
    compute_rank: list[str] = field(default_factory=list)              # pools, most FLOP/byte first
    baseline: Candidate | None = None
    # per pool and tp, the expert-parallel degrees > 1 a MoE model can use there (empty: ep 1 only)
    gen_ep: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    # pools priced 0 (GPUs already owned): the most of them a plan may use, their count
    owned: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # one line each: what the space left out, and why
    # --set overrides every candidate's scenario takes (a trainer layout the scenario's cannot train), and why
    trainer_overrides: list[str] = field(default_factory=list)
    trainer_notes: list[str] = field(default_factory=list)

    def eps(self, pool: str, tp: int) -> list[int]:
        """Expert-parallel options for a worker of ``tp`` GPUs in ``pool``: 1, plus ``gen_ep``'s."""
        return [1, *self.gen_ep.get(pool, {}).get(tp, [])]

    # ---- construction from a scenario -------------------------------------------------------

    @classmethod
    def from_plan(cls, plan: Plan, budget: Budget, step: int | None = None, tps: list[int] | None = None,
                  alphas: list[int] = (0, 1, 2), redundancies: list[float] = (0.0, 0.25, 0.5),
                  reward_gpus: list[int] | None = None, search_affinity: bool = True,
                  owned_counts: dict[str, int] | None = None) -> "Space":
        """The space a budget allows on the scenario's GPU pools (their GPU types; counts are
        free, but a pool priced 0, GPUs already owned, holds its count), in
        multiples of ``step`` GPUs (default: 8 — a node — for budgets of 64 GPUs or more, else 4, 2 or 1). ``tps``: the generation tensor-parallel degrees to try; default the
        powers of two within each pool's NVLink domain (1, 2, 4, 8 on an HGX board; up to 64 on an
        NVL72 rack, where a wider worker stays on NVLink). ``owned_counts``: the GPUs an owned pool really has,
        where the plan's count was raised to validate a moved trainer (``rollart plan --trainer-pools``)."""
        from rollart.calibration import generation_cost
        from rollart.sim.costs.price import cpu_cores

        if plan.placement.pd_disaggregation:
            raise PlanError(["placement.pd_disaggregation: the planner does not search prefill/decode-"
                             "disaggregated placements yet; plan without it, then split roles by hand"])
        if plan.placement.colocated:
            raise PlanError(["placement.colocated: the planner searches disaggregated placements (trainer and "
                             "engines on their own GPUs); plan with colocated=false, then compare the colocated "
                             "layout with `rollart compare` or a sweep"])
        if budget.gpus is None and budget.usd_per_hour is None:
            raise PlanError(["--budget-usd-per-hour / --budget-gpus: give one budget"])
        c = plan.cluster
        pools = list(c.gpu_pools)
        price = {p: plan.prices.gpu_price(c.gpu_pools[p].gpu) for p in pools}
        cpu_hourly = cpu_cores(plan) * plan.prices.cpu_core_usd_per_hour
        if budget.usd_per_hour is not None:
            missing = [f"prices.gpu_usd_per_hour.{c.gpu_pools[p].gpu}: no price for GPU type "
                       f"'{c.gpu_pools[p].gpu}' (pool '{p}'); a US$ budget needs one" for p in pools if price[p] is None]
            if missing:
                raise PlanError(missing)
        # pools priced 0 (GPUs already owned): the GPUs owned, not as many as the search likes, under either
        # budget (under a GPU budget, the cost objective would count the extra ones as free)
        owned = {p: (owned_counts or {}).get(p, c.gpu_pools[p].count) for p in pools if price[p] == 0}

        def max_gpus(pool: str) -> int:
            caps = []
            if budget.gpus is not None:
                caps.append(budget.gpus)
            if pool in owned:
                caps.append(owned[pool])
            elif budget.usd_per_hour is not None:
                caps.append(int(max(0.0, budget.usd_per_hour - cpu_hourly) // price[pool]))
            return min(caps)

        def trainer_max() -> int:
            """Trainer GPUs that leave room for one step of generation GPUs, on the cheapest pool
            (generation may sit on H20 while the trainer is on H800)."""
            caps = []
            if budget.gpus is not None:
                caps.append(budget.gpus - step)
            if tr.pool in owned:
                caps.append(owned[tr.pool])
            elif budget.usd_per_hour is not None:
                cheapest = min(price[p] for p in pools if price[p])
                caps.append(int(max(0.0, budget.usd_per_hour - cpu_hourly - step * cheapest) // price[tr.pool]))
            return min(caps) if caps else 10**6

        biggest = max(max_gpus(p) for p in pools)
        if step is None:
            step = 8 if biggest >= 64 else 4 if biggest >= 16 else 2 if biggest >= 6 else 1
        tr = plan.placement.trainer
        sheet = c.gpu_type(c.gpu_pools[tr.pool].gpu)
        seq = plan.longest_context_tokens
        batch = plan.algorithm.batch_size  # sets a micro-batch's sequences where micro_batches is set

        def trainer_sizes(t: TrainerPlacement) -> tuple[list[int], list[int], int]:
            """(the trainer sizes the budget allows, those whose GPUs hold its state, the step between sizes)."""
            # whole tp·cp·pp-GPU data-parallel ranks; an explicit ep must divide the GPUs of a pipeline stage too
            whole = _lcm(t.rank_gpus, (t.ep or 1) * t.pp)
            unit = _lcm(step, whole)
            # a data-parallel rank needs a sequence of the batch to train: beyond batch · tp · cp · pp GPUs a
            # trainer only idles (a review's 100,000-GPU budget came back as 12,500 ranks for 64 sequences)
            tmax = min(trainer_max(), plan.algorithm.batch_size * t.rank_gpus)
            sizes = sorted({n for n in range(unit, tmax + 1, unit)}
                           | ({t.gpus} if t.gpus <= tmax and t.gpus % whole == 0 else set()))
            if t.profile is not None:  # a measured trainer ran: it holds its state
                return sizes, sizes, unit
            return sizes, [n for n in sizes if trainer_fits(plan.model, sheet, t.model_copy(update={"gpus": n}),
                                                            seq, batch)], unit

        trainer_gpus, fits, unit = trainer_sizes(tr)
        trainer_overrides: list[str] = []
        trainer_notes: list[str] = []
        if trainer_gpus and not fits:
            # a context too long for the scenario's layout: split each sequence over more GPUs (context
            # parallelism, tp and pp as the scenario has them), the narrowest cp that some trainer size holds
            for cp in (tr.cp * 2 ** k for k in range(1, 7)):
                sizes, held, cp_unit = trainer_sizes(tr.model_copy(update={"cp": cp}))
                if held:
                    trainer_overrides = [f"placement.trainer.cp={cp}"]
                    trainer_notes.append(f"cp {cp}: the scenario's tp {tr.tp} · pp {tr.pp} · cp {tr.cp} holds no "
                                         f"{seq:,}-token sequence on {c.gpu_pools[tr.pool].gpu}; every plan splits "
                                         f"each sequence over {cp} GPUs (placement.trainer.cp)")
                    tr, trainer_gpus, fits, unit = tr.model_copy(update={"cp": cp}), sizes, held, cp_unit
                    break
            else:
                raise PlanError(trainer_memory_problems(plan.model, c.gpu_pools[tr.pool].gpu, sheet,
                                                        tr.model_copy(update={"gpus": trainer_gpus[-1]}), seq, batch))
        trainer_gpus = fits
        if not trainer_gpus:
            raise PlanError([f"budget: {budget.describe()} cannot hold a {unit}-GPU trainer and {step} "
                             "generation GPUs"])
        longest = plan.longest_context_tokens
        notes: list[str] = []  # what the space left out and why, said with the plan
        gen_tp: dict[str, list[int]] = {}
        gen_gpus: dict[str, list[int]] = {}
        gen_ep: dict[str, dict[int, list[int]]] = {}
        experts = plan.model.moe_experts
        for p in pools:
            gpu_name = c.gpu_pools[p].gpu
            domain = c.gpu_type(gpu_name).nvlink_domain
            # a candidate's engines on this pool take the scenario's first group there as their template
            # (Candidate.apply), so their KV room is its gpu_memory_utilization's, not vLLM's default
            util = next((g.gpu_memory_utilization for g in plan.placement.generation if g.pool == p),
                        GenerationGroup.model_fields["gpu_memory_utilization"].default)

            def fitting(options: set[int], util: float = util) -> list[int]:
                found = []
                for tp in sorted(options):
                    if plan.model.heads % tp:
                        continue
                    cost = generation_cost(plan.model, gpu_name, c.gpu_type(gpu_name), tp, c.gpu_pools[p].profile,
                                           memory_utilization=util)
                    if cost.kv_capacity_tokens >= longest:
                        found.append(tp)
                        # MoE: one rank per GPU (ep = tp) besides ep 1, when tp divides the experts and the
                        # context still fits (each rank replicates the dense weights). Intermediate ep
                        # (ranks of several GPUs) would multiply the space for a finer trade-off; not searched.
                        eps = [tp] if (experts and tp > 1 and experts % tp == 0  # a context on one rank's KV
                                       and generation_cost(plan.model, gpu_name, c.gpu_type(gpu_name), tp,
                                                           c.gpu_pools[p].profile, tp, memory_utilization=util
                                                           ).kv_capacity_tokens // tp
                                       >= longest) else []
                        if eps:
                            gen_ep.setdefault(p, {})[tp] = eps
                return found

            if tps is not None:  # the user's degrees, as given
                tried, ok = sorted(set(tps)), fitting(set(tps))
            else:  # the powers of two inside the NVLink domain and the scenario's own workers
                own = {g.tp for g in plan.placement.generation if g.pool == p}
                tried = sorted(set(_powers_of_two(domain)) | own)
                ok = fitting(set(tried))
                if not any(t <= domain for t in ok):
                    # the model and one context fit no worker inside a domain: wider workers across domains (a
                    # 671B MoE is served so, tp × ep over several nodes), as wide as MAX_CROSS_DOMAIN_TP; the
                    # scenario's own wide workers among them were tried already
                    wider = set(_powers_of_two(MAX_CROSS_DOMAIN_TP)) - set(tried)
                    tried = sorted(set(tried) | wider)
                    ok = sorted(set(ok) | set(fitting(wider)))
                    if ok:
                        notes.append(f"{p}: {plan.model.name} with a {longest:,}-token context fits no worker inside "
                                     f"one {domain}-GPU NVLink domain; workers of tp {', '.join(map(str, ok))} across "
                                     "domains searched instead")
            if not ok:
                notes.append(f"{p}: {plan.model.name} with a {longest:,}-token context fits no worker of {gpu_name} "
                             f"(tp {', '.join(map(str, tried))}): no generation planned there")
            gen_tp[p] = ok
            # a worker needs a trajectory in flight: at most batch · (1 + redundancy) · (α + 1) of them at
            # once, each on at most the widest tp tried
            in_flight = plan.algorithm.batch_size * (1 + max(redundancies)) * (max(alphas) + 1)
            cap = int(in_flight * max(ok)) if ok else 0
            gen_gpus[p] = list(range(0, min(max_gpus(p), cap) + 1, step)) if ok else [0]
        if not any(len(v) > 1 for v in gen_gpus.values()):
            heads = plan.model.heads
            if tps is not None and all(heads % tp for tp in tps):  # a head is not split across GPUs
                divisors = ", ".join(str(d) for d in _powers_of_two(64) if heads % d == 0)
                raise PlanError([f"--tp: {plan.model.name}'s {heads} attention heads do not split evenly over "
                                 f"{', '.join(map(str, sorted(set(tps))))} GPUs; use one of {divisors}"])
            if tps is not None:
                raise PlanError([f"placement.generation: no GPU pool can serve {plan.model.name} at tp "
                                 f"{', '.join(map(str, tps))} with a {longest}-token context; allow a larger --tp"])
            raise PlanError([f"placement.generation: no GPU pool can serve {plan.model.name} with a {longest}-token "
                             f"context at tp up to {MAX_CROSS_DOMAIN_TP} (across NVLink domains); serve it in FP8 "
                             "(model.weight_dtype, model.kv_dtype), shorten the tasks' max_context_tokens, or give "
                             "a larger --tp"])
        rewards: list[tuple[str, str | None, int]] = []
        if plan.llm_judged_tasks:
            if c.serverless is not None:
                rewards.append(SERVERLESS)
            # whole judge engines: the base plan's dedicated judge tp carries over to the candidates
            judge_tp = plan.placement.reward.tp if plan.placement.reward.where == "dedicated" else 1
            sizes = sorted({max(judge_tp, g // judge_tp * judge_tp)
                            for g in (reward_gpus or [max(1, step // 2), step])})
            # a mode that scores on the serverless platform (sync+, one-off with one) would leave dedicated
            # judges idle: the same run as serverless with GPUs the budget check would count, so none are offered
            for p in pools if _mode_uses_dedicated_judges(plan, pools[0]) else ():
                for g in sizes:
                    rewards.append(("dedicated", p, g))
        else:
            rewards.append(SERVERLESS)
        tags = list(dict.fromkeys(t.affinity_tag for t in plan.tasks))
        rank = sorted(pools, key=lambda p: -c.gpu_type(c.gpu_pools[p].gpu).tflops_bf16
                      / c.gpu_type(c.gpu_pools[p].gpu).hbm_tbps)
        space = cls(pools=pools, gpu_price=price, cpu_usd_per_hour=cpu_hourly, trainer_pool=tr.pool,
                    trainer_gpus=trainer_gpus, gen_gpus=gen_gpus, gen_tp=gen_tp, tags=tags,
                    alphas=sorted(set(alphas)), redundancies=sorted(set(redundancies)), rewards=rewards,
                    budget=budget, heuristic_affinity=_task_kinds(plan), compute_rank=rank, gen_ep=gen_ep,
                    owned=owned, notes=notes, trainer_overrides=trainer_overrides, trainer_notes=trainer_notes)
        if not search_affinity:
            space.affinity_maps = []  # filled per candidate by the heuristic map only
        # the scenario's own placement is the reference, unless its trainer layout cannot train the context
        space.baseline = None if trainer_overrides else space.candidate_from_plan(plan)
        return space

    def candidate_from_plan(self, plan: Plan) -> Candidate | None:
        """The scenario's own placement as a candidate (None when it is not one: several tp in a pool)."""
        p = plan.placement
        gen: dict[str, tuple[int, int]] = {}
        eps: dict[str, int] = {}
        for g in p.generation:
            n, tp = gen.get(g.pool, (0, g.tp))
            if tp != g.tp or eps.setdefault(g.pool, g.ep) != g.ep:
                return None
            gen[g.pool] = (n + g.workers * g.tp, tp)
        gen_t = tuple((pool, n, tp) for pool in self.pools if pool in gen for n, tp in [gen[pool]])
        tags = {t.affinity_tag for t in plan.tasks}
        default = p.hw_affinity.get("default", gen_t[0][0])
        affinity = tuple((tag, p.hw_affinity.get(tag, default)) for tag in self.tags if tag in tags)
        r = p.reward
        # what the plan's mode does with its reward GPUs (unused ones are not placed, so not the candidate's)
        reward = ("dedicated", r.pool, r.gpus) if dedicated_reward_used(plan, mode_config(plan)) else SERVERLESS
        return Candidate(p.trainer.pool, p.trainer.gpus, gen_t, affinity, plan.algorithm.alpha,
                         plan.algorithm.redundancy, reward, _ep_pairs(self.pools, eps))

    # ---- feasibility ---------------------------------------------------------------------------

    def fixed_usd_per_hour(self, c: Candidate) -> float | None:
        total = self.cpu_usd_per_hour
        for pool, n in c.gpus_by_pool().items():
            if self.gpu_price.get(pool) is None:
                return None
            total += n * self.gpu_price[pool]
        return total

    def fits(self, c: Candidate) -> bool:
        if self.budget.gpus is not None and c.total_gpus > self.budget.gpus:
            return False
        if self.owned and any(n > self.owned.get(pool, n) for pool, n in c.gpus_by_pool().items()):
            return False
        if self.budget.usd_per_hour is not None:
            fixed = self.fixed_usd_per_hour(c)
            if fixed is None or fixed > self.budget.usd_per_hour + 1e-9:
                return False
        return True

    def valid(self, c: Candidate) -> bool:
        # only what the user allowed (--alphas, --redundancies, the reward placements): a scenario's own
        # α or redundancy outside them is a reference, never a plan the search may return
        if c.alpha not in self.alphas or c.redundancy not in self.redundancies or c.reward not in self.rewards:
            return False
        pools = c.gen_pools()
        if not pools:
            return False
        for pool, n, tp in c.gen:
            if n <= 0 or tp not in self.gen_tp.get(pool, []) or n % tp or c.ep_of(pool) not in self.eps(pool, tp):
                return False
        if any(pool not in pools or ep <= 1 for pool, ep in c.ep):
            return False
        return all(pool in pools for _, pool in c.affinity)

    # ---- generating candidates ---------------------------------------------------------------------

    def maps_for(self, gen_pools: list[str]) -> list[tuple[tuple[str, str], ...]]:
        """Affinity maps over these generation pools: every map (searching), or the heuristic one."""
        if self.affinity_maps:
            return [m for m in self.affinity_maps if all(p in gen_pools for _, p in m)]
        if self.affinity_maps is None:
            return [tuple(zip(self.tags, choice)) for choice in itertools.product(gen_pools, repeat=len(self.tags))]
        return [self.heuristic_map(gen_pools)]

    def heuristic_map(self, gen_pools: list[str]) -> tuple[tuple[str, str], ...]:
        """Prefill-heavy tasks → the generation pool with the most FLOPs per byte of HBM
        bandwidth, decode-heavy ones → the least (the ROLLART hardware-affinity rule)."""
        ranked = [p for p in self.compute_rank if p in gen_pools] or gen_pools
        compute, bandwidth = ranked[0], ranked[-1]
        return tuple((tag, compute if self.heuristic_affinity.get(tag) == "compute" else bandwidth)
                     for tag in self.tags)

    def enumerate(self) -> Iterator[Candidate]:
        """Every valid candidate within the budget (for small spaces and tests)."""
        per_pool = [[(p, n, tp, ep) for n in self.gen_gpus[p] for tp in (self.gen_tp[p] if n else [0])
                     if n == 0 or n % tp == 0 for ep in (self.eps(p, tp) if n else [1])] for p in self.pools]
        for tg in self.trainer_gpus:
            for reward in self.rewards:
                for gens in itertools.product(*per_pool):
                    gen = tuple(g[:3] for g in gens if g[1] > 0)
                    if not gen:
                        continue
                    ep = tuple((g[0], g[3]) for g in gens if g[1] > 0 and g[3] > 1)
                    probe = Candidate(self.trainer_pool, tg, gen, (), 0, 0.0, reward)
                    if not self.fits(probe):
                        continue
                    for amap in self.maps_for([g[0] for g in gen]):
                        for a in self.alphas:
                            for r in self.redundancies:
                                c = Candidate(self.trainer_pool, tg, gen, amap, a, r, reward, ep)
                                if self.valid(c):
                                    yield c

    def count(self, limit: int) -> int:
        """How many candidates, counting at most ``limit + 1``."""
        return sum(1 for _ in itertools.islice(self.enumerate(), limit + 1))

    def _affordable(self, usd_per_hour: float, pool: str) -> float:
        """GPUs of ``pool`` that ``usd_per_hour`` pays for: unbounded where its price is 0 (GPUs already
        owned, which the pool's count caps: ``owned``, ``gen_gpus``)."""
        price = self.gpu_price[pool]
        return usd_per_hour / price if price else math.inf

    def _fill(self, rng: random.Random, tg: int, reward: tuple[str, str | None, int], weights: dict[str, float],
              fraction: float) -> tuple[tuple[str, int, int], ...] | None:
        """Split what the budget leaves after the trainer and reward among generation pools."""
        pools = [p for p in self.pools if len(self.gen_gpus[p]) > 1 and weights.get(p, 0) > 0]
        if not pools:
            return None
        base = Candidate(self.trainer_pool, tg, (), (), 0, 0.0, reward)
        total_w = sum(weights[p] for p in pools)
        gen: dict[str, tuple[int, int]] = {}
        for p in pools:
            tp = rng.choice(self.gen_tp[p])
            if self.budget.gpus is not None:
                share = (self.budget.gpus - base.total_gpus) * fraction * weights[p] / total_w
            else:
                left = self.budget.usd_per_hour - (self.fixed_usd_per_hour(base) or 0.0)
                share = self._affordable(left * fraction * weights[p] / total_w, p)
            if self.budget.gpus is not None and self.budget.usd_per_hour is not None:
                left = self.budget.usd_per_hour - (self.fixed_usd_per_hour(base) or 0.0)
                share = min(share, self._affordable(left * fraction * weights[p] / total_w, p))
            options = [n for n in self.gen_gpus[p] if n <= share and n % tp == 0]
            gen[p] = (max(options) if options else 0, tp)
        # Round-off leftovers: keep adding a step to a random pool while the budget allows.
        for _ in range(64):
            order = [p for p in pools if gen[p][0] < self.gen_gpus[p][-1]]
            rng.shuffle(order)
            grown = False
            for p in order:
                n, tp = gen[p]
                bigger = [m for m in self.gen_gpus[p] if m > n and m % tp == 0]
                if not bigger or fraction < 1.0:
                    continue
                trial = {**gen, p: (bigger[0], tp)}
                cand = Candidate(self.trainer_pool, tg, tuple((q, m, t) for q, (m, t) in trial.items() if m),
                                 (), 0, 0.0, reward)
                if self.fits(cand):
                    gen, grown = trial, True
                    break
            if not grown:
                break
        out = tuple((p, n, tp) for p in self.pools if p in gen for n, tp in [gen[p]] if n > 0)
        return out or None

    def random(self, rng: random.Random, full: bool = True) -> Candidate | None:
        """A random candidate that uses the whole budget (``full``) or a random part of it."""
        for _ in range(50):
            tg = rng.choice(self.trainer_gpus)
            reward = rng.choice(self.rewards)
            weights = {p: rng.random() ** 2 for p in self.pools}
            if rng.random() < 0.25:  # sometimes a single generation pool
                only = rng.choice(self.pools)
                weights = {p: (1.0 if p == only else 0.0) for p in self.pools}
            gen = self._fill(rng, tg, reward, weights, 1.0 if full else rng.uniform(0.2, 1.0))
            if not gen:
                continue
            maps = self.maps_for([g[0] for g in gen])
            heuristic = self.heuristic_map([g[0] for g in gen])
            amap = heuristic if rng.random() < 0.5 or not maps else rng.choice(maps)
            c = Candidate(self.trainer_pool, tg, gen, amap, rng.choice(self.alphas), rng.choice(self.redundancies),
                          reward, self._random_ep(rng, gen))
            if self.valid(c) and self.fits(c):
                return c
        return None

    def _random_ep(self, rng: random.Random, gen: tuple[tuple[str, int, int], ...]) -> tuple[tuple[str, int], ...]:
        """An ep per generation pool, drawn only where there is a choice (a dense model draws
        nothing, so its random sequence is what it was without ep)."""
        eps = {}
        for pool, _, tp in gen:
            options = self.eps(pool, tp)
            if len(options) > 1:
                eps[pool] = rng.choice(options)
        return _ep_pairs(self.pools, eps)

    def structured(self, fractions: tuple[float, ...] = (1.0,), widest: bool = False) -> list[Candidate]:
        """Hand-made starting points: the scenario's placement (if within budget), and for a few
        trainer sizes the budget (each of ``fractions`` of what the trainer leaves) split evenly /
        all-in-one-pool with the heuristic affinity, at the narrowest tp that divides a pool's GPUs
        and, with ``widest``, also the widest (fewer, faster engines: how few GPUs serve cheaply)."""
        out: list[Candidate] = []
        if self.baseline is not None and self.valid(self.baseline) and self.fits(self.baseline):
            out.append(self.baseline)
        rng = random.Random(0)
        reward = self.baseline.reward if self.baseline and self.baseline.reward in self.rewards else self.rewards[0]
        alpha = self.baseline.alpha if self.baseline and self.baseline.alpha in self.alphas else self.alphas[0]
        red = (self.baseline.redundancy if self.baseline and self.baseline.redundancy in self.redundancies
               else self.redundancies[0])
        picks = sorted({self.trainer_gpus[len(self.trainer_gpus) * k // 4] for k in (1, 2, 3)})
        for tg in picks:
            splits = [{p: 1.0 for p in self.pools}] + [{p: float(p == q) for p in self.pools} for q in self.pools]
            for fraction in fractions:
                for weights in splits:
                    filled = self._fill(rng, tg, reward, weights, fraction)
                    if not filled:
                        continue
                    for pick in (min, max) if widest else (min,):
                        gen = tuple((p, n, pick(t for t in self.gen_tp[p] if n % t == 0)) for p, n, _ in filled)
                        c = Candidate(self.trainer_pool, tg, gen, self.heuristic_map([g[0] for g in gen]), alpha,
                                      red, reward)
                        if self.valid(c) and self.fits(c) and c not in out:
                            out.append(c)
        return out

    def neighbours(self, c: Candidate) -> list[Candidate]:
        """Candidates one move away: trainer ± a step (generation giving or taking it), a step of
        generation GPUs moved between pools, added or removed, a pool's tp up/down, one tag's
        affinity flipped, α / redundancy to the next option, another reward placement (its GPUs
        taken from a generation pool or added; the GPUs it frees given to one, or left)."""
        out: list[Candidate] = []
        gen = {p: (n, tp) for p, n, tp in c.gen}

        def with_gen(g: dict[str, tuple[int, int]], **kw: Any) -> Candidate:
            gen_t = tuple((p, n, tp) for p in self.pools if p in g for n, tp in [g[p]] if n > 0)
            pools = [p for p, _, _ in gen_t]
            affinity = kw.pop("affinity", c.affinity)
            if pools and any(p not in pools for _, p in affinity):
                affinity = tuple((tag, p if p in pools else pools[0]) for tag, p in affinity)
            # a pool keeps its ep while its new tp allows it, else runs ep 1
            eps = kw.pop("ep", dict(c.ep))
            eps = {p: e for p, _, tp in gen_t for e in [eps.get(p, 1)] if e in self.eps(p, tp)}
            fields = dict(trainer_pool=c.trainer_pool, trainer_gpus=c.trainer_gpus, gen=gen_t, affinity=affinity,
                          alpha=c.alpha, redundancy=c.redundancy, reward=c.reward, ep=_ep_pairs(self.pools, eps))
            fields.update(kw)
            return Candidate(**fields)

        def step_of(p: str, n: int, up: bool) -> int | None:
            opts = self.gen_gpus.get(p, [0])
            tp = gen.get(p, (0, min(self.gen_tp.get(p) or [1])))[1]
            cands = [m for m in opts if (m > n if up else m < n) and (m == 0 or m % tp == 0)]
            return (min(cands) if up else max(cands)) if cands else None

        ti = self.trainer_gpus.index(c.trainer_gpus) if c.trainer_gpus in self.trainer_gpus else None
        for j in (ti - 1, ti + 1) if ti is not None else ():
            if 0 <= j < len(self.trainer_gpus):
                tg = self.trainer_gpus[j]
                out.append(with_gen(gen, trainer_gpus=tg))
                delta = tg - c.trainer_gpus
                for p, (n, tp) in gen.items():  # generation gives or takes the difference
                    m = n - delta
                    if m in self.gen_gpus[p] and (m == 0 or m % tp == 0):
                        out.append(with_gen({**gen, p: (m, tp)}, trainer_gpus=tg))
        for p in self.pools:
            n, tp = gen.get(p, (0, min(self.gen_tp.get(p) or [1])))
            up, down = step_of(p, n, True), step_of(p, n, False)
            if up is not None:
                out.append(with_gen({**gen, p: (up, tp)}))
            if down is not None:
                out.append(with_gen({**gen, p: (down, tp)}))
            for q in self.pools:
                if q == p or up is None:
                    continue
                m, tq = gen.get(q, (0, 0))
                down_q = step_of(q, m, False) if m else None
                if down_q is not None:
                    out.append(with_gen({**gen, p: (up, tp), q: (down_q, tq)}))
            if n:
                tps = self.gen_tp[p]
                i = tps.index(tp) if tp in tps else 0
                for j in (i - 1, i + 1):
                    if 0 <= j < len(tps) and n % tps[j] == 0:
                        out.append(with_gen({**gen, p: (n, tps[j])}))
                eps = self.eps(p, tp)  # MoE: the pool's ep to the next option
                k = eps.index(c.ep_of(p)) if c.ep_of(p) in eps else 0
                for j in (k - 1, k + 1):
                    if 0 <= j < len(eps):
                        out.append(with_gen(gen, ep={**dict(c.ep), p: eps[j]}))
        pools = c.gen_pools()
        maps = self.maps_for(pools)
        if self.affinity_maps is None:
            for i, (tag, pool) in enumerate(c.affinity):
                for q in pools:
                    if q != pool:
                        out.append(with_gen(gen, affinity=c.affinity[:i] + ((tag, q),) + c.affinity[i + 1:]))
        else:
            out += [with_gen(gen, affinity=m) for m in maps if m != c.affinity]
        for name, opts in (("alpha", self.alphas), ("redundancy", self.redundancies)):
            cur = getattr(c, name)
            i = opts.index(cur) if cur in opts else None
            for j in (i - 1, i + 1) if i is not None else range(len(opts)):
                if 0 <= j < len(opts):
                    out.append(with_gen(gen, **{name: opts[j]}))
        for r in self.rewards:
            if r == c.reward:
                continue
            out.append(with_gen(gen, reward=r))
            extra = r[2] - c.reward[2]
            for p, (n, tp) in gen.items():  # dedicated judges take their GPUs from a generation pool
                fewer = [m for m in self.gen_gpus[p] if m <= n - extra and (m == 0 or m % tp == 0)]
                if extra > 0 and fewer:
                    out.append(with_gen({**gen, p: (max(fewer), tp)}, reward=r))
                # and give them back: judges moving to the serverless platform (or fewer of them) free
                # GPUs that generation takes in the same move (else two moves, which the climb rarely makes)
                more = [m for m in self.gen_gpus[p] if n < m <= n - extra and m % tp == 0]
                if extra < 0 and more:
                    out.append(with_gen({**gen, p: (max(more), tp)}, reward=r))
        seen, keep = set(), []
        for n in out:
            if n != c and n not in seen and self.valid(n) and self.fits(n):
                seen.add(n)
                keep.append(n)
        return keep


def _mode_uses_dedicated_judges(plan: Plan, pool: str) -> bool:
    """Whether the plan's mode runs the LLM judge on a dedicated candidate's GPUs (``pool``): a
    candidate's plan with dedicated reward, as :meth:`Candidate.apply` writes it, through the mode."""
    reward = plan.placement.reward.model_copy(update={"where": "dedicated", "pool": pool, "gpus": 1})
    probe = plan.model_copy(update={"placement": plan.placement.model_copy(update={"reward": reward})})
    return dedicated_reward_used(probe, mode_config(probe))


def _ep_pairs(pools: list[str], eps: dict[str, int]) -> tuple[tuple[str, int], ...]:
    """``Candidate.ep``: the pools (in space order) whose ep is above 1."""
    return tuple((p, eps[p]) for p in pools if eps.get(p, 1) > 1)


def _task_kinds(plan: Plan) -> dict[str, str]:
    """Each task tag → "compute" when its prefill work per generated token is above the mix's
    median (long observations, many turns), else "bandwidth" (long generations)."""
    ratio: dict[str, float] = {}
    for t in plan.tasks:
        turns = t.turns.mean()
        prefill = t.prompt_tokens.mean() + turns * t.obs_tokens.mean()
        decode = max(1.0, turns * t.response_tokens.mean())
        ratio[t.affinity_tag] = prefill / decode
    if not ratio:
        return {}
    values = sorted(ratio.values())
    median = values[len(values) // 2] if len(values) % 2 else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
    return {tag: ("compute" if r >= median else "bandwidth") for tag, r in ratio.items()}
