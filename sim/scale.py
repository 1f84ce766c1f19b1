"""Scale-out approximation: simulate 1/m of a very large cluster, account for the rest by symmetry.

Workers of a generation group are exchangeable under least-loaded routing, env managers of a
task are exchangeable, and the α window, redundancy and group sizes are per group, so a plan
with m times fewer workers in every generation group, m times fewer GRPO groups per batch, env
managers (an explicit ``algorithm.env_managers``; the default is a batch's), env cores,
serverless instances and reward GPUs sees the same per-worker load, the same step time and
1/m of the throughput. What does not shrink is the trainer: its step (and the weight
transfer) is priced on the *full* plan with the simulated batch replicated m times. The result
scales the extensive figures (trajectories, tokens, counts, serverless GPU·s, cost) back by m
and says so in ``summary["scale_approx"]``.

What symmetry does not give is the tail. When a batch has to wait for *every* group it could be
formed from (in ROLLART mode with α = 1 and the default env managers, every other steady batch
is the whole cohort admitted at a weight sync), its ready time is the slowest of G groups in the full cluster but of only
G/m in the subset: the subset under-samples the tail and its steady step is too short, more so
the larger the cluster (before this correction, mean of 4 seeds against 2: −0.1, −2.2 and −3.3 %
over steps 2–5 at 128, 512 and 1,024 GPUs). :class:`TailProbe` watches the subset's groups and,
for such a batch, estimates by order statistics when the slowest of m times as many groups
would finish (see :func:`cohort_done_s`); :func:`scale_result` sets the batch's wait by it.
The trainer prices such a batch's m − 1 unsimulated copies on earlier whole cohorts
(:meth:`TailProbe.train_lengths`), not on copies of the simulated one.

On env groups (ROLLART's default) the same holds batch by batch: round 0 of a batch takes one episode from
each env group (``rollart/core/buffer.py::_batch_by_rounds``), so the batch waits for the slowest of all
env groups' oldest episodes, G of them in full and G/m in the subset. There the tail is estimated member by
member (:func:`env_batch_done_s`): a member's duration is its generated tokens over its pool's decode rate
(a line in tokens per task and pool, fitted on the subset), the tokens taken from the plan's distribution
in closed form where it gives one (:func:`token_cdf`: single-turn lognormal or constant; cap included), and
members start on the corrected clock. A long-tailed plan needs it (1,024 GPUs, batch 4,096, a 9×-tailed
lognormal task, steady traj/s, means of 4 seeds against 4 full ones: +11 % at redundancy 0 where it was
+49 %, +6 % at 0.25 where it was +28 %); the paper plans hardly move (their longest response is 2–3× the
mean). What remains at redundancy 0 (measured; calibration/CHANGES.md, session 51): the capped responses decode ~3 %
slower than the fitted line (their own context's KV read: 81 against 84 tok/s on H20), ~10 s of a ~350 s
step; and each step's estimate is an expectation, chained step to step, where the full run's short step
waits for max(this batch's slowest, the previous one's), a maximum of two random times that the mean of
each understates (full short steps 16–73 s, estimated ~16 s).
:func:`env_groups_tail_warning` still says so for such plans.

What no correction removes is the subset's sampling spread: 32 groups per batch in a short run
whatever the cluster, so one 4-step approximate run's steady step differs from seed to seed by ±5 %
(sd); it averages out over a long run (or over seeds), which is why a long run simulates fewer groups
per batch (:func:`min_groups`; 16 from 7 steps on: ±4 % per 20-step seed at 1,024 GPUs).

Not for modes that launch a whole batch at once (sync, sync+, one-off: ``batch_level_launch``).
Their step waits for the slowest trajectory of the full batch (in sync also at every turn, for the
slowest env), a maximum the subset under-samples and the order statistics above do not cover: a
review measured the approximation 12–33 % fast for them at 1,024 GPUs (sync 4.42 against 3.31
traj/s in full) and flat from 1,024 to 3,072 GPUs, where the full step grows. :func:`auto_factor`
returns 1 for them and :class:`SimBackend` refuses a factor above 1.

Not for plans where the symmetry does not hold: colocated placement (the engines on the
trainer's GPUs), CPU-host contention (measured profiles), or counts m does not divide.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections import deque
from typing import Any, Callable, Sequence

import numpy as np

from rollart.plan import Plan, PlanError

# What the subset must keep to stand for the whole (measured, 1,024 GPUs, mean over seeds, against full):
# * workers per generation group: least-loaded routing pools a group's workers, and one worker alone
#   loses that: over 20 steps its steady step is +4.3 % (8 seeds); with 2, -0.0 % (12 seeds); with 4,
#   -1.7 % (4 seeds; full: 398.1 s, 2 seeds). A 4-step run does not show it (+0.7 % with one worker).
#   The figures and the opt-in check: tests/test_scale.py, test_a_long_run_matches_full_simulation_...
# * groups per batch: the subset's sample of the batch. Its sampling spread shrinks over the steady steps
#   it averages, so a long run may simulate fewer per batch: 32 in a 4-step run (3 steady steps), 16 from
#   7 steps on (the 20-step figures above are 16 groups per batch with 2 workers).
MIN_WORKERS = 2        # simulated workers per generation group, at least
SHORT_RUN_GROUPS = 32  # simulated GRPO groups per batch in a run of up to 4 steps (validated at 4 steps)
STEADY_GROUPS = 96     # past 4 steps: simulated groups over the run's steady steps, at least ...
MIN_GROUPS = 16        # ... and per batch, at least (validated at 20 steps)


def min_groups(steps: int) -> int:
    """The fewest GRPO groups per batch the subset simulates in a run of ``steps`` steps:
    max(16, min(32, ⌈96 / (steps − 1)⌉)) (the first step is the pipeline's fill)."""
    spread = -(-STEADY_GROUPS // max(1, steps - 1))
    return max(MIN_GROUPS, min(SHORT_RUN_GROUPS, spread))


def _divisible(plan: Plan, m: int) -> list[str]:
    pl, problems = plan.placement, []
    for i, g in enumerate(pl.generation):
        if g.workers % m:
            problems.append(f"placement.generation.{i}.workers ({g.workers}) is not a multiple of {m}")
    if plan.groups_per_batch % m:
        problems.append(f"algorithm.batch_size: {plan.groups_per_batch} groups per batch is not a multiple of {m}")
    if pl.trainer.gpus % m:
        problems.append(f"placement.trainer.gpus ({pl.trainer.gpus}) is not a multiple of {m}")
    envs = plan.algorithm.env_managers
    if envs is not None and envs % m:
        problems.append(f"algorithm.env_managers ({envs}) is not a multiple of {m}")
    if pl.reward.gpus and pl.reward.gpus % (m * pl.reward.tp):
        problems.append(f"placement.reward.gpus ({pl.reward.gpus}) is not a multiple of {m} × tp")
    return problems


def auto_factor(plan: Plan, batch_level: bool = False) -> int:
    """The largest m that keeps ≥ MIN_WORKERS workers per generation group and ≥ :func:`min_groups`
    groups per batch and divides every count (1: no approximation). ``batch_level``: the mode launches
    whole batches (sync, sync+, one-off), which the approximation does not cover: 1."""
    if batch_level:
        return 1
    gens = plan.placement.generation
    groups = min_groups(plan.algorithm.steps)
    hi = min([g.workers // MIN_WORKERS for g in gens] + [plan.groups_per_batch // groups])
    for m in range(max(1, hi), 1, -1):
        if not _divisible(plan, m):
            return m
    return 1


def approximation_factor(plan: Plan, batch_level: bool = False) -> int:
    """:func:`auto_factor` for ``plan`` (built under ``sim_request_scale(math.inf)``), with the
    simulated-work guard checked on the 1/m subset it simulates: a PlanError naming the problems."""
    from rollart.plan.schema import sim_request_scale, work_problems

    m = auto_factor(plan, batch_level)
    with sim_request_scale(m):
        if problems := work_problems(plan):
            raise PlanError(problems)
    return m


def shrink_plan(plan: Plan, m: int) -> Plan:
    """The 1/m plan that is simulated at full detail."""
    if getattr(plan.placement, "colocated", False):
        raise PlanError(["--scale-approx: colocated placement (engines on the trainer's GPUs) is not symmetric "
                         "under the approximation; simulate it in full"])
    problems = _divisible(plan, m)
    if problems:
        raise PlanError([f"--scale-approx {m}: {p}" for p in problems])
    d: dict[str, Any] = plan.model_dump(mode="python", by_alias=True, exclude_none=False)
    pools = d["cluster"]["gpu_pools"]
    for g in d["placement"]["generation"]:
        g["workers"] //= m
    for name, p in pools.items():
        p["count"] = max(1, -(-p["count"] // m))
    for p in d["cluster"]["cpu_pools"].values():
        p["cores"] = max(1, -(-p["cores"] // m))
        if p.get("image_pull_gbps"):  # 1/m of the envs pull through 1/m of the path
            p["image_pull_gbps"] = p["image_pull_gbps"] / m
    if d["cluster"].get("serverless"):
        # 1/m of the platform's instances, each serving as many calls at once as before
        s = d["cluster"]["serverless"]
        per_instance = s["instance_concurrency"]
        s["max_concurrency"] = max(1, -(-(s["max_concurrency"] // per_instance) // m)) * per_instance
    d["placement"]["trainer"]["gpus"] //= m
    if d["placement"]["reward"].get("gpus"):
        d["placement"]["reward"]["gpus"] //= m
    d["algorithm"]["batch_size"] //= m
    if d["algorithm"].get("env_managers"):
        d["algorithm"]["env_managers"] //= m
    try:
        return Plan.model_validate(d)
    except Exception as exc:  # pydantic's error: one line naming the first field
        raise PlanError([f"--scale-approx {m}: the 1/{m} plan is not valid ({str(exc).splitlines()[0]})"]) from None


@dataclasses.dataclass
class GroupTail:
    """One completed group of a batch's cohort, as the tail estimate needs it."""

    task: str
    launch_s: float          # admission (its first member's start)
    size: int                # members that must score
    events: list[float]      # durations of the members that scored
    censored: list[float]    # members still running (or failed) when it filled: longer than this


def _member_survival(events: list[float], censored: list[float], grid: np.ndarray) -> np.ndarray:
    """Kaplan–Meier survival of a task's member durations on ``grid``; past the last scored member
    an exponential tail whose scale is the mean excess of the slowest fifth of the scored members
    (the redundant members are censored exactly where the tail starts, so it is never empty)."""
    ev = np.sort(np.asarray(events, dtype=float))
    times = np.concatenate([ev, np.asarray(censored, dtype=float)])
    is_event = np.concatenate([np.ones(len(ev), bool), np.zeros(len(censored), bool)])
    order = np.lexsort((~is_event, times))  # at a tie the event comes first
    times, is_event = times[order], is_event[order]
    at_risk = len(times) - np.arange(len(times))
    factors = np.where(is_event, 1.0 - 1.0 / at_risk, 1.0)
    surv = np.cumprod(factors)
    idx = np.searchsorted(times, grid, side="right") - 1
    out = np.where(idx >= 0, surv[np.maximum(idx, 0)], 1.0)
    last = ev[-1]
    s_last = surv[np.searchsorted(times, last, side="right") - 1]
    if s_last > 0:
        top = ev[len(ev) - _top_k(len(ev)):]
        theta = max(float(np.mean(top - top[0])), 1e-3 * max(last, 1.0))
        tail = s_last * np.exp(-(grid - last) / theta)
        out = np.where(grid > last, tail, out)
    return out


def _top_k(n: int) -> int:
    """How many of the slowest scored members the tail scale is the mean excess of: √n, the usual
    compromise of extreme-value fits (few: close to the tail; not too few: not all noise)."""
    return max(2, math.ceil(math.sqrt(n)))


def _at_least(p: np.ndarray, n: int, k: int) -> np.ndarray:
    """P(Binomial(n, p) ≥ k), elementwise."""
    q = 1.0 - p
    return sum(math.comb(n, j) * p ** j * q ** (n - j) for j in range(k, n + 1))


GRID_POINTS = 4000


def cohort_done_s(cohort: list[GroupTail], m: int, history: Sequence[GroupTail] = ()) -> float:
    """When the last of m copies of ``cohort`` is done, in expectation: the full cluster's ready
    time of a batch that waits for its whole cohort, of which the subset simulated one copy.

    Each simulated group stands for m exchangeable groups of the full cluster: the same task,
    admitted at the same time, under the same per-worker load. A group of size s with n members
    is done when s of its n members have scored; members of a task are exchangeable, so their
    duration distribution G_t is estimated over the cohort and ``history`` (earlier cohorts of the
    same kind; Kaplan–Meier, since redundant members are censored when their group fills). Then
    P(group done by d) = P(Binomial(n, G_t(d)) ≥ s), the m-fold cohort is done by x with
    probability Π_g F_g(x − launch_g)^m, and the result is that distribution's mean. Redundancy
    helps: the slowest of many groups needs only its (n − s + 1)-th slowest member to be slow, a
    quantile the subset's members do sample. The model's mean, not the subset's own slowest group
    plus a difference, is used: over a few pooled cohorts its spread is a fraction of the single
    maximum's (at 1,024 GPUs, 32 of 512 groups: ±2 s with 8 cohorts against ±10 s)."""
    cohort = [g for g in cohort if g.events]
    if not cohort:
        return 0.0
    lo = min(g.launch_s for g in cohort)
    by_task: dict[str, tuple[list[float], list[float]]] = {}
    for g in [*cohort, *history]:
        ev, ce = by_task.setdefault(g.task, ([], []))
        ev.extend(g.events)
        ce.extend(g.censored)
    # far enough past the slowest scored member that every group is done
    longest = max(max(ev) for ev, _ in by_task.values())
    grid = np.linspace(lo, max(g.launch_s for g in cohort) + 3.0 * longest, GRID_POINTS)
    dx = grid[1] - grid[0]
    log_done = np.zeros_like(grid)
    cache: dict[tuple[str, float, int, int], np.ndarray] = {}
    for g in cohort:
        key = (g.task, g.launch_s, g.size, len(g.events) + len(g.censored))
        if key not in cache:
            ev, ce = by_task[g.task]
            d = grid - g.launch_s
            surv = _member_survival(ev, ce, np.maximum(d, 0.0))
            f = np.where(d > 0, _at_least(1.0 - surv, key[3], g.size), 0.0)
            with np.errstate(divide="ignore"):
                cache[key] = np.log(f)
        log_done += cache[key]
    return lo + float(np.sum(1.0 - np.exp(m * log_done)) * dx)


@dataclasses.dataclass
class StepTail:
    """What one step's batch waited for, seen in the subset."""

    step: int
    wait_start_s: float
    wait_end_s: float
    ready_s: float        # the batch's cohort's last completion
    delay_s: float        # the full cluster's ready time (cohort_done_s) less ready_s; 0: the batch
                          # did not wait for its slowest group


def token_cdf(task: Any, observed: Sequence[int] = ()) -> "Callable[[np.ndarray], np.ndarray] | None":
    """P(a trajectory of ``task`` generates ≤ x tokens), for the env-groups tail (:func:`env_batch_done_s`).

    In closed form where the plan gives it: a single-turn task whose ``response_tokens`` is lognormal (its
    cap and the context's included) or constant. The full cluster's slowest member is a draw from the
    top 1/(m·members) of this distribution, far past anything the subset saw, so it is not estimated
    from the subset: a fit of the subset's durations swung ±25 % with the seed (calibration/CHANGES.md, session 50).
    Otherwise (multi-turn tasks, other kinds) the subset's own generated tokens (pooled over the run;
    they are drawn, not shaped by the load): an empirical CDF, which never reaches past the subset's
    longest, so there the correction is at most what the subset sampled. None: nothing to go on."""
    from rollart.calibration.env_fit import model_cdf
    from rollart.plan.distributions import Constant, LogNormal

    turns, dist = task.turns, task.response_tokens
    single = isinstance(turns, Constant) and round(turns.value) <= 1
    cap = float(task.max_context_tokens)
    if single and isinstance(dist, LogNormal) and dist.sigma > 0:  # its own cap in model_cdf, the context's here
        return lambda x: np.where(np.asarray(x, dtype=float) >= cap, 1.0, model_cdf(dist, x))
    if single and isinstance(dist, Constant):
        value = min(cap, dist.value)
        return lambda x: (np.asarray(x) >= value).astype(float)
    if len(observed) < 8:
        return None
    ranked = np.sort(np.asarray(observed, dtype=float))
    return lambda x: np.searchsorted(ranked, x, side="right") / len(ranked)


def _at_least_of(ps: np.ndarray, k: int) -> np.ndarray:
    """P(at least k of independent events with probabilities ps[i] (rows) happen), per column."""
    dist = np.zeros((ps.shape[0] + 1, ps.shape[1]))
    dist[0] = 1.0
    for p in ps:
        dist[1:] = dist[1:] * (1.0 - p) + dist[:-1] * p
        dist[0] = dist[0] * (1.0 - p)
    return dist[k:].sum(axis=0)


@dataclasses.dataclass
class EnvGroupTail:
    """One group of an env-groups batch as :func:`env_batch_done_s` needs it."""

    task: str
    size: int                                  # members that must score
    lag_s: float                               # from its last scored member's finish to its completion (the reward)
    members: list[tuple[float, str | None]]    # (start on the corrected clock, generation pool) of those started in time


def env_batch_done_s(groups: Sequence[EnvGroupTail], m: int, ready_s: float,
                     duration_cdf: "Callable[[str, str | None, np.ndarray], np.ndarray | None]") -> float:
    """When the full cluster's env-groups batch is ready, in expectation, given that the subset's copy of it
    was ready at ``ready_s``: the batch waits for every env group's oldest episode, and the full cluster has
    m copies of each simulated group (same task, same start, same pool). The simulated copy is one of them,
    so the full batch is ready at max(ready_s, Y), Y the slowest of the m − 1 others: with F(x) = P(every
    simulated group done by x), E = ready_s + ∫_{ready_s}^∞ (1 − F(x)^(m−1)) dx. A group of size s is done
    when s of its members are (independent members, each P(done by x) = its duration's CDF at x − start,
    plus the group's reward lag). ``duration_cdf(task, pool, d)``: P(a member's duration ≤ d), None: unknown
    (the batch keeps ``ready_s``). Never earlier than ``ready_s``: the subset's draw is part of the full batch."""
    if m <= 1 or not groups:
        return ready_s
    probe = np.array([1e9])
    if any(duration_cdf(g.task, pool, probe) is None for g in groups for _, pool in g.members):
        return ready_s
    # far enough that every group is done: the durations' CDFs reach 1 (their cap) or 1 − 1e-12
    hi_d = _duration_upper(groups, duration_cdf)
    hi = max(s for g in groups for s, _ in g.members) + hi_d + max(g.lag_s for g in groups)
    if hi <= ready_s:
        return ready_s
    grid = np.linspace(ready_s, hi, GRID_POINTS)
    dx = grid[1] - grid[0]
    log_done = np.zeros_like(grid)
    for g in groups:
        if len(g.members) < g.size:
            return ready_s  # a group filled by members started later: not modelled
        ps = np.stack([duration_cdf(g.task, pool, np.maximum(grid - g.lag_s - s, 0.0)) * (grid - g.lag_s > s)
                       for s, pool in g.members])
        with np.errstate(divide="ignore"):
            log_done += np.log(np.clip(_at_least_of(ps, g.size), 0.0, 1.0))
    return ready_s + float(np.sum(1.0 - np.exp((m - 1) * log_done)) * dx)


def _duration_upper(groups: Sequence[EnvGroupTail], duration_cdf: Any) -> float:
    """The longest duration any member's CDF allows (to 1e-12), by doubling."""
    d = 1.0
    keys = {(g.task, pool) for g in groups for _, pool in g.members}
    while d < 1e7 and any(duration_cdf(t, p, np.array([d]))[0] < 1.0 - 1e-12 for t, p in keys):
        d *= 2.0
    return d


@dataclasses.dataclass(slots=True)
class BatchGroup:
    """One group of an env-groups batch as the subset ran it, kept for the end of the run (one per group of
    every step, so its members are packed: ~17 bytes each against ~100 as a list of tuples)."""

    task: str
    size: int
    lag_s: float                      # as EnvGroupTail.lag_s
    version: int
    done_s: float                     # its completion (subset clock)
    last: int                         # the member that scored last
    starts: array                     # 'd': each member's start (subset clock), those started before done_s
    pools: tuple[str | None, ...]     # each member's generation pool
    held: bytes                       # 1 where the member was held for the weights

    def tail(self, starts: Sequence[float]) -> EnvGroupTail:
        """Its :class:`EnvGroupTail` with the members started at ``starts``."""
        return EnvGroupTail(self.task, self.size, self.lag_s, list(zip(starts, self.pools)))


@dataclasses.dataclass
class EnvBatch:
    """An env-groups step's batch, seen in the subset (subset clock), kept compact (no trajectories): per
    group its tail record, version, completion, which members were held for the weights and which one
    scored last."""

    step: int
    ready_s: float                                          # its last group's completion
    groups: list[BatchGroup]


PAIR_HISTORY = 10_000  # scored members per (task, pool) the duration line is fitted on, the latest (as
                      # HISTORY_COHORTS: ~10k; bounds the probe's memory over a long run)
MIN_FIT_MEMBERS = 16  # scored members of a (task, pool) to fit a duration line on (two per group of 8: a line
                      # through a handful of points; below it the task's members over all pools are used)


HISTORY_COHORTS = 32  # cohorts whose members are pooled for the tail: ~10k members at 32 groups each


class TailProbe:
    """Watches the subset's groups for :func:`cohort_done_s` and :meth:`train_lengths`. It wraps two methods of the run's
    controller and tracer (``new_group``: every admitted group; the trainer's ``get_batch`` span:
    the batch was just taken) and keeps only the groups of the last few policy versions, so its
    memory follows what is in flight."""

    def __init__(self, ctl: Any, m: int) -> None:
        self.ctl, self.m = ctl, m
        self.steps: list[StepTail] = []
        self._live: dict[int, Any] = {}                       # admitted, not yet complete/evicted
        self._done: dict[int, list[tuple[Any, GroupTail]]] = {}  # version -> completed groups
        self._taken: set[int] = set()                          # ids of the completed groups already trained on
        self._history: deque[tuple[set[int], list[GroupTail]]] = deque(maxlen=HISTORY_COHORTS)
        self._lengths: deque[dict[str, list[int]]] = deque(maxlen=HISTORY_COHORTS)  # whole cohorts' lengths
        self._train_rest: tuple[set[int], list[int]] | None = None
        self.trained_tokens: dict[int, int] = {}  # step -> tokens of the full plan's batch as priced
        # env groups: each step's batch (env_batch_done_s) and, per (task, pool), the scored members'
        # (generated tokens, duration) for the duration model (duration_cdf)
        self.env_batches: dict[int, EnvBatch] = {}
        self._pairs: dict[tuple[str, str | None], "deque[tuple[int, float]]"] = {}
        self._fits: dict[tuple[str, str | None], tuple[float, float] | None] = {}
        self._token_cdfs: dict[str, Any] = {}
        new_group, span = ctl.new_group, ctl.tracer.trainer_span

        def traced_new_group(task: Any, batch_index: int, slot: int | None = None) -> Any:
            group = new_group(task, batch_index, slot)
            self._live[group.id] = group
            return group

        def traced_span(name: str, t0: float, t1: float) -> None:
            if name == "get_batch (waiting)":
                self._batch_taken(t0, t1)
            span(name, t0, t1)

        ctl.new_group = traced_new_group
        ctl.tracer.trainer_span = traced_span

    def _collect(self) -> None:
        for gid, g in list(self._live.items()):
            if g.complete:
                launch = min(t.started_at for t in g.members)
                events = [t.finished_at - t.started_at for t in g.scored]
                censored = [g.completed_at - t.started_at for t in g.members
                            if t not in g.scored and t.started_at < g.completed_at]
                self._done.setdefault(g.version, []).append(
                    (g, GroupTail(g.task, launch, g.size, events, censored)))
            elif not (g.evicted or g.abandoned):
                continue
            del self._live[gid]

    def _plan_train(self, batch: list[Any]) -> None:
        """The m − 1 copies of a whole-cohort batch the full cluster trains alongside the simulated
        one: per task, sequence lengths of the earlier whole cohorts (most recent first, cycled when
        there are fewer), else this batch's again. A copy of the subset's own sample would carry its
        deviation m times (±3.7 % in the batch's tokens at 32 groups against ±0.9 % at 512); earlier
        cohorts are draws from the same distribution (lengths are drawn, not shaped by the load)."""
        own: dict[str, list[int]] = {}
        for g in batch:
            own.setdefault(g.task, []).extend(t.context_tokens for t in g.scored)
        rest: list[int] = []
        for task, lens in own.items():
            pool = [n for past in reversed(self._lengths) for n in past.get(task, ())]
            need = (self.m - 1) * len(lens)
            if pool:
                rest.extend(pool[i % len(pool)] for i in range(need))
            else:
                rest.extend(lens * (self.m - 1))
        self._train_rest = ({t.id for g in batch for t in g.scored}, rest)
        self._lengths.append(own)

    def train_lengths(self, batch: Sequence[Any]) -> list[int]:
        """The full plan's training batch (sequence lengths) for the subset's ``batch``; its token
        count is what the step reports as trained."""
        own = [t.context_tokens for t in batch]
        if self._train_rest is not None and {t.id for t in batch} == self._train_rest[0]:
            lens = own + self._train_rest[1]
        else:
            lens = own * self.m  # a selected batch (the first of a cohort to finish): its copies are alike
        self.trained_tokens[self.ctl.version] = sum(lens)
        return lens

    def _batch_taken(self, t0: float, t1: float) -> None:
        ctl = self.ctl
        self._collect()
        n = ctl.version
        batch = [g for pairs in self._done.values() for g, _ in pairs if g.consumed and g.id not in self._taken]
        self._taken.update(g.id for g in batch)
        self._train_rest = None
        if ctl.scheduler.env_groups:
            # env groups (ROLLART, AReaL-style): a batch is each env group's oldest episode, and each
            # env group's managers roll its episodes out, α ahead. Round 0 of a batch still waits for
            # every env group's oldest episode, the slowest of G in full against G/m here: the batch is
            # recorded for env_batch_done_s (_with_tail). The batch is an unselected sample of each env
            # group's task, so the full batch's other copies come from earlier ones.
            if batch and len(batch) == ctl.plan.groups_per_batch:
                self._plan_train(batch)
            ready = max((g.completed_at for g in batch), default=t1)
            if batch:
                self._record_env_batch(n, batch, ready)
            self.steps.append(StepTail(n, t0, t1, ready, 0.0))
            self._forget_old(n)
            return
        versions = {g.version for g in batch}
        cohort = [rec for v in versions for _, rec in self._done.get(v, [])]
        groups = [g for v in versions for g, _ in self._done.get(v, [])]
        # only a batch that waited for all it could be formed from sits on the tail; one formed
        # while usable groups were still running is an inner quantile, the same in both (a mode
        # that evicts nothing, AReaL, can use every open group, so any open group counts)
        waited_for_all = not any(ctl.buffer.usable(g, n) for g in ctl.buffer.open.values())
        ready = max((g.completed_at for g in groups), default=t1)
        delay = 0.0
        if waited_for_all and batch:
            # earlier cohorts like this one (as many groups: the same load) sharpen the members' tail
            history = [rec for vs, past in self._history if not vs & versions and len(past) == len(cohort)
                       for rec in past]
            delay = cohort_done_s(cohort, self.m, history) - ready
            self._history.append((versions, cohort))
            if len(batch) == len(groups):  # the whole cohort: an unselected sample of each task's trajectories
                self._plan_train(batch)
        self.steps.append(StepTail(n, t0, t1, ready, delay))
        self._forget_old(n)

    def _pool(self, t: Any) -> str | None:
        return self.ctl.proxy.pool_of(t.last_worker)

    def _record_env_batch(self, n: int, batch: list[Any], ready: float) -> None:
        self._fits.clear()
        self._token_cdfs.clear()
        groups = []
        for g in batch:
            for t in g.scored:
                self._pairs.setdefault((g.task, self._pool(t)), deque(maxlen=PAIR_HISTORY)).append(
                    (t.generated_tokens, t.finished_at - t.started_at))
            members = [t for t in g.members if t.started_at < g.completed_at]
            last = max(g.scored, key=lambda t: t.finished_at)
            groups.append(BatchGroup(g.task, g.size, max(0.0, g.completed_at - last.finished_at), g.version,
                                     g.completed_at, members.index(last), array("d", (t.started_at for t in members)),
                                     tuple(self._pool(t) for t in members),
                                     bytes(t.held_for_weights is not None for t in members)))
        self.env_batches[n] = EnvBatch(n, ready, groups)

    def duration_cdf(self, task: str, pool: str | None, d: np.ndarray) -> np.ndarray | None:
        """P(a member of ``task`` served by ``pool`` takes ≤ d): its generated tokens' CDF (:func:`token_cdf`)
        through the duration's line in tokens, d = a + b·tokens, fitted (least squares) on the subset's scored
        members of that task and pool over the run (durations are linear in tokens per pool: the pools decode
        at different rates, ~83 against ~100 tokens/s on H20 and H800 in the probe, flat from 500 to 25k
        tokens; only the capped 30k responses run ~3 % slower, their own context's KV read, which the line
        leaves out; calibration/CHANGES.md, session 51). None: too few members to fit."""
        key = (task, pool)
        if key not in self._fits:
            pairs = self._pairs.get(key) or []
            if len(pairs) < MIN_FIT_MEMBERS:  # a thinly served pool: the task's members over all its pools
                pairs = [p for (t, _), ps in self._pairs.items() if t == task for p in ps]
            fit = None
            if len(pairs) >= MIN_FIT_MEMBERS:
                x, y = np.asarray(pairs, dtype=float).T
                if np.ptp(x) > 0:
                    b, a = np.polyfit(x, y, 1)
                    fit = (float(a), float(b)) if b > 0 else None
            self._fits[key] = fit
        fit = self._fits[key]
        if fit is None:
            return None
        if task not in self._token_cdfs:
            observed = [tok for (t, _), ps in self._pairs.items() if t == task for tok, _ in ps]
            self._token_cdfs[task] = token_cdf(self.ctl.plan.task(task), observed)
        cdf = self._token_cdfs[task]
        if cdf is None:
            return None
        a, b = fit
        return cdf((np.asarray(d, dtype=float) - a) / b)

    def _forget_old(self, n: int) -> None:
        for v in [v for v in self._done if v < n - self.ctl.mode.alpha - 1]:
            self._taken.difference_update(g.id for g, _ in self._done.pop(v))


_EXTENSIVE = ("aborted_stale", "aborted_redundant", "env_failures", "env_call_errors", "routed_fallback", "routed_preferred",
              "kv_preemptions", "serverless_gpu_seconds", "serverless_cold_starts", "serverless_serving_s", "serverless_instance_s",
              "tokens_per_s", "wasted_tokens", "discarded_tokens")


def _with_tail(steps: list[Any], tail: "TailProbe | None") -> tuple[list[Any], float, int]:
    """The steps with each batch's wait lengthened by its tail delay (later steps shifted by it);
    the added seconds count as generation (the slowest groups are generating or in env turns)."""
    if tail is None:
        return steps, 0.0, 0
    seen = {t.step: t for t in tail.steps}
    out, shift, corrected = [], 0.0, 0
    ends: dict[int, tuple[float, float]] = {}  # step -> (its end on the subset's clock, the shift from then on)
    for s in steps:
        t = seen.get(s.step)
        extra = 0.0
        eb = tail.env_batches.get(s.step) if t is not None else None
        if eb is not None:
            ready_full = _env_ready(tail, eb, ends)
            t.delay_s = ready_full - (t.ready_s + shift)
            new_wait = max(0.0, ready_full - (t.wait_start_s + shift))
            extra = new_wait - (t.wait_end_s - t.wait_start_s)  # < 0: the subset's own late starts moved too far
        elif t is not None and t.delay_s:
            new_wait = max(0.0, t.ready_s + t.delay_s - t.wait_start_s)
            extra = new_wait - (t.wait_end_s - t.wait_start_s)  # < 0: the subset drew a slow straggler
        breakdown = dict(s.breakdown_s)
        if extra > 0:
            breakdown["generation"] = breakdown.get("generation", 0.0) + extra
        elif extra < 0:  # a shorter wait: take it off what the critical path waited on
            left = -extra
            for key in ("generation", "env_step", "env_reset", "reward", "idle"):
                cut = min(left, breakdown.get(key, 0.0))
                breakdown[key] = breakdown.get(key, 0.0) - cut
                left -= cut
        corrected += bool(extra)
        out.append(dataclasses.replace(s, start_s=s.start_s + shift, end_s=s.end_s + shift + extra,
                                       breakdown_s=breakdown))
        shift += extra
        ends[s.step] = (s.end_s, shift)
    return out, shift, corrected


def _env_ready(tail: "TailProbe", eb: EnvBatch, ends: dict[int, tuple[float, float]]) -> float:
    """The full cluster's ready time of an env-groups batch on the corrected clock: the slowest of all its
    env groups' oldest episodes (:func:`env_batch_done_s`), with each member started on the corrected clock.
    A member of a version-v group cannot start before version v is published there (the end of step v − 1,
    which the correction moved): one held for the weights moves with them; one the subset started earlier
    moves only as far as that end. Whether the subset holds a member for the weights depends on its own
    (short) steps, so moving only the held ones made the estimate swing with the seed (37.2 against ~28
    traj/s on one seed; calibration/CHANGES.md, session 51)."""
    def moved(version: int, start: float, held: bool) -> float:
        end, moved_by = ends.get(version - 1, (None, 0.0))
        if end is None:
            return 0.0
        if held:
            return moved_by
        return max(0.0, end + moved_by - start)

    # the simulated copy on the corrected clock: each group completes when the subset completed it, moved
    # as the member it waited for (its last scored one) started
    ready = max(g.done_s + moved(g.version, g.starts[g.last], bool(g.held[g.last])) for g in eb.groups)
    groups = [g.tail([s + moved(g.version, s, bool(h)) for s, h in zip(g.starts, g.held)]) for g in eb.groups]
    return env_batch_done_s(groups, tail.m, ready, tail.duration_cdf)


# A trained batch's longest response over its mean past which the env-groups approximation is not trusted: the
# paper plans sit at 2.1–3.1; a lognormal σ 0.9 tail (the paper's production ~9×) reaches 6–13 in the subset.
LONG_TAIL_RATIO = 5.0


def env_groups_tail_warning(steps: list[Any]) -> str:
    """The warning an env-groups approximation carries when the subset's responses are long-tailed (the
    trained batches' longest ÷ mean reaches :data:`LONG_TAIL_RATIO`), else "". Round 0 of a batch waits for
    every env group's oldest episode; :func:`env_batch_done_s` estimates the full plan's slowest of them, but
    on such a tail it is still short (measured on 1,024 GPUs, batch 4,096, a 9×-tailed task, means over 4
    seeds: throughput +11 % at redundancy 0, +6 % at 0.25; module docstring)."""
    ratios = [s.response_tokens_max / s.response_tokens_mean for s in steps if s.response_tokens_mean > 0]
    worst = max(ratios, default=0.0)
    if worst < LONG_TAIL_RATIO:
        return ""
    return (f"; WARNING: long-tailed responses (a batch's longest is {worst:.0f}× its mean): the full plan's batches "
            "wait for the slowest of all its env groups, which the subset samples 1/m of; the correction for it "
            "leaves throughput overstated by up to ~11 % (measured on a 9×-tailed plan at 1,024 GPUs); run "
            "without --scale-approx for this plan")


def _judge_busy_over_corrected_steps(summary: dict, subset: dict, before: list[Any], after: list[Any]) -> None:
    """The dedicated judges' busy shares over the tail-corrected run: the same busy seconds over the longer
    spans (the judges are idle in the time the correction adds). The steady share keeps its meaning only
    while the window starts at the same step; where the correction moved it, the figure is dropped (None)."""
    if not before or not after:
        return
    if subset.get("reward_gpu_busy_fraction") is not None and after[-1].end_s > 0:
        summary["reward_gpu_busy_fraction"] = subset["reward_gpu_busy_fraction"] * before[-1].end_s / after[-1].end_s
    steady = subset.get("reward_gpu_busy_steady_fraction")
    if steady is None:
        return
    first_before, first_after = subset["steady"]["from_step"], summary["steady"]["from_step"]

    def span(steps: list[Any], first: int) -> float:
        start = next((s.start_s for s in steps if s.step >= first), steps[-1].end_s)
        return steps[-1].end_s - start

    new_span = span(after, first_after)
    summary["reward_gpu_busy_steady_fraction"] = (steady * span(before, first_before) / new_span
                                                  if first_before == first_after and new_span > 0 else None)


def scale_result(result: Any, full_plan: Plan, m: int, simulated_plan: Plan, tail: "TailProbe | None" = None) -> Any:
    """The simulated 1/m result as the full plan's: extensive figures × m, each batch's wait
    corrected for the tail (``tail``, see :func:`cohort_done_s`), cost on the full plan."""
    from rollart.core.modes import mode_config
    from rollart.report import price_steady_state, summary_from_steps
    from rollart.sim.costs.price import missing_prices, run_cost

    priced = tail.trained_tokens if tail is not None else {}
    steps = [dataclasses.replace(s, trajectories=s.trajectories * m, tokens=priced.get(s.step, s.tokens * m),
                                 env_timeouts=s.env_timeouts * m,
                                 task_trajectories={k: v * m for k, v in s.task_trajectories.items()})
             for s in result.steps]
    steps, added_s, corrected = _with_tail(steps, tail)
    summary = dict(result.summary)
    mode = mode_config(full_plan, result.mode)
    summary.update(summary_from_steps(steps, mode.alpha))
    for key in _EXTENSIVE:
        if summary.get(key) is not None:
            summary[key] = summary[key] * m
    if summary.get("routed_fallback_from"):
        summary["routed_fallback_from"] = {pool: n * m for pool, n in summary["routed_fallback_from"].items()}
    elapsed = summary.get("simulated_s") or 0.0
    if added_s and elapsed:
        summary["tokens_per_s"] = summary["tokens_per_s"] * elapsed / (elapsed + added_s)  # a rate over the longer run
        summary["simulated_s"] = elapsed + added_s
    _judge_busy_over_corrected_steps(summary, result.summary, result.steps, steps)
    summary["trajectories"] = {k: v * m for k, v in summary["trajectories"].items()}
    if not missing_prices(full_plan, mode) and steps:
        # the subset's peak share of its pool's cores, on the full pool (a plan that writes no cpu_pools is
        # billed for its peak, price.cpu_cores_billed)
        held = {pool: v["peak_held_share"] * v["cores"] for pool, v in (summary.get("env_cores") or {}).items()}
        cost = run_cost(full_plan, steps[-1].end_s, len(steps), sum(s.trajectories for s in steps),
                        summary["serverless_gpu_seconds"], mode, cpu_held=held)
        summary.update({"cost_per_step_usd": cost.per_step_usd,
                        "cost_per_1k_trajectories_usd": cost.per_1k_trajectories_usd,
                        "cost_usd_per_hour": cost.usd_per_hour})
        summary.pop("cpu_cores_billed_at_peak", None)  # the subset's; the full plan's, where billed at peak
        if cost.cpu_billed_at_peak:
            summary["cpu_cores_billed_at_peak"] = cost.cpu_cores_billed
        price_steady_state(summary)
    gens = simulated_plan.placement.generation
    summary["scale_approx"] = {
        "factor": m,
        "tail_s": added_s,
        "tail_steps": corrected,
        "note": (f"scale-out approximation: simulated 1/{m} of the cluster in full detail "
                 f"({sum(g.workers for g in gens)} of {sum(g.workers for g in full_plan.placement.generation)} "
                 f"generation workers, batch {simulated_plan.algorithm.batch_size} of "
                 f"{full_plan.algorithm.batch_size}); the trainer and weight transfer priced on the full plan, "
                 f"counts and throughput × {m}; "
                 + (f"env groups: each batch's wait for the slowest of all env groups, which the subset samples "
                    f"1/{m} of, estimated member by member ({added_s:+.1f} s over {corrected} step(s))"
                    + env_groups_tail_warning(result.steps)
                    if tail is not None and tail.ctl.scheduler.env_groups else
                    f"the slowest groups the subset does not sample added {added_s:.1f} s over {corrected} "
                    f"step(s) (order statistics)")),
    }
    return dataclasses.replace(result, steps=steps, summary=summary, scenario=full_plan.name)
