"""Cost models of the simulator, each behind a small interface so calibrated models
(``rollart.calibration``) can replace the first-principles defaults."""

from rollart.sim.costs.env import EnvModel
from rollart.sim.costs.gpu import DecodeLine, GenerationCost, RooflineEfficiency, RooflineGeneration
from rollart.sim.costs.link import WeightTransferCost
from rollart.sim.costs.train import TrainCost

__all__ = ["DecodeLine", "EnvModel", "GenerationCost", "RooflineEfficiency", "RooflineGeneration", "TrainCost",
           "WeightTransferCost"]
