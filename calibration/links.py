"""Link models: latency + bandwidth (alpha-beta) per link kind.

NVLink and the inter-node network (InfiniBand on the measured DGX) are fitted from Vidur's
NCCL point-to-point timings; cross-cluster TCP (200 Gbps Ethernet) and RDMA (400 Gbps) carry
their line rates with assumed latencies (no public timings in calibration/data). Written to
``profiles/links.yaml`` by ``python -m rollart.calibration.build``."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

import yaml

from rollart.calibration import datasets as D
from rollart.calibration import kernels as K
from rollart.calibration.profiles import PROFILE_DIR

if TYPE_CHECKING:
    from rollart.plan.schema import Link

LINKS_FILE = PROFILE_DIR / "links.yaml"

# Mooncake store: per-bucket metadata round trip and registration, on top of the transfer.
STORE_BUCKET_OVERHEAD_S = 0.002


def fit_links() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, intra in (("nvlink", True), ("ib", False)):
        X, y, files = D.vidur_collective("send_recv", intra_node=intra)
        fit = K.fit_collective(X, y)
        out[kind] = {"bandwidth_gbps": round(fit.params["beta_gbps"], 1),
                     "latency_us": round(fit.params["alpha_s"] * 1e6, 2),
                     "mape_heldout": round(fit.mape_heldout, 4), "rows": fit.rows + fit.heldout_rows,
                     "source": f"NCCL send/recv on 8×H100 DGX ({files[0]}), {'within' if intra else 'across'} nodes"}
    out["tcp"] = {"bandwidth_gbps": 200.0, "latency_us": 50.0,
                  "source": "200 Gbps Ethernet line rate (paper's cross-cluster link); latency assumed"}
    out["rdma"] = {"bandwidth_gbps": 400.0, "latency_us": 5.0,
                   "source": "400 Gbps InfiniBand line rate (paper's intra-cluster link); latency assumed"}
    out["pcie"] = {"bandwidth_gbps": 400.0, "latency_us": 2.0, "source": "PCIe Gen5 x16 line rate; latency assumed"}
    out["store"] = {"bucket_overhead_s": STORE_BUCKET_OVERHEAD_S,
                    "source": "assumed: a store transfer over an RDMA/IB link (and over TCP when no measurement "
                              "is shipped); TCP links use the per-bucket overheads measured through the real "
                              "Mooncake store's TCP transport (calibration/data/weight_transfer/measured.yaml)"}
    return out


def default_network() -> tuple[float, float]:
    """(bytes/s, latency s) between nodes of a cluster whose plan names no intra-cluster link: the
    InfiniBand fit of the link table (NCCL across 8×H100 DGX nodes)."""
    ib = calibrated_links().get("ib") or {"latency_us": 20.0, "bandwidth_gbps": 200.0}
    return ib["bandwidth_gbps"] * 1e9 / 8, ib["latency_us"] * 1e-6


# Share of a link's line rate that bulk traffic reaches: a weight transfer, and NCCL's collectives
# (trainer gradient and TP rings, all-to-alls, engines' TP across nodes) over the same wire. ASSUMED
# (not measurable here: loopback TCP says nothing about 200 Gbps Ethernet): TCP pays per-flow congestion
# control and kernel copies, RDMA/IB run near line rate. The one measured point is lower: the table's
# NCCL send/recv fit across DGX nodes reaches 288.5 Gbps, 0.72 of a 400 Gbps NIC, point to point.
# NVLink/PCIe line rates are used as given; a measured rate (that fit, used when the plan gives no
# bandwidth) as it is.
LINK_EFFICIENCY = {"tcp": 0.6, "rdma": 0.9, "ib": 0.9}


def effective_bytes_per_s(link: "Link") -> float:
    """The rate bulk traffic reaches on ``link``: its line rate times its kind's share
    (:data:`LINK_EFFICIENCY`), or a measured throughput as it is."""
    return link.bytes_per_s if link.measured_rate else link.bytes_per_s * LINK_EFFICIENCY.get(link.kind, 1.0)


def rdma_between_nodes(network: "Link | None") -> bool:
    """Whether a cluster's nodes talk RDMA (what DeepEP's kernels need across nodes): every link kind but
    TCP; no link named: the InfiniBand fit (:func:`default_network`)."""
    return network is None or network.kind != "tcp"


def inter_node_link(network: "Link | None") -> tuple[float, float]:
    """(bytes/s, latency s) between a cluster's nodes: the plan's intra-cluster ``network`` link at
    the rate bulk traffic reaches on it (:func:`effective_bytes_per_s`) when it names one, else
    :func:`default_network`."""
    return (effective_bytes_per_s(network), network.latency_s) if network is not None else default_network()


@lru_cache(maxsize=1)
def calibrated_links() -> dict[str, Any]:
    """The shipped link table (empty when the file is missing)."""
    if not LINKS_FILE.is_file():
        return {}
    return yaml.safe_load(LINKS_FILE.read_text()) or {}
