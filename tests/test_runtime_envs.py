"""Runtime environments: FrozenLake, GEM game and math, code execution, injected latency,
the env registry and the EnvWorker. Plain and fast (no Ray)."""

from __future__ import annotations

import json
import random
import re
import threading
import time

import numpy as np
import pytest

from rollart.plan.distributions import Constant, Gaussian, LogNormal, Uniform
from rollart.plan.schema import EnvSpec, TaskSpec
from rollart.runtime.envs.base import StepResult
from rollart.runtime.envs.code_exec import PROBLEMS, CodeExecTextEnv, extract_code, run_solution
from rollart.runtime.envs.frozenlake import FrozenLakeTextEnv, parse_action
from rollart.runtime.envs.gem_envs import (MATH_DATA, GemGameTextEnv, GemMathTextEnv, generate_math_problems,
                                           load_math_rows)
from rollart.runtime.envs.latency import EnvFailure, EnvTimeout, InjectedLatency, env_kind, make_env
from rollart.runtime.envs.worker import EnvWorker
from rollart.runtime.reward import rules


def task_spec(name: str, tag: str | None = None, **env: object) -> TaskSpec:
    env_fields = {"reset": 0.0, "step": 0.0, **env}
    return TaskSpec(name=name, tag=tag, share=1, turns=1, obs_tokens=1, response_tokens=1, env=EnvSpec(**env_fields))


def play_guess(env: GemGameTextEnv, seed: int) -> StepResult:
    """Binary search from the hints; returns the last step."""
    obs = env.reset(seed)
    lo, hi = map(int, re.search(r"between (\d+) and (\d+)", obs).groups())
    while True:
        mid = (lo + hi) // 2
        res = env.step(f"My guess is \\boxed{{{mid}}}")
        if res.done:
            return res
        if "higher" in res.observation:
            lo = mid + 1
        else:
            hi = mid - 1


# ---------------------------------------------------------------- FrozenLake


def test_frozenlake_text_observation_and_scripted_policy_solves():
    env = FrozenLakeTextEnv()
    obs = env.reset(0)
    assert "P F F F" in obs and "LEFT, DOWN, RIGHT, UP" in obs and "row 0, column 0" in obs
    path = env.shortest_path()
    assert len(path) == 6
    steps = []
    for move in path:
        res = env.step(f"I think {move.lower()} is best, then maybe UP")  # first matching word wins
        steps.append({"action": move, "observation": res.observation, "reward": res.reward, "done": res.done,
                      "info": res.info})
    assert res.done and res.reward == 1.0 and res.info["reached_goal"]
    assert rules.score("FrozenLake", {"steps": steps}) == 1.0
    with pytest.raises(RuntimeError):
        env.step("LEFT")
    env.close()


def test_frozenlake_invalid_action_is_a_penalised_noop_and_holes_end_it():
    env = FrozenLakeTextEnv(max_steps=3)
    env.reset(1)
    res = env.step("jump over the lake")
    assert not res.done and res.reward == 0.0
    assert res.info["invalid_action"] and res.info["penalty"] > 0 and res.info["position"] == [0, 0]
    assert "Invalid action" in res.observation
    env.step("RIGHT")
    res = env.step("DOWN")  # (1, 1) is a hole
    assert res.done and res.reward == 0.0 and res.info["fell_in_hole"]
    assert rules.score("FrozenLake", {"steps": [{"info": res.info}]}) == 0.0
    assert parse_action("go Up") == 3 and parse_action("UPWARD") is None


def test_frozenlake_random_maps_are_seeded_and_truncate():
    a, b = FrozenLakeTextEnv(random_map=True, size=5, max_steps=2), FrozenLakeTextEnv(random_map=True, size=5)
    assert a.reset(7).split("\n")[1:6] == b.reset(7).split("\n")[1:6]
    assert b.shortest_path(), "generate_random_map guarantees a path"
    for move in b.shortest_path():
        res = b.step(move)
    assert res.info["reached_goal"]
    a.step("LEFT")
    res = a.step("UP")
    assert res.done and res.info["truncated"] and not res.info["reached_goal"]


# ---------------------------------------------------------------- GEM


