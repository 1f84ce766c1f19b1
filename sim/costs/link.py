"""Weight transfer between the training and inference clusters, term by term (issue 14, item 6)."""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from rollart.calibration import tp_allreduce
from rollart.calibration.links import effective_bytes_per_s
from rollart.plan.schema import GpuType, Link, Plan
from rollart.sim.costs.moe import expert_params, gpu_weight_bytes, served_weight_bytes
from rollart.sim.costs.train import trainer_ep

HBM_COPY_EFFICIENCY = 0.7  # a strided layout conversion on the GPU reads and writes every byte
MEASURED = Path(__file__).resolve().parents[2] / "calibration" / "data" / "weight_transfer" / "measured.yaml"


def all_gather_s(nbytes: float, n: int, gpu_name: str, gpu: GpuType, network: Link | None,
                 gpus: int | None = None) -> float:
    """A ring all-gather of ``nbytes`` sharded over ``n`` trainer GPUs: each receives the (n−1)/n it
    lacks at the bus rate of the trainer's all-reduce fit (:func:`~rollart.calibration.tp_allreduce`:
    NVLink's one-way rate inside the GPU type's NVLink domain, the cluster's network beyond, and for the
    groups of ``n`` laid out over the trainer's ``gpus`` that straddle a domain boundary); 0 for one GPU."""
    if n <= 1:
        return 0.0
    _, bus_bytes_per_s, _ = tp_allreduce(gpu_name, gpu, n, network, gpus)
    return nbytes * (n - 1) / n / bus_bytes_per_s


@lru_cache(maxsize=1)
def measured_store() -> dict[str, float]:
    """Per-bucket overheads of the real Mooncake store (``python -m rollart.calibration.transfer_bench``)."""
    try:
        data = yaml.safe_load(MEASURED.read_text()) or {}
        mc = data["mooncake_tcp_loopback"]
        return {"publish_s": float(mc["publish"]["bucket_overhead_s"]), "pull_s": float(mc["pull"]["bucket_overhead_s"])}
    except (OSError, KeyError, TypeError, ValueError):
        return {}


