"""The ROLLART paper's evaluation as experiments: base scenarios, variants and analyses.

Every variant is a shipped scenario (``scenarios/paper/...``) plus a mode and ``--set``
overrides, so each row of the report can be rerun with ``rollart simulate`` (the report lists
the commands). The paper's numbers quoted here are exactly those of the project's paper notes;
everything the paper does not say is a choice written into the scenario files' comments.
One calibration serves every experiment: the shipped GPU kernel profiles, the trainer's FLOPs
model and the task profiles of ``calibration/tasks``; no experiment adjusts them. One module per
experiment; ``common`` holds the base scenarios, the modes and the notes they share.
"""

from __future__ import annotations

from rollart.reproduce.experiments.affinity import AFFINITY
from rollart.reproduce.experiments.alpha import ALPHA
from rollart.reproduce.experiments.colocation import COLOCATION
from rollart.reproduce.experiments.env_latency import ENV_SIGMA
from rollart.reproduce.experiments.hardware import H800_H20
from rollart.reproduce.experiments.pd import PD
from rollart.reproduce.experiments.redundancy import REDUNDANCY
from rollart.reproduce.experiments.reward import REWARD_EXP
from rollart.reproduce.experiments.scaling import SCALING
from rollart.reproduce.experiments.swe import SWE
from rollart.reproduce.experiments.throughput import THROUGHPUT
from rollart.reproduce.experiments.transfer import TRANSFER
from rollart.reproduce.model import Experiment

EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    SWE, H800_H20, THROUGHPUT, SCALING, AFFINITY, ENV_SIGMA, REWARD_EXP, ALPHA, TRANSFER, REDUNDANCY, PD, COLOCATION)}
