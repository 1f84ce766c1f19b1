"""The five training modes as configurations of one core (no second code path)."""

from __future__ import annotations

from dataclasses import dataclass

from rollart.plan.schema import Plan


@dataclass(frozen=True)
class ModeConfig:
    name: str
    alpha: int                 # staleness bound: a trajectory started at v is usable while v >= n - alpha
    batch_level_launch: bool   # launch a whole rollout batch at once (vs refill group by group)
    lockstep_env: bool         # every trajectory of a batch waits for the slowest at each turn
    reward_after_batch: bool   # score only once the whole batch finished its rollout
    serverless_reward: bool    # LLM-judge calls go to the serverless platform (else dedicated GPUs)
    hw_affinity: bool          # route by task tag (else least-loaded over every worker)
    redundancy: float          # extra members per group, as a fraction of the group size
    async_weight_transfer: bool  # bucketed store publish/pull overlapped with rollout (else blocking)
    update_after_train: bool = False  # push the weights right after each train step, before get_batch (AReaL, ROLL)
    # Groups older than n − α are evicted and their running members aborted (ROLL's GroupQueue expires
    # them). AReaL bounds staleness by admission only: its StalenessManager caps submissions at
    # (α + version + 1) × batch, and its executor trains on finished rollouts oldest first, never
    # dropping one for age — so a straggler is trained on late, and its staleness may exceed α.
    evict_stale: bool = True
    # ROLL's env groups (``algorithm.env_groups``, on by default in both continuous modes): the env
    # managers form fixed groups of one GRPO group's members, each bound to one task (tasks share
    # the groups by their shares, ROLL's num_groups_partition); each manager, once free, joins its
    # group's oldest episode still short of members or starts the next, α ahead (ROLL's
    # GroupQueue.get_episode_id), and a batch takes each group's oldest finished episode (ROLL's
    # GroupQueue.get), so every batch holds the tasks in their shares and a fast task cannot fill
    # batches while a slow one's episodes go stale. AReaL-style runs on the same rollout: the paper's
    # baselines differ from ROLLART in the mechanisms it ablates (affinity, redundancy, transfer,
    # reward), and its figure (ROLLART 1.22–1.36× AReaL) is what the pooled variant contradicts.
    # Off: the env managers are one pool and a batch is the oldest finished groups, whatever their
    # task (AReaL's own rollout executor).
    env_groups: bool = False

    @property
    def sync_before_get_batch(self) -> bool:
        """With alpha = 0 the next batch can only start on fresh weights, so weight sync
        (steps ②–⑤) must precede get_batch (step ①); otherwise the cycle waits for the batch
        first, which hides the weight pull behind the wait. AReaL updates the rollout workers as
        soon as a train step ends (interrupting in-flight generation), so its admission window,
        counted from the workers' version, is one batch wider while the trainer waits: with
        α = 1 the rollout may run up to two batches ahead and skip a straggling group (AReaL trains
        it once it finishes; ROLLART's window evicts it as stale). ROLLART updates in the same order:
        its implementation (ROLL's agentic pipeline) runs suspend → model_update → get_batch → train
        each step, and its rollout queue keeps groups of
        α + 1 step tags alive (a group expires when step − create_step > α). The paper lists
        get_batch first; read literally (workers still on n − 1 while the trainer waits for batch n)
        only α batches would ever be in flight, every batch would be exactly one version stale, and
        long-horizon rollout would be latency-bound at half ROLL's concurrency."""
        return self.alpha == 0 or self.update_after_train


def mode_config(plan: Plan, mode: str | None = None) -> ModeConfig:
    """Sync: α=0, lockstep env, reward after batch, dedicated reward, blocking weight sync.
    Sync+: Sync + trajectory-level env/reward + serverless reward.
    One-off: Sync+ with the rollout one batch ahead of training (α=1, batch-level).
    AReaL-style: trajectory-level, staleness bounded by admission only (plan α; nothing evicted), no
    affinity, no redundancy, blocking weight transfer right after each train step, dedicated reward. ROLLART: everything on, as the plan says,
    with the weights updated before get_batch and the env managers in fixed env groups as ROLL does
    (see ``sync_before_get_batch`` and ``env_groups``)."""
    mode = mode or plan.algorithm.mode
    a = plan.algorithm
    has_dedicated = plan.placement.reward.gpus > 0
    serverless_ok = plan.cluster.serverless is not None
    plan_serverless = plan.placement.reward.where == "serverless"
    if mode == "sync":
        return ModeConfig(mode, 0, True, True, True, not has_dedicated and serverless_ok, False, 0.0, False)
    if mode == "sync+":
        return ModeConfig(mode, 0, True, False, False, serverless_ok or not has_dedicated, False, 0.0, False)
    if mode == "one-off":
        return ModeConfig(mode, 1, True, False, False, serverless_ok or not has_dedicated, False, 0.0, False)
    if mode == "areal":
        return ModeConfig(mode, a.alpha, False, False, False, not has_dedicated and serverless_ok, False, 0.0, False,
                          update_after_train=True, evict_stale=False, env_groups=a.env_groups)
    if mode == "rollart":
        return ModeConfig(mode, a.alpha, False, False, False, plan_serverless, True, a.redundancy,
                          plan.weight_sync.transport == "bucketed_store", update_after_train=True,
                          env_groups=a.env_groups)
    raise ValueError(f"--mode: unknown mode '{mode}'; modes are: sync, sync+, one-off, areal, rollart")