def test_gem_guess_the_number_solves_and_keeps_global_random():
    env = GemGameTextEnv()
    random.seed(123)
    before = random.getstate()
    res = play_guess(env, seed=3)
    assert random.getstate() == before, "gem must not reseed the process-global random"
    assert res.done and res.reward == 1.0 and res.info["solved"] and res.info["target"] >= 1
    assert rules.score("GEM-Game", {"steps": [{"info": res.info, "reward": res.reward}]}) == 1.0
    # Same seed, same secret; a bare number is boxed leniently.
    other = GemGameTextEnv()
    other.reset(3)
    out = other.step(f"it is {res.info['target']}")
    assert out.info["lenient_boxed"] and out.info["solved"]
    # No number at all: GEM's format error ends the game.
    other.reset(4)
    bad = other.step("no idea")
    assert bad.done and bad.reward < 0 and not bad.info["solved"]
    assert rules.score("Guess", {"steps": [{"info": bad.info, "reward": bad.reward}]}) == 0.0


def test_math_dataset_is_shipped_and_matches_its_generator():
    rows = [json.loads(line) for line in MATH_DATA.read_text().splitlines() if line.strip()]
    assert len(rows) == 50 and rows == generate_math_problems(50)
    assert list(load_math_rows()) == rows


def test_gem_math_scores_right_and_wrong_answers():
    env = GemMathTextEnv()
    prompt = env.reset(7)
    answer = load_math_rows()[7]["answer"]
    assert prompt == load_math_rows()[7]["problem"] and "\\boxed" in prompt
    right = env.step(f"Let me compute. The result is \\boxed{{{answer}}}.")
    assert right.done and right.reward == 1.0 and right.info["correct"] and right.info["formatted"]
    env.reset(7)
    wrong = env.step(f"\\boxed{{{int(answer) + 1}}}")
    assert wrong.done and wrong.reward == 0.0 and not wrong.info["correct"]
    env.reset(7)
    unboxed = env.step(f"so the answer is {answer}")  # lenient fallback, same parser as the rule
    assert unboxed.reward == 1.0 and not unboxed.info["formatted"]
    for res, action in ((right, f"\\boxed{{{answer}}}"), (wrong, "\\boxed{1}")):
        assert rules.score("GEM-Math", {"steps": [{"action": action, "info": res.info}]}) == res.reward


def test_gem_math_grades_off_the_main_thread():
    """gem grades under SIGALRM, which only works on the main thread; we must not crash."""
    env = GemMathTextEnv()
    env.reset(3)
    answer = load_math_rows()[3]["answer"]
    out: list = []
    t = threading.Thread(target=lambda: out.append(env.step(f"\\boxed{{{answer}}}")))
    t.start()
    t.join(30)
    assert out and out[0].reward == 1.0


# ---------------------------------------------------------------- code execution


def test_code_exec_passes_a_correct_solution_and_fails_a_wrong_one():
    env = CodeExecTextEnv(max_attempts=2)
    prompt = env.reset(1)
    assert "reverse_string" in prompt and "```python" in prompt
    wrong = env.step("```python\ndef reverse_string(s):\n    return s\n```")
    assert not wrong.done and wrong.reward == 0.0 and wrong.info["status"] == "failed"
    assert wrong.info["tests_passed"] == 1 and "expected 'cba'" in wrong.observation
    assert rules.score("CodeExec", {"steps": [{"info": wrong.info}]}) == 0.0
    right = env.step(f"Here:\n```python\n{PROBLEMS[1].solution}```\nDone.")
    assert right.done and right.reward == 1.0 and right.info["passed"]
    assert rules.score("SWE", {"steps": [{"info": right.info}]}) == 1.0


def test_code_exec_runs_out_of_attempts_and_reports_errors():
    env = CodeExecTextEnv(max_attempts=2)
    env.reset(0)
    res = env.step("no code here")
    assert res.info["status"] == "no_code" and not res.done
    res = env.step("```python\ndef add(a, b)\n    return a + b\n```")
    assert res.done and res.info["status"] == "error" and "SyntaxError" in res.observation


@pytest.mark.exclusive
def test_code_exec_kills_an_infinite_loop_within_its_limit():
    t0 = time.monotonic()
    r = run_solution("def add(a, b):\n    while True:\n        pass\n", PROBLEMS[0], cpu_s=1, wall_s=10)
    assert r.status == "cpu_limit" and not r.passed
    assert time.monotonic() - t0 < 4.0
    t0 = time.monotonic()
    r = run_solution("import time\ndef add(a, b):\n    time.sleep(60)\n", PROBLEMS[0], cpu_s=1, wall_s=1.0)
    assert r.status == "timeout" and time.monotonic() - t0 < 3.0


