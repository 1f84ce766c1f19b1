"""The closed-form continuous-batching engine against a brute-force per-iteration reference."""

from __future__ import annotations

import heapq

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from rollart.plan.schema import ModelSpec
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType
from rollart.sim.costs.gpu import RooflineGeneration
from rollart.sim.engine import GenerationEngine
from tests.test_engine_kv_on_demand import ToyCost
from tests.test_engine_kv_on_demand import reference as on_demand_reference


def reference(cost: ToyCost, arrivals: list[tuple[float, int, int]], max_num_seqs: int) -> list[float]:
    """Iteration by iteration with on-demand KV and preemption by recompute (the rules are stated in
    tests/test_engine_kv_on_demand.py, which tests them under KV pressure)."""
    return on_demand_reference(cost, arrivals, max_num_seqs)[0]


def simulate(cost: ToyCost, arrivals: list[tuple[float, int, int]], max_num_seqs: int) -> list[float]:
    env = simpy.Environment()
    engine = GenerationEngine(env, 0, "p", cost, max_num_seqs, prefix_cache=False)
    finished: dict[int, float] = {}

    def client(i: int, at: float, ctx: int, n: int):
        yield env.timeout(at)
        req = engine.add(i, ctx, n)
        yield req.done
        finished[i] = env.now

    for i, (at, ctx, n) in enumerate(arrivals):
        env.process(client(i, at, ctx, n))
    env.run()
    return [finished[i] for i in range(len(arrivals))]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 2.0), st.integers(10, 2000), st.integers(1, 300)), min_size=1, max_size=7),
       st.integers(1, 4))
def test_engine_matches_per_iteration_reference(arrivals, max_num_seqs) -> None:
    cost = ToyCost()
    got = simulate(cost, arrivals, max_num_seqs)
    want = reference(cost, arrivals, max_num_seqs)
    for g, w in zip(got, want):
        assert abs(g - w) <= 1e-6 * max(1.0, w), (got, want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.03), st.integers(10, 2000), st.integers(1, 300)), min_size=2, max_size=12),
       st.integers(1, 6))
def test_requests_arriving_within_one_iteration_join_at_its_end_as_the_reference(arrivals, max_num_seqs) -> None:
    """Bursts: several requests land inside one iteration of a busy engine (a few ms), which joins
    them all at that iteration's end (one wake-up, the plan in progress untouched)."""
    cost = ToyCost()
    got = simulate(cost, arrivals, max_num_seqs)
    want = reference(cost, arrivals, max_num_seqs)
    for g, w in zip(got, want):
        assert abs(g - w) <= 1e-6 * max(1.0, w), (got, want)


def test_a_busy_engine_wakes_once_per_iteration_however_many_requests_arrive() -> None:
    """Five requests arriving during one decode iteration of a running request cost one wake-up at its
    end, not a re-plan and a timer each."""
    cost = ToyCost()
    env = simpy.Environment()
    engine = GenerationEngine(env, 0, "p", cost, 8, prefix_cache=False)
    engine.add(0, 100, 200)
    env.run(until=0.05)  # the first request is decoding; its iterations last ~4 ms
    t_in, plan = env.now, engine._plan
    wakeups = set()
    for i in range(1, 6):
        env.run(until=t_in + 0.0002 * i)  # all inside the iteration in progress
        engine.add(i, 50, 10)
        wakeups.add(id(engine._boundary[2]))
        assert engine._plan is plan  # not re-planned
    assert len(wakeups) == 1 and len(engine.waiting) == 5
    env.run(until=engine._boundary[0] + 1e-9)
    assert len(engine.running) == 6 and not engine.waiting


def test_engine_steps_are_counted_up_to_any_time_however_requests_arrived() -> None:
    """The engine-step count a summary reports is the steps finished by then: settled ones and the
    plan in progress's, the same whether or not a request arrived mid-plan."""
    cost = ToyCost()
    counts = []
    for burst in (False, True):
        env = simpy.Environment()
        engine = GenerationEngine(env, 0, "p", cost, 8, prefix_cache=False)
        engine.add(0, 100, 300)
        if burst:
            env.run(until=0.2)
            engine.add(1, 50, 1000)  # joins at the end of the iteration in progress
        env.run(until=0.4)
        counts.append(engine.iterations_until(env.now))
        assert engine.iterations_until(env.now) >= engine.it
        assert engine.iterations_until(0.1) <= engine.iterations_until(env.now)
    # one request alone: its mixed step plus every decode iteration finished by 0.4 s
    it, t = 1, cost.mixed_step_time(100, 100 * 50, 0, 0)
    while t + cost.decode_line(1).total(101 + it - 1, 1, 1) <= 0.4:
        t += cost.decode_line(1).total(101 + it - 1, 1, 1)
        it += 1
    assert counts[0] == it


def test_single_request_time_is_prefill_plus_decode() -> None:
    model = ModelSpec.model_validate("Qwen3-8B")
    cost = RooflineGeneration(model, GpuType(**GPU_PRESETS["H800"]), tp=1)
    got = simulate(cost, [(0.0, 1000, 100)], 256)[0]
    want = cost.mixed_step_time(1000, 1000 * 500, 0, 0) + cost.decode_line(1).total(1001, 1, 99)
    assert cost.mixed_step_time(1000, 1000 * 500, 0, 0) == cost.prefill_time(1000, 1000 * 500)
    assert abs(got - want) < 1e-9
    # Decode of a lone 8B request on H800 is bandwidth-bound: ~16 GB / (3.35 TB/s · 0.8) ≈ 6 ms + overhead.
    assert 0.008 < cost.decode_line(1).total(1001, 1, 1) < 0.012
    # A mixed step pays one overhead and one weight read: cheaper than prefill + decode apart.
    mixed = cost.mixed_step_time(500, 500 * 250, 32, 32 * 2000)
    apart = cost.prefill_time(500, 500 * 250) + cost.decode_line(32).total(32 * 2000, 32, 1)
    assert cost.prefill_time(500, 500 * 250) < mixed < apart


