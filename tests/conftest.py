"""Shared helpers: small plans built from the embedded default scenario; the machine lock that
lets wall-clock tests run alone under pytest-xdist."""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterable, Iterator

import pytest

from rollart.core import mode_config
from rollart.core.trajectory import TrajState
from rollart.plan import Plan, load_plan
from rollart.scenarios_catalog import default_scenario
from rollart.sim import SimBackend, SimOutcome


def small_plan(overrides: Iterable[str] = ()) -> Plan:
    """The default scenario shrunk to seconds of wall time: batch 16 (2 groups of 8), 3 steps."""
    base = ["algorithm.batch_size=16", "algorithm.steps=3"]
    return load_plan(default_scenario(), [*base, *overrides])


def run_sim(plan: Plan, mode: str | None = None, seed: int | None = None, watch_running: bool = False) -> SimOutcome:
    """Simulate; with ``watch_running`` record the most trajectories ever RUNNING at once
    (checked at every launch) as ``outcome.running_high_water``."""
    backend = SimBackend(plan, mode_config(plan, mode), plan.algorithm.seed if seed is None else seed)
    high = [0]
    if watch_running:
        ctl = backend.ctl
        launch = ctl.new_trajectory

        def watched(group, held=None):
            traj = launch(group, held)
            high[0] = max(high[0], sum(1 for t in ctl.trajectories if t.state is TrajState.RUNNING))
            return traj

        ctl.new_trajectory = watched  # type: ignore[method-assign]
    out = backend.run()
    out.running_high_water = high[0]  # type: ignore[attr-defined]
    return out


@pytest.fixture
def plan() -> Plan:
    return small_plan()


# ---------------------------------------------------------------- the machine lock (pytest-xdist)
# Tests marked `exclusive` measure wall time against a model or a deadline (`rollart validate` profiles the
# machine, then compares a real run with the simulator calibrated on that profile): a test on another
# worker starting or stopping beside them changes the machine under their feet. They take a file lock
# exclusively and every other test takes it shared, for its whole setup, call and teardown (module
# fixtures that start Ray included). The turnstile keeps new shared holders out while an exclusive one
# waits, so it is not starved.


_lock_key = pytest.StashKey[Path]()


def _lock_path(testrunuid: str) -> Path:
    return Path(tempfile.gettempdir()) / f"rollart-pytest-{testrunuid}"


def pytest_configure(config: pytest.Config) -> None:
    """The xdist controller names the run (its workers get the same ``testrunuid``) so that it can
    remove the lock folder when they are gone; a uid the user gave may be shared, so it stays."""
    distributing = config.getoption("dist", "no") != "no" and config.getoption("tx", None)
    if getattr(config, "workerinput", None) is None and distributing and not config.option.testrunuid:
        config.option.testrunuid = uuid.uuid4().hex
        config.stash[_lock_key] = _lock_path(config.option.testrunuid)


def pytest_unconfigure(config: pytest.Config) -> None:
    d = config.stash.get(_lock_key, None)
    if d is not None:  # leave nothing in /tmp
        shutil.rmtree(d, ignore_errors=True)


def _lock_dir(config: pytest.Config) -> Path | None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return None  # one process: nothing runs beside a test
    d = _lock_path(workerinput["testrunuid"])
    d.mkdir(exist_ok=True)
    return d


@contextlib.contextmanager
def _machine(config: pytest.Config, exclusive: bool) -> Iterator[None]:
    d = _lock_dir(config)
    if d is None:
        yield
        return
    with open(d / "turnstile", "a") as gate, open(d / "machine", "a") as machine:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(machine, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _machine(item.config, item.get_closest_marker("exclusive") is not None):
        return (yield)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Exclusive tests first: the workers then meet at the start, not while a long test holds the lock.
    (Slow tests first as well measured no faster: 14 min 2 s against 13 min 55 s.)"""
    items.sort(key=lambda it: it.get_closest_marker("exclusive") is None)  # stable: the rest keep their order
