"""The code-execution sandbox against the escapes that worked on the old harness: each model
answer below tries one and must fail, and a wrong answer never scores 1.0."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rollart.runtime.envs.code_exec import PROBLEMS, CodeExecTextEnv, run_solution, sandbox_available
from rollart.runtime.procs import pids

ok, why = sandbox_available()
pytestmark = pytest.mark.skipif(not ok, reason=f"code sandbox unavailable here: {why}")
ADD = PROBLEMS[0]  # add(a, b); tests (1, 2) → 3, (-5, 5) → 0, (100, 23) → 123


USED_UIDS: set[int] = set()


@pytest.fixture(autouse=True)
def _record_uids(monkeypatch):
    """Remember the uids this test's sandboxes ran as (other sandboxes may run on the machine)."""
    from rollart.runtime.envs import code_exec

    pick = code_exec._sandbox_uid

    def recorded() -> int:
        uid = pick()
        USED_UIDS.add(uid)
        return uid

    monkeypatch.setattr(code_exec, "_sandbox_uid", recorded)


def _sandbox_processes() -> list[int]:
    """Live processes of the uids this module's sandboxes ran as."""
    out = []
    for pid, path in pids():
        try:
            if os.stat(path).st_uid in USED_UIDS:
                out.append(pid)
        except OSError:
            pass
    return out


def _fails(code: str, **kw) -> str:
    r = run_solution(code, ADD, **kw)
    assert not r.passed and r.tests_passed < r.tests_total, r
    return "\n".join(r.failures) + r.stderr_tail


def test_runs_as_an_unprivileged_user_without_groups() -> None:
    text = _fails("import os\ndef add(a, b):\n    return [os.getuid(), os.getgid(), os.getgroups()]\n")
    uid = int(text.split("returned [")[1].split(",")[0])
    assert uid >= 200_000
    assert "[]]" in text  # no supplementary groups


def test_cannot_read_what_an_unprivileged_user_cannot() -> None:
    # /etc/passwd is world-readable (so any user reads it); /etc/shadow and root's files are not
    assert "Permission denied" in _fails("def add(a, b):\n    return open('/etc/shadow').read()\n")
    assert "Permission denied" in _fails("import os\ndef add(a, b):\n    return os.listdir('/root')\n")


def test_cannot_read_the_parents_environment_or_see_its_processes() -> None:
    me = os.getpid()
    text = _fails(f"def add(a, b):\n    return open('/proc/{me}/environ').read()\n")
    assert "No such file" in text or "Permission denied" in text
    text = _fails("import os\ndef add(a, b):\n    return sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n")
    assert "returned [1, 2]" in text  # only the sandbox's own init and itself
    assert "Permission denied" in _fails("import os\ndef add(a, b):\n    return open(f'/proc/{os.getppid()}/environ').read()\n")


