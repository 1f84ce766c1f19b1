"""The Ray backend: executes the core's effects on real workers.

Same Controller, same processes as the simulator; only the effect handlers differ:

| effect | here |
| --- | --- |
| EnvReset / EnvStep / EnvClose | an EnvWorker actor (real envs, injected latency tails) |
| Generate | the InferenceWorker actor the LLMProxy picked (ADD; cancellation ⇒ ABORT) |
| ComputeReward | rule functions in-process, or the serverless endpoint (Ray Serve or a URL) |
| TrainStep | the GRPO trainer actor on the trajectories' real tokens and rewards |
| BroadcastWeights | the trainer's weights through the Ray object store (NCCL on GPUs) |
| PublishWeights | bucketed publish to the weight store (Mooncake), workers pull in the background |
| UpdateWeights | workers swap the new version in between engine steps (KV recomputed) |
"""

from __future__ import annotations

import asyncio
import functools
import gc
import signal
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rollart.core import Controller, RunAborted
from rollart.core.effects import (BroadcastWeights, ComputeReward, EnvClose, EnvOutcome, EnvReset,
                                  EnvStep, Generate, GenOutcome, PublishWeights, TrainStep, UpdateWeights)
from rollart.core.modes import ModeConfig, unused_settings, weight_sync_summary
from rollart.core.stats import StepRecord
from rollart.core.trajectory import Trajectory
from rollart.plan.schema import Plan
from rollart.runtime.driver import AsyncDriver
from rollart.runtime.heap import settle_heap
from rollart.trace import NullTracer, Tracer


_OPEN_STORES: dict[Any, Any] = {}

# How long tear-down waits for ``ray.shutdown()`` before it kills Ray's processes instead.
# It normally takes 1-3 s on a CPU host; it was seen to hang (a core-worker thread that never
# joins) after a signal reached both the driver and its wrapper.
RAY_SHUTDOWN_S = 30.0


def pull_version(spec: Any, version: int) -> dict[str, Any]:
    """Runs inside an inference worker: pull ``version`` from the store (one client per process)."""
    store = _OPEN_STORES.get(spec)
    if store is None:
        store = _OPEN_STORES[spec] = spec.open()
    return store.pull(version)


def simulator_only_settings(plan: Any) -> list[str]:
    """The plan's fields only the simulator prices, one line each: a real run's envs are local
    processes that pull no image, and its reward functions take the time they take."""
    notes = []
    for t in plan.tasks:
        if t.env.image_gb > 0:
            notes.append(f"tasks.{t.name}.env.image_gb: a real run's envs pull no image (simulator only)")
        if t.rule_reward_time_set:
            notes.append(f"tasks.{t.name}.rule_reward_s: a real run times its reward functions (simulator only)")
        if t.judge_input_tokens is not None:
            notes.append(f"tasks.{t.name}.judge_input_tokens: a real run sends its scorer the trajectory it has "
                         "(simulator only)")
    for i, g in enumerate(plan.placement.generation):
        if g.step_overhead_ms is not None:
            notes.append(f"placement.generation.{i}.step_overhead_ms: a real run's engines take the steps they "
                         "take (simulator only)")
    if plan.placement.reward.step_overhead_ms is not None:
        notes.append("placement.reward.step_overhead_ms: a real run's judge takes the steps it takes (simulator only)")
    if plan.algorithm.reference_kl and plan.placement.trainer.profile is None:  # a measured profile: as it ran
        notes.append("algorithm.reference_kl: a real run's trainer has no KL term and runs no reference forward; the "
                     "simulator prices one (set it false to compare like with like)")
    return notes


@dataclass
class Conversation:
    """One trajectory as the model sees it: chat messages and the flattened token sequence
    with the positions the model generated (trained on) and their behaviour log-probs."""

    messages: list[dict[str, str]] = field(default_factory=list)  # {"role", "content"} chat turns
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)          # everything after the first prompt
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_reward: float = 0.0
    last_action: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)  # env step results, for the reward rules


@dataclass
class RuntimeCounters:
    reward_calls: int = 0
    reward_failures: int = 0
    reward_last_error: str | None = None
    step_reward_calls: int = 0     # this step's (since the last TrainStep), for max_reward_failure_rate
    step_reward_failures: int = 0
    env_worker_deaths: int = 0     # env calls lost to a dead env worker (the trajectory failed, refilled)
    generate_calls: int = 0
    reissued: int = 0            # generate calls re-issued after their worker died
    generate_seconds: float = 0.0
    reward_seconds: float = 0.0
    weight_publish_s: list[float] = field(default_factory=list)
    broadcast_s: float = 0.0
    update_s: list[float] = field(default_factory=list)      # UpdateWeights round trips (all workers)
    env_overhead_s: dict[str, list[float]] = field(default_factory=lambda: {"reset": [], "step": []})
    # each generate call's round trip as the driver saw it, by request id (record_engine_steps only)
    generate_round_trips: dict[str, float] = field(default_factory=dict)
    train_metrics: list[dict[str, float]] = field(default_factory=list)
    host_cpu_s: float = 0.0      # CPU the driver and the env workers used during the run
    host_cpu_wall_s: float = 0.0  # the wall time host_cpu_s was measured over
    host_idle_cores: float = 0.0  # the same processes' CPU rate with nothing to do (measured before it)