def test_code_exec_limits_memory_and_cannot_pass_by_exiting():
    r = run_solution("def add(a, b):\n    x = bytearray(2 * 10**9)\n    return a + b\n", PROBLEMS[0], memory_mb=256)
    assert r.status == "memory" and not r.passed
    r = run_solution("import sys\nsys.exit(0)\n", PROBLEMS[0])
    assert not r.passed and r.status == "error"


def test_extract_code_prefers_the_block_defining_the_function():
    text = "```\nprint(1)\n```\nthen\n```python\ndef f(x):\n    return x\n```\n```bash\nls\n```"
    assert extract_code(text, "f").startswith("def f")
    assert extract_code("import math\ndef f(): pass", "f").startswith("import math")
    assert extract_code("nothing", "f") is None


# ---------------------------------------------------------------- injected latency


class _Echo:
    name = "echo"

    def reset(self, seed: int) -> str:
        return f"seed {seed}"

    def step(self, action: str) -> StepResult:
        return StepResult(action, 0.0, False, {})

    def close(self) -> None:
        pass


@pytest.mark.exclusive
def test_injected_latency_mean_matches_the_distribution():
    dist = Gaussian(mean=0.004, std=0.002)
    env = InjectedLatency(_Echo(), Constant(value=0.0), dist, seed=1)
    env.reset(0)
    n = 100
    t0 = time.perf_counter()
    for _ in range(n):
        env.step("x")
    wall = (time.perf_counter() - t0) / n
    assert env.slept_s / n == pytest.approx(dist.mean(), rel=0.15)
    assert wall == pytest.approx(dist.mean(), rel=0.5, abs=0.002)  # real sleeps, with scheduler slack
    # Drawn (not slept) over many calls: tight agreement, for a skewed distribution too.
    for d in (dist, LogNormal(median=0.01, sigma=0.8), Uniform(low=0.0, high=0.02)):
        fake = InjectedLatency(_Echo(), d, d, seed=2, sleep=lambda s: None)
        for _ in range(4000):
            fake.step("x")
        assert fake.slept_s / 4000 == pytest.approx(d.mean(), rel=0.06)


def test_injected_failure_rate_and_timeouts():
    env = InjectedLatency(_Echo(), Constant(value=0.0), Constant(value=0.001), failure_prob=0.2, seed=3,
                          sleep=lambda s: None)
    fails = 0
    for _ in range(3000):
        try:
            assert env.step("a").observation == "a"
        except EnvFailure as exc:
            assert str(exc) == "injected failure"
            fails += 1
    assert fails / 3000 == pytest.approx(0.2, abs=0.025) and env.failures == fails
    slept: list[float] = []
    slow = InjectedLatency(_Echo(), Constant(value=5.0), Constant(value=0.0), timeout_s=0.05, seed=0,
                           sleep=slept.append)
    with pytest.raises(EnvTimeout):
        slow.reset(0)
    assert slept == [0.05] and slow.timeouts == 1
    scaled = InjectedLatency(_Echo(), Constant(value=2.0), Constant(value=0.0), timeout_s=10, scale=0.01, seed=0,
                             sleep=slept.append)
    assert scaled.reset(4) == "seed 4" and slept[-1] == pytest.approx(0.02)


# ---------------------------------------------------------------- registry


def test_make_env_picks_the_kind_by_name_or_tag():
    assert env_kind("FrozenLake") == "frozenlake"
    assert env_kind("frozenlake-8x8") == "frozenlake"
    assert env_kind("GEM-Game") == env_kind("GuessTheNumber") == "game"
    assert env_kind("GEM-Math") == env_kind("Math500") == "math"
    assert env_kind("CodeExec") == env_kind("SWE") == env_kind("swe-bench") == "code"
    assert env_kind("MyTask", task_spec("MyTask", tag="FrozenLake")) == "frozenlake"
    with pytest.raises(ValueError, match="known kinds: frozenlake, game, math, code"):
        make_env("WebShop", None, 0)
    assert isinstance(make_env("CodeExec", None, 0), CodeExecTextEnv)


