"""A Python code-execution environment: write a tiny function, the unit tests judge it.

``reset(seed)`` poses problem ``seed % len(PROBLEMS)`` (a function to write, with examples).
``step(action)`` extracts the code (a fenced ```python block, else the text from the first
``def``/``import``), runs it with the problem's unit tests in a fresh subprocess
(``sys.executable -I``, own session, empty temp dir as cwd, stdin closed, stdout/stderr to
files) under limits, and answers with pass/fail, the failing cases and the stderr tail.
The episode ends after a pass or ``max_attempts`` attempts; reward 1 on a pass, else 0.

Limits: ``RLIMIT_CPU`` (soft ``cpu_s``, hard ``cpu_s + 1``: SIGXCPU then SIGKILL),
``RLIMIT_AS`` (``memory_mb``), ``RLIMIT_FSIZE`` (``output_kb`` for the output files), and a
wall-clock timeout (``wall_s``; the whole process group is SIGKILLed). By default the limits
are set by the child's first statements, before the candidate code runs (hard limits are
lowered too, so the code cannot raise them back). ``limits_in="preexec"`` sets them in
``preexec_fn`` instead; Python documents ``preexec_fn`` as unsafe when the parent has threads
(a Ray actor, the EnvWorker's timeout threads), which is why it is not the default.

Not a security sandbox: no network, filesystem or syscall isolation beyond the above. The
pass verdict is a line with a per-run random token the harness prints after the tests; code
that reads the harness file could forge it (fine for RL on toy problems, not for untrusted
production code).

``info``: ``passed``, ``status`` (passed | failed | error | no_code | cpu_limit | timeout |
memory), ``tests_passed``, ``tests_total``, ``returncode``, ``elapsed_s``, ``attempt``.
"""

from __future__ import annotations

import json
import os
import re
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollart.runtime.envs.base import StepResult


@dataclass(frozen=True)
class Problem:
    func: str
    signature: str
    description: str
    tests: list[tuple[list[Any], Any]]
    solution: str = field(repr=False)  # a reference solution (for tests and scripted policies)


PROBLEMS: tuple[Problem, ...] = (
    Problem("add", "def add(a: int, b: int) -> int", "Return the sum of a and b.",
            [([1, 2], 3), ([-5, 5], 0), ([100, 23], 123)],
            "def add(a, b):\n    return a + b\n"),
    Problem("reverse_string", "def reverse_string(s: str) -> str", "Return s reversed.",
            [(["abc"], "cba"), ([""], ""), (["racecar!"], "!racecar")],
            "def reverse_string(s):\n    return s[::-1]\n"),
    Problem("is_palindrome", "def is_palindrome(s: str) -> bool",
            "Return True when s reads the same backwards, ignoring case and non-alphanumerics.",
            [(["A man, a plan, a canal: Panama"], True), (["abc"], False), ([""], True)],
            "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n"),
    Problem("fizzbuzz", "def fizzbuzz(n: int) -> str",
            "Return 'FizzBuzz' if n is divisible by 15, 'Fizz' if by 3, 'Buzz' if by 5, else str(n).",
            [([3], "Fizz"), ([5], "Buzz"), ([15], "FizzBuzz"), ([7], "7")],
            "def fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n"
            "        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)\n"),
    Problem("factorial", "def factorial(n: int) -> int", "Return n! (0! is 1).",
            [([0], 1), ([1], 1), ([5], 120), ([10], 3628800)],
            "def factorial(n):\n    r = 1\n    for i in range(2, n + 1):\n        r *= i\n    return r\n"),
    Problem("count_vowels", "def count_vowels(s: str) -> int", "Return how many of a, e, i, o, u (any case) s has.",
            [(["hello"], 2), (["AEIOU xyz"], 5), ([""], 0)],
            "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s.lower())\n"),
    Problem("fibonacci", "def fibonacci(n: int) -> int", "Return the n-th Fibonacci number (fibonacci(0) = 0, fibonacci(1) = 1).",
            [([0], 0), ([1], 1), ([10], 55), ([20], 6765)],
            "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"),
    Problem("second_largest", "def second_largest(xs: list[int]) -> int",
            "Return the second largest distinct value of xs (xs has at least two distinct values).",
            [([[1, 2, 3]], 2), ([[5, 5, 4]], 4), ([[-1, -2]], -2)],
            "def second_largest(xs):\n    return sorted(set(xs))[-2]\n"),
)

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_TOKEN_PREFIX = "__ROLLART_RESULT__"

