"""Rule rewards, one per task kind: ``score(task, trajectory_record) -> float``.

Stateless and dependency-free (standard library only), so the same functions run in-process
and inside the serverless reward deployment.

The trajectory record is a JSON-able dict; what the rules read::

    {
      "task": "GEM-Math",                # task name (the ``task`` argument wins when given)
      "kind": "math",                    # optional: frozenlake | game | math | code
      "steps": [                         # one entry per env.step, in order ("turns" also accepted)
        {"action": "... \\boxed{42}", "observation": "...", "reward": 1.0, "done": true,
         "info": {...}},                 # the StepResult.info the env returned
      ],
      "reference": "42",                 # optional: math reference answer (else steps[-1].info)
      "final_answer": "...",             # optional: the last action (when there are no steps)
      "env_reward": 1.0,                 # optional: the sum of the env's step rewards
    }

Without ``steps`` (a record of only ``final_answer``/``env_reward``, as the runtime backend
sends today) each rule falls back to trusting the env's own verdict: ``env_reward >= 1``
(the envs pay exactly 1 for a goal, a solved game, a right answer, passing tests). Records
with the step infos let the rule re-check independently of the env.

What each rule checks (the env writes these keys into its step ``info``):

* FrozenLake — the goal was reached: ``info.reached_goal`` of the last step (else an env
  reward of 1 on the last step). 1 or 0.
* GEM game — solved: ``info.solved`` of the last step (else the last env reward >= 1). 1 or 0.
* GEM math — the number in the last action equals the reference (``record.reference`` or
  ``info.reference``), parsed robustly (``\\boxed{}``, "answer is", last number; commas,
  fractions, decimals, a trailing period; compared exactly as fractions). 1 or 0.
* Code — the unit tests passed: ``info.passed`` of the last step. 1 or 0.
* Digits (the CPU learning task, ``envs/toy.py``) — the share of digit characters among the
  non-space characters of the last action, in [0, 1].
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Callable

KINDS = ("frozenlake", "game", "math", "code", "digits")

# Task name / tag prefixes (case-insensitive) → kind. Shared with the env registry.
KIND_PREFIXES: tuple[tuple[str, str], ...] = (
    ("frozenlake", "frozenlake"),
    ("gem-game", "game"),
    ("guess", "game"),
    ("gem-math", "math"),
    ("math", "math"),
    ("code", "code"),
    ("swe", "code"),
    ("digits", "digits"),
)


def kind_of(*names: str | None) -> str | None:
    """The env kind of a task from its name or tag (first that matches), else None."""
    for name in names:
        if not name:
            continue
        low = name.strip().lower()
        if low in KINDS:
            return low
        for prefix, kind in KIND_PREFIXES:
            if low.startswith(prefix):
                return kind
    return None


# ---------------------------------------------------------------- number parsing

_NUM = r"[-+−]?\s*(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?"
_NUM_RE = re.compile(_NUM)
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is|:|=)\s*\$?\s*(" + _NUM + ")", re.IGNORECASE)


def _boxed_contents(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (braces balanced), else None."""
    idx = text.rfind("\\boxed")
    if idx < 0:
        return None
    start = text.find("{", idx)
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
    return None


def parse_number(text: str | int | float | None) -> Fraction | None:
    """One number from a short string: ``42``, ``-3``, ``1,000``, ``2.50``, ``7/2``,
    ``\\frac{7}{2}``, ``$12$``, ``12.``; None when there is none."""
    if text is None:
        return None
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        try:
            return Fraction(text).limit_denominator(10**9)
        except (ValueError, OverflowError):
            return None
    s = str(text).strip()
    frac = re.search(r"\\d?frac\{\s*([-+]?\d+)\s*\}\{\s*([-+]?\d+)\s*\}", s)
    if frac:
        num, den = int(frac.group(1)), int(frac.group(2))
        sign = -1 if re.search(r"[-−]\s*\\d?frac", s) else 1
        return sign * Fraction(num, den) if den else None
    m = _NUM_RE.search(s)
    if not m:
        return None
    tok = m.group(0).replace("−", "-").replace(",", "").replace(" ", "")
    try:
        if "/" in tok:
            num, den = tok.split("/")
            return Fraction(Fraction(num), Fraction(den)) if Fraction(den) else None
        return Fraction(tok)
    except (ValueError, ZeroDivisionError):
        return None


