"""Weight transfer between the training and inference clusters (latency + bandwidth)."""

from __future__ import annotations

import math
from typing import Any

from rollart.plan.schema import Link, Plan


class WeightTransferCost:
    """Synchronous: an NCCL broadcast over the cross-cluster link, ``lat + W / bw``
    (the intra-cluster fan-out is pipelined behind it), during which rollout is stalled.

    Asynchronous: the trainer publishes ``n = ⌈W / bucket⌉`` buckets once,
    ``n·(lat + o) + W / bw_cross`` with ``o`` the store's per-bucket overhead, and each worker
    pulls bucket i over its intra-cluster link as soon as it lands, so the pull adds one
    bucket's time; the swap into GPU memory then costs
    ``W / tp / h2d`` per worker. When trainer and workers share a physical cluster the
    intra-cluster link carries both.

    A measured train profile (``measured``) replaces all three with the times it measured."""

    def __init__(self, plan: Plan, measured: Any = None):
        self.measured = measured
        self.colocated = plan.placement.colocated
        ws = plan.weight_sync
        links = plan.cluster.links
        pools = plan.cluster.gpu_pools
        train_cluster = pools[plan.placement.trainer.pool].cluster
        same = all(pools[g.pool].cluster == train_cluster for g in plan.placement.generation)
        self.intra: Link = links.get("intra_cluster", links[ws.link])
        self.cross: Link = self.intra if same else links[ws.link]
        self.weight_bytes = plan.model.weight_bytes
        self.bucket_bytes = ws.bucket_mb * 2**20
        self.h2d_bytes_per_s = ws.h2d_gbps * 1e9 / 8
        from rollart.calibration.links import STORE_BUCKET_OVERHEAD_S, calibrated_links

        self.bucket_overhead_s = float(calibrated_links().get("store", {}).get("bucket_overhead_s",
                                                                               STORE_BUCKET_OVERHEAD_S))

    def broadcast_s(self) -> float:
        if self.measured is not None:
            return self.measured.broadcast_s
        if self.colocated:
            return 0.0  # the engines load the new weights in the colocation switch (ColocationSwitch)
        return self.cross.latency_s + self.weight_bytes / self.cross.bytes_per_s

    def publish_pull_s(self) -> float:
        if self.measured is not None:
            return self.measured.publish_pull_s
        buckets = max(1, math.ceil(self.weight_bytes / self.bucket_bytes))
        publish = buckets * (self.cross.latency_s + self.bucket_overhead_s) + self.weight_bytes / self.cross.bytes_per_s
        last_bucket = min(self.bucket_bytes, self.weight_bytes)
        return publish + self.intra.latency_s + self.bucket_overhead_s + last_bucket / self.intra.bytes_per_s

    def swap_s(self, tp: int) -> float:
        if self.measured is not None:
            return self.measured.swap_s
        return self.weight_bytes / tp / self.h2d_bytes_per_s