_HARNESS = '''\
import resource as _r
{limits}del _r
import json as _json, sys as _sys
_TESTS = _json.loads({tests!r})
_res = {{"tests_total": len(_TESTS), "tests_passed": 0, "failures": []}}
_ns = {{"__name__": "solution"}}
with open({solution!r}, encoding="utf-8") as _f:
    _src = _f.read()
exec(compile(_src, "solution.py", "exec"), _ns)
_fn = _ns.get({func!r})
if not callable(_fn):
    raise NameError("the code does not define a function named " + {func!r})
for _args, _want in _TESTS:
    _call = {func!r} + "(" + ", ".join(repr(a) for a in _args) + ")"
    try:
        _got = _fn(*_args)
    except Exception as _e:
        _res["failures"].append(_call + " raised " + type(_e).__name__ + ": " + str(_e)[:200])
        continue
    if _got == _want:
        _res["tests_passed"] += 1
    else:
        _res["failures"].append(_call + " returned " + repr(_got)[:200] + ", expected " + repr(_want))
_sys.stdout.flush()
print("\\n" + {token!r} + _json.dumps(_res), flush=True)
'''


def extract_code(text: str, func: str | None = None) -> str | None:
    """The code in a model answer: the fenced block that defines ``func`` (else the last
    fenced python/untagged block); without fences, the text from the first ``def``/``import``."""
    text = text or ""
    blocks = [(lang.lower(), body) for lang, body in _FENCE_RE.findall(text)]
    blocks = [(lang, body) for lang, body in blocks if lang in ("", "python", "py", "python3")]
    if blocks:
        if func:
            for _, body in blocks:
                if re.search(rf"\bdef\s+{re.escape(func)}\s*\(", body):
                    return body
        return blocks[-1][1]
    m = re.search(r"^(?:def |import |from |class )", text, re.MULTILINE)
    return text[m.start():] if m else None


def _limit_lines(cpu_s: float, memory_mb: int, output_kb: int) -> list[tuple[int, int, int]]:
    cpu = max(1, int(round(cpu_s)))
    mem = memory_mb * 1024 * 1024
    fsize = output_kb * 1024
    return [(resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_AS, mem, mem),
            (resource.RLIMIT_FSIZE, fsize, fsize)]