class RuntimeBackend:
    def __init__(self, plan: Plan, mode: ModeConfig, seed: int, address: str | None = None,
                 tracer: Tracer | None = None, on_step: Callable[[StepRecord], None] | None = None,
                 checkpoint_dir: Path | None = None, resume: Path | None = None, record_engine_steps: bool = False):
        self.plan, self.mode, self.seed = plan, mode, seed
        self.record_engine_steps = record_engine_steps  # each engine step's work and time (rollart validate)
        self.address = address
        self.model = plan.run_model
        self.tracer = tracer or NullTracer()
        self.checkpoint_dir = checkpoint_dir
        self.resume = resume
        self._t0 = time.monotonic()
        self.ctl = Controller(plan, mode, clock=self.now, tracer=self.tracer, on_step=on_step)
        self.conv: dict[int, Conversation] = {}
        self.counters = RuntimeCounters()
        # tear-down steps, run in order; the graceful ones are skipped after a second signal
        self._closers: list[tuple[str, Callable[[], None]]] = []
        self._watchdog: Any = None
        self.interrupted: int | None = None
        self.hurry = False                 # a second signal: skip the graceful tear-down
        self.teardown_stuck: str | None = None  # why the tear-down gave up waiting (then Ray was killed)

    def now(self) -> float:
        return time.monotonic() - self._t0

    # ---- set-up and tear-down ------------------------------------------------------------

    def setup(self) -> None:
        import ray
        import redis

        from rollart.runtime.cluster import ResourceManager, pool_capacities, start_ray
        from rollart.runtime.engines.tokenizer import build_tokenizer
        from rollart.runtime.envs.worker import remote_env_worker
        from rollart.runtime.inference_worker import InferenceWorkerActor
        from rollart.runtime.trainer.actor import TrainerActor

        from rollart.runtime.head import start_head_services
        from rollart.runtime.procs import Watchdog

        plan, rt = self.plan, self.plan.runtime
        started_here = not ray.is_initialized()
        if started_here and not self.address:
            # SIGKILL of this process runs no tear-down: the watchdog then kills Ray's processes
            # (GCS, raylet, agents, workers) and their children
            self._watchdog = Watchdog()
            self._closers.append(("watchdog", self._watchdog.stop))
        start_ray(plan, self.address)
        if started_here:  # a Ray we joined (tests, --address) is left running
            self._closers.insert(len(self._closers) - 1 if self._closers else 0, ("ray", self._shutdown_ray))
        self.head = start_head_services(self._service_host())
        self._closers.insert(0, ("head services", lambda: ray.get(self.head.close.remote(), timeout=30)))
        host, port, password = ray.get(self.head.redis_address.remote())
        self.head_node = ray.get(self.head.node_id.remote())
        self.redis = redis.Redis(host=host, port=port, password=password)
        self.resources = ResourceManager(pool_capacities(plan), self.redis)
        # which node offers which pool (the summary says where each worker ran)
        self.cluster_nodes = {n["NodeID"]: {"address": n.get("NodeManagerAddress"),
                                            "pools": sorted(k[len("rollart_pool_"):] for k in n.get("Resources", {})
                                                            if k.startswith("rollart_pool_")),
                                            "head": "node:__internal_head__" in n.get("Resources", {})}
                              for n in ray.nodes() if n.get("Alive")}
        self.tokenizer = build_tokenizer(self.model.vocab)
        self.workers = []
        group_of = [g for g in plan.placement.generation for _ in range(g.workers)]  # build_workers' order
        for w in self.ctl.proxy.workers:
            pool = self.resources.bind(f"gen-{w.id}", w.pool)
            g = group_of[w.id]
            # a GPU engine takes the group's sequence slots and memory share, as the simulator prices them
            engine_kwargs = ({"max_batch": g.max_num_seqs, "gpu_memory_utilization": g.gpu_memory_utilization}
                             if rt.engine == "vllm" else None)
            actor = InferenceWorkerActor.options(num_cpus=0, max_restarts=3,
                                                 resources=self.resources.ray_resources(pool)).remote(
                self.model, engine=rt.engine, seed=self.seed, name=f"gen-{w.id}", engine_kwargs=engine_kwargs)
            self.workers.append(actor)
        # restarted like the inference workers: a dead one's in-flight trajectories fail (and are
        # refilled by the core), the others carry on
        self.env_workers = [remote_env_worker(num_cpus=0, tasks=self.plan, seed=self.seed + i,
                                              inject=rt.inject_env_latency, max_restarts=-1)
                            for i in range(rt.env_workers)]
        self._check_code_sandbox()
        # the trainer computes log-probs under the same temperature the engines sample with
        self.trainer = TrainerActor.options(num_cpus=0).remote(self.model, lr=rt.learning_rate, seed=self.seed,
                                                               temperature=rt.temperature)
        self.store_spec = self._make_store()
        self.reward_url = rt.reward_url
        if self.reward_url is None and self.mode.serverless_reward and plan.llm_judged_tasks:
            from rollart.runtime.reward.serverless import deploy_reward, shutdown_reward

            self.reward_url = deploy_reward("rollart-reward")
            self._closers.insert(1, ("reward endpoint", shutdown_reward))
        if self.resume is not None:
            self._restore(self.resume)
        # every worker starts from the trainer's weights (same seed ⇒ same init, but be explicit)
        self._load_initial_weights()
        if self.record_engine_steps:
            ray.get([w.record_steps.remote(True) for w in self.workers])
        # first-use imports (gem-llm: ~3 s) before the clock starts, not inside a timed first reset
        ray.get([w.warmup.remote() for w in self.env_workers])
        # the last thing before the clock starts: no full collection of the setup heap mid-run
        ray.get([a.settle_heap.remote() for a in (*self.workers, *self.env_workers, self.trainer)])
        settle_heap()
        # this process outlives the run: unfreeze at close, or the run's actor handles (held in
        # reference cycles) would never be collected and their actors never released
        self._closers.append(("heap", gc.unfreeze))

    def _load_initial_weights(self) -> None:
        """Hand the trainer's weights to every worker before the clock starts. With a bucketed
        store the hand-off goes through the store itself: it opens the publisher's and every
        puller's client and registers their memory now (≈ 0.2 s on a CPU host), a one-time cost
        that would otherwise land in the first step of the run."""
        import ray

        version = self.ctl.version
        if self.mode.async_weight_transfer:
            bucket = int(self.plan.weight_sync.bucket_mb * 2**20)
            ray.get(self.trainer.publish.remote(self.store_spec, version, bucket))
            ray.get([w.update_weights.remote(version, self.pull_loader(version)) for w in self.workers])
        else:
            state = ray.get(self.trainer.state_dict.remote())
            ray.get([w.update_weights.remote(version, state) for w in self.workers])

    def pull_loader(self, version: int) -> Callable[[], dict[str, Any]]:
        """What a worker runs to pull ``version`` from the run's store (as a puller)."""
        spec = self.store_spec.for_puller() if hasattr(self.store_spec, "for_puller") else self.store_spec
        return functools.partial(pull_version, spec, version)

    def _check_code_sandbox(self) -> None:
        """A plan with a code-execution task needs the sandbox on the env workers' machines:
        refuse to start (one line) rather than fail every code trajectory later."""
        import ray

        from rollart.runtime.cluster import ClusterError
        from rollart.runtime.reward.rules import kind_of

        code = [t.name for t in self.plan.tasks if kind_of(t.name, t.tag) == "code"]
        if not code:
            return
        for why in ray.get([w.sandbox_check.remote() for w in self.env_workers]):
            if why is not None:
                raise ClusterError(f"tasks.{code[0]}: the code sandbox cannot run on the env workers ({why}); "
                                   "refusing to run model-written code unconfined")

    def _service_host(self) -> str:
        """Where the head's services (Redis, the Mooncake master) listen: loopback unless the
        driver runs on another machine than the head."""
        import ray

        if not self.address:
            return "127.0.0.1"
        head_ip = self._head_address()
        return "127.0.0.1" if head_ip == ray.util.get_node_ip_address() else head_ip

    def _head_address(self) -> str:
        """The head node's address (127.0.0.1 for a local run)."""
        import ray

        if not self.address:
            return "127.0.0.1"
        head = [n for n in ray.nodes() if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {})]
        return head[0]["NodeManagerAddress"] if head else "127.0.0.1"

    def _make_store(self) -> Any:
        """A picklable store spec the trainer publishes through and workers pull from: the
        Mooncake store (master on the head, TCP), else Ray's object store. Mooncake's transfer
        engine listens on all interfaces without authentication, so it is used only when the
        plan allows that (``runtime.allow_external_listeners``)."""
        import ray

        self.store_note = "ray object store"
        if self.plan.runtime.weight_store == "mooncake":
            from rollart.runtime.weights import mooncake_store

            ok, reason = mooncake_store.available()
            if ok and not self.plan.runtime.allow_external_listeners:
                ok, reason = False, ("its transfer engine listens on all interfaces unauthenticated; set "
                                     "runtime.allow_external_listeners=true to use it")
            if ok:
                self.store_note = "mooncake"
                return ray.get(self.head.start_mooncake.remote(self._head_address()))
            self.store_note = f"ray object store (mooncake not used: {reason})"
        import uuid

        from rollart.runtime.weights.ray_store import RayStoreSpec

        return RayStoreSpec(name=f"rollart-weights-{uuid.uuid4().hex[:8]}")  # one registry per run

    def _restore(self, directory: Path) -> None:
        import ray

        step, version = ray.get(self.trainer.load_checkpoint.remote(str(directory)))
        self.ctl.resume_from(version)
        self.resumed_step = step

    def close(self) -> None:
        """Tear down in order. After a second signal (``hurry``) the graceful steps (head
        services, the reward endpoint) are skipped and Ray's processes are killed, not shut down."""
        closers, self._closers = self._closers, []
        for name, close in closers:
            if self.hurry and name in ("head services", "reward endpoint"):
                continue
            try:
                close()
            except Exception:  # noqa: BLE001 - tear-down must reach every component
                pass

    def _shutdown_ray(self) -> None:
        """``ray.shutdown()``, bounded: in a thread, waited for up to :data:`RAY_SHUTDOWN_S`
        (or until a second signal). If it does not return, the watchdog kills Ray's processes
        and ``teardown_stuck`` says so; the caller should then leave with ``os._exit`` once its
        outputs are written, since Ray's own exit hook would wait on the same stuck shutdown."""
        import ray

        done = threading.Event()

        def shutdown() -> None:
            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001 - a failed shutdown is reaped like a stuck one
                pass
            finally:
                done.set()

        if not self.hurry:
            threading.Thread(target=shutdown, name="rollart-ray-shutdown", daemon=True).start()
            deadline = time.monotonic() + RAY_SHUTDOWN_S
            while not done.wait(0.1) and not self.hurry and time.monotonic() < deadline:
                pass
            if done.is_set():
                return
        self.teardown_stuck = ("a second signal: Ray's processes were killed" if self.hurry else
                               f"ray.shutdown() did not return within {RAY_SHUTDOWN_S:.0f} s: "
                               "Ray's processes were killed")
        if self._watchdog is not None:
            self._watchdog.kill()

    # ---- effect handlers -----------------------------------------------------------------------

    def _env_worker(self, traj: Trajectory) -> Any:
        return self.env_workers[traj.id % len(self.env_workers)]

    def _tokens(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def _env_call(self, traj: Trajectory, method: str, *args: Any) -> dict:
        """``method`` on the trajectory's env worker; a dead worker (Ray restarts it) fails the
        call, so the core fails the trajectory and refills its group."""
        try:
            return await getattr(self._env_worker(traj), method).remote(*args)
        except Exception as exc:  # noqa: BLE001
            if not _worker_died(exc):
                raise
            self.counters.env_worker_deaths += 1
            return {"ok": False, "error": f"error: env worker died ({type(exc).__name__}); restarted by Ray"}

    async def _env_reset(self, eff: EnvReset) -> EnvOutcome:
        traj = eff.traj
        seed = zlib.crc32(f"{self.seed}:{traj.group.id}".encode())  # a GRPO group shares its prompt
        t0 = self.now()
        res = await self._env_call(traj, "reset", traj.id, traj.task, seed)
        self._env_overhead("reset", t0, res)
        if not res["ok"]:
            return EnvOutcome(ok=False, error=res.get("error") or "error")
        conv = self.conv[traj.id] = Conversation(messages=[{"role": "user", "content": res["observation"]}])
        conv.prompt_ids = self._prompt_ids(conv)
        return EnvOutcome(ok=True, obs_tokens=len(conv.prompt_ids))

    async def _env_step(self, eff: EnvStep) -> EnvOutcome:
        traj = eff.traj
        conv = self.conv[traj.id]
        t0 = self.now()
        res = await self._env_call(traj, "step", traj.id, conv.last_action)
        self._env_overhead("step", t0, res)
        if not res["ok"]:
            return EnvOutcome(ok=False, error=res.get("error") or "error")
        conv.env_reward += float(res.get("reward") or 0.0)
        conv.steps.append({"action": conv.last_action, "reward": res.get("reward"), "done": res["done"],
                           "info": res.get("info") or {}})
        if res["done"]:
            return EnvOutcome(ok=True, obs_tokens=0, done=True)
        before = len(self._prompt_ids(conv))
        conv.messages.append({"role": "user", "content": res["observation"]})
        obs_ids = self._prompt_ids(conv)[before:]
        conv.ids += obs_ids
        conv.loss_mask += [0] * len(obs_ids)
        return EnvOutcome(ok=True, obs_tokens=len(obs_ids))

    def _env_overhead(self, kind: str, t0: float, res: dict) -> None:
        """A successful env call's round trip beyond the latency injected into it."""
        if res.get("ok"):
            self.counters.env_overhead_s[kind].append(max(0.0, self.now() - t0 - float(res.get("injected_s") or 0.0)))

    async def _env_close(self, eff: EnvClose) -> None:
        await self._env_call(eff.traj, "close", eff.traj.id)

    def _prompt_ids(self, conv: Conversation) -> list[int]:
        from rollart.runtime.engines.tokenizer import render_chat

        return self._tokens(render_chat(conv.messages, add_generation_prompt=True))

    async def _generate(self, eff: Generate) -> GenOutcome:
        traj = eff.traj
        conv = self.conv[traj.id]
        worker = self.workers[eff.worker]
        request_id = f"{traj.id}-{traj.turns}"
        prompt = conv.prompt_ids + conv.ids
        max_new = min(eff.max_new_tokens, self.plan.runtime.max_new_tokens)
        t0 = self.now()
        for attempt in range(3):
            try:
                out = await worker.generate.remote(f"{request_id}.{attempt}", prompt, max_new,
                                                   self.plan.runtime.temperature,
                                                   zlib.crc32(f"{self.seed}:{request_id}".encode()))
                break
            except asyncio.CancelledError:
                worker.abort.remote(f"{request_id}.{attempt}")  # ABORT on the engine, fire and forget
                raise
            except Exception as exc:  # the worker died: Ray restarts it; re-issue the turn there
                if not _worker_died(exc) or attempt == 2:
                    raise
                self.counters.reissued += 1
                await self._revive(eff.worker)
        t1 = self.now()
        self.counters.generate_calls += 1
        self.counters.generate_seconds += t1 - t0
        # matched with the worker's request log by `rollart validate`; a reissued call's time
        # includes the revive, so only first attempts are kept
        if self.record_engine_steps and attempt == 0:
            self.counters.generate_round_trips[f"{request_id}.{attempt}"] = t1 - t0
        self.tracer.worker_span(self.ctl.proxy.workers[eff.worker].pool, eff.worker, f"generate traj {traj.id}", t0, t1)
        conv.ids += list(out.token_ids)
        conv.loss_mask += [1] * len(out.token_ids)
        conv.logprobs += list(out.logprobs)
        conv.messages.append({"role": "assistant", "content": out.text})
        conv.last_action = out.text
        return GenOutcome(tokens=max(1, len(out.token_ids)), text=out.text)

    async def _reward(self, eff: ComputeReward) -> float | None:
        from rollart.runtime.reward.rules import score

        traj = eff.traj
        conv = self.conv[traj.id]
        record = {"task": traj.task, "messages": conv.messages, "env_reward": conv.env_reward,
                  "final_answer": conv.last_action, "steps": conv.steps}
        t0 = self.now()
        self.counters.reward_calls += 1
        value: float | None
        error = None
        if eff.serverless and self.reward_url:
            value, _attempts, error = await asyncio.to_thread(self._reward_client().score, record)
        else:
            try:
                value = score(traj.task, record)
            except ValueError:  # no rule for this task kind: the env's own score
                value = conv.env_reward
        self.counters.reward_seconds += self.now() - t0
        c = self.counters
        c.step_reward_calls += 1
        if value is None:  # endpoint down after its retries: the trajectory fails (never a silent 0)
            c.reward_failures += 1
            c.step_reward_failures += 1
            c.reward_last_error = error
            self._check_reward_failures()
            return None
        return float(value)

    def _check_reward_failures(self) -> None:
        """Stop the run once more than ``runtime.max_reward_failure_rate`` of this step's reward
        calls failed (judged once the failures alone exceed that share of a batch)."""
        c, rate = self.counters, self.plan.runtime.max_reward_failure_rate
        batch = self.plan.algorithm.batch_size
        if c.step_reward_failures > rate * batch and c.step_reward_failures > rate * c.step_reward_calls:
            raise RunAborted(f"runtime.max_reward_failure_rate: {c.step_reward_failures} of {c.step_reward_calls} "
                             f"reward calls failed in step {self.ctl.version} (limit {rate:.0%}); last error: "
                             f"{c.reward_last_error} (endpoint {self.reward_url}); stopped instead of training "
                             "without rewards")

    async def _on_worker(self, wid: int, call: Callable[[Any], Any]) -> Any:
        """``call(actor)`` on worker ``wid``; if the worker died, wait for its restart, give it
        the served weights and call again."""
        for attempt in range(3):
            try:
                return await call(self.workers[wid])
            except Exception as exc:
                if not _worker_died(exc) or attempt == 2:
                    raise
                await self._revive(wid)

    async def _revive(self, wid: int) -> None:
        """Wait for a restarted worker and give it the weights the proxy serves."""
        worker = self.workers[wid]
        for _ in range(100):
            try:
                await asyncio.wait_for(worker.ping.remote(), timeout=5)
                break
            except Exception:  # noqa: BLE001 - still restarting
                await asyncio.sleep(0.2)
        version = self.ctl.proxy.version
        if self.mode.async_weight_transfer and version > 0:
            source: Any = self.pull_loader(version)
        elif version > 0:
            source = self._broadcast_ref
        else:
            source = self.trainer.state_dict.remote()
        await worker.update_weights.remote(version, source)
        await worker.settle_heap.remote()

    def _reward_client(self) -> Any:
        """One HTTP client for the run, so its failure and retry counters add up."""
        if getattr(self, "_http_reward", None) is None:
            from rollart.runtime.reward.serverless import HttpReward

            self._http_reward = HttpReward(self.reward_url, timeout_s=self.plan.runtime.reward_timeout_s,
                                           retries=self.plan.runtime.reward_retries)
        return self._http_reward

    async def _train(self, eff: TrainStep) -> None:
        from rollart.runtime.trainer.grpo import Sample

        samples = []
        for t in eff.batch:
            conv = self.conv.get(t.id) or self.finished[t.id]
            samples.append(Sample(group_id=t.group.id, prompt_ids=conv.prompt_ids, completion_ids=conv.ids,
                                  loss_mask=conv.loss_mask, behaviour_logprobs=conv.logprobs,
                                  reward=float(t.reward or 0.0)))
        # Conversations are kept from EnvClose until training; drop the used and the dropped ones.
        for tid in [tid for tid, _ in self.finished.items()
                    if self.ctl.trajectories[tid].state.value not in ("scored",)]:
            del self.finished[tid]
        self.counters.step_reward_calls = self.counters.step_reward_failures = 0
        t0 = self.now()
        metrics = await self.trainer.train_step.remote(samples, eff.version)
        metrics["round_trip_s"] = self.now() - t0
        metrics["context_tokens"] = [t.context_tokens for t in eff.batch]
        self.counters.train_metrics.append(metrics)
        every = self.plan.runtime.checkpoint_every
        if every and self.checkpoint_dir is not None and (eff.version + 1) % every == 0:
            await self.trainer.save_checkpoint.remote(str(self.checkpoint_dir), eff.version + 1, eff.version + 1)

    async def _broadcast(self, eff: BroadcastWeights) -> None:
        import ray

        t0 = self.now()
        self._broadcast_ref = ray.put(await self.trainer.state_dict.remote())
        self.counters.weight_publish_s.append(self.now() - t0)
        self.counters.broadcast_s += self.now() - t0

    async def _publish(self, eff: PublishWeights) -> None:
        t0 = self.now()
        bucket = int(self.plan.weight_sync.bucket_mb * 2**20)
        await self.trainer.publish.remote(self.store_spec, eff.version, bucket)
        loader = self.pull_loader(eff.version)

        # No version can be dropped under a prefetch: a publish waits until every worker serves
        # the previous version, and the store keeps two.
        await asyncio.gather(*(self._on_worker(i, lambda w: w.prefetch_weights.remote(eff.version, loader))
                               for i in range(len(self.workers))))
        self.counters.weight_publish_s.append(self.now() - t0)

    async def _update(self, eff: UpdateWeights) -> None:
        ref = None if eff.from_host else self._broadcast_ref

        async def update(wid: int) -> None:
            try:
                await self._on_worker(wid, lambda w: w.update_weights.remote(eff.version, ref))
            except KeyError:  # restarted after the prefetch: pull the version again
                await self.workers[wid].update_weights.remote(eff.version, self.pull_loader(eff.version))

        t0 = self.now()
        await asyncio.gather(*(update(w) for w in eff.workers))
        self.counters.update_s.append(self.now() - t0)

    # ---- running ---------------------------------------------------------------------------

    async def _main(self) -> str | None:
        if self.record_engine_steps:  # what the host processes burn idle (Ray's threads, polls)
            self.counters.host_idle_cores = await self._idle_cores()
        self._t0 = time.monotonic()  # the run's clock starts once the cluster is up
        cpu0 = await self._host_cpu_s()
        cpu_t0 = time.monotonic()
        driver = AsyncDriver({
            EnvReset: self._env_reset, EnvStep: self._env_step, EnvClose: self._env_close_keep,
            Generate: self._generate, ComputeReward: self._reward, TrainStep: self._train,
            BroadcastWeights: self._broadcast, PublishWeights: self._publish, UpdateWeights: self._update,
        })
        self.driver = driver
        main = driver.spawn(self.ctl.main())
        error = None
        while not main.done():
            await asyncio.sleep(0.05)
            # first: a Ctrl-C reaches Ray's own processes too (same process group), whose
            # failures then follow; the interruption is the cause
            if self.interrupted is not None:  # SIGINT/SIGTERM: stop here, the finished steps are kept
                error = (f"interrupted by {signal.Signals(self.interrupted).name} after "
                         f"{len(self.ctl.stats.steps)} finished steps")
                break
            if driver.failures:  # a process raised: stop the run with its message
                error = _describe(driver.failures[0])
                break
        if main.done() and not main.cancelled() and main.exception() is not None:
            error = _describe(main.exception())
        self.ctl.finished = True  # stopping: no env manager that closes now starts another trajectory
        await driver.cancel_all()
        self.counters.host_cpu_s = await self._host_cpu_s() - cpu0
        self.counters.host_cpu_wall_s = time.monotonic() - cpu_t0
        return error

    async def _idle_cores(self, seconds: float = 0.5) -> float:
        """Cores the driver and env workers use with nothing to do, over ``seconds`` of the same
        50 ms poll the run's driver keeps up."""
        cpu0, t0 = await self._host_cpu_s(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            await asyncio.sleep(0.05)
        return max(0.0, (await self._host_cpu_s() - cpu0) / (time.monotonic() - t0))

    async def _host_cpu_s(self) -> float:
        """CPU seconds used so far by this driver process and the env worker processes: the
        per-effect work besides the engines and the trainer (what ``rollart validate`` prices)."""
        try:
            envs = await asyncio.gather(*(w.cpu_seconds.remote() for w in self.env_workers))
        except Exception:  # noqa: BLE001 - a dead env worker: count the driver alone
            envs = []
        return time.process_time() + sum(envs)

    async def _env_close_keep(self, eff: EnvClose) -> None:
        """Close the env; keep the conversation until the trainer has used the trajectory."""
        conv = self.conv.pop(eff.traj.id, None)
        if conv is not None and eff.traj.state.value in ("scored", "used"):
            self.finished[eff.traj.id] = conv
        await self._env_close(eff)

    def run(self, on_outcome: Callable[["RuntimeOutcome"], None] | None = None) -> "RuntimeOutcome":
        """Set up, run, tear down. ``on_outcome`` gets the outcome before the tear-down, so the
        caller writes the finished steps before anything that could hang or be killed."""
        self.finished: dict[int, Conversation] = {}
        self.interrupted = None
        previous = self._catch_signals()
        try:
            self.setup()
            self._catch_signals()  # again: connecting to Ray installs its own (fatal) SIGTERM handler
            if self.interrupted is None:
                error = asyncio.run(self._main())
                stats = self._worker_stats() if not self.hurry else []
            else:
                error, stats = f"interrupted by {signal.Signals(self.interrupted).name} during set-up", []
            outcome = RuntimeOutcome(self, error, stats)
            if on_outcome is not None:
                on_outcome(outcome)
        finally:
            self.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        return outcome

    def _catch_signals(self) -> dict[int, Any]:
        """SIGINT/SIGTERM ask the run to stop at the next safe point (the driver's poll: the
        finished steps are kept, written and reported). A second one skips the graceful
        tear-down (Ray's processes are killed); only a third interrupts at once. Raising at the
        second could land inside Ray's shutdown or a lock it needs, and hang it."""
        def handler(signum: int, frame: Any) -> None:
            if self.interrupted is None:
                self.interrupted = signum
            elif not self.hurry:
                self.hurry = True
            else:
                raise KeyboardInterrupt

        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
        return previous

    def _worker_stats(self) -> list[dict[str, Any]]:
        import ray

        out = []
        for w in self.workers:
            try:
                st = ray.get(w.stats.remote(), timeout=30)
                if self.record_engine_steps:
                    st["request_log"] = ray.get(w.request_log.remote(), timeout=30)
                    st["step_log"] = ray.get(w.record_steps.remote(False), timeout=30)
                out.append(st)
            except Exception:  # noqa: BLE001 - a worker that died at the very end has no stats
                out.append({})
        return out


def _worker_died(exc: BaseException) -> bool:
    return type(exc).__name__ in ("RayActorError", "ActorDiedError", "ActorUnavailableError")


def _describe(exc: BaseException) -> str:
    """One line for the report: the message, and where it was raised unless it is a RunAborted."""
    if isinstance(exc, RunAborted):
        return str(exc)
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    text = str(exc)
    if _worker_died(exc):  # Ray's paragraph (with its OOM guess): its first line says which actor died
        text = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {text}{where}"


class RuntimeOutcome:
    def __init__(self, backend: RuntimeBackend, error: str | None, worker_stats: list[dict[str, Any]]):
        self.backend, self.error, self.worker_stats = backend, error, worker_stats
        self.elapsed_s = backend.now()

    def to_result(self):  # noqa: ANN201
        from rollart.report import RunResult, summary_from_steps, task_share_summary, waste_summary

        b = self.backend
        ctl = b.ctl
        steps = ctl.stats.steps
        elapsed = steps[-1].end_s if steps else self.elapsed_s
        counts = ctl.outcome_counts()
        busy: dict[str, float] = {}
        n: dict[str, int] = {}
        rows: dict[str, list[int]] = {}  # per pool: [sequences its engines' steps decoded, those steps]
        for w, s in zip(ctl.proxy.workers, self.worker_stats):
            busy[w.pool] = busy.get(w.pool, 0.0) + min(1.0, s.get("busy_seconds", 0.0) / max(elapsed, 1e-9)) * w.tp
            n[w.pool] = n.get(w.pool, 0) + w.tp
            if "decode_rows" in s and w.role != "prefill":  # PD prefill workers decode nothing
                r = rows.setdefault(w.pool, [0, 0])
                r[0], r[1] = r[0] + s["decode_rows"], r[1] + s.get("steps", 0)
        # the trainer's devices count on their pool as the simulator counts them: busy while
        # training or broadcasting weights
        tr = b.plan.placement.trainer
        trainer_s = sum(m.get("time_s", 0.0) for m in b.counters.train_metrics) + b.counters.broadcast_s
        busy[tr.pool] = busy.get(tr.pool, 0.0) + min(1.0, trainer_s / max(elapsed, 1e-9)) * tr.gpus
        n[tr.pool] = n.get(tr.pool, 0) + tr.gpus
        effects = b.driver.effects_handled if hasattr(b, "driver") else 0
        summary: dict[str, Any] = summary_from_steps(steps, b.mode.alpha)
        summary.update(task_share_summary(b.plan, steps, ctl.stats, b.mode))
        summary.update(waste_summary(ctl.stats, ctl.discarded_tokens()))
        summary.update({
            "tokens_per_s": ctl.stats.generated_tokens / elapsed if elapsed else 0.0,
            "gpu_busy_fraction": {p: busy[p] / n[p] for p in busy},
            "decode_batch_mean": {p: r / k for p, (r, k) in rows.items() if k},
            "reward_gpu_busy_fraction": None,
            "reward_gpu_busy_steady_fraction": None,
            "aborted_stale": counts["aborted_stale"],
            "aborted_redundant": counts["aborted_redundant"],
            "env_failures": ctl.stats.env_failures,
            "env_call_errors": ctl.stats.env_errors,
            "trajectories": counts,
            "reward_calls": b.counters.reward_calls,
            "reward_failures": b.counters.reward_failures,
            "env_worker_deaths": b.counters.env_worker_deaths,
            "interrupted": signal.Signals(b.interrupted).name if getattr(b, "interrupted", None) else None,
            "mean_generate_s": b.counters.generate_seconds / max(1, b.counters.generate_calls),
            "generate_reissued": b.counters.reissued,
            "mean_reward_call_s": b.counters.reward_seconds / max(1, b.counters.reward_calls),
            "weight_transfer_s_mean": (sum(b.counters.weight_publish_s) / len(b.counters.weight_publish_s)
                                       if b.counters.weight_publish_s else 0.0),
            "train": b.counters.train_metrics,
            "weight_sync": weight_sync_summary(b.plan, b.mode),
            "unused_settings": unused_settings(b.plan, b.mode) + simulator_only_settings(b.plan),
            "routed_fallback": ctl.proxy.routed_fallback,
            "routed_preferred": ctl.proxy.routed_preferred,
            "routed_fallback_from": dict(ctl.proxy.fallback_from),
            "resource_fallbacks": b.resources.fallbacks if hasattr(b, "resources") else 0,
            "steps_done": len(steps),
            "wall_s": self.elapsed_s,
            "effects": effects,
            "env_call_overhead_s": {k: sum(v) / len(v) if v else 0.0 for k, v in b.counters.env_overhead_s.items()},
            # per effect, beyond what the same processes burn idle (the idle rate is measured only
            # when engine steps are recorded, as rollart validate does; otherwise it counts all CPU)
            "host_cpu_per_effect_s": max(0.0, b.counters.host_cpu_s
                                         - b.counters.host_idle_cores * b.counters.host_cpu_wall_s)
                                     / effects if effects else 0.0,
            "host_idle_cores": b.counters.host_idle_cores,
            "engine_steps": [{"worker": w.id, "pool": w.pool, "steps": st.get("steps", 0),
                              "busy_s": st.get("busy_seconds", 0.0), "node": st.get("node_id")}
                             for w, st in zip(ctl.proxy.workers, self.worker_stats)],
            "cluster_nodes": getattr(b, "cluster_nodes", {}),
            "head_services_node": getattr(b, "head_node", None),  # where Redis (and a Mooncake master) ran
            "weight_store": getattr(b, "store_note", None),
        })
        return RunResult(scenario=b.plan.name, mode=b.mode.name, seed=b.seed, backend="runtime", steps=steps,
                         summary=summary, calibration={"engine": b.plan.runtime.engine, "model": b.model.name},
                         error=self.error)
