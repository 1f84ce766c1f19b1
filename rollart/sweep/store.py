"""Finished sweep points on disk: one JSON per point under ``OUT/points/``, named by a stable
hash of what determines its result (scenario content, overrides, seed, mode), so a rerun of
the same sweep, or of a grid that overlaps it, skips what is already there."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

from rollart.files import write_text_atomic


def point_key(scenario: dict[str, Any], overrides: Iterable[str], seed: int | None, mode: str | None) -> str:
    """Hex digest of the scenario's content (after ``extends:``; the file name does not matter),
    the overrides in order, the seed and the mode."""
    blob = json.dumps({"scenario": scenario, "overrides": list(overrides), "seed": seed, "mode": mode},
                      sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


class ResultStore:
    def __init__(self, out: str | Path):
        self.root = Path(out)
        self.points = self.root / "points"
        self.points.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.points / f"{key}.json"

    def has(self, key: str) -> bool:
        return self.path(key).is_file()

    def load(self, key: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.path(key).read_text())
        except (OSError, ValueError):  # missing, or a torn write from an interrupted run: redo it
            return None

    def save(self, key: str, record: dict[str, Any]) -> None:
        """Atomic: a crash mid-write never leaves a half file that a rerun would trust."""
        write_text_atomic(self.path(key), json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
