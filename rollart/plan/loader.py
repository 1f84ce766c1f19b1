"""Load a plan from YAML, apply ``--set a.b=c`` overrides, and turn validation errors
into one line per problem: ``field.path: what is wrong``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import ValidationError

from rollart.plan.schema import PROBLEM_SEPARATOR, Plan

# Discriminator tags pydantic inserts into error locations after a distribution field;
# a user never writes them.
_UNION_TAGS = {"constant", "lognormal", "gaussian", "uniform", "pareto", "empirical", "mixture", "spliced"}
_DIST_FIELDS = {"reset", "step", "turns", "prompt_tokens", "obs_tokens", "response_tokens", "dist"}


def did_you_mean(word: str, options: Iterable[str], what: str, many: int = 12) -> str:
    """``; did you mean 'x'?`` for the closest option (difflib), and the whole list when it is
    short: the tail of an error message."""
    import difflib

    options = [str(o) for o in options]
    close = difflib.get_close_matches(str(word), options, n=1, cutoff=0.6)
    if not close:  # case slips (Frozenlake) are the commonest typo
        close = [o for o in options if o.lower() == str(word).lower()]
    out = f"; did you mean '{close[0]}'?" if close else ""
    if options and len(options) <= many:
        out += f" {what} are: {', '.join(options)}" if close else f"; {what} are: {', '.join(options)}"
    elif not close:
        out += " (see the README's plan reference)" if what == "fields" else ""
    return out


class PlanError(Exception):
    """A plan the user wrote is wrong; ``problems`` are ``path: message`` lines."""

    def __init__(self, problems: list[str]):
        # one line each, whatever a user's string holds
        self.problems = [p.replace("\r", "\\r").replace("\n", "\\n") for p in problems]
        super().__init__("\n".join(problems))


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.0.c=VALUE`` → (["a","b","0","c"], yaml-parsed VALUE). A list item may also be written
    with brackets, as in Python or Hydra: ``tasks[0].share``, ``tasks[FrozenLake].share``."""
    if "=" not in text:
        raise PlanError([f"--set {text}: expected KEY=VALUE, e.g. algorithm.alpha=2"])
    key, _, raw = text.partition("=")
    key = re.sub(r"\[([^\[\]]+)\]", r".\1", key.strip())
    path = [part for part in key.split(".") if part]
    if not path:
        raise PlanError([f"--set {text}: empty key"])
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise PlanError([f"--set {key}: value is not valid YAML ({exc.problem})"]) from None
    return path, value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Set each dotted path in a copy of ``data``. List items can be addressed by index or,
    for lists of named items (tasks), by name: ``tasks.FrozenLake.share=0.3``."""
    import copy

    data = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node: Any = data
        for i, part in enumerate(path):
            last = i == len(path) - 1
            where = ".".join(path[: i + 1])
            if isinstance(node, list):
                idx = _list_index(node, part)
                if idx is None:
                    names = [str(x["name"]) for x in node if isinstance(x, dict) and "name" in x]
                    hint = (did_you_mean(part, names, path[i - 1] if i else "items") if names
                            else f"; indexes are 0 to {len(node) - 1}")
                    raise PlanError([f"--set {'.'.join(path)}: no item '{part}' at {where}{hint}"])
                if last:
                    node[idx] = value
                else:
                    node = node[idx]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                else:
                    child = _expand_shorthand(part, node.get(part))
                    if child is None:
                        child = {}
                    elif not isinstance(child, (dict, list)):
                        raise PlanError([f"--set {'.'.join(path)}: {where} is a value ({child!r}), not a section"])
                    node[part] = child
                    node = child
            else:
                raise PlanError([f"--set {'.'.join(path)}: {'.'.join(path[:i])} is a value, not a section"])
    return data


def _expand_shorthand(key: str, value: Any) -> Any:
    """A section written in short form becomes its long form, so a field inside can be set:
    ``model: Qwen3-8B`` → ``{preset: Qwen3-8B}``, ``reset: 2`` → ``{kind: constant, value: 2}``."""
    from rollart.plan.distributions import coerce_distribution

    if key in ("model", "reward_model") and isinstance(value, str):
        return {"preset": value}
    if key in _DIST_FIELDS:
        return coerce_distribution(value)
    return value


def _list_index(items: list[Any], part: str) -> int | None:
    if part.lstrip("-").isdigit():
        idx = int(part)
        return idx if -len(items) <= idx < len(items) else None
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("name") == part:
            return i
    return None


def _task_names(data: dict[str, Any]) -> list[str | None]:
    tasks = data.get("tasks")
    if not isinstance(tasks, list):
        return []
    return [t.get("name") if isinstance(t, dict) and isinstance(t.get("name"), str) else None for t in tasks]


def format_validation_error(err: ValidationError, data: dict[str, Any] | None = None) -> list[str]:
    """One ``path: message`` line per error; tasks are named (``tasks.FrozenLake.env...``),
    which is also how ``--set`` addresses them."""
    names = _task_names(data or {})
    lines = []
    for e in err.errors():
        raw = [str(x) for x in e["loc"]]
        if len(raw) > 1 and raw[0] == "tasks" and raw[1].isdigit() and int(raw[1]) < len(names) \
                and names[int(raw[1])] and re.fullmatch(r"[^\s.:]+", names[int(raw[1])]):
            raw[1] = names[int(raw[1])]
        loc = [x for i, x in enumerate(raw) if not (x in _UNION_TAGS and i and raw[i - 1] in _DIST_FIELDS)]
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if not loc and PROBLEM_SEPARATOR in msg or (not loc and ":" in msg.split(" ")[0]):
            lines.extend(msg.split(PROBLEM_SEPARATOR))  # cross-field checks already carry their paths
            continue
        path = ".".join(loc) or "plan"
        if e["type"] == "extra_forbidden":
            allowed = _allowed_fields([str(x) for x in e["loc"]][:-1])
            msg = ("unknown field" + did_you_mean(str(e["loc"][-1]), allowed, "fields", many=10)
                   if allowed else "unknown field (check the spelling; see the README's plan reference)")
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif "input" in e and e["type"] not in ("model_type",) and not isinstance(e["input"], (dict, list)):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"{path}: {msg}")
    return lines


def _allowed_fields(loc: list[str]) -> list[str]:
    """The field names a model accepts at ``loc`` (a raw pydantic error location, with list
    indexes, dict keys and distribution tags), walking the schema's types; [] if unknown."""
    from typing import Annotated, Union, get_args, get_origin

    from pydantic import BaseModel

    from rollart.plan.schema import Plan

    def members(tp: Any) -> list[Any]:
        origin = get_origin(tp)
        if origin is Annotated:
            return members(get_args(tp)[0])
        if origin is Union or type(tp).__name__ == "UnionType":
            return [m for a in get_args(tp) for m in members(a)]
        return [tp]

    def fields(model: type[BaseModel]) -> dict[str, Any]:
        return {(f.alias or n): f.annotation for n, f in model.model_fields.items()}

    current: list[Any] = [Plan]
    for part in loc:
        nxt: list[Any] = []
        for tp in (m for t in current for m in members(t)):
            origin = get_origin(tp)
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                kind = tp.model_fields.get("kind")
                if kind is not None and part == kind.default:
                    nxt.append(tp)  # the discriminator tag pydantic puts in the location
                elif part in fields(tp):
                    nxt.append(fields(tp)[part])
            elif origin in (list, dict):
                nxt.append(get_args(tp)[-1])
        if not nxt:
            return []
        current = nxt
    names: list[str] = []
    for tp in (m for t in current for m in members(t)):
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            names += [n for n in fields(tp) if n not in names and n != "kind"]
    return names


