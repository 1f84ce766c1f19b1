"""What an experiment is (a list of variants of shipped scenarios) and what running one gives."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from rollart.core.stats import StepRecord
from rollart.plan import Plan
from rollart.report import RunResult
from rollart.reproduce.checks import Check


@dataclass(frozen=True)
class Variant:
    """One simulated configuration: a shipped scenario (name relative to ``scenarios/``, as
    ``rollart simulate`` takes it), a mode (None: the plan's ``algorithm.mode``) and
    ``--set``-style overrides. ``params`` carries the experiment's own coordinates
    (model, σ, batch size, …) for its tables and plots."""

    label: str
    scenario: str
    mode: str | None = None
    overrides: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    probe_env_errors: bool = False  # record every failed env call (task, call, error, start, end)

    def command(self, steps: int, extra: tuple[str, ...] = ()) -> str:
        """The equivalent ``rollart simulate`` command line."""
        parts = ["rollart simulate", self.scenario]
        if self.mode:
            parts += ["--mode", self.mode]
        parts += ["--steps", str(steps)]
        for o in (*self.overrides, *extra):
            parts += ["--set", f"'{o}'" if any(c in o for c in " {}[],") else o]
        return " ".join(parts)


@dataclass
class Outcome:
    """A variant's run: its plan, its result (None when the plan or the run failed) and why not."""

    variant: Variant
    plan: Plan | None
    result: RunResult | None
    error: str | None
    wall_s: float
    steps: int
    cached: bool = False
    extra_overrides: tuple[str, ...] = ()  # what the runner added (a reduced run's batch cap)
    cpu_s: float = 0.0                     # process CPU time of the simulation (0 when reused)
    env_errors: list[tuple[str, str, str, float, float]] = field(default_factory=list)

    def command(self) -> str:
        return self.variant.command(self.steps, self.extra_overrides)

    @property
    def ok(self) -> bool:
        return self.result is not None and bool(self.result.steps)

    @property
    def summary(self) -> dict[str, Any]:
        return self.result.summary if self.result is not None else {}

    @property
    def records(self) -> list[StepRecord]:
        return self.result.steps if self.result is not None else []


@dataclass
class MdTable:
    headers: list[str]
    rows: list[list[str]]

    def render(self) -> str:
        def esc(cell: str) -> str:
            return str(cell).replace("|", "\\|").replace("\n", " ")

        out = ["| " + " | ".join(esc(h) for h in self.headers) + " |",
               "| " + " | ".join("---" if i == 0 else "---:" for i in range(len(self.headers))) + " |"]
        out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in self.rows]
        return "\n".join(out)


@dataclass
class Section:
    """What an experiment contributes to the report besides its setup and plot."""

    table: MdTable
    comparison: MdTable | None = None   # quantity | simulated | paper
    notes: list[str] = field(default_factory=list)
    extra_tables: list[tuple[str, MdTable]] = field(default_factory=list)
    headline: dict[str, Any] = field(default_factory=dict)  # machine-readable key figures
    checks: list[Check] = field(default_factory=list)       # paper figures with a verdict (the report's summary)


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    setup: str                   # one paragraph for the report
    steps: int                   # default simulated steps per variant
    variants: tuple[Variant, ...]
    analyse: Callable[[list[Outcome]], Section]
    plot: Callable[[list[Outcome], Path], None]
    paper: str = ""              # what paper-notes.md says about it, quoted in the report


class ReproduceError(Exception):
    """A usage error (unknown experiment name, bad option): one line for the user."""
