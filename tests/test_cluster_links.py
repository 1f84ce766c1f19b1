"""Which network a transfer inside or between clusters takes, and at what rate."""

from __future__ import annotations

import pytest

from rollart.calibration.links import default_network, effective_bytes_per_s
from rollart.plan import load_plan
from rollart.plan.schema import Link
from rollart.scenarios_catalog import default_scenario
from rollart.sim.costs.link import WeightTransferCost
from rollart.sim.costs.moe import ring_link

SLOW_CROSS = "cluster.links={cross_cluster: {kind: tcp, bandwidth_gbps: 25}}"


def test_weights_inside_one_cluster_take_its_network_not_the_path_between_clusters() -> None:
    """A review's what-if: rollout moved into the trainer's cluster, no intra-cluster link named, a 25 Gb/s
    TCP path between clusters: the broadcast still crossed that path (8.8 s a step) while the trainer's
    collectives in the same cluster took InfiniBand. One cluster has one network: the InfiniBand fit."""
    together = WeightTransferCost(load_plan(default_scenario(), ["cluster.gpu_pools.h20.cluster=train", SLOW_CROSS,
                                                                 "placement.trainer.tp=1"]))
    apart = WeightTransferCost(load_plan(default_scenario(), [SLOW_CROSS, "placement.trainer.tp=1"]))
    assert together.intra.kind == together.cross.kind == "ib"
    assert effective_bytes_per_s(together.cross) == pytest.approx(default_network()[0])
    assert apart.cross.kind == "tcp" and apart.intra.kind == "ib"
    wire = together.weight_bytes / default_network()[0]
    assert together.broadcast_s() < apart.broadcast_s() - 5 and together.broadcast_s() > wire


@pytest.mark.parametrize("same_cluster", [True, False])
def test_pd_kv_hand_off_takes_the_link_between_the_pools_clusters(same_cluster: bool) -> None:
    """Prefill → decode KV crosses the intra-cluster link, each GPU of the narrower worker through its own
    port, when both pools sit in one cluster; else the path between the clusters (an aggregate rate);
    both at the rate bulk traffic reaches (TCP 0.6, IB 0.9 of line rate)."""
    links = "cluster.links={cross_cluster: {kind: tcp, bandwidth_gbps: 10}, intra_cluster: {kind: ib}}"
    plan = load_plan(default_scenario(), [links])
    w = WeightTransferCost(plan)
    latency, rate = w.kv_link(same_cluster, 2)
    if same_cluster:
        assert rate == pytest.approx(2 * effective_bytes_per_s(Link(kind="ib")))
    else:
        assert rate == pytest.approx(10e9 / 8 * 0.6) and latency == Link(kind="tcp").latency_s


def test_a_ring_across_domains_crosses_through_each_members_own_port() -> None:
    """NCCL runs a channel per NIC: a ring with k members in each node crosses at k ports' rate, never
    faster than NVLink inside the node; one data-parallel member a node gets one port. A crossing ring's
    latency is NVLink's plus the network's (was the larger of the two, 30 µs here: the network's 20 µs hid)."""
    nvlink, net = (150e9, 30e-6), (36e9, 20e-6)
    assert ring_link(8, nvlink, net) == nvlink
    assert ring_link(16, nvlink, net) == pytest.approx((150e9, 50e-6))  # 8 ports: 288 GB/s, NVLink caps it
    assert ring_link(16, nvlink, net, ports=2) == pytest.approx((72e9, 50e-6))
    assert ring_link(64, nvlink, net, ports=1) == pytest.approx((36e9, 50e-6))
    slow = (5e9, 50e-6)
    assert ring_link(16, nvlink, slow) == pytest.approx((40e9, 80e-6))
