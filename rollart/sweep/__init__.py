"""What-if sweeps: a grid (or Latin-hypercube samples) of ``--set`` overrides over one scenario,
each point simulated in a Ray task, results kept one JSON per point so a rerun skips finished
points, written as ``results.csv`` (and ``results.parquet`` with pyarrow) with a Pareto plot.

Ray is optional: nothing here imports it until a sweep actually runs (:mod:`rollart.sweep.runner`).
"""

from rollart.sweep.grid import GridDim, Point, grid_points, lhs_points, parse_grid
from rollart.sweep.pareto import pareto_front, plot_pareto
from rollart.sweep.results import result_row, write_results
from rollart.sweep.store import ResultStore, point_key

__all__ = ["GridDim", "Point", "ResultStore", "grid_points", "lhs_points", "pareto_front", "parse_grid",
           "plot_pareto", "point_key", "result_row", "write_results"]
