"""The LLM judge's platforms: that the judge fits its GPUs, how many GPUs a serverless instance
bills, cold starts that outlive an aborted call, and the judge's own context window."""

from __future__ import annotations

import pytest
import simpy

from rollart.calibration import generation_cost
from rollart.core import mode_config
from rollart.plan import PlanError
from rollart.plan.schema import ModelSpec, Serverless
from rollart.sim import SimBackend
from rollart.sim.reward import BatchingServerlessPlatform, ServerlessPlatform, judge_input_tokens, judge_window
from tests.conftest import run_sim, small_plan

# a 70B dense judge (Llama-3-70B's geometry): 141 GB of BF16 weights, more than one 80 GB GPU holds
JUDGE_70B = ("reward_model={name: judge-70b, layers: 80, hidden: 8192, heads: 64, kv_heads: 8, head_dim: 128, "
             "intermediate: 28672, vocab: 128256}")
PLATFORMS = [(ServerlessPlatform, {}), (BatchingServerlessPlatform, {"instance_concurrency": 8})]


def _dedicated(tp: int) -> list[str]:
    """4 dedicated judge GPUs in engines of ``tp``."""
    return ["cluster.gpu_pools.h800.count=12", f"placement.reward={{where: dedicated, pool: h800, gpus: 4, tp: {tp}}}"]


def _backend(overrides: list[str], mode: str = "rollart") -> SimBackend:
    plan = small_plan(overrides)
    return SimBackend(plan, mode_config(plan, mode), 0)


@pytest.mark.parametrize("overrides, mode, field", [
    ([JUDGE_70B], "rollart", "cluster.serverless.tp"),
    ([JUDGE_70B, "cluster.serverless.tp=2"], "rollart", "cluster.serverless.tp"),  # 15 K KV tokens on 2
    ([JUDGE_70B, *_dedicated(1)], "sync", "placement.reward.tp"),
])
def test_a_judge_too_big_for_its_gpus_is_refused_naming_the_field(overrides: list[str], mode: str, field: str) -> None:
    with pytest.raises(PlanError) as err:
        _backend(overrides, mode)
    [line] = err.value.problems
    assert line.startswith(f"{field}: the reward model judge-70b") and "\n" not in line
    assert "KV tokens" in line


def test_a_judge_that_fits_its_gpus_runs() -> None:
    assert _backend([JUDGE_70B, "cluster.serverless.tp=4"]).serverless.spec.tp == 4
    assert len(_backend([JUDGE_70B, *_dedicated(4)], "sync").judges) == 1


def _platform(cls: type, **spec: object) -> tuple[simpy.Environment, ServerlessPlatform | BatchingServerlessPlatform]:
    plan = small_plan()
    s = Serverless(**{"gpu": "H800", "cold_start_s": 10.0, "scale_down_idle_s": 30.0, **spec})
    judge = generation_cost(plan.reward_model, s.gpu, plan.cluster.gpu_type(s.gpu), s.tp)
    env = simpy.Environment()
    return env, cls(env, s, judge, 64)


def _caller(env: simpy.Environment, platform, at: float, done: dict, name: str):
    yield env.timeout(at)
    try:
        yield from platform.call(20_000)
        done[name] = env.now
    except simpy.Interrupt:
        done[name] = None


def _run(env: simpy.Environment, platform, calls: list[tuple[str, float, float | None]]) -> dict:
    """Start each (name, at, abort_at) call; return when each finished (None: aborted)."""
    done: dict = {}
    for name, at, abort_at in calls:
        proc = env.process(_caller(env, platform, at, done, name))
        if abort_at is not None:
            env.process(_abort(env, proc, abort_at))
    env.run()
    platform.close()
    return done


def _abort(env: simpy.Environment, proc, at: float):
    yield env.timeout(at)
    if proc.is_alive:
        proc.interrupt("aborted")


def test_a_serverless_instance_of_tp_gpus_bills_tp_gpu_seconds() -> None:
    for billing in ("per_request", "instance_time"):
        one, two = ((_platform(ServerlessPlatform, tp=tp, billing=billing)) for tp in (1, 2))
        for env, p in (one, two):
            _run(env, p, [("a", 0.0, None)])
            seconds = p.spec.cold_start_s + p.call_time(20_000)  # one cold start and one call
            assert p.billed_s == pytest.approx(p.spec.tp * seconds)


@pytest.mark.parametrize("cls, extra", PLATFORMS)
@pytest.mark.parametrize("billing", ["per_request", "instance_time"])
def test_a_call_aborted_during_a_cold_start_leaves_the_instance_booting(cls: type, extra: dict, billing: str) -> None:
    """10 s cold start: call A, aborted at 2 s, does not make the instance warm; call B at 3 s waits
    for it to be ready (10 s) and ends one call later, and the whole cold start is billed once."""
    env, p = _platform(cls, billing=billing, **extra)
    done = _run(env, p, [("a", 0.0, 2.0), ("b", 3.0, None)])
    call = p.call_time(20_000) if cls is ServerlessPlatform else done["b"] - 10.0
    assert done["a"] is None and p.cold_starts == 1
    assert done["b"] == pytest.approx(10.0 + call) and 1.0 < call < 1.2  # ≈ 11.1 (was 4.1)
    assert p.billed_s == pytest.approx(10.0 + call)


@pytest.mark.parametrize("cls, extra", PLATFORMS)
def test_scale_down_idle_time_counts_from_when_the_instance_is_ready(cls: type, extra: dict) -> None:
    """5 s scale-down, 10 s cold start: A aborted at 2 s; at 8 s the instance is still booting, not
    idle for 6 s, so B takes it rather than starting a second cold start."""
    env, p = _platform(cls, scale_down_idle_s=5.0, billing="instance_time", **extra)
    done = _run(env, p, [("a", 0.0, 2.0), ("b", 8.0, None)])
    assert p.cold_starts == 1 and 11.0 < done["b"] < 11.2
    assert p.billed_s == pytest.approx(done["b"])  # one instance, from 0 until B left (no idle tail at the end)


def test_the_judge_reads_up_to_its_own_models_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge cuts a trajectory at the reward model's max_context_tokens (32 K when unset)."""
    assert judge_window(ModelSpec.model_validate("Qwen2.5-7B")) == 32768
    small = ModelSpec.model_validate({"preset": "Qwen2.5-7B", "max_context_tokens": 8192})
    assert judge_window(small) == 8192 and judge_input_tokens(20_000, judge_window(small)) == 8192
    seen: list[int] = []
    call = ServerlessPlatform.call
    monkeypatch.setattr(ServerlessPlatform, "call", lambda self, n: (seen.append(n), call(self, n))[1])
    judged = ["tasks.GEM-Math.prompt_tokens=3000"]  # every judged trajectory is longer than the window
    run_sim(small_plan([*judged, "reward_model={preset: Qwen2.5-7B, max_context_tokens: 2048}"]), "rollart")
    assert seen and set(seen) == {2048 - 64}  # the window holds the 64-token verdict too


def test_a_judge_call_fits_its_window_with_its_verdict() -> None:
    """vLLM refuses a prompt whose tokens plus max_tokens pass max_model_len: the trajectory is cut so the
    judge's window still holds the verdict's output_tokens."""
    assert judge_input_tokens(50_000, 32_768, 64) == 32_768 - 64
    assert judge_input_tokens(1_000, 32_768, 64) == 1_000
    assert judge_input_tokens(10, 8, 64) == 1  # never an empty prompt
