"""Experiment: Colocated (time-shared) vs disaggregated trainer and rollout on 128 H800 (Qwen3-8B)."""

from __future__ import annotations


from rollart.reproduce import plots
from rollart.reproduce.experiments.common import B8, MODE_LABEL, _failures, _find
from rollart.reproduce.figures import breakdown_mean, busy, fr, fs, fx, ratio, step_s, steady, throughput
from rollart.reproduce.model import Experiment, MdTable, Outcome, Section, Variant


COLOC_MODES = ("sync", "areal", "rollart")
COLOC_LAYOUTS = (
    ("colocated", "colocated: trainer and rollout time-share 128 H800",
     ("placement.colocated=true", "placement.trainer.gpus=128", "placement.generation=[{pool: h800, workers: 128, tp: 1}]")),
    ("disaggregated", "disaggregated: 64 H800 train + 64 H800 rollout",
     ("placement.trainer.gpus=64", "placement.generation=[{pool: h800, workers: 64, tp: 1}]")),
)
COLOC_BASE = ("cluster.gpu_pools.h800.count=128", "placement.hw_affinity={}")


def _analyse_colocation(outs: list[Outcome]) -> Section:
    rows, head = [], {}
    for m in COLOC_MODES:
        for key, label, _ in COLOC_LAYOUTS:
            o = _find(outs, mode=m, layout=key)
            if o is None:
                continue
            head[f"{m}.{key}"] = throughput(o)
            rows.append([MODE_LABEL[m], label, fs(step_s(o)), fr(throughput(o)),
                         fs(breakdown_mean(steady(o), "train")), busy(o)])
    table = MdTable(["mode", "placement", "step s", "traj/s", "train s / step (incl. switch)", "GPU busy"], rows)
    comparison = MdTable(["quantity", "simulated", "paper"], [
        [f"{MODE_LABEL[m]}: disaggregated ÷ colocated throughput",
         fx(ratio(head.get(f"{m}.disaggregated"), head.get(f"{m}.colocated"))),
         "Table 5 compares the two (no number in our notes)" if m == "sync" else ""] for m in COLOC_MODES])
    notes = ["Colocated: every train step offloads the engines (KV and weights) and onloads the trainer's weights "
             "and optimizer state, and back (`ColocationSwitch`, sim/costs/train.py); rollout cannot overlap "
             "training, so asynchronous modes lose their overlap. Disaggregated: half the GPUs each, overlap "
             "allowed (α = 1). Throughput over the steady-state steps."] + _failures(outs)
    return Section(table, comparison, notes, headline=head)


COLOCATION = Experiment(
    name="colocation",
    title="Colocated (time-shared) vs disaggregated trainer and rollout on 128 H800 (Qwen3-8B)",
    setup=("Qwen3-8B, the four-task mix (no SWE), batch 512, on 128 H800: trainer and 128 rollout workers "
           "time-sharing every GPU, or 64 train + 64 rollout; modes Sync, AReaL-style and ROLLART (α = 1; ROLLART "
           "without H20 here, routing least-loaded). Scenario `paper/qwen3-8b-128gpu` with placement overrides."),
    steps=8,
    variants=tuple(Variant(f"{MODE_LABEL[m]} · {label}", B8, m, (*COLOC_BASE, *ov),
                           params={"mode": m, "layout": key, "key": f"{m}.{key}"})
                   for m in COLOC_MODES for key, label, ov in COLOC_LAYOUTS),
    analyse=_analyse_colocation,
    plot=lambda outs, path: plots.bars(outs, path, [(f"{m}.{k}", f"{MODE_LABEL[m]}\n{k}") for m in COLOC_MODES
                                                    for k, _, _ in COLOC_LAYOUTS], "key", throughput,
                                       "trajectories / s", "Colocation vs disaggregation (Qwen3-8B, 128 H800)"),
    paper="The paper compares colocation with disaggregation (Table 5); the notes record no number.",
)
