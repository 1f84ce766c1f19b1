"""A Python code-execution environment: write a tiny function, the unit tests judge it.

``reset(seed)`` poses problem ``seed % len(PROBLEMS)`` (a function to write, with examples).
``step(action)`` extracts the code (a fenced ```python block, else the text from the first
``def``/``import``), runs it in the sandbox of :mod:`.sandbox_launcher` and answers with
pass/fail, the failing cases and the stderr tail. The episode ends after a pass or
``max_attempts`` attempts; reward 1 on a pass, else 0.

The sandbox (one per step, see :mod:`rollart.runtime.envs.sandbox_launcher`): an unprivileged
uid with no groups and ``no_new_privs``; new network (no interface up), PID, mount, IPC and
UTS namespaces; ``/`` read-only, a private size-limited ``/tmp``; rlimits on CPU
(``cpu_s``: SIGXCPU then SIGKILL), address space (``memory_mb``), file size (``output_kb``),
processes (``nproc``) and open files; a wall-clock limit (``wall_s``). When the step ends the
whole namespace is killed (children that ``setsid`` too). It needs root (namespaces,
``setuid``) on Linux; where it cannot be made, :class:`SandboxUnavailable` says why and the
env refuses to start rather than run model output unconfined.

Verdict: the sandbox receives the code and the test *inputs* and returns the function's
return values as JSON on a private pipe; the expected outputs stay in this process, which
compares them (exact types: ``1`` is not ``True``). Nothing the code prints counts.

``info``: ``passed``, ``status`` (passed | failed | error | no_code | cpu_limit | timeout |
memory), ``tests_passed``, ``tests_total``, ``returncode``, ``elapsed_s``, ``attempt``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
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


LAUNCHER = Path(__file__).with_name("sandbox_launcher.py")
UNAVAILABLE = 97  # the launcher's exit status when it cannot make the namespaces
_uids = itertools.count()


class SandboxUnavailable(RuntimeError):
    """The code sandbox cannot be made here (no namespaces / not root / not Linux)."""


def _sandbox_uid() -> int:
    """A dedicated uid (and gid) per sandbox, outside the system's users: concurrent sandboxes
    do not share an RLIMIT_NPROC budget, and none owns a file on the host."""
    return 200_000 + (os.getpid() * 4096 + next(_uids)) % 100_000


def _same(got: Any, want: Any) -> bool:
    """Equal with the same JSON types all the way down (``1 == True`` does not pass)."""
    if isinstance(want, (list, tuple)):
        return isinstance(got, list) and len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in the sandbox's answer")


def _read_capped(fd: int, box: dict, cap: int) -> None:
    chunks, n = [], 0
    with os.fdopen(fd, "rb") as f:
        while True:
            b = f.read(65536)
            if not b:
                break
            if n < cap:
                chunks.append(b[:cap - n])
            n += len(b)
    box["data"], box["truncated"] = b"".join(chunks), n > cap


def _sandbox_config(cpu_s: float, memory_mb: int, output_kb: int, nproc: int, tmp_kb: int, result_fd: int) -> dict:
    prefix = os.path.realpath(sys.base_prefix)
    exe = os.path.realpath(sys.executable)
    if not exe.startswith(prefix + os.sep):  # a venv's python links into its base installation
        exe = os.path.realpath(os.path.join(prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}"))
    uid = _sandbox_uid()
    cpu = max(1, int(round(cpu_s)))
    return {"caller": os.getpid(), "uid": uid, "gid": uid, "cpu_s": cpu, "memory": memory_mb * 2**20,
            "fsize": output_kb * 1024, "nproc": nproc, "tmp_kb": tmp_kb, "python_prefix": prefix,
            "python_rel": os.path.relpath(exe, prefix), "result_fd": result_fd}


def run_in_sandbox(code: str, func: str, args: list[list[Any]], *, cpu_s: float = 2.0, memory_mb: int = 256,
                   wall_s: float = 5.0, output_kb: int = 256, nproc: int = 16, tmp_kb: int = 4096,
                   result_cap: int = 1 << 20) -> tuple[dict | None, int, bool, str, str, float]:
    """Run ``func(*a)`` for each ``a`` of ``args`` on ``code`` in a fresh sandbox; returns
    (parsed answer or None, exit status, timed out, stdout tail, stderr tail, seconds)."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable("the code sandbox needs Linux namespaces")
    with tempfile.TemporaryDirectory(prefix="rollart-code-") as tmp:  # 0700, ours: the child's output files
        d = Path(tmp)
        out_path, err_path = d / "stdout.txt", d / "stderr.txt"
        r, w = os.pipe()
        cfg = _sandbox_config(cpu_s, memory_mb, output_kb, nproc, tmp_kb, w)
        payload = json.dumps({"code": code, "func": func, "args": args}).encode()
        box: dict[str, Any] = {}
        t0 = time.monotonic()
        timed_out = False
        try:
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                proc = subprocess.Popen([sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(cfg)],
                                        stdin=subprocess.PIPE, stdout=out, stderr=err, pass_fds=(w,),
                                        start_new_session=True, env={"LC_ALL": "C.UTF-8"})
        finally:
            os.close(w)
        reader = threading.Thread(target=_read_capped, args=(r, box, result_cap), daemon=True)
        reader.start()
        try:
            proc.stdin.write(payload)  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            pass
        try:
            rc = proc.wait(timeout=wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()  # the launcher's death kills the namespace's init, and with it everything in it
            rc = proc.wait()
        reader.join(timeout=5)
        elapsed = time.monotonic() - t0
        stdout, stderr = _tail(out_path, 16 * 1024), _tail(err_path, 16 * 1024)
    answer = None
    data = box.get("data")
    if data and not box.get("truncated"):
        try:
            answer = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            answer = None
    return answer, rc, timed_out, stdout, stderr, elapsed


_CHECKED: tuple[bool, str] | None = None


def sandbox_available() -> tuple[bool, str]:
    """(True, "") when the sandbox runs here (one probe per process), else (False, why)."""
    global _CHECKED
    if _CHECKED is None:
        try:
            answer, rc, _, _, err, _ = run_in_sandbox("def f():\n    return 1\n", "f", [[]], wall_s=20)
        except OSError as exc:
            _CHECKED = (False, f"cannot start the sandbox launcher: {exc}")
        else:
            ok = rc == 0 and answer == {"results": [{"ok": True, "value": 1}]}
            why = err.strip().splitlines()[-1] if err.strip() else f"the probe exited with status {rc}"
            _CHECKED = (True, "") if ok else (False, why)
    return _CHECKED


def run_solution(code: str, problem: Problem, *, cpu_s: float = 2.0, memory_mb: int = 256, wall_s: float = 5.0,
                 output_kb: int = 256, limits_in: str = "child", stderr_lines: int = 12, nproc: int = 16) -> RunResult:
    """Run ``code`` against ``problem``'s tests in the sandbox; the verdict is decided here.
    ``limits_in`` is kept for callers of the old harness: the sandbox always sets every limit
    before the candidate code is loaded."""
    if limits_in not in ("child", "preexec"):
        raise ValueError(f"limits_in must be 'child' or 'preexec', not {limits_in!r}")
    ok, why = sandbox_available()
    if not ok:
        raise SandboxUnavailable(f"code sandbox unavailable: {why}")
    answer, rc, timed_out, _stdout, stderr, elapsed = run_in_sandbox(
        code, problem.func, [list(a) for a, _ in problem.tests], cpu_s=cpu_s, memory_mb=memory_mb, wall_s=wall_s,
        output_kb=output_kb, nproc=nproc)
    total = len(problem.tests)
    passed, failures = 0, []
    results = (answer or {}).get("results")
    if isinstance(results, list) and len(results) == total:
        for (args, want), res in zip(problem.tests, results):
            call = f"{problem.func}({', '.join(repr(a) for a in args)})"
            if not isinstance(res, dict) or not isinstance(res.get("ok"), bool):
                failures.append(f"{call}: malformed result")
            elif not res["ok"]:
                failures.append(f"{call} raised {str(res.get('error'))[:200]}")
            elif _same(res.get("value"), want):
                passed += 1
            else:
                failures.append(f"{call} returned {repr(res.get('value'))[:200]}, expected {want!r}")
    else:
        results = None
        if answer and "error" in answer:
            failures.append(str(answer["error"])[:300])
    stderr_tail = "\n".join(stderr.strip().splitlines()[-stderr_lines:])
    if timed_out:
        status = "timeout"
    elif rc in (128 + signal.SIGXCPU, 128 + signal.SIGKILL):
        status = "cpu_limit"
    elif "MemoryError" in stderr or any("MemoryError" in f for f in failures):
        status = "memory"
    elif results is None or rc != 0:
        status = "error"
    else:
        status = "passed" if passed == total else "failed"
    return RunResult(status=status, passed=status == "passed", tests_passed=passed if results is not None else 0,
                     tests_total=total, failures=failures, returncode=rc, elapsed_s=elapsed, stderr_tail=stderr_tail)


class CodeExecTextEnv:
    """Write a function; the unit tests in a limited subprocess judge it."""

    def __init__(self, name: str = "CodeExec", *, max_attempts: int = 3, cpu_s: float = 2.0, memory_mb: int = 256,
                 wall_s: float = 5.0, limits_in: str = "child", problems: tuple[Problem, ...] = PROBLEMS):
        ok, why = sandbox_available()
        if not ok:  # never run model output unconfined
            raise SandboxUnavailable(f"{name}: the code sandbox cannot run here ({why}); refusing to start")
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
