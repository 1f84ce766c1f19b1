"""The SimPy backend: executes the core's effects on a simulated cluster.

Each core process runs inside a SimPy process (:meth:`SimBackend._drive`): the effect it
yields is handed to a handler that turns it into SimPy events priced by the cost models,
and the result is sent back. An Abort interrupts the target processes, which then receive
:class:`~rollart.core.effects.Aborted` at the effect they were waiting on."""

from __future__ import annotations

import gc
from functools import partial
from heapq import heappop, heappush
from typing import Any, Callable, Generator, Hashable

import simpy
from simpy.core import StopSimulation
from simpy.events import NORMAL, EventPriority

from rollart.calibration import StepOverheadOnEngineProfile, generation_cost, train_cost
from rollart.calibration.cost import ProfiledTrainCost
from rollart.core import Controller, RunAborted, build_workers
from rollart.core.effects import (Abort, Aborted, AcquireEnv, BroadcastWeights, ComputeReward, EnvClose, EnvOutcome,
                                  EnvReset, EnvStep, Generate, GenOutcome, PublishWeights, Sleep, Spawn, TrainStep,
                                  UpdateWeights, Wait)
from rollart.core.modes import ModeConfig, unused_settings, weight_sync_summary
from rollart.core.stats import StepRecord
from rollart.plan import Plan, PlanError
from rollart.plan.schema import GenerationGroup
from rollart.report import RunResult, price_steady_state, summary_from_steps, task_share_summary, waste_summary
from rollart.sim.costs.env import EnvModel
from rollart.sim.costs.link import WeightTransferCost
from rollart.sim.costs.moe import effective_domain, worker_domain, worker_weight_bytes
from rollart.sim.costs.price import unplaced_gpu_notes
from rollart.sim.costs.train import ColocationSwitch, trainer_memory_problems
from rollart.sim.contention import HostContention, ScaledGeneration
from rollart.sim.engine import GenerationEngine, Request
from rollart.sim.reward import (BatchingServerlessPlatform, ServerlessPlatform, judge_input_tokens,
                                judge_window)
from rollart.sim.shared_pipe import SharedPipe
from rollart.trace import NullTracer, Tracer

SimGen = Generator[Any, Any, Any]


def _held_weights(model: Any, ep: int, tp: int) -> str:
    """The weights a worker holds as served (dtype, ep replication), for a does-not-fit message."""
    return f"{worker_weight_bytes(model, ep, tp) / 1e9:.1f} GB of {model.weight_dtype} weights held"


def _fp8_hint(model: Any, section: str, holds: Callable[[Any], bool]) -> str:
    """A does-not-fit message's FP8 fix: the first of an FP8 KV cache, FP8 weights, both, that the model
    does not use yet and with which ``holds`` (the worker holds the longest context), if any."""
    for change in ({"kv_dtype": "fp8"}, {"weight_dtype": "fp8"}, {"weight_dtype": "fp8", "kv_dtype": "fp8"}):
        if all(getattr(model, k) != v for k, v in change.items()) and holds(model.model_copy(update=change)):
            return f", or serve it in FP8 ({', '.join(f'{section}.{k}: fp8' for k in change)})"
    return ""


# KV preemptions from this share of the trajectories trained on are thrash worth a setting (kv_fit): the 32B plan
# at batch 1,024 preempted 812 requests for 5,120 trajectories (16 %); a run 6 over 768 (0.8 %) lost to the cure
KV_THRASH_SHARE = 0.05
# The highest vLLM gpu_memory_utilization a fix suggests: past it an engine has no room for its activations
# and CUDA graphs (vLLM's docs use up to 0.95)
GPU_MEMORY_UTILIZATION_CEILING = 0.95


class _Wake:
    """A bare SimPy timeout for a process to wait on (what SimPy's step and a process read of
    one: callbacks, _ok, _value); ``Timeout`` costs an ``__init__`` and five attributes more."""

    __slots__ = ("callbacks",)
    _ok = True
    _value = None

    def __init__(self, env: simpy.Environment, delay: float):
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        self.callbacks: list[Any] = []
        # Environment.schedule(self, NORMAL, delay), inlined (the same queue entry)
        heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), self))  # type: ignore[attr-defined]


class _ImagePull:
    """An image on its way into a pool: the SimPy process moving its bytes, and how many env resets
    wait for it (when the last gives up, the pull stops and gives its share of the path back)."""

    __slots__ = ("key", "proc", "waiters")

    def __init__(self, key: tuple[str, int]):
        self.key, self.proc, self.waiters = key, None, 0


def ms_to_s(ms: float | None) -> float | None:
    """Milliseconds a plan states as seconds; None (unset) stays None."""
    return None if ms is None else ms / 1e3


