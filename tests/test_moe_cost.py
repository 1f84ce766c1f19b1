"""MoE weight traffic: the expected number of distinct experts a batch touches, and that the
roofline and the calibrated kernel-profile cost both read that many experts per step."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollart.calibration import generation_cost
from rollart.plan.presets import GPU_PRESETS
from rollart.plan.schema import GpuType, ModelSpec
from rollart.sim.costs.gpu import RooflineGeneration
from rollart.sim.costs.moe import experts_touched, model_experts_touched, weight_bytes_read

MOE = ModelSpec(name="Qwen3-30B-A3B", layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128,
                intermediate=768, vocab=151936, moe_experts=128, moe_active_experts=8)
H800 = GpuType(**GPU_PRESETS["H800"])


def test_one_token_touches_its_k_experts() -> None:
    assert experts_touched(1, 128, 8) == pytest.approx(8)
    assert experts_touched(1, 64, 2) == pytest.approx(2)
    assert experts_touched(0, 128, 8) == 0.0


def test_large_batch_touches_every_expert() -> None:
    assert experts_touched(4096, 128, 8) == pytest.approx(128)
    assert experts_touched(10**9, 128, 8) <= 128


def test_closed_form() -> None:
    assert experts_touched(16, 128, 8) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 16))


@given(st.integers(1, 1023), st.integers(1, 256), st.integers(1, 16))
def test_monotone_and_bounded(b: int, experts: int, active: int) -> None:
    active = min(active, experts)
    lo, hi = experts_touched(b, experts, active), experts_touched(b + 1, experts, active)
    assert active - 1e-9 <= lo <= hi + 1e-9
    assert hi <= experts


def test_dense_model_reads_all_its_weights() -> None:
    dense = ModelSpec(preset="Qwen3-8B")
    assert model_experts_touched(dense, 64) == 1.0
    assert weight_bytes_read(dense, 1) == weight_bytes_read(dense, 512) == dense.weight_bytes


def test_moe_weight_bytes_grow_from_active_to_all() -> None:
    one, many = weight_bytes_read(MOE, 1), weight_bytes_read(MOE, 100_000)
    assert many == pytest.approx(MOE.weight_bytes)
    assert one == pytest.approx(2 * MOE.active_params, rel=1e-9)  # k experts + the dense part
    assert one < weight_bytes_read(MOE, 32) < many


@pytest.mark.parametrize("profile", ["datasheet", None])  # roofline and the shipped kernel profile
def test_moe_decode_cost_follows_the_experts_touched(profile: str | None) -> None:
    cost = generation_cost(MOE, "H800", H800, 1, profile)
    per_token = [cost.decode_line(b).total(0.0, b, 1) / b for b in (1, 8, 64, 512)]
    t1, t512 = cost.decode_line(1).total(0.0, 1, 1), cost.decode_line(512).total(0.0, 512, 1)
    # Reading all 128 experts at batch 512 costs far more than one token's 8, yet far less per token.
    assert t512 > 3 * t1
    assert per_token == sorted(per_token, reverse=True)


def test_roofline_moe_decode_one_token_reads_active_weights_only() -> None:
    # the active weights (k experts) for one token, every expert for a large batch; the input
    # embedding is a lookup of a few rows, not a read of the table
    cost = RooflineGeneration(MOE, H800, 1)
    bw = H800.hbm_tbps * 1e12 * cost.eff.decode_bandwidth
    lookup = 2 * MOE.vocab * MOE.hidden
    assert cost.decode_line(1).m0 == pytest.approx((2 * MOE.active_params - lookup) / bw)
    assert cost.decode_line(4096).m0 == pytest.approx((MOE.weight_bytes - lookup) / bw)


# ---------------------------------------------------------------- expert parallelism

from rollart.plan.schema import Link  # noqa: E402
from rollart.sim.costs.moe import (all_to_all_s, rank_expert_rows, rank_experts_touched, served_weight_bytes,  # noqa: E402
                                   worker_weight_bytes)


@pytest.mark.parametrize("profile", ["datasheet", None])
def test_ep_1_is_plain_tensor_parallelism(profile: str | None) -> None:
    a, b = generation_cost(MOE, "H800", H800, 8, profile), generation_cost(MOE, "H800", H800, 8, profile, 1)
    assert a.decode_line(64) == b.decode_line(64) and a.prefill_time(4096, 4096**2 / 2) == b.prefill_time(4096, 4096**2 / 2)


def test_each_rank_reads_its_share_of_the_experts_plus_the_busiest_ranks_excess() -> None:
    for tokens in (1, 8, 64):
        mean = experts_touched(tokens, 128, 8) / 8
        assert mean < rank_experts_touched(MOE, tokens, 8) <= 128 / 8  # the step waits for the busiest rank
        assert tokens * 8 / 8 < rank_expert_rows(MOE, tokens, 8) <= tokens * 8
    assert rank_experts_touched(MOE, 100_000, 8) == pytest.approx(16)  # a large batch touches all 16 of each rank's
    assert rank_experts_touched(MOE, 64, 1) == experts_touched(64, 128, 8)


def test_ep_replicates_the_dense_weights_and_splits_the_experts() -> None:
    served = served_weight_bytes(MOE)
    experts = 2.0 * 48 * 3 * 2048 * 768 * 128
    assert worker_weight_bytes(MOE, 8) == pytest.approx(served + 7 * (served - experts))
    kv = {ep: generation_cost(MOE, "H800", H800, 8, None, ep).kv_capacity_tokens for ep in (1, 2, 8)}
    assert kv[2] > kv[8]  # the replicated attention weights take KV room
    # ep 1 runs attention TP 8 over 4 KV heads: each head held twice, so about half the tokens fit
    # (expert parallelism's data-parallel attention avoids that copy)
    assert kv[1] < kv[8] < kv[2] and kv[1] == pytest.approx(kv[2] / 2, rel=0.02)


def test_ep_pays_off_where_kv_reads_dominate() -> None:
    # 4 KV heads on 8 GPUs: TP replicates each KV head on two GPUs, DP attention (ep = 8) reads
    # each cached token once; at one short sequence the replicated dense weights and the
    # all-to-all make EP slower.
    def decode(ep: int, batch: int, ctx: int) -> float:
        return generation_cost(MOE, "H800", H800, 8, None, ep).decode_line(batch).total(batch * ctx, batch, 1)

    assert decode(8, 64, 32768) < 0.85 * decode(1, 64, 32768)
    assert decode(8, 1, 1024) > decode(1, 1, 1024)


@pytest.mark.parametrize("profile", ["datasheet", None])
def test_a_lone_sequence_attends_on_one_rank(profile: str | None) -> None:
    # data-parallel attention: a sequence and its KV live on one rank. One sequence puts its whole
    # context on one rank (8× an even eighth); eight sequences one each; nine put two on the busiest
    cost = generation_cost(MOE, "H800", H800, 8, profile, 8)
    one, eight, nine = (cost.decode_line(b) for b in (1, 8, 9))
    assert one.m1 == pytest.approx(8 * eight.m1) and one.c1 == pytest.approx(8 * eight.c1)
    assert nine.m1 == pytest.approx(eight.m1 * 2 * 8 / 9, rel=0.02)
    # so EP loses to plain TP for one 128K-token sequence, and wins for a batch of them
    tp_only = generation_cost(MOE, "H800", H800, 8, profile, 1)
    assert cost.decode_line(1).total(131072, 1, 1) > tp_only.decode_line(1).total(131072, 1, 1)
    assert cost.decode_line(64).total(64 * 131072, 64, 1) < tp_only.decode_line(64).total(64 * 131072, 64, 1)


def test_all_to_all_moves_every_tokens_hidden_state_to_its_experts_and_back() -> None:
    nv = (400e9, 10e-6)
    t = all_to_all_s(MOE, 64, 8, 8, *nv, 1.0, 1.0)  # one node: the network does not matter
    per_gpu = 64 / 8 * 8 * 2048 * 2 * 7 / 8  # a rank's tokens × k × hidden × BF16 × off-rank share
    assert t == pytest.approx(2 * 48 * (10e-6 + per_gpu / 400e9))
    assert all_to_all_s(MOE, 64, 1, 8, *nv, 1.0, 1.0) == 0.0
    # a worker wider than a node sends its off-node share over the cluster's network
    slow = all_to_all_s(MOE, 64, 16, 16, *nv, 25e9 / 8, 20e-6)
    assert slow > all_to_all_s(MOE, 64, 16, 16, *nv, 400e9, 10e-6)


@pytest.mark.parametrize("profile", ["datasheet", None])
def test_a_lone_prompt_sends_all_its_tokens_to_the_experts_from_one_rank(profile: str | None) -> None:
    # DP attention + EP: a prompt prefills on one rank, which dispatches every one of its tokens to
    # their k experts' ranks and combines them back; the step waits for that rank. One 8K prompt
    # therefore pays the all-to-all of 8K tokens from one rank (ep times an even share's), eight
    # 1K prompts an even share each. Over a slow cross-node link the difference is the exchange.
    slow = Link(kind="rdma", bandwidth_gbps=25)  # DeepEP's kernels (RDMA): a TCP network gathers every token
    cost = generation_cost(MOE, "H800", H800, 16, profile, 16, slow)
    n, pairs = 8192, 8192.0**2 / 2
    net = (25e9 / 8, 0.0)
    even = all_to_all_s(MOE, n, 16, 16, 1e15, 0.0, *net, kernel="normal")  # a prefill's kernels
    lone = all_to_all_s(MOE, n, 16, 16, 1e15, 0.0, *net, rank_tokens=n, kernel="normal")
    assert lone == pytest.approx(16 * even)
    # the cost model's step grows by at least the exchange's difference (its attention grows too)
    assert cost.prefill_time(n, pairs, sequences=1) - cost.prefill_time(n, pairs, sequences=16) >= 0.9 * (lone - even)


@pytest.mark.parametrize(("tp", "ep", "off"), [(16, 16, 8 / 15), (16, 2, 1.0), (16, 4, 2 / 3), (32, 4, 1.0)])
def test_the_off_node_share_counts_the_ranks_a_token_can_leave_for(tp: int, ep: int, off: float) -> None:
    # of the ep − 1 other ranks, those outside this node (8 GPUs) take the off-node share; ranks of
    # tp/ep GPUs, so tp 16 · ep 2 has no other rank on its node and everything crosses the network
    slow_net = (1e9, 0.0)
    t = all_to_all_s(MOE, 4096, ep, tp, 1e15, 0.0, *slow_net)  # NVLink ~free: the network's share is the time
    per_gpu = 4096 / ep * 8 * 2048 * 2 * (ep - 1) / ep / (tp // ep)
    assert t == pytest.approx(2 * 48 * per_gpu * off / slow_net[0], rel=1e-9)


@pytest.mark.parametrize("profile", ["datasheet", None])
def test_ep_across_nodes_pays_the_intra_cluster_link(profile: str | None) -> None:
    fast = generation_cost(MOE, "H800", H800, 16, profile, 16, Link(kind="nvlink"))
    tcp = generation_cost(MOE, "H800", H800, 16, profile, 16, Link(kind="tcp", bandwidth_gbps=25))
    assert tcp.prefill_time(8192, 8192**2 / 2) > 2 * fast.prefill_time(8192, 8192**2 / 2)


def test_ep_is_validated_against_gpus_and_experts() -> None:
    from rollart.plan import PlanError
    from tests.conftest import small_plan

    moe = ("model={name: moe, layers: 4, hidden: 256, heads: 8, kv_heads: 2, head_dim: 32, intermediate: 64, "
           "vocab: 1000, moe_experts: 8, moe_active_experts: 2}")
    assert small_plan([moe, "placement.generation.0.ep=2"]).placement.generation[0].ep == 2
    six = moe.replace("moe_experts: 8", "moe_experts: 6")
    for overrides, words in (([moe, "placement.generation.0.ep=4"], "must divide"),  # generation 0 has tp 2
                             ([six, "placement.generation.0.tp=4", "placement.generation.0.ep=4"], "6 experts"),
                             (["placement.generation.0.ep=2"], "is dense (no experts to split)")):  # dense default
        with pytest.raises(PlanError) as err:
            small_plan(overrides)
        assert [p for p in err.value.problems if p.startswith("placement.generation.0.ep: ") and words in p], \
            err.value.problems


@pytest.mark.parametrize("profile", ["datasheet", None])
@pytest.mark.parametrize("tp,ep", [(8, 1), (8, 2), (8, 8), (16, 16)])
def test_no_ep_layout_beats_the_datasheet_roofline(profile: str | None, tp: int, ep: int) -> None:
    cost = generation_cost(MOE, "H800", H800, tp, profile, ep, Link(kind="ib"))
    peak, bw = tp * H800.tflops_bf16 * 1e12, tp * H800.hbm_tbps * 1e12
    emb = 2.0 * MOE.vocab * MOE.hidden * 2
    for batch, ctx in ((1, 1024), (64, 4096), (512, 8192)):
        flops = 2.0 * MOE.layers * MOE.active_params_per_layer * batch + 4.0 * MOE.layers * MOE.heads * MOE.head_dim \
            * batch * ctx
        nbytes = weight_bytes_read(MOE, batch) - emb + MOE.kv_bytes_per_token * batch * ctx  # read at least once
        assert cost.decode_line(batch).total(batch * ctx, batch, 1) >= max(flops / peak, nbytes / bw)


# ---- the all-to-all of a step that prefills: DeepEP's normal (high-throughput) kernels

DSV3_LIKE = ModelSpec(name="dsv3-like", layers=61, hidden=7168, heads=128, kv_heads=128, head_dim=128,
                      intermediate=2048, vocab=129280, moe_experts=256, moe_active_experts=8)


@given(experts_per_group=st.integers(1, 64), groups=st.integers(1, 64), active=st.integers(1, 16))
def test_groups_reached_is_between_one_and_k(experts_per_group: int, groups: int, active: int) -> None:
    from rollart.sim.costs.moe import groups_reached

    experts = experts_per_group * groups
    active = min(active, experts)
    reached = groups_reached(experts, active, groups)
    assert 1.0 - 1e-9 <= reached <= min(active, groups) + 1e-9
    if active < experts:  # one expert more reaches at least as many groups
        assert groups_reached(experts, active + 1, groups) >= reached - 1e-12


def test_groups_reached_closed_form() -> None:
    from rollart.sim.costs.moe import groups_reached

    # 8 of 256 experts over 4 domains of 64: a domain is missed with Π (192 − i)/(256 − i)
    miss = 1.0
    for i in range(8):
        miss *= (192 - i) / (256 - i)
    assert groups_reached(256, 8, 4) == pytest.approx(4 * (1 - miss))
    assert groups_reached(256, 8, 1) == 1.0
    assert groups_reached(256, 256, 8) == pytest.approx(8.0)  # every expert: every group


def test_a_prefill_sends_a_token_once_to_each_node_it_needs() -> None:
    # DeepEP's normal kernels (DeepSeek-V3 EP32 on 4 HGX nodes, NVLink taken as free): a token crosses the
    # network once per other node its 8 experts live on (2.7 expected), not once per expert (6 expected)
    from rollart.sim.costs.moe import groups_reached

    net = (45e9, 0.0)
    tokens = 4096 * 32
    normal = all_to_all_s(DSV3_LIKE, tokens, 32, 32, 1e15, 0.0, *net, dispatch=1 + 4 / 128, kernel="normal")
    low_latency = all_to_all_s(DSV3_LIKE, tokens, 32, 32, 1e15, 0.0, *net, dispatch=1 + 4 / 128)
    copies = groups_reached(256, 8, 4) * 3 / 4
    assert copies == pytest.approx(2.71, abs=0.01)
    one_copy = 4096 * 7168 * ((1 + 4 / 128) + 2.0) / net[0]  # dispatch in FP8, combine in BF16
    assert normal == pytest.approx(DSV3_LIKE.moe_layers * copies * one_copy)
    assert low_latency == pytest.approx(DSV3_LIKE.moe_layers * 8 * (31 / 32) * (24 / 31) * one_copy)
    assert normal < 0.5 * low_latency


def test_inside_one_node_a_prefill_sends_one_copy_per_destination_rank() -> None:
    from rollart.sim.costs.moe import groups_reached

    nvlink = (150e9, 0.0)
    tokens = 4096 * 8
    normal = all_to_all_s(DSV3_LIKE, tokens, 8, 8, *nvlink, 1e9, 0.0, kernel="normal")  # network never used
    per_copy = 4096 * 7168 * (2.0 + 2.0) / nvlink[0]
    assert normal == pytest.approx(DSV3_LIKE.moe_layers * groups_reached(256, 8, 8) * 7 / 8 * per_copy)
    assert normal < all_to_all_s(DSV3_LIKE, tokens, 8, 8, *nvlink, 1e9, 0.0)  # fewer copies than k·7/8


def test_decode_steps_keep_the_low_latency_kernels() -> None:
    # the engine's decode line prices one copy per routed expert (DeepEP low-latency); a prefill does not
    cost = generation_cost(MOE, "H800", H800, 16, None, 16, Link(kind="rdma", bandwidth_gbps=25))
    assert cost._allreduce(256, 16) == cost._allreduce(256, 16, "low_latency")
    assert cost._allreduce(4096, 256, "normal") < cost._allreduce(4096, 256, "low_latency")
    with pytest.raises(ValueError, match="kernel"):
        all_to_all_s(MOE, 4096, 16, 16, 1e11, 0.0, 1e10, 0.0, kernel="fast")


@pytest.mark.parametrize("profile", ["datasheet", None])
def test_cross_node_ep_on_tcp_gathers_every_token(profile: str | None) -> None:
    # DeepEP needs RDMA between nodes; on TCP the engine's fallback (vLLM's default all2all backend)
    # all-gathers every rank's tokens (BF16) and reduce-scatters them back, a ring whose network hops
    # cross at min(NVLink, 8 ports × the port) on 8-GPU nodes, (ep − 1) ring steps each way, each waiting for
    # its slowest hop (the network's 50 µs; ring_link's latency, NVLink's + the network's, is a whole call's)
    from rollart.sim.costs.moe import ring_link

    tcp = Link(kind="tcp", bandwidth_gbps=100)
    rdma = Link(kind="rdma", bandwidth_gbps=100 * 0.6 / 0.9)  # the same effective rate (LINK_EFFICIENCY)
    nvlink, net = (2e11, 1e-5), (100e9 / 8 * 0.6, 5e-5)
    gathered = all_to_all_s(MOE, 4096, 32, 32, *nvlink, *net, rdma=False)
    rate, latency = ring_link(32, nvlink, net, 8)
    assert rate == min(2e11, 8 * net[0]) and latency == pytest.approx(6e-5)
    assert gathered == pytest.approx(48 * 2 * (31 * 5e-5 + 4096 * 2048 * 2 * 31 / 32 / rate))
    # inside one node DeepEP runs on NVLink whatever the network
    assert all_to_all_s(MOE, 4096, 8, 8, 1e11, 0.0, *net, rdma=False) == all_to_all_s(MOE, 4096, 8, 8, 1e11, 0.0, *net)
    on_tcp = generation_cost(MOE, "H800", H800, 32, profile, 32, tcp)
    on_rdma = generation_cost(MOE, "H800", H800, 32, profile, 32, rdma)
    assert on_tcp.decode_line(256).a > on_rdma.decode_line(256).a