def test_calls_handled_in_process_cost_the_next_iteration_once() -> None:
    """``call_step_s``: the first iteration after a call arrived at a busy engine, or a result
    went back, pays it once; an idle engine loses nothing to a call."""

    class CallCost(ToyCost):
        call_step_s = 0.004

    g = CallCost.call_step_s
    # arrivals at an idle engine and the last return cost nothing
    assert simulate(CallCost(), [(0.0, 100, 10)] * 4, 8) == pytest.approx(simulate(ToyCost(), [(0.0, 100, 10)] * 4, 8))
    # the short request's return lands in the long one's next decode step: that step pays it
    base = simulate(ToyCost(), [(0.0, 100, 2), (0.0, 100, 6)], 8)
    got = simulate(CallCost(), [(0.0, 100, 2), (0.0, 100, 6)], 8)
    assert got == pytest.approx([base[0], base[1] + g], abs=1e-12)
    # a call arriving while the engine decodes: its admission step pays, then its return does
    base = simulate(ToyCost(), [(0.0, 100, 40), (0.01, 100, 2)], 8)
    got = simulate(CallCost(), [(0.0, 100, 40), (0.01, 100, 2)], 8)
    assert got[1] == pytest.approx(base[1] + g, abs=1e-9)
    assert got[0] == pytest.approx(base[0] + 2 * g, abs=1e-9)


def test_prefix_cache_reuses_the_previous_turn() -> None:
    env = simpy.Environment()
    engine = GenerationEngine(env, 0, "p", ToyCost(capacity=100_000), 8, prefix_cache=True)

    def conversation():
        r = engine.add(7, 1000, 100)
        yield r.done
        r = engine.add(7, 1100 + 200, 50)  # history + 200 new observation tokens
        yield r.done

    env.process(conversation())
    env.run()
    assert engine.cache_hits_tokens == 1100
    assert engine.prefill_tokens == 1000 + 200


def test_a_pd_decode_request_does_not_count_its_cached_prefix_twice() -> None:
    # turn 1 leaves the conversation's 1,100 tokens cached; turn 2's KV arrives from a prefill
    # worker (prefilled=True): while it decodes, its KV is the running request's reservation, and
    # the old cached copy is no longer separately held
    env = simpy.Environment()
    engine = GenerationEngine(env, 0, "p", ToyCost(capacity=100_000), 8, prefix_cache=True)
    seen: list[int] = []

    def conversation():
        r = engine.add(7, 1000, 100)
        yield r.done
        assert engine.cache_tokens == 1100
        r = engine.add(7, 1300, 50, prefilled=True)
        yield env.timeout(1e-6)  # admitted, decoding
        seen.append(engine.cache_tokens)
        yield r.done

    env.process(conversation())
    env.run()
    assert seen == [0]
    assert engine.prefill_tokens == 1000 and engine.cache_tokens == 1350  # cached again when it ends


def test_abort_frees_the_batch_and_never_completes() -> None:
    env = simpy.Environment()
    engine = GenerationEngine(env, 0, "p", ToyCost(), 8, prefix_cache=False)
    out = {}

    def victim():
        r = engine.add(1, 100, 10_000)
        out["req"] = r
        yield env.timeout(1.0)
        engine.abort(r)

    def other():
        yield env.timeout(0.5)
        r = engine.add(2, 100, 200)
        yield r.done
        out["other"] = env.now

    env.process(victim())
    env.process(other())
    env.run(until=50)
    assert not out["req"].done.triggered
    assert not engine.running and engine.ctx_sum == 0
    assert out["other"] > 0.5


def test_kv_capacity_makes_requests_wait() -> None:
    cost = ToyCost(capacity=1500)
    solo = simulate(cost, [(0.0, 1000, 100)], 8)[0]
    both = simulate(cost, [(0.0, 1000, 100), (0.0, 1000, 100)], 8)
    assert abs(both[0] - solo) < 1e-9          # the first runs alone
    assert both[1] > solo                      # the second waits for its KV


def test_weight_update_pauses_and_recomputes_kv() -> None:
    env = simpy.Environment()
    cost = ToyCost(capacity=100_000)
    engine = GenerationEngine(env, 0, "p", cost, 8, prefix_cache=True)
    out = {}

    def client():
        r = engine.add(1, 1000, 400)
        yield r.done
        out["done"] = env.now

    def updater():
        yield env.timeout(0.3)
        yield engine.update_weights(swap_s=0.5)
        out["updated"] = env.now

    env.process(client())
    env.process(updater())
    env.run()
    baseline = simulate(cost, [(0.0, 1000, 400)], 8)[0]
    assert out["updated"] > 0.8                     # swap plus recompute after 0.3 s
    assert out["done"] > baseline + 0.5             # the request lost the swap and the recompute
    assert engine.cache_tokens == 1000 + 400 and list(engine.cache) == [1]
