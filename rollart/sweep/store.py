"""Finished sweep points on disk: one JSON per point under ``OUT/points/``, named by a stable
hash of what determines its result (scenario content, overrides, seed, mode, and the simulator
itself), so a rerun of the same sweep, or of a grid that overlaps it, skips what is already there,
and a rerun after the simulator or its calibration changed recomputes it."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from rollart.files import write_text_atomic


def simulator_files() -> list[tuple[str, Path]]:
    """(label, path) of the simulator's code and the calibration it reads: the ``rollart``, ``sim`` and
    ``calibration`` packages' .py and .yaml files, labelled ``<package dir>/<relative path>``."""
    import rollart
    import rollart.calibration
    import rollart.sim

    files = []
    for root in sorted({Path(m.__file__).resolve().parent for m in (rollart, rollart.sim, rollart.calibration)}):
        for path in sorted(root.rglob("*")):
            if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts and path.is_file():
                files.append((f"{root.name}/{path.relative_to(root).as_posix()}", path))
    return files


@lru_cache(maxsize=1)
def simulator_digest() -> str:
    """Hex digest of ``simulator_files``: a point's result depends on them as much as on its
    scenario, so a resumed sweep must not serve a result an older model computed."""
    h = hashlib.sha256()
    for label, path in simulator_files():
        h.update(f"{label}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def point_key(scenario: dict[str, Any], overrides: Iterable[str], seed: int | None, mode: str | None,
              scale_approx: bool = False) -> str:
    """Hex digest of the scenario's content (after ``extends:``; the file name does not matter),
    the overrides in order, the seed, the mode, the simulator (``simulator_digest``) and, when set,
    ``--scale-approx`` (an approximated point is not the full one)."""
    key: dict[str, Any] = {"scenario": scenario, "overrides": list(overrides), "seed": seed, "mode": mode,
                           "simulator": simulator_digest()}
    if scale_approx:
        key["scale_approx"] = True
    blob = json.dumps(key, sort_keys=True, default=str, separators=(",", ":"))
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
