"""Before ``rollart run`` / ``rollart validate`` start Ray: does this plan fit the machine?

A plan written for a GPU cluster (``rollart run default``) would otherwise map its pools onto
CPU "virtual devices" and try to load a billions-of-parameters model on this host, which
hangs for minutes before failing. The check takes milliseconds and says what is missing and
how to map the plan: ``runtime.pools`` onto CPU virtual devices with a tiny
``runtime.model`` (as ``scenarios/local/*.yaml`` do), or ``--address`` of a GPU cluster.
With ``--address`` the machine at hand is not where the workers run, so only the plan's own
consistency is checked here (the cluster's resources are Ray's to match)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from rollart.plan.presets import canonical_gpu
from rollart.plan.schema import Plan

GIB = 2**30
# Bytes per parameter the CPU runtime holds: each engine keeps an fp32 copy; the trainer
# keeps fp32 weights, gradients and Adam's two moments.
ENGINE_BYTES_PER_PARAM = 4
TRAINER_BYTES_PER_PARAM = 16


def _hint(pools: list[str]) -> str:
    sets = " ".join(f"--set runtime.pools.{p}.devices=cpu" for p in pools)
    return ("map the pools onto CPU virtual devices with a tiny model, as scenarios/local/*.yaml do (runtime: {pools: "
            f"{{<pool>: {{devices: cpu, count: N}}}}, model: Qwen3-tiny}}; "
            f"here: --set runtime.model=Qwen3-tiny {sets}), "
            "or run on a GPU Ray cluster with --address HOST:PORT")


@dataclass(frozen=True)
class Machine:
    """What this host offers the runtime."""

    gpus: int
    cpu_cores: int
    memory_available_bytes: int

    @classmethod
    def here(cls) -> "Machine":
        return cls(gpus=_local_gpus(), cpu_cores=os.cpu_count() or 1, memory_available_bytes=_available_memory())


def _local_gpus() -> int:
    """NVIDIA GPUs visible to this process (``nvidia-smi -L``; 0 without a driver)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    if visible:
        n = min(n, len([x for x in visible.split(",") if x.strip()]))
    return n


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError):
        return 1 << 62  # unknown: do not refuse


def _gpus_placed(plan: Plan, pool: str) -> int:
    p = plan.placement
    n = sum(g.workers * g.tp for g in p.generation if g.pool == pool)
    if p.trainer.pool == pool:
        n += p.trainer.gpus
    if p.reward.gpus and p.reward.pool == pool:
        n += p.reward.gpus
    return n


def problems(plan: Plan, address: str | None = None, machine: Machine | None = None) -> list[str]:
    """What stops ``plan`` from running here, one line each naming the field; empty if it fits."""
    if address:
        return []
    m = machine or Machine.here()
    rt = plan.runtime
    out: list[str] = []
    used_pools = sorted({g.pool for g in plan.placement.generation} | {plan.placement.trainer.pool}
                        | ({plan.placement.reward.pool} if plan.placement.reward.gpus and plan.placement.reward.pool
                           else set()))
    # A pool the runtime section does not map, of a datasheet GPU type (H800, H20...), is a pool
    # of real GPUs; one of a custom type the runtime maps onto CPU virtual devices.
    want_gpu = {}
    for name in used_pools:
        rp = rt.pools.get(name)
        gpu = plan.cluster.gpu_pools[name].gpu
        if rp is None and gpu not in plan.cluster.custom_gpus and canonical_gpu(gpu) is not None:
            want_gpu[name] = (_gpus_placed(plan, name), gpu, False)
        elif rp is not None and rp.devices == "gpu":
            want_gpu[name] = (rp.count, gpu, True)
    need = sum(n for n, _, _ in want_gpu.values())
    if want_gpu and need > m.gpus:
        pools = ", ".join(f"{name} ({n} × {gpu}{', runtime.pools' if mapped else ''})"
                          for name, (n, gpu, mapped) in want_gpu.items())
        have = "no GPU" if m.gpus == 0 else f"{m.gpus} GPUs"
        out.append(f"runtime.pools: this plan needs {need} GPUs — pools {pools} — and this machine has {have}; "
                   + _hint(list(want_gpu)))
        return out  # the rest follows from the mapping the user picks
    if rt.num_cpus is not None and rt.num_cpus > m.cpu_cores:
        out.append(f"runtime.num_cpus: {rt.num_cpus} CPUs asked for, this machine has {m.cpu_cores} cores; "
                   f"set it to at most {m.cpu_cores} or leave it out")
    if rt.engine == "vllm" and not any(rp.devices == "gpu" for rp in rt.pools.values()):
        out.append("runtime.engine: vllm needs GPU pools (runtime.pools.<pool>.devices: gpu); use engine: torch on "
                   "CPU virtual devices")
    if rt.trainer == "megatron" and m.gpus == 0:
        out.append("runtime.trainer: megatron needs GPUs and this machine has none; use trainer: torch")
    if not any(rp.devices == "gpu" for rp in rt.pools.values()):
        model = rt.model or plan.model
        engines = sum(g.workers for g in plan.placement.generation)
        need_bytes = model.params * (engines * ENGINE_BYTES_PER_PARAM + TRAINER_BYTES_PER_PARAM)
        if need_bytes > m.memory_available_bytes:
            field = "runtime.model" if rt.model is not None else "model"
            out.append(f"{field}: {model.name} ({model.params / 1e9:.2g} B parameters) needs about "
                       f"{need_bytes / GIB:,.0f} GiB on CPU ({engines} engine copies in fp32 + the trainer with "
                       f"Adam) and this machine has {m.memory_available_bytes / GIB:,.1f} GiB available; set "
                       "runtime.model to a small model (e.g. --set runtime.model=Qwen3-tiny, as scenarios/local/ "
                       "do), or run on a GPU cluster with --address HOST:PORT")
    return out


def require_runnable(plan: Plan, address: str | None = None) -> None:
    """Exit with code 2 and the problems (one line each) when ``plan`` cannot run here."""
    found = problems(plan, address)
    if found:
        from rollart.cli import _fail

        _fail(found)


__all__ = ["Machine", "problems", "require_runnable"]