class SimBackend:
    def __init__(self, plan: Plan, mode: ModeConfig, seed: int, tracer: Tracer | None = None,
                 on_step: Callable[[StepRecord], None] | None = None, keep_history: bool = True,
                 scale_approx: int = 1):
        # scale_approx m > 1 (sim/scale.py): the rollout side is the 1/m plan; the trainer and the
        # weight transfer are priced on the full plan, and the result is scaled back by m
        self.full_plan, self.scale = plan, max(1, int(scale_approx))
        if self.scale > 1:
            from rollart.sim.scale import TailProbe, shrink_plan

            if mode.batch_level_launch:
                raise PlanError([f"--scale-approx: mode {mode.name} launches whole batches, whose step waits for "
                                 "the full batch's slowest trajectory, which a 1/m subset under-samples; "
                                 "simulate it in full"])
            plan = shrink_plan(plan, self.scale)
        self.plan = plan
        self.mode = mode
        self.env = simpy.Environment()
        self.tracer = tracer or NullTracer()
        # the dedicated judges' busy seconds at each step's end, so their utilisation can be read over the
        # steps a run's step time is (the steady window), not only over the whole run
        self.judge_busy_at_step: list[float] = []

        def step_ended(record: StepRecord) -> None:
            self.judge_busy_at_step.append(sum(e.busy_until(self.env.now) for e in self.judges))
            if on_step is not None:
                on_step(record)

        # keep_history=False: memory follows what is in flight (ctl.trajectories/batches stay empty)
        # the clock, read at every effect: getattr(env, "_now") through C calls only (= env.now)
        self.ctl = Controller(plan, mode, clock=partial(getattr, self.env, "_now"), tracer=self.tracer,
                              on_step=step_ended, keep_history=keep_history)
        self.tail = TailProbe(self.ctl, self.scale) if self.scale > 1 else None  # the tail the subset misses
        self.envs = EnvModel(seed)
        self.effects_handled = 0
        self._procs: dict[Hashable, simpy.Process] = {}
        self._holding_cpu: dict[int, tuple[str, float]] = {}
        self._step_overhead: dict[str, float] = {}  # per task: its env pool's step_overhead_s
        self._build_engines()
        self._build_env_pools()
        self._build_reward()
        full = self.full_plan
        gpu = full.gpu_of_pool(full.placement.trainer.pool)
        try:
            pool = full.cluster.gpu_pools[full.placement.trainer.pool]
            self.train_cost = train_cost(full.model, gpu, full.placement.trainer, pool.gpu,
                                         full.cluster.links.get("intra_cluster"), pool.profile == "datasheet",
                                         full.algorithm.reference_kl)
        except (OSError, ValueError) as exc:
            raise PlanError([f"placement.trainer.profile: {exc}"]) from None
        measured = self.train_cost.profile if isinstance(self.train_cost, ProfiledTrainCost) else None
        if measured is None:  # a measured trainer ran, so it fit; a modelled one must fit its GPUs
            trainer = full.placement.trainer
            problems = trainer_memory_problems(full.model, full.cluster.gpu_pools[trainer.pool].gpu, gpu, trainer,
                                               full.longest_context_tokens, full.algorithm.batch_size)
            if problems:
                raise PlanError(problems)
        self.transfer = WeightTransferCost(full, measured)
        self._kv_pipes: dict[tuple[Any, ...], tuple[float, SharedPipe]] = {}  # PD hand-offs' paths (_kv_pipe)
        self.trainer_shares_host = measured is not None  # measured on the engines' host: it contends
        self.contention = self._host_contention()
        if self.scale > 1 and self.contention is not None:
            raise PlanError(["--scale-approx: engines sharing a measured CPU host contend with each other; "
                             "simulate such a plan in full"])
        self.trainer_busy_s = 0.0
        self.switch, self.shared_engines = self._colocation()
        self.colocated_pause_s = 0.0  # seconds each shared engine spent offloaded for training
        self._handlers: dict[type, Callable[[Any], SimGen]] = {
            AcquireEnv: self._acquire_env, EnvReset: self._env_reset, EnvStep: self._env_step, EnvClose: self._env_close,
            Generate: self._generate, ComputeReward: self._reward, TrainStep: self._train,
            BroadcastWeights: self._broadcast, PublishWeights: self._publish, UpdateWeights: self._update,
            Wait: self._wait, Sleep: self._sleep, Spawn: self._spawn, Abort: self._abort,
        }

    # ---- construction --------------------------------------------------------------------

    def _build_engines(self) -> None:
        plan = self.plan
        self.cost_sources: dict[str, str] = {}
        self.engines: list[GenerationEngine] = []
        self.worker_ep: dict[int, int] = {}  # expert-parallel ranks of each generation worker
        tp_of = []
        for gi, g in enumerate(plan.placement.generation):
            tp_of += [(gi, g)] * g.workers
        # One cost model per generation group, shared by its engines: it is a pure function of the
        # group's GPU, tp and ep, and its memoised decode lines and step terms then serve them all; another
        # for its workers that straddle an NVLink domain boundary, if any (_worker_domain: one per piece).
        group_costs: dict[tuple[int, int], Any] = {}
        first: dict[int, int] = {}  # each group's first worker id
        for w in build_workers(plan):
            gi, g = tp_of[w.id]
            gpu_name = plan.cluster.gpu_pools[g.pool].gpu
            full = self.full_plan.placement.generation[gi]
            domain = self._worker_domain(gpu_name, g.tp, w.id - first.setdefault(gi, w.id), full.workers * full.tp)
            cost = group_costs.get((gi, domain))
            if cost is None:
                cost = group_costs[(gi, domain)] = self._generation_cost(gi, g, domain)
            if "straddling" not in self.cost_sources.get(gpu_name, ""):  # the report flags a straddling worker
                self.cost_sources[gpu_name] = cost.source
            span = self._worker_span(g.pool, w.id)
            self.engines.append(GenerationEngine(self.env, w.id, g.pool, cost, g.max_num_seqs,
                                                 plan.placement.prefix_cache, span))
            self.ctl.proxy.workers[w.id].kv_capacity_tokens = cost.kv_capacity_tokens  # routing sees KV room
            self.worker_ep[w.id] = g.ep  # what a weight swap loads per GPU

    def _worker_domain(self, gpu_name: str, tp: int, index: int, full_gpus: int) -> int:
        """The NVLink domain the collectives of worker ``index`` of a group of tp-GPU workers see (a
        generation group's, the dedicated judges'). The workers are laid out as tp consecutive GPUs each
        from a domain boundary of their pool (worker i on GPUs i·tp … (i+1)·tp − 1), so one that straddles
        a boundary crosses the network with its smallest piece (moe.worker_domain: of 4 × tp 32 on 72-GPU
        racks, the third, on GPUs 64–95). Under --scale-approx the simulated 1/m of the workers cannot say
        which of the full plan's ``full_gpus`` they stand for: each gets the full group's worst
        (moe.effective_domain), a conservative price."""
        domain = self.plan.cluster.gpu_type(gpu_name).nvlink_domain
        if self.scale > 1:
            return effective_domain(tp, full_gpus, domain)
        return worker_domain(index * tp, tp, domain)

    def _generation_cost(self, gi: int, g: GenerationGroup, domain: int | None = None) -> Any:
        """The cost model of generation group ``gi`` (for its workers whose collectives see an NVLink domain
        of ``domain`` GPUs: :meth:`_worker_domain`); a plan error when the group cannot hold one context of
        the longest task."""
        plan = self.plan
        pool = plan.cluster.gpu_pools[g.pool]
        gpu_name = pool.gpu
        try:
            cost = generation_cost(plan.model, gpu_name, plan.cluster.gpu_type(gpu_name), g.tp, pool.profile,
                                   g.ep, plan.cluster.links.get("intra_cluster"), g.gpu_memory_utilization,
                                   domain, step_overhead_s=ms_to_s(g.step_overhead_ms))
        except StepOverheadOnEngineProfile as exc:
            raise PlanError([f"placement.generation.{gi}.step_overhead_ms: {exc}"]) from None
        except (OSError, ValueError) as exc:
            raise PlanError([f"cluster.gpu_pools.{g.pool}.profile: {exc}"]) from None
        longest = plan.longest_context_tokens
        # with expert parallelism a sequence's KV lives on one rank: each holds 1/ep of the worker's
        per_rank = cost.kv_capacity_tokens // g.ep
        if per_rank < longest:  # as a real engine, refuse a context it cannot hold
            def holds(model: Any = plan.model, ep: int = g.ep, utilization: float = g.gpu_memory_utilization) -> bool:
                return generation_cost(model, gpu_name, plan.cluster.gpu_type(gpu_name), g.tp, pool.profile, ep,
                                       None, utilization, domain).kv_capacity_tokens // ep >= longest

            where = (f"{cost.kv_capacity_tokens} KV tokens on {g.tp} × {gpu_name}" if g.ep == 1 else
                     f"{per_rank} KV tokens on each of {g.ep} expert-parallel ranks of {g.tp // g.ep} × {gpu_name}")
            # only the fixes that would hold one context here (a helper found "raise gpu_memory_utilization"
            # offered at 0.99 where nothing but more GPUs could help)
            fixes = ["raise tp"]
            if g.gpu_memory_utilization < GPU_MEMORY_UTILIZATION_CEILING and holds(
                    utilization=GPU_MEMORY_UTILIZATION_CEILING):
                fixes.append(f"gpu_memory_utilization (at {GPU_MEMORY_UTILIZATION_CEILING:g} it holds one)")
            if g.ep > 1 and holds(ep=1):
                fixes.append("lower ep")
            raise PlanError([f"placement.generation.{gi}.tp: {plan.model.name} "
                             f"({_held_weights(plan.model, g.ep, g.tp)}) leaves {where}, less than one "
                             f"{longest}-token context (tasks' max_context_tokens) at gpu_memory_utilization "
                             f"{g.gpu_memory_utilization:g}; {', or '.join(fixes)}"
                             + _fp8_hint(plan.model, "model", holds)])
        return cost

    def _colocation(self) -> tuple[ColocationSwitch | None, list[GenerationEngine]]:
        """Colocated placement: the engines on the trainer's pool give their GPUs to each train step."""
        pl = self.plan.placement
        if not pl.colocated:
            return None, []
        shared = [e for e in self.engines if pl.shares_trainer_gpus(e.pool)]
        # the switch ends when the GPU loading the most weight bytes does (the narrowest worker)
        domain = self.plan.gpu_of_pool(pl.trainer.pool).nvlink_domain  # bounds the trainer's default ep
        switch = max((ColocationSwitch(self.plan.model, pl.trainer, g.tp, self.transfer.h2d_bytes_per_s, g.ep, domain)
                      for g in pl.generation if pl.shares_trainer_gpus(g.pool)), key=lambda s: s.after_s)
        return switch, shared

    def _host_contention(self) -> HostContention | None:
        """Engines measured on virtual devices of one host (their profiles say how many actors
        it runs in parallel) share its cores with each other and with a measured trainer."""
        costs = [e.cost for e in self.engines]
        if not costs or any(getattr(c, "host_parallelism", None) is None for c in costs):
            return None
        contention = HostContention(costs[0].host_parallelism, engine_ref=costs[0].side_by_side,
                                    effect_cpu_s=getattr(costs[0], "effect_cpu_s", 0.0), clock=lambda: self.env.now)
        for e in self.engines:
            e.cost = ScaledGeneration(e.cost)
            e.contention = contention
            contention.engines.append(e)
        return contention

    def _worker_span(self, pool: str, wid: int) -> Callable[[str, float, float], None] | None:
        if isinstance(self.tracer, Tracer):
            return lambda name, t0, t1: self.tracer.worker_span(pool, wid, name, t0, t1)
        return None

    def _build_env_pools(self) -> None:
        self.cpu: dict[str, simpy.Container] = {
            name: simpy.Container(self.env, capacity=p.cores, init=p.cores)
            for name, p in self.plan.cluster.cpu_pools.items()}
        self._default_cpu_pool = next(iter(self.plan.cluster.cpu_pools))
        # per pool with an image_pull_gbps: the path its envs pull their images through, shared
        self.image_pipes = {name: SharedPipe(self.env, p.image_pull_gbps * 1e9 / 8)
                            for name, p in self.plan.cluster.cpu_pools.items() if p.image_pull_gbps}
        # per (pool, image): True once the pool holds the image, else the pull in flight (_ImagePull); an
        # entry lives while an open env of the pool runs the image (a retried reset pulls nothing)
        self._images: dict[tuple[str, int], Any] = {}
        self._image_of: dict[int, tuple[str, int]] = {}  # per open trajectory: the (pool, image) it runs
        self._image_users: dict[tuple[str, int], int] = {}
        # per (pool, image) still open: bytes an abandoned pull had moved, which the next pull does not move
        # again (a registry client keeps the layers it fetched: containerd's content store)
        self._image_partial: dict[tuple[str, int], tuple[float, float]] = {}
        self.pull_s: dict[str, list[float]] = {}  # per pool: [seconds the finished pulls took, how many]
        self.pulls_abandoned: dict[str, int] = {}  # per pool: pulls every waiting reset gave up on (timed out, aborted)
        # per pool: the most cores held at once, and [seconds envs queued for cores, envs that took cores]
        self.cpu_peak: dict[str, float] = dict.fromkeys(self.cpu, 0.0)
        self.cpu_wait: dict[str, list[float]] = {name: [0.0, 0] for name in self.cpu}
        # per pool: [cores held now, core-seconds held so far, when that was brought up to date] and the
        # core-seconds envs computed in (resets, steps, rule rewards): what sizing the pool needs, beside
        # what the envs reserve for their episodes
        self.cpu_held: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in self.cpu}
        self.cpu_busy_s: dict[str, float] = dict.fromkeys(self.cpu, 0.0)

    def _build_reward(self) -> None:
        plan, mode = self.plan, self.mode
        self.serverless: ServerlessPlatform | BatchingServerlessPlatform | None = None
        self.judges: list[GenerationEngine] = []
        self.judge_window = judge_window(plan.reward_model)
        if not plan.llm_judged_tasks:
            return
        if mode.serverless_reward:
            if plan.cluster.serverless is None:
                raise PlanError([f"cluster.serverless: mode '{mode.name}' sends LLM-judge rewards to a serverless "
                                 "platform; define one"])
            s = plan.cluster.serverless
            cost = self._judge_cost("cluster.serverless.tp", s.gpu, s.tp)
            platform = ServerlessPlatform if s.instance_concurrency == 1 else BatchingServerlessPlatform
            self.serverless = platform(self.env, s, cost, plan.placement.reward.output_tokens)
            return
        r = plan.placement.reward
        if r.gpus == 0 or r.pool is None:
            raise PlanError([f"placement.reward.gpus: mode '{mode.name}' runs the LLM judge on dedicated GPUs; "
                             "set placement.reward.pool and gpus"])
        pool = plan.cluster.gpu_pools[r.pool]
        # the judges: r.gpus / tp workers laid out as the generation groups' (_worker_domain)
        costs: dict[int, Any] = {}
        for i in range(r.gpus // r.tp):  # the plan checks that tp divides gpus
            domain = self._worker_domain(pool.gpu, r.tp, i, self.full_plan.placement.reward.gpus)
            cost = costs.get(domain)
            if cost is None:
                cost = costs[domain] = self._judge_cost("placement.reward.tp", pool.gpu, r.tp, pool.profile, domain)
            self.judges.append(GenerationEngine(self.env, 10_000 + i, r.pool, cost, r.max_num_seqs, False, None))

    def _judge_cost(self, field: str, gpu_name: str, tp: int, profile: str | None = None,
                    domain: int | None = None) -> Any:
        """The LLM judge's cost model on ``tp`` × ``gpu_name`` (``domain``: the NVLink domain its collectives
        see, :meth:`_worker_domain`; None: the GPU type's); a plan error naming ``field`` when it cannot hold
        the longest judge call (as a generation worker must hold the longest context)."""
        plan = self.plan
        try:
            cost = generation_cost(plan.reward_model, gpu_name, plan.cluster.gpu_type(gpu_name), tp, profile,
                                   network=plan.cluster.links.get("intra_cluster"), domain=domain,
                                   step_overhead_s=ms_to_s(plan.placement.reward.step_overhead_ms))
        except StepOverheadOnEngineProfile as exc:
            raise PlanError([f"placement.reward.step_overhead_ms: {exc}"]) from None
        judged = max(t.judge_reads(t.max_context_tokens) for t in plan.llm_judged_tasks)
        out = plan.placement.reward.output_tokens
        longest = judge_input_tokens(judged, self.judge_window, out) + out
        if cost.kv_capacity_tokens < longest:
            m = plan.reward_model

            def holds(model: Any) -> bool:
                return generation_cost(model, gpu_name, plan.cluster.gpu_type(gpu_name), tp, profile,
                                       domain=domain).kv_capacity_tokens >= longest

            raise PlanError([f"{field}: the reward model {m.name} ({_held_weights(m, 1, tp)}) leaves "
                             f"{cost.kv_capacity_tokens} KV tokens on {tp} × {gpu_name}, less than one {longest}-token "
                             "judge call (the longest judged context, up to the judge's window, plus "
                             f"placement.reward.output_tokens); raise {field}, or set tasks.<task>."
                             "judge_input_tokens where the judge reads less than the whole trajectory"
                             + _fp8_hint(m, "reward_model", holds)])
        return cost

    # ---- driving core processes --------------------------------------------------------------

    def spawn(self, gen: Generator[Any, Any, Any], key: Hashable | None = None) -> simpy.Process:
        proc = self.env.process(self._drive(gen, key))
        if key is not None:
            self._procs[key] = proc
        return proc

    def _drive(self, gen: Generator[Any, Any, Any], key: Hashable | None) -> SimGen:
        handlers = self._handlers
        note = self.contention.note_effect if self.contention is not None else None
        env, envs, engines, tasks = self.env, self.envs, self.engines, self.plan.tasks_by_name
        step_overhead = self._step_overhead
        send: Any = None
        throw: BaseException | None = None
        try:
            while True:
                try:
                    effect = gen.throw(throw) if throw is not None else gen.send(send)
                except StopIteration as stop:
                    return stop.value
                throw = None
                self.effects_handled += 1
                if note is not None:  # the driver's own CPU load (measured hosts)
                    note()
                kind = type(effect)
                try:
                    # The two effects of every turn, handled here rather than by a handler
                    # generator each (the same events, in the same order, as their handlers).
                    if kind is EnvStep:  # = _env_step
                        task = tasks[effect.traj.task]
                        latency, send = envs.step(task, effect.traj.id)
                        self._computing(task, latency)
                        overhead = step_overhead.get(task.name)
                        if overhead is None:
                            overhead = step_overhead[task.name] = self._env_pool(task).step_overhead_s
                        yield _Wake(env, latency + overhead)
                    elif kind is Generate and effect.prefill_worker is None \
                            and engines[effect.worker].request_overhead_s <= 0:  # = _generate's common case
                        traj = effect.traj
                        tokens = envs.response_tokens(tasks[traj.task], traj.id, effect.max_new_tokens)
                        engine = engines[effect.worker]
                        req = engine.add(traj.id, effect.context_tokens, tokens, False)
                        try:
                            yield req.done
                        except simpy.Interrupt as intr:
                            intr.decoded_tokens = engine.abort(req)  # as _run_request does
                            raise
                        send = GenOutcome(tokens=tokens)
                    else:
                        send = yield from handlers[kind](effect)
                except simpy.Interrupt as intr:
                    if kind is Generate:  # the tokens the cut request had decoded (PD: its stage's), 0 between requests
                        throw = Aborted(str(intr.cause), getattr(intr, "decoded_tokens", 0))
                    else:
                        throw = Aborted(str(intr.cause))
                    send = None
        finally:
            if key is not None:
                self._procs.pop(key, None)

    # ---- effect handlers (each a SimPy generator returning the effect's result) -------

    def _wait(self, eff: Wait) -> SimGen:
        ev = self.env.event()
        eff.signal.add_waiter(lambda value: ev.succeed(value) if not ev.triggered else None)
        return (yield ev)

    def _sleep(self, eff: Sleep) -> SimGen:
        yield self.env.timeout(eff.seconds)

    def _spawn(self, eff: Spawn) -> SimGen:
        self.spawn(eff.process, eff.key)
        return None
        yield  # pragma: no cover - makes this a generator

    def _abort(self, eff: Abort) -> SimGen:
        active = self.env.active_process
        for traj in eff.trajs:
            proc = self._procs.get(traj.id)
            if proc is not None and proc.is_alive and proc is not active:
                proc.interrupt(eff.reason)
        return None
        yield  # pragma: no cover

    def _acquire_env(self, eff: AcquireEnv) -> SimGen:
        traj = eff.traj
        task = self.plan.task(traj.task)
        if traj.id not in self._holding_cpu:  # a CPU slot for the env's whole life
            pool = task.env.pool or self._default_cpu_pool
            cores = self.cpu[pool]
            t0 = self.env.now
            get = cores.get(task.env.cpu_cores)
            try:
                yield get
            except simpy.Interrupt:  # aborted while queued for cores: give them back
                if get.triggered:
                    cores.put(task.env.cpu_cores)
                else:
                    get.cancel()
                raise
            self._holding_cpu[traj.id] = (pool, task.env.cpu_cores)
            self._note_held(pool, task.env.cpu_cores)
            wait = self.cpu_wait[pool]
            wait[0] += self.env.now - t0
            wait[1] += 1
            self.cpu_peak[pool] = max(self.cpu_peak[pool], cores.capacity - cores.level)

    def _note_held(self, pool: str, change: float) -> None:
        """Integrate the cores ``pool``'s envs held up to now, then change what they hold by ``change``."""
        held = self.cpu_held[pool]
        held[1] += held[0] * (self.env.now - held[2])
        held[0] += change
        held[2] = self.env.now

    def _computing(self, task: Any, seconds: float) -> None:
        """An env computed ``seconds`` on its cores (a reset, a step, a rule reward)."""
        self.cpu_busy_s[task.env.pool or self._default_cpu_pool] += seconds * task.env.cpu_cores

    def _env_reset(self, eff: EnvReset) -> SimGen:
        """One reset attempt. A sandbox start that pulls its image is under the start-up timeout (ROLL's
        sandbox manager): one deadline, ``env.timeout_s`` from the attempt's start, covers the wait for
        the image and the reset; at the deadline the attempt is abandoned (a pull no one else waits for
        stops and gives its share of the path back) and the core's retry policy takes over."""
        traj = eff.traj
        task = self.plan.task(traj.task)
        if traj.id not in self._holding_cpu:
            yield from self._acquire_env(AcquireEnv(traj))
        left = None
        if task.env.image_gb > 0:
            pull = self._image_pull(task, traj)
            if pull is not None:
                timeout_s, t0 = task.env.timeout_s, self.env.now
                pull.waiters += 1
                try:
                    yield pull.proc | self.env.timeout(timeout_s)
                except simpy.Interrupt:  # aborted while waiting for the image
                    self._stop_waiting(pull)
                    raise
                if not pull.proc.triggered:  # the deadline came first
                    self._stop_waiting(pull)
                    return EnvOutcome(ok=False, error="timeout")
                pull.waiters -= 1
                left = timeout_s - (self.env.now - t0)
        latency, outcome = self.envs.reset(task, traj.id, left)
        self._computing(task, latency)
        yield self.env.timeout(latency + self._env_pool(task).reset_overhead_s)
        return outcome

    def _image_key(self, traj: Any) -> int:
        """The image a trajectory's env runs: its GRPO group's. A group's members share one prompt, so
        one repository image (SWE-style tasks): on their pool the first member's reset pulls it, later
        members wait for that pull or find it there, and whether a cache holds it is drawn once."""
        return traj.group.id

    def _image_pull(self, task: Any, traj: Any) -> _ImagePull | None:
        """The pull a trajectory's env waits for, or None when its pool holds the image."""
        key = (task.env.pool or self._default_cpu_pool, self._image_key(traj))
        if traj.id not in self._image_of:
            self._image_of[traj.id] = key
            self._image_users[key] = self._image_users.get(key, 0) + 1
        state = self._images.get(key)
        if state is None:
            if self.envs.image_cached(task, key[1]):
                state = True
            else:
                state = _ImagePull(key)
                state.proc = self.env.process(self._pull(state, task.env.image_gb * 1e9))
            self._images[key] = state
        return None if state is True else state

    def _pull(self, pull: _ImagePull, nbytes: float) -> SimGen:
        pool, t0 = pull.key[0], self.env.now
        had, spent = self._image_partial.get(pull.key, (0.0, 0.0))  # bytes and seconds of cut-off attempts
        moved = [0.0]
        try:
            yield from self.image_pipes[pool].transfer(nbytes - had, moved)
        except simpy.Interrupt:  # every reset waiting for it gave up: the bytes moved so far stay for a retry
            self.pulls_abandoned[pool] = self.pulls_abandoned.get(pool, 0) + 1
            if self._image_users.get(pull.key):  # an open env may retry; none left: the entry would outlive them
                self._image_partial[pull.key] = (had + moved[0], spent + self.env.now - t0)
            return
        self._image_partial.pop(pull.key, None)
        done = self.pull_s.setdefault(pool, [0.0, 0])  # a pull's time: its cut-off attempts' and this one's
        done[0] += spent + self.env.now - t0
        done[1] += 1
        if self._images.get(pull.key) is pull:
            self._images[pull.key] = True

    def _stop_waiting(self, pull: _ImagePull) -> None:
        pull.waiters -= 1
        if not pull.waiters:
            if self._images.get(pull.key) is pull:
                del self._images[pull.key]  # a later attempt starts a pull of its own
            if pull.proc.is_alive:
                pull.proc.interrupt()

    def _env_step(self, eff: EnvStep) -> SimGen:
        task = self.plan.task(eff.traj.task)
        latency, outcome = self.envs.step(task, eff.traj.id)
        self._computing(task, latency)
        yield self.env.timeout(latency + self._env_pool(task).step_overhead_s)
        return outcome

    def _env_pool(self, task: Any) -> Any:
        return self.plan.cluster.cpu_pools[task.env.pool or self._default_cpu_pool]

    def _env_close(self, eff: EnvClose) -> SimGen:
        image = self._image_of.pop(eff.traj.id, None)
        if image is not None:
            users = self._image_users[image] - 1
            if users:
                self._image_users[image] = users
            else:  # no open env runs the image any more
                del self._image_users[image]
                self._images.pop(image, None)
                self._image_partial.pop(image, None)
        held = self._holding_cpu.pop(eff.traj.id, None)
        if held is not None:
            self._note_held(held[0], -held[1])
            yield self.cpu[held[0]].put(held[1])
        self.envs.forget(eff.traj.id)
        for wid in (eff.traj.last_worker, eff.traj.last_prefill_worker):  # PD: the prefill worker's copy too
            if wid is not None:
                self.engines[wid].forget(eff.traj.id)

    def _generate(self, eff: Generate) -> SimGen:
        traj = eff.traj
        tokens = self.envs.response_tokens(self.plan.task(traj.task), traj.id, eff.max_new_tokens)
        if eff.prefill_worker is not None:
            prefill, decode = self.engines[eff.prefill_worker], self.engines[eff.worker]
            kv_per_token = self.plan.model.kv_bytes_per_token
            remote = 0
            if prefill.prefix_cache and decode.prefix_cache and traj.id not in prefill.cache:
                # The same KV connector the other way: a prefill worker whose cache lost the conversation
                # loads the prefix the decode worker still holds instead of recomputing it (while it holds
                # its own copy it recomputes the last response's tokens with the turn, as before).
                remote = min(decode.cache.get(traj.id, 0), eff.context_tokens)
                if remote:
                    yield from self._send_kv(decode, prefill, remote * kv_per_token)
            yield from self._run_request(prefill, traj.id, eff.context_tokens, 1, False, remote)
            # Only the KV the decode worker lacks crosses the link: its prefix cache still holds the
            # conversation up to its last turn (a KV connector loads just the tokens past the local hit).
            local = min(decode.cache.get(traj.id, 0), eff.context_tokens) if decode.prefix_cache else 0
            yield from self._send_kv(prefill, decode, (eff.context_tokens - local) * kv_per_token)
            if tokens > 1:
                yield from self._run_request(self.engines[eff.worker], traj.id, eff.context_tokens + 1,
                                             tokens - 1, True)
        else:  # (_drive runs the common case, no request overhead, inline without this generator)
            yield from self._run_request(self.engines[eff.worker], traj.id, eff.context_tokens, tokens, False)
        return GenOutcome(tokens=tokens)

    def _send_kv(self, sender: GenerationEngine, receiver: GenerationEngine, nbytes: float) -> SimGen:
        """Move ``nbytes`` of KV between two PD workers: the path's latency, then the bytes through the
        path, shared with the hand-offs in flight on it (:meth:`_kv_pipe`)."""
        latency, pipe = self._kv_pipe(sender, receiver)
        yield self.env.timeout(latency)
        yield from pipe.transfer(nbytes)

    def _kv_pipe(self, sender: GenerationEngine, receiver: GenerationEngine) -> tuple[float, SharedPipe]:
        """(latency s, shared pipe) of a KV transfer from one PD worker to another. In one cluster: the
        ports of the narrower of the two (the sender's when as wide), each of its GPUs moving its shard
        through its own NIC, shared by that worker's hand-offs in flight (the wider end's other ports are
        not its limit; the wider end taking from or sending to several narrow ones at once is not limited).
        Across clusters: the path between them in that direction, an aggregate rate shared by every
        transfer crossing it (1/m of it under --scale-approx, which simulates 1/m of them)."""
        workers = self.ctl.proxy.workers
        pools = self.plan.cluster.gpu_pools
        src, dst = pools[sender.pool].cluster, pools[receiver.pool].cluster
        narrow = receiver if workers[receiver.id].tp < workers[sender.id].tp else sender
        narrower = workers[narrow.id].tp
        key = ("ports", narrow.id) if src == dst else ("between", src, dst)
        found = self._kv_pipes.get(key)
        if found is None:
            latency, rate = self.transfer.kv_link(src == dst, narrower)
            found = self._kv_pipes[key] = (latency, SharedPipe(self.env, rate / (1 if src == dst else self.scale)))
        return found

    def _run_request(self, engine: GenerationEngine, traj_id: int, context: int, tokens: int,
                     prefilled: bool, remote: int = 0) -> SimGen:
        if engine.request_overhead_s > 0:  # the call's time outside the engine (measured profiles)
            yield self.env.timeout(engine.request_overhead_s)
        req: Request = engine.add(traj_id, context, tokens, prefilled, remote)
        try:
            yield req.done
        except simpy.Interrupt as intr:
            # ABORT: the engine drops it at its next step; the count of tokens it had decoded travels with the
            # interrupt to _drive, which hands it to the core in Aborted
            intr.decoded_tokens = engine.abort(req)
            raise

    def _reward(self, eff: ComputeReward) -> SimGen:
        traj = eff.traj
        task = self.plan.task(traj.task)
        if task.reward == "rule":
            seconds = self.envs.rule_reward_s(task, traj.id)
            self._computing(task, seconds)
            yield self.env.timeout(seconds)
            return 0.0  # the simulator models time, not scores (None would mean a failed call)
        n_in = judge_input_tokens(task.judge_reads(traj.context_tokens), self.judge_window,
                                  self.plan.placement.reward.output_tokens)
        if self.serverless is not None:
            yield from self.serverless.call(n_in)
        else:
            judge = min(self.judges, key=lambda e: (len(e.running) + len(e.waiting), e.id))
            yield from self._run_request(judge, -1 - traj.id, n_in, self.plan.placement.reward.output_tokens, False)
        return 0.0  # the simulator models time, not scores

    def _train(self, eff: TrainStep) -> SimGen:
        t = self.train_cost.step_time(self.tail.train_lengths(eff.batch) if self.tail is not None
                                      else [tr.context_tokens for tr in eff.batch])  # the full plan's batch
        if self._trainer_shares_contention:
            t *= self.contention.trainer_factor()  # the slowdown of the step's start
        if self.switch is not None:  # offload the engines, onload the trainer, train, and back
            t += self.switch.before_s + self.switch.after_s
            for e in self.shared_engines:
                e.update_weights(t)  # holds the engine (in-flight KV is recomputed when it resumes)
            self.colocated_pause_s += t
        yield from self._trainer_job(t)
        self.trainer_busy_s += t

    def _broadcast(self, eff: BroadcastWeights) -> SimGen:
        """A blocking NCCL broadcast: the trainer GPUs drive it and every receiving engine sits in the
        collective for its length (its loop runs the receive, not decode steps); the trainer goes on
        once every engine holds the weights, each then recomputing its in-flight KV under them on its
        own (step ③ here; ⑤ after the resume, as the paper orders them; the UpdateWeights that follows
        has nothing left to do). Engines colocated with the trainer loaded the weights in the switch.
        A measured CPU hand-off only occupies the trainer (``broadcast_stalls_engines``)."""
        t = self.transfer.broadcast_s()
        events = [self.engines[wid].update_weights(t) for wid in self._receivers(eff.workers)] \
            if self.transfer.broadcast_stalls_engines else []
        yield from self._trainer_job(t)
        self.trainer_busy_s += t  # trainer GPUs drive the broadcast
        yield self.env.all_of(events)

    def _receivers(self, workers: tuple[int, ...]) -> list[int]:
        """The workers a weight transfer must reach: all but those colocated with the trainer."""
        pl = self.plan.placement
        return [wid for wid in workers if not pl.shares_trainer_gpus(self.engines[wid].pool)]

    def _publish(self, eff: PublishWeights) -> SimGen:
        yield from self._trainer_job(self.transfer.publish_pull_s())

    @property
    def _trainer_shares_contention(self) -> bool:
        return self.contention is not None and self.trainer_shares_host

    def _trainer_job(self, t: float) -> SimGen:
        """``t`` seconds of the trainer's work: a training step, or a weight transfer (the
        profile's figure: from the reference run where it exercised this transport, else
        measured on idle workers). On a shared host a transfer is compute too, the trainer
        serialising and copying the tensors while the workers' threads pull and deserialise
        them, so each job counts as a busy actor in the host's contention while it runs."""
        shared = self._trainer_shares_contention
        if shared:
            self.contention.trainer_job(started=True)
        try:
            yield self.env.timeout(t)
        finally:
            if shared:
                self.contention.trainer_job(started=False)

    def _update(self, eff: UpdateWeights) -> SimGen:
        """Pulled weights (host memory) are swapped in, each engine's share over its host link; returns
        when every engine holds them (each recomputes its in-flight KV after, on its own). A GPU broadcast
        already did it (``_broadcast``); after a measured CPU hand-off the engines pause here for the
        recompute (the measured broadcast includes the load); colocated engines got the weights in the
        switch."""
        if not eff.from_host and self.transfer.broadcast_stalls_engines:
            return
        events = [self.engines[wid].update_weights(
                      self.transfer.swap_s(self.ctl.proxy.workers[wid].tp, self.worker_ep.get(wid, 1))
                      if eff.from_host else 0.0)
                  for wid in self._receivers(eff.workers)]
        yield self.env.all_of(events)

    # ---- running ---------------------------------------------------------------------------

    def run(self) -> "SimOutcome":
        plan = self.plan
        main = self.spawn(self.ctl.main())
        horizon = plan.algorithm.max_sim_hours * 3600.0
        error: str | None = None
        # The collector: what exists now (plan, cost models, the cluster) lives for the whole run,
        # so it is frozen out of every collection; young collections run 10× less often (most of a
        # step's objects die by reference count first), full ones as often as before (every
        # t0·t1·t2 net allocations: garbage cycles of finished trajectories are freed as soon).
        # Both are restored after the run.
        thresholds = gc.get_threshold()
        t0, t1, t2 = thresholds
        gc.freeze()
        gc.set_threshold(10 * t0, t1, max(1, t2 // 10))
        try:
            _run_until(self.env, simpy.AnyOf(self.env, [main, self.env.timeout(horizon)]))
            if not main.triggered and self.env.peek() == float("inf"):
                # Only the horizon was left to fire: every process waits for something that never comes.
                error = (f"simulation stalled after {len(self.ctl.stats.steps)} steps: no process can make progress "
                         f"(pending groups {self.ctl.buffer.pending_groups}, proxy suspended "
                         f"{self.ctl.proxy.suspended}); please report this scenario")
            elif not main.triggered:
                error = (f"algorithm.max_sim_hours: the run did not finish {plan.algorithm.steps} steps within "
                         f"{plan.algorithm.max_sim_hours:g} simulated hours ({len(self.ctl.stats.steps)} done)")
        except RunAborted as exc:
            error = str(exc)
        finally:
            gc.set_threshold(*thresholds)
            gc.unfreeze()
        if self.serverless is not None:
            self.serverless.close()
        return SimOutcome(self, error)


def _run_until(env: simpy.Environment, until: simpy.Event) -> None:
    """``env.run(until=until)`` for an untriggered ``until``: SimPy's ``step`` inlined into one
    loop (the same queue order, callbacks and failure semantics; a method call less per event)."""
    until.callbacks.append(StopSimulation.callback)  # type: ignore[union-attr]
    queue = env._queue  # type: ignore[attr-defined]
    try:
        while True:
            try:
                env._now, _, _, event = heappop(queue)  # type: ignore[attr-defined]
            except IndexError:
                raise RuntimeError(f'No scheduled events left but "until" event was not triggered: '
                                   f'{until}') from None
            callbacks, event.callbacks = event.callbacks, None
            try:
                for callback in callbacks:
                    callback(event)
            except StopSimulation:
                # as Environment.step: keep the remaining callbacks for a later run
                event.callbacks = callbacks[callbacks.index(callback) + 1:]
                env.schedule(event, EventPriority(-1))
                raise
            if not event._ok and not hasattr(event, "_defused"):
                exc = type(event._value)(*event._value.args)  # a copy, as Environment.step raises it
                exc.__cause__ = event._value
                raise exc
    except StopSimulation:
        return


class SimOutcome:
    """What the report needs from a finished (or stopped) simulation."""

    def __init__(self, backend: SimBackend, error: str | None):
        self.backend = backend
        self.error = error
        self.elapsed_s = backend.env.now

    def gpu_busy_fraction(self) -> dict[str, float]:
        b, plan = self.backend, self.backend.plan
        t = b.ctl.stats.steps[-1].end_s if b.ctl.stats.steps else self.elapsed_s
        if t <= 0:
            return {}
        busy: dict[str, float] = {}
        gpus: dict[str, int] = {}
        for e, w in zip(b.engines, b.ctl.proxy.workers):
            shared = plan.placement.shares_trainer_gpus(e.pool)
            pause = min(b.colocated_pause_s, t) if shared else 0.0  # the trainer's time, counted below
            busy[e.pool] = busy.get(e.pool, 0.0) + max(0.0, min(e.busy_until(t), t) - pause) * w.tp
            gpus[e.pool] = gpus.get(e.pool, 0) + w.tp
        tr = plan.placement.trainer
        busy[tr.pool] = busy.get(tr.pool, 0.0) + min(b.trainer_busy_s, t) * tr.gpus
        # colocated: the trainer's GPUs are the engines' GPUs (count them once)
        gpus[tr.pool] = max(gpus.get(tr.pool, 0), tr.gpus) if b.switch is not None else gpus.get(tr.pool, 0) + tr.gpus
        return {pool: busy[pool] / (gpus[pool] * t) for pool in busy}

    def decode_batch_mean(self) -> dict[str, float]:
        """Per generation pool, the sequences an engine iteration decodes on average (Σ batch ÷
        iterations over its engines that decode: PD prefill workers are left out): what "GPU busy" (time
        with any request) does not say, how full the engines ran while busy (a pool 95 % busy at a batch
        of 3 has most of its decode rate left)."""
        rows: dict[str, int] = {}
        its: dict[str, int] = {}
        for e, w in zip(self.backend.engines, self.backend.ctl.proxy.workers):
            if w.role == "prefill":
                continue
            rows[e.pool] = rows.get(e.pool, 0) + e.decode_rows
            its[e.pool] = its.get(e.pool, 0) + e.it
        return {pool: rows[pool] / its[pool] for pool in rows if its[pool]}

    def reward_gpu_busy_fraction(self) -> float | None:
        b = self.backend
        t = b.ctl.stats.steps[-1].end_s if b.ctl.stats.steps else self.elapsed_s
        if not b.judges or t <= 0:
            return None
        return sum(min(e.busy_until(t), t) for e in b.judges) / (len(b.judges) * t)

    def reward_gpu_busy_steady_fraction(self, from_step: int) -> float | None:
        """The dedicated judges' busy share over the steps from ``from_step`` on (the summary's steady window,
        what its step time and throughput are read over)."""
        b = self.backend
        steps, snaps = b.ctl.stats.steps, b.judge_busy_at_step
        first = next((i for i, r in enumerate(steps) if r.step >= from_step), None)
        if not b.judges or first is None or len(snaps) != len(steps):
            return None
        span = steps[-1].end_s - steps[first].start_s
        if span <= 0:
            return None
        return (snaps[-1] - (snaps[first - 1] if first else 0.0)) / (len(b.judges) * span)

    def env_cores_summary(self, elapsed: float) -> dict[str, dict[str, Any]]:
        """Per CPU pool: its cores, the largest share of them envs held at once, the mean time an env queued
        for its cores (the step breakdown's env_queue where it was critical); the mean share held and, of
        the core-seconds held, the share envs computed in (resets, steps, rule rewards): an env reserves its
        cores for its episode, LLM turns included, so a pool sized to the envs' computing needs far fewer;
        and image pulls (of the simulated subset under --scale-approx): how many, their mean time, the most
        at once, and those a reset's timeout cut off."""
        b = self.backend
        now = max(b.env.now, elapsed)  # the cores are integrated to the clock, which may pass the last step
        out: dict[str, dict[str, Any]] = {}
        for pool, w in b.cpu_wait.items():
            held = b.cpu_held[pool]
            area = held[1] + held[0] * max(0.0, now - held[2])
            capacity = b.cpu[pool].capacity
            c: dict[str, Any] = {"cores": b.full_plan.cluster.cpu_pools[pool].cores,
                                 "peak_held_share": b.cpu_peak[pool] / capacity,
                                 "mean_wait_s": w[0] / w[1] if w[1] else 0.0,
                                 "mean_held_share": area / (capacity * now) if now > 0 else 0.0,
                                 "computing_share_of_held": min(1.0, b.cpu_busy_s[pool] / area) if area > 0 else 0.0}
            done = b.pull_s.get(pool)
            if done and done[1]:
                c.update(image_pulls=int(done[1]), mean_pull_s=done[0] / done[1], peak_pulls=b.image_pipes[pool].peak)
            if b.pulls_abandoned.get(pool):
                c["image_pulls_abandoned"] = b.pulls_abandoned[pool]
            out[pool] = c
        return out

    def serverless_gpu_seconds(self) -> float:
        return self.backend.serverless.billed_s if self.backend.serverless else 0.0

    def prefix_cache_hit_rate(self) -> float:
        hits = sum(e.cache_hits_tokens for e in self.backend.engines)
        total = hits + sum(e.prefill_tokens for e in self.backend.engines)
        return hits / total if total else 0.0

    def kv_fit(self, steps: list[Any], preempted: int) -> dict[str, int]:
        """Where the engines preempted requests for KV often (:data:`KV_THRASH_SHARE` of the trajectories
        trained or more) in a mode whose env managers bound the conversations in flight: how many conversations
        of the trained length their KV holds at once, how many ran, and env_managers to try (whole env groups,
        each rolling out a whole number of a batch's groups: a batch one round short makes every step wait for a
        second). Past the fit each turn's conversation is recomputed or re-read: a batch of 1,024 on the 32B plan
        read 0.56 trajectories/s at its default 1,280 env managers and 1.31 at 640 (helper-95), a setting, not
        more GPUs. A rough estimate (the trained length, every engine's KV pooled), so a suggestion to try, made
        only where the thrash is material: a run 6 preemptions over the line read 11 % slower at its suggestion
        (helper-96). Empty otherwise."""
        b = self.backend
        trained, trajectories = sum(s.tokens for s in steps), sum(s.trajectories for s in steps)
        if b.mode.batch_level_launch or not trained or not trajectories or preempted < KV_THRASH_SHARE * trajectories:
            return {}
        held = int(sum(e.capacity for e in b.engines) * trajectories / trained)
        sched = b.ctl.scheduler
        members, groups = sched.members_per_group, sched.groups_per_batch
        out = {"kv_conversations_held": held, "env_managers_in_flight": sched.env_managers}
        if held < members:  # not one group's conversations: no env_managers setting helps
            return out
        if not sched.env_groups:  # one pool of env managers: any whole number of groups, in one round
            return {**out, "env_managers_fit": held // members * members, "env_manager_rounds": 1,
                    "groups_per_batch": groups}
        rounds = next(k for k in range(1, groups + 1) if -(-groups // k) * members <= held)
        return {**out, "env_managers_fit": -(-groups // rounds) * members, "env_manager_rounds": rounds,
                "groups_per_batch": groups}

    def preempted_reuse_share(self) -> float:
        """Of the prompt tokens found in the prefix cache, the share a preempted request found of its own KV."""
        hits = sum(e.cache_hits_tokens for e in self.backend.engines)
        return sum(e.resumed_hit_tokens for e in self.backend.engines) / hits if hits else 0.0


    def to_result(self) -> RunResult:
        b = self.backend
        ctl = b.ctl
        counts = ctl.outcome_counts()
        steps = ctl.stats.steps
        elapsed = steps[-1].end_s if steps else self.elapsed_s
        summary: dict[str, Any] = summary_from_steps(steps, b.mode.alpha)
        preempted = sum(e.preemptions for e in b.engines)  # running requests whose KV the engines evicted
        summary.update(task_share_summary(b.plan, steps, ctl.stats, b.mode))
        summary.update(waste_summary(ctl.stats, ctl.discarded_tokens()))
        summary.update({
            "tokens_per_s": ctl.stats.generated_tokens / elapsed if elapsed else 0.0,
            "gpu_busy_fraction": self.gpu_busy_fraction(),
            "decode_batch_mean": self.decode_batch_mean(),
            "reward_gpu_busy_fraction": self.reward_gpu_busy_fraction(),
            "reward_gpu_busy_steady_fraction": self.reward_gpu_busy_steady_fraction(summary["steady"]["from_step"]),
            "serverless_gpu_seconds": self.serverless_gpu_seconds(),
            "serverless_cold_starts": b.serverless.cold_starts if b.serverless else 0,
            # of the billed GPU·s, those serving calls (the rest: cold starts, and idle warm time when
            # the platform bills instance time)
            "serverless_serving_s": b.serverless.gpu_seconds(b.serverless.busy_s) if b.serverless else 0.0,
            # every instance's life from cold start to scale-down (× its GPUs), whatever the billing
            "serverless_instance_s": b.serverless.gpu_seconds(b.serverless.reserved_s) if b.serverless else 0.0,
            "serverless_billing": b.plan.cluster.serverless.billing if b.serverless else None,
            "aborted_stale": counts["aborted_stale"],
            "aborted_redundant": counts["aborted_redundant"],
            "env_failures": ctl.stats.env_failures,
            "env_call_errors": ctl.stats.env_errors,
            "trajectories": counts,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate(),
            # running requests the engines preempted when their KV filled up (recomputed later); the
            # hit rate above counts a resumed request's own KV found in the cache, as vLLM counts it
            "kv_preemptions": preempted,
            "kv_preempted_reuse_share": self.preempted_reuse_share(),
            **self.kv_fit(steps, preempted),
            "weight_sync": weight_sync_summary(b.plan, b.mode) + b.transfer.bucket_cost_note(b.mode.async_weight_transfer),
            "unused_settings": unused_settings(b.plan, b.mode) + unplaced_gpu_notes(b.plan),
            # a task window past the model's native one (served only with rope scaling): said, not refused
            **({"context_notes": notes} if (notes := b.plan.context_notes()) else {}),
            "env_cores": self.env_cores_summary(elapsed),
            "routed_fallback": ctl.proxy.routed_fallback,
            "routed_preferred": ctl.proxy.routed_preferred,
            "routed_fallback_from": dict(ctl.proxy.fallback_from),
            "steps_done": len(steps),
            "simulated_s": self.elapsed_s,
            "effects": b.effects_handled,
            "engine_steps": [{"worker": e.id, "pool": e.pool, "steps": e.iterations_until(elapsed),
                              "busy_s": min(e.busy_until(elapsed), elapsed)}
                             for e in b.engines],
        })
        # Cost (placed GPUs + env cores for the wall time + billed serverless GPU·s); None when a
        # placed GPU type has no price (rollart sweep/plan then stop with the plan error).
        from rollart.sim.costs.price import missing_prices, run_cost

        if missing_prices(b.plan, b.mode):  # the mode decides whether the reward GPUs are placed
            summary.update({"cost_per_step_usd": None, "cost_per_1k_trajectories_usd": None,
                            "cost_usd_per_hour": None})
        else:
            cost = run_cost(b.plan, elapsed, len(steps), sum(s.trajectories for s in steps),
                            summary["serverless_gpu_seconds"], b.mode, cpu_held=b.cpu_peak)
            summary.update({"cost_per_step_usd": cost.per_step_usd,
                            "cost_per_1k_trajectories_usd": cost.per_1k_trajectories_usd,
                            "cost_usd_per_hour": cost.usd_per_hour,
                            **({"cpu_cores_billed_at_peak": cost.cpu_cores_billed} if cost.cpu_billed_at_peak else {})})
            price_steady_state(summary)
        calibration = dict(b.cost_sources)
        calibration["trainer"] = b.train_cost.source
        result = RunResult(scenario=b.plan.name, mode=b.mode.name, seed=b.envs.seed, backend="sim",
                           steps=steps, summary=summary, calibration=calibration, error=self.error)
        if b.scale > 1:
            from rollart.sim.scale import scale_result

            return scale_result(result, b.full_plan, b.scale, b.plan, b.tail)
        return result


def simulate_plan(plan: Plan, mode: ModeConfig, seed: int, tracer: Tracer | None = None,
                  on_step: Callable[[StepRecord], None] | None = None, keep_history: bool = False,
                  scale_approx: int = 1) -> SimOutcome:
    """Simulate ``plan``; by default without the per-trajectory history (bounded memory: the
    result's counts and per-step records are the same), ``keep_history`` to inspect it after;
    ``scale_approx`` m > 1 simulates 1/m of the cluster and accounts for the rest by symmetry."""
    return SimBackend(plan, mode, seed, tracer, on_step, keep_history=keep_history, scale_approx=scale_approx).run()


__all__ = ["SimBackend", "SimOutcome", "simulate_plan"]
