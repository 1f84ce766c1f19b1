"""Decode work thrown away by aborts: the tokens an engine decoded for a turn cut short (a redundant or
stale trajectory) are counted as wasted (summary ``wasted_tokens``), apart from ``tokens_per_s``."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart.core import mode_config
from rollart.core.effects import Aborted
from rollart.core.env_manager import _count_wasted
from rollart.core.stats import RunStats
from rollart.core.trajectory import TrajState
from rollart.plan import load_plan
from rollart.report import waste_summary
from rollart.sim.backend import SimBackend

# one single-turn task with a long response tail, so a group's surplus members are cut mid-decode
SCENARIO = """
name: waste-single-turn
cluster:
  gpu_pools:
    h800: {gpu: H800, count: 16, cluster: train}
  cpu_pools:
    env: {cores: 512}
model: Qwen3-8B
tasks:
  - name: LT
    share: 1.0
    turns: 1
    prompt_tokens: 500
    obs_tokens: 50
    response_tokens: {kind: lognormal, median: 1500, sigma: 0.9, max: 30000}
    max_context_tokens: 32768
    env: {reset: 0.1, step: 0.05}
placement:
  trainer: {pool: h800, gpus: 8, tp: 2}
  generation:
    - {pool: h800, workers: 8, tp: 1}
algorithm: {batch_size: 64, group_size: 8, alpha: 1, redundancy: 0.25, steps: 3, mode: rollart, seed: 0}
"""


def _run(tmp_path: Path):
    path = tmp_path / "waste.yaml"
    path.write_text(SCENARIO)
    plan = load_plan(path)
    requests: list = []
    backend = SimBackend(plan, mode_config(plan), 0)
    engine_cls = type(backend.engines[0])  # the class the backend built (its module, however imported)
    add = engine_cls.add

    def recording_add(self, *a, **k):
        req = add(self, *a, **k)
        requests.append(req)
        return req

    engine_cls.add = recording_add
    try:
        out = backend.run()
    finally:
        engine_cls.add = add
    return out, requests


def test_engines_account_for_what_aborted_requests_decoded(tmp_path: Path) -> None:
    out, requests = _run(tmp_path)
    engines = out.backend.engines
    aborted = [r for r in requests if r.aborted]
    assert out.to_result().summary["aborted_redundant"] > 0 and aborted
    wasted = sum(e.aborted_decoded_tokens for e in engines)
    assert wasted > 0 and wasted == sum(r.wasted for r in aborted)
    assert sum(e.aborted_requests for e in engines) == sum(1 for r in aborted if r.wasted)
    # a cut request decoded at most what it was asked for (all of it when cut during its last iteration)
    assert all(0 <= r.wasted <= r.tokens for r in aborted if not r.done.triggered)


def test_wasted_tokens_close_the_decode_books(tmp_path: Path) -> None:
    """counted (returned turns) + wasted (cut turns) = every token the engines decoded."""
    out, requests = _run(tmp_path)
    sm = out.to_result().summary
    assert sm["wasted_tokens"] is not None  # the simulator knows what a cut request decoded
    ctl = out.backend.ctl
    engines_decoded = sum(r.tokens for r in requests if r.done.triggered and not r.aborted) \
        + sum(e.aborted_decoded_tokens for e in out.backend.engines)
    assert sm["wasted_tokens"] > 0
    assert ctl.stats.generated_tokens + sm["wasted_tokens"] == engines_decoded
    # one turn a trajectory: an aborted one returned nothing before its cut turn
    assert sm["discarded_tokens"] == 0
    assert sm["wasted_token_share"] == pytest.approx(sm["wasted_tokens"] / engines_decoded)


@pytest.mark.parametrize("keep_history", [True, False])
def test_the_finished_turns_of_untrained_trajectories_are_wasted_too(keep_history: bool) -> None:
    """Multi-turn tasks: a redundant trajectory aborted at its fifth turn threw its first four away as well
    (helper-83: the default scenario's line said 6 % of decoded tokens where 25 % was discarded). Counted
    the same whether the run keeps its trajectories or forgets them as they end."""
    from tests.conftest import small_plan

    plan = small_plan(["algorithm.steps=4"])
    backend = SimBackend(plan, mode_config(plan), 0, keep_history=keep_history)
    sm = backend.run().to_result().summary
    kept = backend if keep_history else SimBackend(plan, mode_config(plan), 0, keep_history=True)
    if not keep_history:
        kept.run()
    untrained = sum(t.generated_tokens for t in kept.ctl.trajectories
                    if t.state.terminal and t.state is not TrajState.USED)
    assert sm["discarded_tokens"] == untrained > 0
    decoded = backend.ctl.stats.generated_tokens + sm["wasted_tokens"]
    assert sm["wasted_token_share"] == pytest.approx((sm["wasted_tokens"] + sm["discarded_tokens"]) / decoded)
    assert sm["discarded_tokens"] > sm["wasted_tokens"]  # here the finished turns outweigh the cut ones


def test_a_backend_that_cannot_report_partial_tokens_gives_no_number() -> None:
    class Ctl:
        stats = RunStats(generated_tokens=1000)

    ctl = Ctl()
    _count_wasted(ctl, Aborted("redundant", 250))
    assert waste_summary(ctl.stats) == {"wasted_tokens": 250, "discarded_tokens": 0, "wasted_token_share": 0.2}
    assert waste_summary(ctl.stats, 125)["wasted_token_share"] == 0.3
    _count_wasted(ctl, Aborted("redundant"))  # the Ray runtime: no partial output
    assert waste_summary(ctl.stats, 125) == {"wasted_tokens": None, "discarded_tokens": 125,
                                             "wasted_token_share": None}
    assert Aborted("x").partial_tokens is None and str(Aborted("x", 3)) == "x"


@pytest.mark.parametrize("fraction", [0.5, 0.999, 1.0])
def test_an_abort_counts_what_the_request_decoded_even_at_its_last_token(fraction: float) -> None:
    """Aborted half-way, in its last iteration or at the instant it finishes: the engine's books hold
    what the request decoded, and abort() returns the same figure."""
    import simpy

    from rollart.sim.engine import GenerationEngine
    from tests.test_engine_kv_on_demand import ToyCost

    def finish_time() -> float:
        env = simpy.Environment()
        engine = GenerationEngine(env, 0, "p", ToyCost(), 4, prefix_cache=False)
        req = engine.add(1, 100, 10)
        env.run(req.done)
        return env.now

    env = simpy.Environment()
    engine = GenerationEngine(env, 0, "p", ToyCost(), 4, prefix_cache=False)
    req = engine.add(1, 100, 10)
    returned = []

    def cut():
        yield env.timeout(finish_time() * fraction)
        returned.append(engine.abort(req))

    env.process(cut())
    env.run()
    assert engine.aborted_decoded_tokens == returned[0] == req.wasted
    assert 0 < returned[0] <= 10
    if fraction == 1.0:  # cut as it finished: all ten were decoded
        assert returned[0] == 10
    assert engine.aborted_requests == 1