def weight_sync_summary(plan: Plan, mode: ModeConfig) -> str:
    """How ``mode`` moves the weights to the rollout workers, in words; says so when the plan's
    ``weight_sync.transport`` asks for what the mode does not do (only ROLLART uses the store)."""
    ws = plan.weight_sync
    if mode.async_weight_transfer:
        return f"bucketed store ({ws.bucket_mb:g} MB buckets), pulled during rollout"
    note = "blocking NCCL broadcast"
    if ws.transport == "bucketed_store":
        note += f" (mode {mode.name} does not use weight_sync.transport=bucketed_store)"
    return note


def unused_settings(plan: Plan, mode: ModeConfig) -> list[str]:
    """The plan's ROLLART settings that ``mode`` does not apply, one line each: the baselines run
    without redundant envs and route least-loaded, whatever the plan says, and a run should say so
    rather than ignore a setting silently. Dedicated reward GPUs (``placement.reward.gpus``) that
    the run does not use (reward on the serverless platform, by the mode or the plan) are named too, and
    so is an env image cache (``env.image_cache_hit``) for a task that pulls no image (``env.image_gb`` 0)."""
    notes = []
    if plan.algorithm.redundancy > 0 and mode.redundancy == 0:
        notes.append(f"algorithm.redundancy={plan.algorithm.redundancy:g}: mode {mode.name} runs no "
                     "redundant envs")
    if plan.placement.hw_affinity and not mode.hw_affinity:
        notes.append(f"placement.hw_affinity: mode {mode.name} routes every request to the least-loaded "
                     "worker")
    if plan.algorithm.alpha != mode.alpha:
        notes.append(f"algorithm.alpha={plan.algorithm.alpha}: mode {mode.name} runs with α = {mode.alpha} "
                     f"({'lockstep' if mode.alpha == 0 else 'one batch ahead'})")
    r = plan.placement.reward
    if r.gpus > 0 and not dedicated_reward_used(plan, mode):  # the run neither places nor bills them
        if not plan.llm_judged_tasks:
            why = "no task is judged by the LLM (every tasks.*.reward is rule)"
        else:
            who = f"mode {mode.name}" if r.where == "dedicated" else "placement.reward.where=serverless"
            why = f"{who} sends LLM-judge calls to the serverless platform"
        notes.append(f"placement.reward.gpus={r.gpus}: {why}; the {r.gpus} {r.pool} GPUs are not placed or billed")
    elif r.gpus > 0 and r.where == "serverless":  # used: the baselines judge on dedicated GPUs the plan places
        notes.append(f"placement.reward.where=serverless: mode {mode.name} judges on the plan's dedicated GPUs "
                     f"({r.gpus} {r.pool}, placement.reward.gpus), as its baseline does; set "
                     "placement.reward.gpus=0 to judge serverless")
    if not plan.algorithm.reference_kl and plan.placement.trainer.profile is not None:
        notes.append("algorithm.reference_kl=false: placement.trainer.profile prices the train step as it was "
                     "measured, whatever passes it ran")
    for t in plan.tasks:  # a cache for images that are never pulled: the calibrated reset already holds the pull
        if t.env.image_cache_hit > 0 and t.env.image_gb <= 0:
            pool = plan.env_pool(t)
            notes.append(f"tasks.{t.name}.env.image_cache_hit={t.env.image_cache_hit:g}: the task pulls no image "
                         f"(env.image_gb is 0; its env.reset distribution holds whatever pull it measured), so a "
                         f"cache saves nothing; to model pulls set tasks.{t.name}.env.image_gb and "
                         f"cluster.cpu_pools.{pool}.image_pull_gbps")
    return notes


def dedicated_reward_used(plan: Plan, mode: ModeConfig | None = None) -> bool:
    """Whether a run places ``placement.reward.gpus``: the plan sets some and ``mode`` sends the LLM
    judge to them (its ``serverless_reward`` off) and some task is judged by it. ``mode`` None: no run
    known (validation, a budget check before simulating), so they count whenever the plan sets them.
    What a run bills (``sim.costs.price``) and what :func:`unused_settings` names."""
    r = plan.placement.reward
    if not r.gpus or r.pool is None:
        return False
    return mode is None or (not mode.serverless_reward and bool(plan.llm_judged_tasks))

