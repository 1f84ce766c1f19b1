"""``rank_evaluations``, throughput objective: throughputs within ``THROUGHPUT_TIE`` of each other tie
at every position of the list, not only at first place. The list is a sequence of blocks: each led by
the best throughput not yet listed, holding every plan not yet listed within ``THROUGHPUT_TIE`` of that
leader, cheapest per 1k trajectories first (then throughput, then label)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from rollart.planner import Budget
from rollart.planner.search import THROUGHPUT_TIE, Evaluation, rank_evaluations


class _Label:
    def __init__(self, text: str):
        self.text = text

    def label(self) -> str:
        return self.text


def ev(tps: float, c1k: float | None, label: str = "") -> Evaluation:
    return Evaluation(_Label(label), 4, {"summary": {"trajectories_per_s": tps, "cost_per_1k_trajectories_usd": c1k,
                                                     "cost_usd_per_hour": 1.0}})


def ranked(*evs: Evaluation) -> list[Evaluation]:
    return rank_evaluations(list(evs), "throughput", Budget(gpus=16))


def _tps(e: Evaluation) -> float:
    return e.record["summary"]["trajectories_per_s"]


def _cost_key(e: Evaluation) -> tuple[float, float, str]:
    c1k = e.record["summary"]["cost_per_1k_trajectories_usd"]
    return (math.inf if c1k is None else c1k, -_tps(e), e.candidate.label())


def blocks(out: list[Evaluation]) -> list[list[Evaluation]]:
    """Split a ranking into its tie blocks, asserting the invariant on the way: from each position, the
    plans within THROUGHPUT_TIE of the best remaining throughput are exactly the next ones, cost-sorted."""
    found, i = [], 0
    while i < len(out):
        leader = max(_tps(e) for e in out[i:])
        tied = [j for j in range(i, len(out)) if _tps(out[j]) >= leader / (1 + THROUGHPUT_TIE)]
        assert tied == list(range(i, i + len(tied)))  # the ties come next, none of them later
        block = out[i:i + len(tied)]
        assert [_cost_key(e) for e in block] == sorted(_cost_key(e) for e in block)
        found.append(block)
        i += len(tied)
    return found


def test_the_tie_break_holds_below_first_place():
    # `rollart plan`'s list: #2 (2.454 traj/s, $5.01/1k) sat above #3 (2.453, $4.74), a 0.04 % tie
    best, dear, cheap, slow = ev(2.60, 6.0, "a"), ev(2.454, 5.01, "b"), ev(2.453, 4.74, "c"), ev(2.2, 1.0, "d")
    assert ranked(dear, slow, cheap, best) == [best, cheap, dear, slow]
    assert [len(b) for b in blocks([best, cheap, dear, slow])] == [1, 2, 1]


def test_a_block_is_anchored_at_its_leader_not_chained():
    # 2.00 ties 1.985 (0.76 %), which ties 1.97 (0.76 %), but 1.97 is 1.5 % below 2.00: the next block
    a, b, c = ev(2.00, 9.0, "a"), ev(1.985, 8.0, "b"), ev(1.97, 1.0, "c")
    assert ranked(a, b, c) == [b, a, c]


_plans = st.lists(st.tuples(st.floats(0.5, 3.0), st.one_of(st.none(), st.floats(0.1, 50.0)),
                            st.sampled_from("pqrs")), max_size=14)


@settings(max_examples=300, deadline=None)
@given(_plans)
def test_every_position_keeps_the_tie_rule(plans):
    evs = [ev(t, c, label) for t, c, label in plans]
    out = ranked(*evs)
    assert sorted(map(id, out)) == sorted(map(id, evs))  # every plan once
    found = blocks(out)
    for k, block in enumerate(found):
        leader = max(_tps(e) for e in block)
        # every plan of a later block is more than THROUGHPUT_TIE below this block's leader
        assert all(_tps(e) < leader / (1 + THROUGHPUT_TIE) for later in found[k + 1:] for e in later)
    # so no plan is followed by one more than THROUGHPUT_TIE faster
    assert all(_tps(a) >= _tps(b) / (1 + THROUGHPUT_TIE) for a, b in zip(out, out[1:]))
    assert out == ranked(*reversed(evs)) or len({(_tps(e), _cost_key(e)) for e in evs}) < len(evs)