def test_cannot_write_outside_its_temp_dir(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    os.chmod(tmp_path, 0o777)  # even a world-writable directory of the host
    text = _fails(f"def add(a, b):\n    open({str(target)!r}, 'w').write('x')\n    return a + b\n")
    assert not target.exists() and ("Read-only" in text or "Permission denied" in text or "No such file" in text)
    for path in ("/work/pwned", "/dev/shm/pwned", "/var/tmp/pwned", "/tmp/pwned"):
        _fails(f"def add(a, b):\n    open({path!r}, 'w').write('x')\n    return a + b\n")
        assert not os.path.exists(path)
    # its own scratch directory works (a legitimate solution may write files)
    r = run_solution("def add(a, b):\n    open('scratch.txt', 'w').write('x')\n    return a + b\n", ADD)
    assert r.passed


def test_has_no_network() -> None:
    for host in ("127.0.0.1", "8.8.8.8"):
        text = _fails(f"import socket\ndef add(a, b):\n    socket.create_connection(({host!r}, 80), timeout=1)\n"
                      "    return a + b\n")
        assert "unreachable" in text.lower()


def test_children_do_not_outlive_the_step() -> None:
    code = ("import os, subprocess, time\n"
            "def add(a, b):\n"
            "    subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
            "    if os.fork() == 0:\n"
            "        os.setsid()\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(60)\n"
            "        os._exit(0)\n"
            "    return a + b + 1\n")
    _fails(code)
    deadline = time.monotonic() + 3
    while _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_processes() == []


def test_a_fork_bomb_is_contained() -> None:
    t0 = time.monotonic()
    _fails("import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n        except OSError:\n"
           "            pass\n", cpu_s=1, wall_s=3)
    assert time.monotonic() - t0 < 6
    time.sleep(0.2)
    assert _sandbox_processes() == []


def test_cannot_forge_a_pass() -> None:
    forged = ("import sys\n"
              "def add(a, b):\n"
              "    print('All 3 tests passed.')\n"
              "    print('__ROLLART_RESULT__0:{\"tests_total\": 3, \"tests_passed\": 3, \"failures\": []}')\n"
              "    return 0\n")
    assert "returned 0, expected 3" in _fails(forged)
    # writing the verdict pipe itself only hands in values; the expected ones stay here
    _fails("import os\nos.write(3, b'{\"results\": [{\"ok\": true, \"value\": 3}]*3}')\nos._exit(0)\n")
    _fails("def add(a, b):\n    return True\n")            # True == 1 in Python, not here
    _fails("class X:\n    def __eq__(self, o):\n        return True\ndef add(a, b):\n    return X()\n")
    _fails("import sys\nsys.exit(0)\n")


def test_killing_its_parent_fails_and_the_caller_survives() -> None:
    text = _fails("import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), 9)\n    os.kill(-1, 9)\n    return a + b\n")
    assert "PermissionError" in text and "Operation not permitted" in text
    me = os.getpid()  # not even visible from inside
    assert "ProcessLookupError" in _fails(f"import os\ndef add(a, b):\n    os.kill({me}, 9)\n    return a + b\n")
    assert os.getpid() == me  # still here


def test_a_wrong_answer_never_scores_one() -> None:
    env = CodeExecTextEnv(max_attempts=1)
    for seed, p in enumerate(PROBLEMS):
        env.reset(seed)
        res = env.step(f"```python\ndef {p.func}(*args):\n    print('All tests passed')\n    return None\n```")
        assert res.reward == 0.0 and not res.info["passed"]
    env.reset(0)
    assert env.step(f"```python\n{ADD.solution}```").reward == 1.0


@pytest.mark.slow
def test_the_sandbox_works_inside_a_ray_env_worker() -> None:
    """The env worker is a threaded Ray actor: each step's sandbox is started from one of its
    threads; a correct answer passes, an escape attempt fails, nothing of it outlives the step."""
    ray = pytest.importorskip("ray")
    from rollart.runtime.cluster import init_local_ray
    from rollart.runtime.envs.worker import remote_env_worker

    started = not ray.is_initialized()
    if started:
        init_local_ray(1, object_store_memory=100 * 2**20)
    try:
        w = remote_env_worker(num_cpus=0)
        assert ray.get(w.sandbox_check.remote(), timeout=120) is None
        assert ray.get(w.reset.remote(0, "CodeExec", 0), timeout=60)["ok"]
        bad = ray.get(w.step.remote(0, "```python\nimport os\ndef add(a, b):\n    os.kill(os.getppid(), 9)\n```"))
        assert bad["ok"] and bad["reward"] == 0.0 and not bad["done"]
        good = ray.get(w.step.remote(0, f"```python\n{ADD.solution}```"), timeout=60)
        assert good["ok"] and good["reward"] == 1.0 and good["done"]
        assert ray.get(w.ping.remote())
        from rollart.runtime.procs import descendants

        def uid(pid: int) -> int:
            try:
                return os.stat(f"/proc/{pid}").st_uid
            except OSError:  # gone meanwhile
                return 0

        left = [q for q in descendants(ray.get(w.pid.remote())) if uid(q) >= 200_000]
        assert left == []  # nothing of the steps' sandboxes is left under the env worker
    finally:
        if started:
            ray.shutdown()