def plan_from_dict(data: dict[str, Any], overrides: Iterable[str] = ()) -> Plan:
    data = apply_overrides(data, overrides)
    try:
        return Plan.model_validate(data)
    except ValidationError as err:
        raise PlanError(format_validation_error(err, data)) from None


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``: mappings merge key by key, anything else (lists too) is replaced,
    and a key whose value in ``top`` is null is removed (from ``base`` and from the result)."""
    out = dict(base)
    for key, value in top.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = deep_merge(out[key] if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = value
    return out


def _resolve_profile_paths(data: dict[str, Any], base: Path) -> None:
    """A pool's or the trainer's ``profile:`` path is relative to the scenario file that names it."""
    pools = (data.get("cluster") or {}).get("gpu_pools") if isinstance(data.get("cluster"), dict) else None
    if not isinstance(pools, dict):
        pools = {}
    trainer = (data.get("placement") or {}).get("trainer") if isinstance(data.get("placement"), dict) else None
    for holder in [*pools.values(), trainer]:
        if isinstance(holder, dict) and isinstance(holder.get("profile"), str) and holder["profile"] != "datasheet":
            candidate = base / holder["profile"]
            if not Path(holder["profile"]).is_absolute() and candidate.exists():
                holder["profile"] = str(candidate)


def read_yaml(path: str | Path, _seen: tuple[Path, ...] | None = None) -> dict[str, Any]:
    """Read a scenario; ``extends: other.yaml`` (relative to this file) deep-merges this file
    over the other, so a what-if scenario only states what it changes:

    * mappings merge key by key, at any depth;
    * any other value, a list included, replaces the parent's whole value;
    * ``key: null`` (or ``key: ~``, or a bare ``key:``) *removes* the key inherited from the
      parent, at any depth of the mappings, so the field falls back to its schema default
      (``reward_model: null``) or the mapping loses that entry (``cluster: {gpu_pools: {h20:
      null}}`` drops a pool, ``placement: {hw_affinity: {GEM-Math: null}}`` a route). Inside a
      list nothing is merged, so there is nothing to remove: restate the list. A null in a file
      that extends nothing is left as it is.

    To set a field to null rather than to its default (``cluster.serverless``, whose default is
    a platform), use an override: ``--set cluster.serverless=null``."""
    path = Path(path)
    if not path.is_file():
        raise PlanError([f"{path}: no such scenario file"])
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise PlanError([f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}"]) from None
    if not isinstance(data, dict):
        raise PlanError([f"{path}: a scenario is a YAML mapping with cluster, model, tasks, placement, algorithm"])
    _resolve_profile_paths(data, path.parent)
    seen = _seen if _seen is not None else (path.resolve(),)
    data.setdefault("name", path.stem)  # the file's own name, not its parent's
    parent = data.pop("extends", None)
    if parent is not None:
        parent_path = (path.parent / str(parent)).resolve()
        if not parent_path.is_file():  # a shipped scenario's name: extends: paper/qwen3-8b-128gpu
            from rollart.scenarios_catalog import resolve

            shipped = resolve(str(parent))
            if shipped.is_file():
                parent_path = shipped.resolve()
        if parent_path in seen:
            raise PlanError([f"{path}: extends: '{parent}' makes a cycle"])
        data = deep_merge(read_yaml(parent_path, seen + (parent_path,)), data)
    return data


def load_plan(path: str | Path, overrides: Iterable[str] = ()) -> Plan:
    return plan_from_dict(read_yaml(path), overrides)
