"""A rollout held back until the workers serve newer weights is weight sync on the critical path, not
idle time: a slow asynchronous publish (tiny store buckets) shows where a buyer can see it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rollart.core.stats import awaited_on_path
from tests.conftest import run_sim, small_plan


def _brute(segments, start, end, awaited, now, n=4000) -> float:
    dt = (end - start) / n
    total = 0.0
    for i in range(n):
        t = start + (i + 0.5) * dt
        gap = not any(s <= t < e for s, e, _ in segments)
        held = any(a <= t < (now if b is None else b) for a, b in awaited)
        total += dt if gap and held else 0.0
    return total


intervals = st.lists(st.tuples(st.floats(0, 100), st.floats(0, 30)), max_size=6)


@given(intervals, intervals, st.booleans())
def test_only_the_paths_gaps_inside_an_awaited_span_count(segs, spans, open_last) -> None:
    segments = sorted((a, a + d, "generation") for a, d in segs)
    merged: list[tuple[float, float, str]] = []  # a trajectory's segments do not overlap
    for s, e, c in segments:
        if merged and s < merged[-1][1]:
            s = merged[-1][1]
        if e > s:
            merged.append((s, e, c))
    awaited = [[a, a + d] for a, d in sorted(spans)]
    flat: list[list[float | None]] = []
    for a, b in awaited:  # spans follow one another
        if flat and a < flat[-1][1]:
            a = flat[-1][1]
        if b > a:
            flat.append([a, b])
    if flat and open_last:
        flat[-1][1] = None
    got = awaited_on_path(merged, 10.0, 90.0, flat, 95.0)
    assert 0.0 <= got <= 80.0 + 1e-9
    assert abs(got - _brute(merged, 10.0, 90.0, flat, 95.0)) <= 0.2


def test_a_slow_publish_shows_as_weight_sync_not_idle() -> None:
    base = ["algorithm.steps=4", "algorithm.batch_size=32"]
    slow = run_sim(small_plan([*base, "weight_sync.bucket_mb=0.5"]), "rollart").to_result()
    fast = run_sim(small_plan(base), "rollart").to_result()
    mean = lambda r, k: r.summary["breakdown_s_mean"][k]  # noqa: E731
    assert mean(slow, "weight_sync") > 5 * max(mean(fast, "weight_sync"), 0.1)
    assert mean(slow, "idle") < mean(slow, "weight_sync")
    for s in slow.steps:  # still a partition of the step
        assert abs(sum(s.breakdown_s.values()) - s.time_s) < 1e-6 and min(s.breakdown_s.values()) >= -1e-9


def test_a_batch_admitted_late_for_the_weights_counts_its_lost_head_start_as_weight_sync() -> None:
    """A review's what-if: 16 MB store buckets (~980 of them, each paying the store's per-bucket cost)
    make the asynchronous publish ~24 s. The next batch's envs are held at admission until the workers
    serve the new weights; once admitted they generate without a gap, so the step's critical path showed
    all generation and no sync. The trajectory would have started as much earlier as it was held: that
    much of its path in the step is weight sync, and no more than it was held (beside the exposed swap)."""
    base = ["algorithm.steps=6", "weight_sync.transport=bucketed_store"]
    slow = run_sim(small_plan([*base, "weight_sync.bucket_mb=16"]), "rollart")
    fast = run_sim(small_plan([*base, "weight_sync.bucket_mb=512"]), "rollart")
    held = max(b - a for t in slow.backend.ctl.trajectories if t.held_for_weights for a, b in [t.held_for_weights])
    slow_r, fast_r = slow.to_result(), fast.to_result()
    sync = [s.breakdown_s["weight_sync"] for s in slow_r.steps[2:]]
    assert max(sync) > 15 and sum(sync) > 3 * sum(s.breakdown_s["weight_sync"] for s in fast_r.steps[2:])
    assert max(sync) <= held + 1.0  # what it was held, plus the swap each update exposes (under a second)
    for s in slow_r.steps:  # still a partition of the step
        assert abs(sum(s.breakdown_s.values()) - s.time_s) < 1e-6 and min(s.breakdown_s.values()) >= -1e-9


def test_a_held_span_inside_the_window_is_counted_once() -> None:
    """The critical path's gaps inside the step's window that fall in an awaited span are already weight
    sync (awaited_on_path); only the part of its admission's wait before the window moves time from its
    path: a span [0, 20] inside a window [0, 100] adds nothing more, one of [-30, 20] adds 30 s."""
    from rollart.core.controller import _move_to_weight_sync

    segments = [(20.0, 100.0, "generation")]
    inside = {"generation": 80.0, "weight_sync": awaited_on_path(segments, 0.0, 100.0, [[0.0, 20.0]], 100.0)}
    assert inside == {"generation": 80.0, "weight_sync": 20.0}
    held_from, held_to, wait_start = -30.0, 20.0, 0.0
    before = max(0.0, min(held_to, wait_start) - held_from)
    _move_to_weight_sync(inside, segments, wait_start, 100.0, before)
    assert inside == {"generation": 50.0, "weight_sync": 50.0}


def test_a_blocking_broadcast_is_counted_once_across_steps() -> None:
    """ROLLART with a blocking NCCL broadcast over a 10 Gb/s link: each step's weight sync is the trainer's own
    broadcast (21.9 s here). A trajectory held for those weights and critical in the next step had its hold
    counted again there: steps read 43.8 s, twice the broadcast, so the column overstated what a faster link
    would save (36 s predicted against 25.8 s measured, helper-88)."""
    plan = small_plan(["algorithm.steps=6", "weight_sync.transport=nccl_broadcast",
                       "cluster.links.cross_cluster.bandwidth_gbps=10"])
    out = run_sim(plan, "rollart")
    steps = out.to_result().steps
    broadcast = steps[1].breakdown_s["weight_sync"]
    assert broadcast > 15
    assert any(t.held_for_weights for t in out.backend.ctl.trajectories)  # the case the rule is about
    for s in steps[1:]:
        assert s.breakdown_s["weight_sync"] <= broadcast * 1.05, (s.step, s.breakdown_s)
        assert abs(sum(s.breakdown_s.values()) - s.time_s) < 1e-6


def test_the_weight_sync_line_says_what_a_store_bucket_costs_and_where_that_is_from() -> None:
    """At small buckets the store's per-bucket cost, not the link, sets the transfer (16 MB buckets over TCP
    cost 18 % of throughput, all of it the 24 ms a bucket measured on a 2-core loopback host: helper-88).
    The run says the figure and its origin; a plan that states its store's says so; a broadcast says none."""
    measured = run_sim(small_plan(), "rollart").to_result().summary["weight_sync"]
    assert "ms publish (Mooncake TCP, measured on a 2-core loopback host)" in measured
    assert "weight_sync.bucket_overhead_s sets yours" in measured
    own = run_sim(small_plan(["weight_sync.bucket_overhead_s=0.002"]), "rollart").to_result().summary["weight_sync"]
    assert "2 ms publish (the plan's), 2 ms pull (the plan's)" in own and "loopback" not in own
    assert "ms publish" not in run_sim(small_plan(), "areal").to_result().summary["weight_sync"]
