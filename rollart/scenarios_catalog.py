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


def shipped_names() -> list[str]:
    return [name.removesuffix(".yaml") for name, _, _ in shipped()]


def resolve_existing(name: str) -> Path:
    """Like :func:`resolve`, but a name that is neither a file nor a shipped scenario is a
    PlanError suggesting the closest shipped names."""
    path = resolve(name)
    if path.is_file():
        return path
    from rollart.plan.loader import PlanError, did_you_mean

    names = shipped_names()
    stem = name.removesuffix(".yaml")
    # match on the whole name and on its last part (qwen3-8b → paper/qwen3-8b-128gpu)
    hint = did_you_mean(stem, names, "shipped scenarios", many=6)
    if "did you mean" not in hint:
        by_tail = {n.rsplit("/", 1)[-1]: n for n in names}
        close = [by_tail[t] for t in __import__("difflib").get_close_matches(stem.rsplit("/", 1)[-1], list(by_tail),
                                                                          n=3, cutoff=0.5)]
        close += [n for n in names if stem and stem in n and n not in close]
        if close:
            hint = f"; did you mean {' or '.join(repr(c) for c in close[:3])}? (rollart scenarios lists them)"
    if "rollart scenarios" not in hint:
        hint += " (rollart scenarios lists the shipped ones)"
    raise PlanError([f"{name}: no such scenario file or shipped scenario{hint}"])


def resolve(name: str) -> Path:
    """A path, or a shipped scenario's name with or without ``.yaml``."""
    p = Path(name)
    if p.is_file():
        return p
    root = scenarios_root()
    # "scenarios/local/digits.yaml" as typed in a clone's root also names the shipped file elsewhere
    short = name[len("scenarios/"):] if name.startswith("scenarios/") else name
    for candidate in (root / name, root / f"{name}.yaml", root / short, root / f"{short}.yaml"):
        if candidate.is_file():
            return candidate
    return p  # the loader reports it missing