def test_make_env_injects_the_task_spec():
    spec = task_spec("FrozenLake", reset=0.0, step=0.001, failure_prob=0.5, timeout_s=3)
    env = make_env("FrozenLake", spec, seed=5, inject=True)
    assert isinstance(env, InjectedLatency) and env.failure_prob == 0.5 and env.timeout_s == 3
    env = make_env("FrozenLake", task_spec("FrozenLake", reset=0.001), seed=5, inject=True)
    assert "row 0" in env.reset(0)
    assert env.shortest_path()  # helpers of the inner env stay reachable
    with pytest.raises(ValueError, match="needs a TaskSpec"):
        make_env("FrozenLake", None, 0, inject=True)


# ---------------------------------------------------------------- EnvWorker


class _Crashy:
    """Reset works; step crashes in various ways."""

    name = "crashy"

    def __init__(self, how: str):
        self.how = how

    def reset(self, seed: int) -> str:
        if self.how == "reset":
            raise ValueError("boom in reset")
        return "ready"

    def step(self, action: str) -> StepResult:
        if self.how == "exit":
            raise SystemExit(3)
        if self.how == "hang":
            time.sleep(1.0)
        raise ZeroDivisionError("boom in step")

    def close(self) -> None:
        pass


def _factory(task, spec, seed, inject, *, scale=1.0, options=None):
    if task.startswith("crash-"):
        return _Crashy(task.removeprefix("crash-"))
    return make_env(task, spec, seed, inject, scale=scale, options=options)


def test_env_worker_survives_crashing_envs():
    w = EnvWorker(env_factory=_factory, default_timeout_s=5.0)
    assert w.reset("ok", "FrozenLake", 0)["ok"]
    r = w.reset("r", "crash-reset", 0)
    assert not r["ok"] and r["error"] == "error: ValueError: boom in reset" and r["error_kind"] == "error"
    assert w.reset("s", "crash-step", 0)["ok"]
    r = w.step("s", "LEFT")
    assert not r["ok"] and "ZeroDivisionError" in r["error"] and r["done"] is False
    assert w.reset("x", "crash-exit", 0)["ok"]
    r = w.step("x", "LEFT")
    assert not r["ok"] and "SystemExit" in r["error"]
    r = w.step("nobody", "LEFT")
    assert not r["ok"] and "reset it first" in r["error"]
    assert not w.reset("bad", "WebShop", 0)["ok"]  # unknown kind: an error dict, not an exception
    # The healthy env is untouched.
    r = w.step("ok", "DOWN")
    assert r["ok"] and r["info"]["position"] == [1, 0] and not r["done"]
    s = w.stats()
    assert s["errors"] == 5 and s["active"] == 5
    warm = w.warmup(["FrozenLake", "WebShop"])
    assert isinstance(warm["FrozenLake"], float) and warm["WebShop"].startswith("error: ValueError")
    assert w.close("s") and not w.close("s")
    assert w.close_all() == 4 and w.active() == []


@pytest.mark.exclusive
def test_env_worker_enforces_its_call_timeout():
    w = EnvWorker(env_factory=_factory, call_timeout_s=0.2)
    assert w.reset("h", "crash-hang", 0)["ok"]
    t0 = time.monotonic()
    r = w.step("h", "go")
    assert time.monotonic() - t0 < 0.6
    assert not r["ok"] and r["error_kind"] == "timeout" and r["error"].startswith("timeout:")
    busy = w.step("h", "go")
    assert not busy["ok"] and "busy" in busy["error"]
    assert w.stats()["abandoned_calls"] == 1
    w.close("h")


def test_env_worker_injected_failures_and_retry_of_a_step():
    spec = task_spec("FrozenLake", step=0.0, failure_prob=0.5)
    w = EnvWorker([spec], inject=True)
    # Resets fail too; a retry builds a fresh env and draws anew from the trajectory's stream.
    assert any(w.reset(1, "FrozenLake", 0)["ok"] for _ in range(30))
    errors, moves = 0, 0
    while moves < 6:  # the scripted path; a failed step is retried with the same action
        action = ["DOWN", "DOWN", "RIGHT", "DOWN", "RIGHT", "RIGHT"][moves]
        r = w.step(1, action)
        if r["ok"]:
            moves += 1
        else:
            assert r["error"] == "error: EnvFailure: injected failure"
            errors += 1
    assert r["done"] and r["reward"] == 1.0 and errors > 0
    timeouts = EnvWorker([task_spec("GEM-Math", reset=1.0, timeout_s=0.05)], inject=True)
    timeouts.warmup()  # gem-llm's first import (~3 s on a loaded machine) would hit the 1.05 s call guard first
    r = timeouts.reset("t", "GEM-Math", 0)
    # the latency wrapper's own timeout, at 0.05 s, not the worker's call guard (timeout_s + 1 s grace)
    assert not r["ok"] and r["error_kind"] == "timeout" and r["elapsed_s"] < 1.0, r
    assert "timed out after 0.05 s" in r["error"]


