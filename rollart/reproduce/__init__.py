"""``rollart reproduce``: the ROLLART paper's evaluation as shipped scenarios, simulated.

* :mod:`rollart.reproduce.experiments` — the registry, one module per experiment (``common`` holds
  what they share): each experiment is a base scenario under ``scenarios/paper/`` plus variants
  (label, mode, ``--set`` overrides), an analysis that puts the simulated figures beside the
  paper's, and a plot.
* :mod:`rollart.reproduce.runner` — runs a variant exactly as ``rollart simulate`` would
  (``load_plan`` → ``mode_config`` → ``simulate_plan``), reusing identical variants.
* :mod:`rollart.reproduce.main` — selection, progress bar, ``report.md`` / ``results.json`` / PNGs.

Reduced runs for CI: ``--steps 1`` and the environment variable ``ROLLART_REPRODUCE_BATCH``
(e.g. ``16``), which caps every plan's batch size (a multiple of its GRPO group size);
``ROLLART_REPRODUCE_VARIANT_TIMEOUT`` (seconds, default 90) bounds one variant's CPU time (not wall time:
machine load does not move it; a variant blocked without computing is stopped too);
``ROLLART_REPRODUCE_JOBS`` sets the worker processes (default one per CPU, at most 8).
"""

from rollart.reproduce.experiments import EXPERIMENTS
from rollart.reproduce.main import run_reproduce, select
from rollart.reproduce.model import Experiment, Outcome, ReproduceError, Variant
from rollart.reproduce.runner import BATCH_ENV, JOBS_ENV, TIMEOUT_ENV, Runner, env_batch_cap, env_jobs

__all__ = ["BATCH_ENV", "EXPERIMENTS", "Experiment", "JOBS_ENV", "Outcome", "ReproduceError", "Runner",
           "TIMEOUT_ENV", "Variant", "env_batch_cap", "env_jobs", "run_reproduce", "select"]
