"""Shipped scenarios: the embedded default and the ones under ``scenarios/``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml


def scenarios_root() -> Path:
    return Path(str(resources.files("rollart.scenarios")))


def default_scenario() -> Path:
    return scenarios_root() / "default.yaml"


def shipped() -> list[tuple[str, Path, str]]:
    """(name relative to scenarios/, path, description) for every shipped scenario."""
    root = scenarios_root()
    out = []
    for path in sorted(root.rglob("*.yaml")):
        try:
            desc = (yaml.safe_load(path.read_text()) or {}).get("description", "")
        except yaml.YAMLError:
            desc = "(unreadable YAML)"
        out.append((str(path.relative_to(root)), path, desc))
    return out


def resolve(name: str) -> Path:
    """A path, or a shipped scenario's name with or without ``.yaml``."""
    p = Path(name)
    if p.is_file():
        return p
    root = scenarios_root()
    for candidate in (root / name, root / f"{name}.yaml"):
        if candidate.is_file():
            return candidate
    return p  # the loader reports it missing