def _tail(path: Path, max_bytes: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


@dataclass
class RunResult:
    status: str
    passed: bool
    tests_passed: int
    tests_total: int
    failures: list[str]
    returncode: int | None
    elapsed_s: float
    stderr_tail: str


def run_solution(code: str, problem: Problem, *, cpu_s: float = 2.0, memory_mb: int = 256, wall_s: float = 5.0,
                 output_kb: int = 256, limits_in: str = "child", stderr_lines: int = 12) -> RunResult:
    """Run ``code`` against ``problem``'s tests in a limited subprocess."""
    token = f"{_TOKEN_PREFIX}{secrets.token_hex(8)}:"
    limits = _limit_lines(cpu_s, memory_mb, output_kb)
    with tempfile.TemporaryDirectory(prefix="rollart-code-") as tmp:
        d = Path(tmp)
        sol = d / "solution.py"
        sol.write_text(code, encoding="utf-8")
        limit_src = "".join(f"_r.setrlimit({res}, ({soft}, {hard}))\n" for res, soft, hard in limits) \
            if limits_in == "child" else ""
        harness = _HARNESS.format(limits=limit_src, tests=json.dumps(problem.tests), solution=str(sol),
                                  func=problem.func, token=token)
        (d / "harness.py").write_text(harness, encoding="utf-8")
        out_path, err_path = d / "stdout.txt", d / "stderr.txt"

        preexec = None
        if limits_in == "preexec":
            def preexec() -> None:  # runs in the forked child before exec
                for res, soft, hard in limits:
                    resource.setrlimit(res, (soft, hard))
        elif limits_in != "child":
            raise ValueError(f"limits_in must be 'child' or 'preexec', not {limits_in!r}")

        t0 = time.monotonic()
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-I", str(d / "harness.py")], cwd=d, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True, preexec_fn=preexec,
                                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"})
            try:
                rc = proc.wait(timeout=wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                rc = proc.wait()
        elapsed = time.monotonic() - t0
        stdout = _tail(out_path, 64 * 1024)
        stderr = _tail(err_path, 16 * 1024)

    result: dict[str, Any] | None = None
    for line in reversed(stdout.splitlines()):
        if line.startswith(token):
            try:
                result = json.loads(line[len(token):])
            except ValueError:
                result = None
            break
    stderr_tail = "\n".join(stderr.strip().splitlines()[-stderr_lines:])
    total = len(problem.tests)
    if timed_out:
        status = "timeout"
    elif rc in (-signal.SIGXCPU, -signal.SIGKILL):
        status = "cpu_limit"
    elif "MemoryError" in stderr or any("MemoryError" in f for f in (result or {}).get("failures", [])):
        status = "memory"
    elif result is None or rc != 0:
        status = "error"
    else:
        status = "passed" if result["tests_passed"] == total else "failed"
    res = result or {}
    return RunResult(status=status, passed=status == "passed", tests_passed=int(res.get("tests_passed", 0)),
                     tests_total=total, failures=list(res.get("failures", [])), returncode=rc,
                     elapsed_s=elapsed, stderr_tail=stderr_tail)


class CodeExecTextEnv:
    """Write a function; the unit tests in a limited subprocess judge it."""

    def __init__(self, name: str = "CodeExec", *, max_attempts: int = 3, cpu_s: float = 2.0, memory_mb: int = 256,
                 wall_s: float = 5.0, limits_in: str = "child", problems: tuple[Problem, ...] = PROBLEMS):
        self.name = name
        self.max_attempts = max_attempts
        self.cpu_s, self.memory_mb, self.wall_s, self.limits_in = cpu_s, memory_mb, wall_s, limits_in
        self.problems = problems
        self.problem: Problem | None = None
        self._attempt = 0
        self._done = True

    def reset(self, seed: int) -> str:
        self.problem = self.problems[int(seed) % len(self.problems)]
        self._attempt = 0
        self._done = False
        p = self.problem
        examples = "\n".join(f"    {p.func}({', '.join(map(repr, args))}) == {want!r}" for args, want in p.tests[:2])
        return (f"Write a Python function `{p.signature}`.\n{p.description}\nExamples:\n{examples}\n"
                f"Answer with the complete function in one ```python code block. It runs with a "
                f"{self.cpu_s:g} s CPU limit; you have {self.max_attempts} attempts.")

    def step(self, action: str) -> StepResult:
        if self._done or self.problem is None:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset() first")
        self._attempt += 1
        p = self.problem
        code = extract_code(action, p.func)
        left = self.max_attempts - self._attempt
        if code is None:
            info = {"passed": False, "status": "no_code", "tests_passed": 0, "tests_total": len(p.tests),
                    "returncode": None, "elapsed_s": 0.0, "attempt": self._attempt}
            self._done = left <= 0
            obs = "No code found: answer with the function in a ```python code block."
            return StepResult(observation=obs + (f" Attempts left: {left}." if not self._done else ""),
                              reward=0.0, done=self._done, info=info)
        r = run_solution(code, p, cpu_s=self.cpu_s, memory_mb=self.memory_mb, wall_s=self.wall_s,
                         limits_in=self.limits_in)
        self._done = r.passed or left <= 0
        info = {"passed": r.passed, "status": r.status, "tests_passed": r.tests_passed, "tests_total": r.tests_total,
                "returncode": r.returncode, "elapsed_s": round(r.elapsed_s, 4), "attempt": self._attempt}
        if r.passed:
            obs = f"All {r.tests_total} tests passed."
        else:
            lines = [f"Tests: {r.tests_passed}/{r.tests_total} passed ({r.status})."]
            if r.status == "cpu_limit":
                lines.append(f"Killed: CPU time limit of {self.cpu_s:g} s exceeded.")
            elif r.status == "timeout":
                lines.append(f"Killed: wall-clock limit of {self.wall_s:g} s exceeded.")
            lines += [f"- {f}" for f in r.failures[:5]]
            if r.stderr_tail:
                lines += ["stderr (last lines):", r.stderr_tail]
            if not self._done:
                lines.append(f"Attempts left: {left}. Answer with a corrected ```python code block.")
            obs = "\n".join(lines)
        return StepResult(observation=obs, reward=1.0 if r.passed else 0.0, done=self._done, info=info)

    def close(self) -> None:
        self.problem = None
        self._done = True
