"""Measure the weight-transfer terms that can be measured on this machine (issue 14, item 6).

* bucket publish / pull through the real Mooncake store (TCP over 127.0.0.1, the runtime's
  ``rollart.runtime.weights.mooncake_store``) and through Ray's object store, at several bucket
  sizes, fitted as ``t = n_buckets · o + bytes / r`` (per-bucket overhead o: registration, put
  RPC and handshake; r the copy rate of this host);
* the trainer → engine state-dict conversion (Megatron's fused QKV per KV group and fused
  gate/up → separate q, k, v, gate, up, contiguous) of one real Qwen3-8B layer on the CPU,
  as a byte rate.

``python -m rollart.calibration.transfer_bench`` writes ``calibration/data/weight_transfer/
measured.yaml`` with the host it ran on; ``sim/costs/link.py`` reads the per-bucket overhead.
Loopback TCP says nothing about a 200 Gbps Ethernet's rate: that term is not measured here.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).parent / "data" / "weight_transfer" / "measured.yaml"
MiB = 1 << 20


def _fit(rows: list[tuple[int, int, float]]) -> dict[str, float]:
    """Least squares of t = n·o + B/r over (n_buckets, bytes, seconds)."""
    import numpy as np

    a = np.array([[n, b] for n, b, _ in rows], dtype=float)
    t = np.array([s for _, _, s in rows])
    (o, inv_r), *_ = np.linalg.lstsq(a, t, rcond=None)
    return {"bucket_overhead_s": float(max(o, 0.0)), "mib_per_s": float(1 / inv_r / MiB) if inv_r > 0 else float("nan")}


def _state(total: int) -> dict[str, Any]:
    import torch

    n = 8
    return {f"w{i}": torch.randn(total // n // 2, dtype=torch.bfloat16) for i in range(n)}


def mooncake(total: int = 64 * MiB, buckets_mib: tuple[int, ...] = (1, 4, 16, 64)) -> dict[str, Any]:
    from rollart.runtime.weights import mooncake_store as ms

    ok, why = ms.available()
    if not ok:
        return {"skipped": why}
    rows_pub, rows_pull = [], []
    with ms.start_master() as master:
        spec = master.spec(segment_bytes=4 * total, keep=1)
        pub, sub = spec.open(), spec.for_puller().open()
        try:
            for v, b in enumerate(buckets_mib * 2, start=1):  # each size twice; the first warms up
                pub.publish(v, _state(total), b * MiB)
                sub.pull(v, timeout=60)
                n = -(-total // (b * MiB))
                if v > len(buckets_mib):
                    rows_pub.append((n, total, pub.last_publish["seconds"]))
                    rows_pull.append((n, total, sub.last_pull["seconds"] - sub.last_pull.get("wait_s", 0.0)))
        finally:
            sub.close()
            pub.close()
    return {"publish": _fit(rows_pub), "pull": _fit(rows_pull),
            "rows": [{"bucket_mib": b, "publish_s": round(p[2], 4), "pull_s": round(q[2], 4)}
                     for b, p, q in zip(buckets_mib, rows_pub, rows_pull)], "state_mib": total // MiB}


def ray_store(sizes_mib: tuple[int, ...] = (1, 16, 64, 256)) -> dict[str, Any]:
    import numpy as np
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # never join a running cluster
    rows = []
    try:
        for mib in sizes_mib:
            x = np.ones(mib * MiB, dtype=np.uint8)
            t0 = time.perf_counter()
            ref = ray.put(x)
            t1 = time.perf_counter()
            ray.get(ref)
            t2 = time.perf_counter()
            rows.append({"mib": mib, "put_s": round(t1 - t0, 5), "get_s": round(t2 - t1, 5)})
    finally:
        ray.shutdown()
    fit = _fit([(1, r["mib"] * MiB, r["put_s"]) for r in rows])
    return {"put": fit, "rows": rows}


def conversion(layers: int = 2) -> dict[str, Any]:
    """Megatron → HF layout of Qwen3-8B layers (hidden 4096, 32 q / 8 kv heads of 128, MLP 12288)."""
    import torch

    h, nq, nkv, d, inter = 4096, 32, 8, 128, 12288
    per = nq // nkv
    qkv = torch.randn(nkv * (per + 2) * d, h, dtype=torch.bfloat16)  # fused per KV group
    gate_up = torch.randn(2 * inter, h, dtype=torch.bfloat16)
    down = torch.randn(h, inter, dtype=torch.bfloat16)
    o = torch.randn(h, nq * d, dtype=torch.bfloat16)
    nbytes = sum(t.numel() * 2 for t in (qkv, gate_up, down, o))
    t0 = time.perf_counter()
    for _ in range(layers):
        g = qkv.view(nkv, per + 2, d, h)
        q = g[:, :per].reshape(nq * d, h).contiguous()
        k = g[:, per].reshape(nkv * d, h).contiguous()
        v = g[:, per + 1].reshape(nkv * d, h).contiguous()
        gate, up = gate_up[:inter].contiguous(), gate_up[inter:].contiguous()
        _ = (q, k, v, gate, up, down.contiguous(), o.contiguous())
    dt = (time.perf_counter() - t0) / layers
    return {"layer_mib": round(nbytes / MiB, 1), "seconds_per_layer": round(dt, 4),
            "mib_per_s": round(nbytes / MiB / dt, 1), "threads": torch.get_num_threads()}


def main() -> int:
    out = {"host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
           "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "python -m rollart.calibration.transfer_bench",
           "mooncake_tcp_loopback": mooncake(), "ray_object_store": ray_store(), "conversion_qwen3_8b_layer": conversion()}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(yaml.safe_dump(out, sort_keys=False))
    print(yaml.safe_dump(out, sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