def test_env_worker_hosts_the_digits_task_with_positional_seed_and_inject():
    spec = task_spec("Digits", reset=0.001, step=0.001)
    w = EnvWorker([spec], 7, True)
    assert w.inject and w.seed == 7
    r = w.reset(0, "Digits", 0)
    assert r["ok"] and "digits" in r["observation"]
    r = w.step(0, "1 2 3 x")
    assert r["ok"] and r["done"] and r["reward"] == 0.75
    assert isinstance(w._slots[0].env, InjectedLatency)


def test_env_worker_latency_streams_differ_within_a_group():
    """Trajectories of one group share the env seed but not their latency draws."""
    spec = task_spec("FrozenLake", reset=LogNormal(median=0.001, sigma=1.0))
    w = EnvWorker([spec], inject=True)
    w.reset("a", "FrozenLake", 9)
    w.reset("b", "FrozenLake", 9)
    la, lb = (w._slots[k].env.last_latency_s for k in ("a", "b"))
    assert la != lb


# ---------------------------------------------------------------- rules


def test_rule_rewards():
    assert rules.parse_number("1,234") == 1234 and rules.parse_number("-7/2") == rules.parse_number("-3.5")
    assert rules.parse_number("\\frac{1}{4}") == rules.parse_number("0.25")
    assert rules.extract_answer("x is 3, so the answer is 12.") == 12
    assert rules.extract_answer("first 3 then \\boxed{\\frac{3}{4}} and 9") == rules.parse_number("0.75")
    assert rules.extract_answer("last 4 and 5") == 5 and rules.extract_answer("none") is None
    rec = {"steps": [{"action": "I get 1,380", "info": {}}], "reference": "1380"}
    assert rules.score("GEM-Math", rec) == 1.0
    assert rules.score("Math", {**rec, "reference": "1381"}) == 0.0
    assert rules.score("GEM-Math", {"steps": []}) == 0.0
    assert rules.score(None, {"kind": "code", "steps": [{"info": {"passed": True}}]}) == 1.0
    assert rules.score(None, {"task": "FrozenLake", "steps": [{"reward": 1.0}]}) == 1.0
    assert rules.score(task_spec("X", tag="GEM-Game"), {"steps": [{"info": {"solved": True}}]}) == 1.0
    assert rules.score("GEM-Game", {"turns": [{"reward": 0.5}]}) == 0.0
    with pytest.raises(ValueError, match="known kinds"):
        rules.score("WebShop", {"steps": []})
    # Records without steps (what the runtime backend sends): the env's own verdict counts.
    flat = {"task": "FrozenLake", "messages": [["user", "..."], ["assistant", "DOWN"]], "env_reward": 1.0,
            "final_answer": "RIGHT"}
    assert rules.score("FrozenLake", flat) == 1.0 and rules.score("CodeExec", {**flat, "env_reward": 0.0}) == 0.0
    assert rules.score("GEM-Math", {"final_answer": "\\boxed{7}", "reference": 7}) == 1.0
    assert rules.score("GEM-Math", {"final_answer": "7", "env_reward": 0.0}) == 0.0
    assert rules.score("Digits", {"final_answer": "4 7 x 1"}) == 0.75
    assert np.isclose(rules.score("code", {"steps": "garbage"}), 0.0)


def test_code_exec_refuses_to_start_without_its_sandbox(monkeypatch):
    from rollart.runtime.envs import code_exec
    from rollart.runtime.envs.worker import EnvWorker

    monkeypatch.setattr(code_exec, "_CHECKED", (False, "cannot create the sandbox's namespaces (EPERM)"))
    with pytest.raises(code_exec.SandboxUnavailable, match="refusing to start"):
        CodeExecTextEnv()
    with pytest.raises(code_exec.SandboxUnavailable, match="EPERM"):
        run_solution(PROBLEMS[0].solution, PROBLEMS[0])
    assert "EPERM" in EnvWorker().sandbox_check()
