"""The machine lock of tests/conftest.py: an exclusive holder never overlaps anyone; shared holders overlap."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import time
import uuid
from types import SimpleNamespace

import pytest

from tests.conftest import _lock_path, _machine


def _hold(runuid: str, idx: int, exclusive: bool, hold_s: float, start_after_s: float, out) -> None:
    time.sleep(start_after_s)
    config = SimpleNamespace(workerinput={"testrunuid": runuid})
    with _machine(config, exclusive):  # type: ignore[arg-type]
        t0 = time.monotonic()
        time.sleep(hold_s)
        out.put((idx, t0, time.monotonic()))


def _intervals(specs: list[tuple[bool, float, float]]) -> list[tuple[int, float, float]]:
    """Run each (exclusive, hold_s, start_after_s) in its own process; (index, start, end) of each hold, in order."""
    fork = mp.get_context("fork")
    runuid, q = uuid.uuid4().hex, fork.Queue()
    procs = [fork.Process(target=_hold, args=(runuid, i, *s, q)) for i, s in enumerate(specs)]
    for p in procs:
        p.start()
    try:
        got = sorted(q.get(timeout=30) for _ in procs)
        for p in procs:
            p.join(timeout=30)
    finally:
        shutil.rmtree(_lock_path(runuid), ignore_errors=True)
    return got


def _overlap(a: tuple[int, float, float], b: tuple[int, float, float]) -> bool:
    return a[1] < b[2] and b[1] < a[2]


@pytest.mark.exclusive  # its holds are timed: nothing may run beside it
def test_an_exclusive_holder_overlaps_no_one_and_is_not_starved() -> None:
    # the exclusive one asks while a shared one holds; two more shared ones ask after it
    first, ex, later, last = _intervals([(False, 0.4, 0.0), (True, 0.3, 0.1), (False, 0.4, 0.2), (False, 0.4, 0.3)])
    assert not any(_overlap(ex, g) for g in (first, later, last))
    assert later[1] >= ex[2] and last[1] >= ex[2]  # it went before those that asked after it: not starved
    assert _overlap(later, last)


@pytest.mark.exclusive
def test_shared_holders_run_side_by_side() -> None:
    a, b = _intervals([(False, 0.5, 0.0), (False, 0.5, 0.1)])
    assert _overlap(a, b)