class WeightTransferCost:
    """What moving W bytes of weights from the trainer to the engines costs, per term:

    1. **gather**: each pipeline stage's TP ranks all-gather their shards of the dense weights, and
       a MoE's ep expert-parallel ranks their experts, into whole tensors (:func:`all_gather_s`),
       ``(W_dense/pp)·(tp−1)/tp / β_tp + (W_experts/pp)·(ep−1)/ep / β_ep``, β the trainer's
       all-reduce bus rate of a group that size; the stages work in parallel;
    2. **convert**: layout and dtype from the trainer's format to the engine's (fused QKV per KV
       group and fused gate/up split, contiguous copies; BF16 → FP8 when the engines serve FP8) on
       the trainer GPUs: every byte read in BF16 and written as served, at HBM rate,
       ``(W_bf16 + W)/pp / (hbm·0.7)``; from here on W is the served bytes;
    3. **transfer** at the link's *effective* rate ``bw·eff`` (``LINK_EFFICIENCY``);
    4. the **store** path also stages the buckets into the CPU-resident store, ``(W/pp) / h2d``,
       and pays a per-bucket registration + put + handshake ``o_pub`` when publishing and
       ``o_pull`` when pulling (measured through the real Mooncake store's TCP transport, for a TCP
       link; the assumed metadata round trip ``STORE_BUCKET_OVERHEAD_S`` on an RDMA/IB link; or the
       plan's ``weight_sync.bucket_overhead_s``). Staging and publishing are a two-stage pipeline over
       the n buckets (bucket i on the wire while bucket i + 1 is staged): the slower of the two
       plus 1/n of the other. The workers pull bucket i over their intra-cluster link as soon as it
       lands, so the pull adds one bucket;
    5. **receive**: each GPU of a worker copies what it holds host → device (``gpu_weight_bytes``: W/tp
       without expert parallelism, more with ep ranks, each holding the dense weights) and re-shards it
       (``swap_s``; a blocking NCCL broadcast lands on the GPU and only re-shards).

    Synchronous (NCCL broadcast): 1 + 2 + ``lat + W/(bw·eff)``, rollout stalled throughout (the
    receiving engines sit in the collective); when the trainer and every engine share one NVLink domain
    the broadcast rides NVLink instead. Asynchronous (bucketed store): 1 + 2 + the staging pipelined
    with ``n·(lat + o_pub) + W/(bw·eff)`` + one pulled bucket, overlapped with rollout; then ``swap_s``
    on the update. When trainer and workers share a physical cluster the intra-cluster link carries
    both. Colocated: the engines on the trainer's GPUs load the new weights in the switch
    (:class:`~rollart.sim.costs.train.ColocationSwitch`), so when every engine is colocated there is
    nothing left to send.

    A measured train profile (``measured``) replaces all of it with the times it measured."""

    def __init__(self, plan: Plan, measured: Any = None):
        self.measured = measured
        ws = plan.weight_sync
        links = plan.cluster.links
        pools = plan.cluster.gpu_pools
        tr = plan.placement.trainer
        # every engine time-shares the trainer's GPUs: the switch loads the new weights, none are sent
        self.all_colocated = all(plan.placement.shares_trainer_gpus(g.pool) for g in plan.placement.generation)
        train_cluster = pools[tr.pool].cluster
        same = all(pools[g.pool].cluster == train_cluster for g in plan.placement.generation)
        # no intra-cluster link named: the network the trainer's collectives take (the InfiniBand fit of
        # the link table), not the cross-cluster path's
        self.intra: Link = links.get("intra_cluster") or Link(kind="ib")
        self.between: Link = links[ws.link]  # the path between the training and the inference cluster
        self.cross: Link = self.intra if same else self.between
        gpu = plan.gpu_of_pool(tr.pool)
        gpu_name = pools[tr.pool].gpu
        # Trainer and every engine on one pool whose GPUs in use fit one NVLink domain (4 train + 4 rollout
        # on an HGX board, a whole plan in an NVL72 rack): NCCL's broadcast never leaves NVLink, so it runs
        # at the NVLink bus rate of a ring that size (a broadcast's bus rate is its algorithm rate).
        in_use = plan.placement.gpus_by_pool().get(tr.pool, 0)
        self.nvlink_broadcast: tuple[float, float] | None = None
        if not self.all_colocated and all(g.pool == tr.pool for g in plan.placement.generation) \
                and in_use <= gpu.nvlink_domain:
            latency, rate, _ = tp_allreduce(gpu_name, gpu, in_use)
            self.nvlink_broadcast = (latency, rate)
        # The trainer gathers its BF16 weights and converts them to the engines' format (FP8 when they
        # serve FP8) before the wire: what crosses, lands in the store and is swapped in is what the
        # engines hold (served bytes: half the BF16 copy's linear layers in FP8).
        self.trainer_bytes = plan.model.weight_bytes
        self.weight_bytes = served_weight_bytes(plan.model)
        self.plan_model = plan.model
        self.bucket_bytes = ws.bucket_mb * 2**20
        self.h2d_bytes_per_s = ws.h2d_gbps * 1e9 / 8
        stage = self.trainer_bytes / tr.pp
        experts = 2.0 * expert_params(plan.model) / tr.pp  # a stage's experts in BF16, as weight_bytes
        intra = links.get("intra_cluster")
        self.gather_s = all_gather_s(stage - experts, tr.tp, gpu_name, gpu, intra, tr.gpus) \
            + all_gather_s(experts, trainer_ep(plan.model, tr, gpu.nvlink_domain), gpu_name, gpu, intra, tr.gpus)
        # read the BF16 stage, write it in the served dtype
        self.convert_s = (stage + self.weight_bytes / tr.pp) / (gpu.hbm_tbps * 1e12 * HBM_COPY_EFFICIENCY)
        self.stage_s = self.weight_bytes / tr.pp / self.h2d_bytes_per_s
        from rollart.calibration.links import STORE_BUCKET_OVERHEAD_S, calibrated_links

        # The measured per-bucket costs are Mooncake's TCP transport's (a socket exchange per transfer); an
        # RDMA or InfiniBand path posts its transfers to the NIC with no such exchange, so it keeps the
        # assumed metadata round trip (STORE_BUCKET_OVERHEAD_S) rather than a TCP measurement
        store = measured_store()
        assumed = float(calibrated_links().get("store", {}).get("bucket_overhead_s", STORE_BUCKET_OVERHEAD_S))

        def measured_on(link: Link, key: str) -> float:
            return store.get(key, assumed) if link.kind == "tcp" else assumed

        self.publish_overhead_s = measured_on(self.cross, "publish_s")
        self.pull_overhead_s = measured_on(self.intra, "pull_s")
        # where each per-bucket cost comes from, for the run's weight-sync line
        self.bucket_cost_sources = tuple("Mooncake TCP, measured on a 2-core loopback host"
                                         if store and link.kind == "tcp" else "assumed"
                                         for link in (self.cross, self.intra))
        if ws.bucket_overhead_s is not None:  # the plan's own store (e.g. an RDMA cluster's)
            self.publish_overhead_s = self.pull_overhead_s = ws.bucket_overhead_s
            self.bucket_cost_sources = ("the plan's", "the plan's")
        self.bucket_overhead_s = self.publish_overhead_s

    def bucket_cost_note(self, store_used: bool) -> str:
        """What each store bucket costs beyond the wire and where that figure is from ('' when the run uses no
        store): at small buckets it, not the link, sets the transfer (helper-88: 16 MB buckets over TCP, 18 %
        of throughput)."""
        if not store_used:
            return ""
        pub, pull = self.bucket_cost_sources
        note = (f"; per bucket {self.publish_overhead_s * 1e3:.3g} ms publish ({pub}), "
                f"{self.pull_overhead_s * 1e3:.3g} ms pull ({pull})")
        return note + ("" if pub == "the plan's" else "; weight_sync.bucket_overhead_s sets yours")

    def kv_link(self, same_cluster: bool, gpus: int) -> tuple[float, float]:
        """(latency s, bytes/s) a prefill worker's KV reaches a decode worker at (PD disaggregation): over
        the intra-cluster link, each of the ``gpus`` GPUs of the narrower worker sending its shard through
        its own port, when both pools sit in one cluster; else over the path between the clusters
        (``weight_sync.link``, an aggregate rate); at the rate bulk traffic reaches on each
        (:func:`~rollart.calibration.links.effective_bytes_per_s`)."""
        if same_cluster:
            return self.intra.latency_s, gpus * effective_bytes_per_s(self.intra)
        return self.between.latency_s, effective_bytes_per_s(self.between)

    @property
    def broadcast_stalls_engines(self) -> bool:
        """A GPU broadcast (NCCL) runs inside the receiving engines: they sit in the collective and
        decode nothing until it ends, and the weights are in place when it does. A measured CPU
        hand-off (``rollart run`` puts the state in Ray's object store) goes on beside generation;
        the workers fetch and swap it at the update."""
        return self.measured is None

    def broadcast_s(self) -> float:
        if self.all_colocated:
            return 0.0  # the engines load the new weights in the colocation switch (ColocationSwitch)
        if self.measured is not None:
            return self.measured.broadcast_s
        latency, rate = self.nvlink_broadcast or (self.cross.latency_s, effective_bytes_per_s(self.cross))
        return self.gather_s + self.convert_s + latency + self.weight_bytes / rate

    def publish_pull_s(self) -> float:
        if self.all_colocated:
            return 0.0  # the engines load the new weights in the colocation switch (ColocationSwitch)
        if self.measured is not None:
            return self.measured.publish_pull_s
        buckets = max(1, math.ceil(self.weight_bytes / self.bucket_bytes))
        publish = buckets * (self.cross.latency_s + self.publish_overhead_s) \
            + self.weight_bytes / effective_bytes_per_s(self.cross)
        last_bucket = min(self.bucket_bytes, self.weight_bytes)
        pull = self.intra.latency_s + self.pull_overhead_s + last_bucket / effective_bytes_per_s(self.intra)
        # bucket i crosses the wire while bucket i + 1 is staged: the slower stage plus one bucket of the other
        staged_and_published = max(self.stage_s, publish) + min(self.stage_s, publish) / buckets
        return self.gather_s + self.convert_s + staged_and_published + pull

    def swap_s(self, tp: int, ep: int = 1) -> float:
        """Seconds a worker of ``tp`` GPUs in ``ep`` expert-parallel ranks loads the pulled weights from host
        memory, its GPUs in parallel: each loads what it holds (:func:`gpu_weight_bytes`: with ep ranks the
        dense weights are replicated on every rank, so a GPU holds more than served / tp)."""
        if self.measured is not None:
            return self.measured.swap_s
        return gpu_weight_bytes(self.plan_model, ep, tp) / self.h2d_bytes_per_s