def extract_answer(response: str | None) -> Fraction | None:
    """The final numeric answer of a response: ``\\boxed{}`` first, then "the answer is X",
    then the last number in the text."""
    if not response:
        return None
    boxed = _boxed_contents(response)
    if boxed is not None:
        return parse_number(boxed)
    said = _ANSWER_IS_RE.findall(response)
    if said:
        return parse_number(said[-1])
    nums = _NUM_RE.findall(response)
    return parse_number(nums[-1]) if nums else None


def numbers_equal(response: str | None, reference: Any) -> bool:
    ans, ref = extract_answer(response), parse_number(reference)
    return ans is not None and ref is not None and ans == ref


# ---------------------------------------------------------------- the rules

def _steps(record: dict) -> list[dict]:
    steps = record.get("steps", record.get("turns"))
    return [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []


def _last(record: dict) -> tuple[dict, dict]:
    steps = _steps(record)
    last = steps[-1] if steps else {}
    info = last.get("info") if isinstance(last.get("info"), dict) else {}
    return last, info


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


def _env_verdict(record: dict, last: dict) -> float:
    """1 when the env itself paid the success reward (last step's, else the record's sum)."""
    reward = last.get("reward") if last else record.get("env_reward")
    return 1.0 if _num(reward) >= 1.0 else 0.0


def _final_action(record: dict, last: dict) -> str | None:
    action = last.get("action") if last else None
    if action is None:
        action = record.get("final_answer", record.get("response"))
    return action if isinstance(action, str) else None


def score_frozenlake(record: dict) -> float:
    last, info = _last(record)
    if "reached_goal" in info:
        return 1.0 if info["reached_goal"] else 0.0
    return _env_verdict(record, last)


def score_game(record: dict) -> float:
    last, info = _last(record)
    if "solved" in info:
        return 1.0 if info["solved"] else 0.0
    return _env_verdict(record, last)


def score_math(record: dict) -> float:
    last, info = _last(record)
    reference = record.get("reference", info.get("reference"))
    if reference is None:
        return _env_verdict(record, last)
    return 1.0 if numbers_equal(_final_action(record, last), reference) else 0.0


def score_code(record: dict) -> float:
    last, info = _last(record)
    if "passed" in info:
        return 1.0 if info["passed"] is True else 0.0
    return _env_verdict(record, last)


def score_digits(record: dict) -> float:
    last, _ = _last(record)
    action = _final_action(record, last)
    if action is None:
        return max(0.0, min(1.0, _num(last.get("reward") if last else record.get("env_reward"))))
    chars = [c for c in action if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


RULES: dict[str, Callable[[dict], float]] = {
    "frozenlake": score_frozenlake,
    "game": score_game,
    "math": score_math,
    "code": score_code,
    "digits": score_digits,
}


def score(task: Any, trajectory_record: dict) -> float:
    """The rule reward of a finished trajectory (0.0 when the record is empty or malformed).

    ``task`` is the task name or tag (or a kind, or a ``TaskSpec``); falls back to
    ``record["kind"]`` and ``record["task"]``. Raises ValueError only for a task no rule knows."""
    if not isinstance(trajectory_record, dict):
        raise ValueError(f"trajectory_record must be a dict, got {type(trajectory_record).__name__}")
    names = [getattr(task, "name", None), getattr(task, "tag", None)] if not isinstance(task, (str, type(None))) \
        else [task]
    kind = kind_of(*names, trajectory_record.get("kind"), trajectory_record.get("task"))
    if kind is None:
        raise ValueError(f"no rule reward for task {task!r}; known kinds: {', '.join(KINDS)} "
                         f"(task names starting with {', '.join(p for p, _ in KIND_PREFIXES)})")
    return float(RULES[kind](trajectory_record))
