"""A streamed trace (``Tracer(stream_to=path)``) holds few events in memory and writes the same
bytes as an in-memory trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollart import trace as trace_mod
from rollart.core import mode_config
from rollart.sim import SimBackend
from rollart.trace import Tracer
from tests.conftest import small_plan


def test_streamed_trace_equals_in_memory_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = small_plan()
    whole = Tracer()
    SimBackend(plan, mode_config(plan), 0, tracer=whole).run()
    whole.write(tmp_path / "whole.json")

    monkeypatch.setattr(trace_mod, "FLUSH_EVERY", 50)
    path = tmp_path / "streamed.json"
    streamed = Tracer(stream_to=path)
    held: list[int] = []
    SimBackend(plan, mode_config(plan), 0, tracer=streamed, on_step=lambda _: held.append(len(streamed.events))).run()
    assert max(held) < 50 and (tmp_path / "streamed.json.part").exists()
    streamed.write(path)
    assert not (tmp_path / "streamed.json.part").exists()
    assert path.read_bytes() == (tmp_path / "whole.json").read_bytes()
    assert len(json.loads(path.read_text())["traceEvents"]) > 200
