"""A decode line held between others (``EnvelopeLine``): what a custom GPU type's decode iteration costs
when measured presets bound it. Each iteration costs ``min(max_j H_j(x), min_i F_i(x))`` at its context
``x``: never more than any floor's line, never less than every ceiling's unless a floor says so. The
coefficient-wise bound it replaced took the fixed time from one line and the per-token slope from another,
and priced an H20 with 0.1 % more HBM bandwidth 21 % below the H20 itself (DeepSeek-V3, FP8, tp 8)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rollart.calibration import generation_cost
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, ModelSpec
from rollart.sim.costs.gpu import DecodeLine, EnvelopeLine

COEF = st.floats(min_value=0.0, max_value=0.05, allow_nan=False)
SLOPE = st.floats(min_value=0.0, max_value=1e-6, allow_nan=False)
LINE = st.builds(DecodeLine, a=COEF, c0=COEF, c1=SLOPE, m0=COEF, m1=SLOPE)


def _iteration(line: DecodeLine, x: float) -> float:
    return line.a + max(line.c0 + line.c1 * x, line.m0 + line.m1 * x)


def _bounded(high: list[DecodeLine], low: list[DecodeLine], x: float) -> float:
    return min([max((_iteration(h, x) for h in high), default=float("inf")), *(_iteration(f, x) for f in low)])


@settings(max_examples=200, deadline=None)
@given(high=st.lists(LINE, min_size=1, max_size=3), low=st.lists(LINE, max_size=3),
       x0=st.floats(min_value=0.0, max_value=2e5), batch=st.integers(1, 256), k=st.integers(1, 400))
def test_every_iteration_costs_the_envelope_at_its_context(high, low, x0, batch, k):
    env = EnvelopeLine.between(high, low)
    want = [_bounded(high, low, x0 + i * batch) for i in range(k)]
    assert abs(env.total(x0, batch, k) - sum(want)) <= 1e-9 * max(1.0, sum(want))
    assert abs(env.total(x0, batch, 1) - want[0]) <= 1e-12 * max(1.0, want[0])
    # the engine's inverse: the smallest iteration count whose time reaches an elapsed time
    for elapsed in (want[0] / 2, sum(want) / 3, sum(want) * 0.999):
        n = env.iterations_within(x0, batch, k, elapsed)
        assert env.total(x0, batch, n) >= elapsed and (n == 0 or env.total(x0, batch, n - 1) < elapsed)


@given(high=st.lists(LINE, min_size=1, max_size=2), low=st.lists(LINE, max_size=2),
       factor=st.floats(min_value=0.1, max_value=10.0))
def test_a_slowed_envelope_is_the_envelope_slowed(high, low, factor):
    env = EnvelopeLine.between(high, low)
    assert abs(env.scaled(factor).total(1000.0, 8, 50) - factor * env.total(1000.0, 8, 50)) \
        <= 1e-9 * max(1.0, factor * env.total(1000.0, 8, 50))


def test_an_h20_with_more_bandwidth_decodes_no_faster_than_its_floors_allow():
    """The review's case: an H20 sheet with 0.1 % more HBM bandwidth, DeepSeek-V3 with FP8 weights and KV on
    tp 8, decoding 2 sequences of 32K tokens: 13.54 ms under the coefficient-wise bound, against 17.15 ms on
    the H20 and 17.10 ms on the same sheet served weight-only, the two lines it is held under."""
    m = ModelSpec.model_validate({"preset": "DeepSeek-V3", "weight_dtype": "fp8", "kv_dtype": "fp8"})
    sheet = GpuType(**{**GPU_PRESETS["H20"], "hbm_tbps": GPU_PRESETS["H20"]["hbm_tbps"] * 1.001})
    h20 = generation_cost(m, "H20", GpuType(**GPU_PRESETS["H20"]), 8)
    custom = generation_cost(m, "H20-more-hbm", sheet, 8)
    for batch, ctx in ((2, 32768), (16, 4096), (1, 512)):
        mine = custom.decode_line(batch).total(batch * ctx, batch, 1)
        floors = [f.decode_line(batch).total(batch * ctx, batch, 1) for f in custom._floors]
        assert mine <= h20.decode_line(batch).total(batch * ctx, batch, 1) * (1 + 1e-9)
        assert mine >= 0.99 * min(floors), (batch, ctx, mine, floors)
