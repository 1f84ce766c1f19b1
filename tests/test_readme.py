"""Every code block of README.md works as printed.

Each shell command of a ```bash block and each ``$ ...`` line of a ```text block is run as a
user would (the console script, from a scratch folder, in README order where one command uses
another's files), with the extra arguments listed in COMMANDS appended to keep it short (later
options win over earlier ones); the ones that start Ray or run a model are marked slow. A
README command missing from COMMANDS fails ``test_every_readme_command_is_covered``, so a new
example cannot go untested. The Python block (Listing 1) runs as printed. The sample outputs
must be what ``scripts/readme_outputs.py`` regenerates (wall-clock figures aside)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
INSTALL = "python3 -m venv .venv && . .venv/bin/activate && pip install -e "


@dataclass(frozen=True)
class Spec:
    extra: tuple[str, ...] = ()         # appended to keep the run short
    slow: bool = False
    rc: int = 0
    env: dict[str, str] = field(default_factory=dict)
    needle: str = ""                    # expected in the output
    after: str = ""                     # the README command whose files it reads (run first, same folder)
    covered_by: str = ""                # the test that runs it as printed, with checks of its own (not run again here)


# README command (comment removed) → how it is run here
COMMANDS: dict[str, Spec] = {
    "rollart simulate": Spec(),
    "rollart simulate --steps 4": Spec(),
    "rollart compare default --steps 8": Spec(extra=("--steps", "1")),
    "rollart simulate paper/qwen3-14b-128gpu --set algorithm.alpha=2 --set cluster.gpu_pools.h20.count=48":
        Spec(extra=("--steps", "1")),
    "rollart simulate --set tasks.CodeExec.env.failure_prob=0.05 --mode areal --json out.json --trace trace.json":
        Spec(extra=("--steps", "2")),
    "rollart simulate --set cluster.gpu_pools.h20.gpu=B200":
        Spec(extra=("--steps", "1"), needle="calibrated kernel profile B200 (b200.yaml)"),
    "rollart simulate --set 'cluster.custom_gpus.B300={tflops_bf16: 2250, hbm_tbps: 8, memory_gb: 288, "
    "nvlink_gbps: 1800, tflops_fp8: 4500}' --set cluster.gpu_pools.h20.gpu=B300":
        Spec(extra=("--steps", "1"), needle="B200 kernel profile on the B300"),
    "rollart simulate --set placement.hw_affinity.FrozenLake=H900": Spec(rc=2, needle="unknown pool 'H900'"),
    "rollart simulate --set algorithm.alpah=2": Spec(rc=2, needle="did you mean 'alpha'"),
    "rollart scenarios": Spec(needle="paper/qwen3-8b-128gpu"),
    "rollart run default --steps 1": Spec(rc=2, needle="Qwen3-tiny"),
    "rollart calibrate show": Spec(needle="measured:"),
    "rollart calibrate show h20 --plot h20.png": Spec(),
    "rollart calibrate profile --engine torch --model Qwen3-tiny --out cpu.csv": Spec(extra=("--repeats", "1"), slow=True),
    "rollart calibrate fit cpu.csv --gpu cpu-local --out cpu.yaml":
        Spec(slow=True, after="rollart calibrate profile --engine torch --model Qwen3-tiny --out cpu.csv"),
    "python -c \"from rollart.calibration.env_fit import synthetic_trace; synthetic_trace('trace.csv', 'SWE', 2000, 0)\"":
        Spec(),
    "rollart calibrate env trace.csv --task SWE": Spec(),
    "rollart validate local/validate-sync --out v/":
        Spec(extra=("--steps", "5"), slow=True,
             covered_by="tests/test_validate.py::test_validate_end_to_end_within_the_ci_bound"),
    "rollart reproduce --out report/": Spec(extra=("--only", "h800-vs-h20", "--steps", "1", "-q"), slow=True,
                                            env={"ROLLART_REPRODUCE_BATCH": "16"}),
    "rollart sweep paper/qwen3-14b-128gpu --grid algorithm.alpha=0,1,2 --grid algorithm.redundancy=0,0.25 --out sweep/":
        Spec(extra=("--steps", "1", "--set", "algorithm.batch_size=32", "-q"), slow=True),
    "rollart plan paper/qwen3-14b-128gpu --budget-usd-per-hour 454 --out plan.yaml":
        Spec(extra=("--candidates", "4", "--finalists", "1", "--local-rounds", "0", "--polish-rounds", "0",
                    "--steps", "1", "--set", "algorithm.batch_size=32", "-q"), slow=True),
    "rollart simulate plan.yaml": Spec(extra=("--steps", "1"), slow=True,
                                       after="rollart plan paper/qwen3-14b-128gpu --budget-usd-per-hour 454 --out plan.yaml"),
    "rollart run scenarios/local/digits.yaml --steps 40 --json run.json --trace run.trace.json":
        Spec(extra=("--steps", "3", "-q"), slow=True,
             covered_by="tests/test_runtime_run.py::test_cli_run_writes_the_same_contract_and_trace"),
    # one round each: the README command's point is that the benchmarks run and print their ratios
    "python -m pytest tests/test_benchmark.py --benchmark-enable -s -n 0 --dist no":
        Spec(extra=("--benchmark-min-rounds", "1", "--benchmark-max-time", "0", "--benchmark-warmup", "off"),
             slow=True),
}
# the install lines: their rollart / pytest tail is what is run (the install is what CI itself does)
INSTALL_TAILS = {"rollart simulate": "rollart simulate", "python -m pytest": None}


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(README.read_text())]


def strip_comment(line: str) -> str:
    return re.sub(r"\s+#\s.*$", "", line).strip()


def readme_commands() -> list[str]:
    """Every command in README order (text blocks: the ``$`` lines; bash blocks: each line)."""
    out = []
    for lang, body in blocks():
        for line in body.splitlines():
            if lang == "text" and line.startswith("$ "):
                out.append(strip_comment(line[2:]))
            elif lang == "bash" and line.strip():
                out.append(strip_comment(line))
                for tail, run in INSTALL_TAILS.items():
                    if out[-1].startswith(INSTALL) and out[-1].endswith("&& " + tail) and run:
                        out.append(run)  # what follows the install is run like any command
    return out


def run_command(command: str, spec: Spec, cwd: Path, more: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    argv = [*shlex.split(command), *spec.extra, *more]
    if argv[0] == "rollart":
        argv[0] = str(Path(sys.executable).parent / "rollart")
    elif argv[0] == "python":
        argv[0] = sys.executable
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb", **spec.env}
    return subprocess.run(argv, cwd=cwd if argv[1:3] != ["-m", "pytest"] else ROOT, env=env, capture_output=True,
                          text=True, timeout=1500)


def readme_command(start: str) -> tuple[str, Spec]:
    """The one README command that begins with ``start``, and how it is run (for a test that covers it)."""
    (command,) = [c for c in COMMANDS if c.startswith(start)]
    return command, COMMANDS[command]


def check(command: str, spec: Spec, cwd: Path, more: tuple[str, ...] = ()) -> None:
    proc = run_command(command, spec, cwd, more)
    out = proc.stdout + proc.stderr
    assert proc.returncode == spec.rc, f"{command}: exit {proc.returncode}\n{out[-3000:]}"
    assert "Traceback" not in out, f"{command}:\n{out[-3000:]}"
    assert spec.needle in out, f"{command}: no '{spec.needle}' in\n{out[-3000:]}"


def test_every_readme_command_is_covered():
    missing = []
    for command in readme_commands():
        if command.startswith(INSTALL):
            assert any(command.endswith("&& " + tail) for tail in INSTALL_TAILS), command
        elif command not in COMMANDS:
            missing.append(command)
    assert not missing, f"README commands without a test (add them to COMMANDS): {missing}"
    assert not set(COMMANDS) - set(readme_commands()), "COMMANDS lists commands the README no longer has"


def test_install_lines_name_real_extras_and_ci_runs_the_test_line():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [c for c in readme_commands() if c.startswith(INSTALL)]
    assert len(lines) == 2
    extras = re.findall(r'pip install -e "\.\[(\w+)\]"', lines[1])
    assert extras and all(e in project["optional-dependencies"] for e in extras)
    assert project["scripts"]["rollart"] == "rollart.cli:app"
    assert lines[1] in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command verbatim


def _fast() -> list[str]:
    seen = []
    for c in readme_commands():
        if c in COMMANDS and not COMMANDS[c].slow and c not in seen:
            seen.append(c)
    return seen


@pytest.mark.parametrize("command", _fast())
def test_fast_readme_command_runs(command: str, tmp_path_factory: pytest.TempPathFactory):
    cwd = tmp_path_factory.getbasetemp() / "readme-fast"
    cwd.mkdir(exist_ok=True)  # one folder: trace.csv is written by the line before calibrate env
    if command == "rollart run default --steps 1":
        from rollart.preflight import Machine

        if Machine.here().gpus >= 16:  # pragma: no cover - a machine that can run it
            pytest.skip("this machine has the GPUs the default plan asks for")
    check(command, COMMANDS[command], cwd)


def _slow_chains() -> list[list[str]]:
    """The slow commands in README order, as chains: a command that reads another's files (``Spec.after``)
    runs after it in the same folder; the chains are independent, so pytest-xdist spreads them."""
    chains: dict[str, list[str]] = {}
    for command in readme_commands():
        spec = COMMANDS.get(command)
        if spec is None or not spec.slow or spec.covered_by or any(command in c for c in chains.values()):
            continue
        head = command
        while COMMANDS[head].after:
            head = COMMANDS[head].after
        chains.setdefault(head, []).append(command)
    return list(chains.values())


def test_a_command_runs_after_the_one_whose_files_it_reads():
    order = readme_commands()
    for command, spec in COMMANDS.items():
        if spec.after:
            assert spec.after in COMMANDS and COMMANDS[spec.after].slow == spec.slow, command
            assert order.index(spec.after) < order.index(command), command
    chains = _slow_chains()
    slow = {c for c in order if c in COMMANDS and COMMANDS[c].slow and not COMMANDS[c].covered_by}
    assert sum(len(c) for c in chains) == len(slow)
    assert any(len(c) > 1 for c in chains)


def test_a_covered_command_names_a_test_that_runs_it():
    import importlib

    for command, spec in COMMANDS.items():
        if spec.covered_by:
            path, name = spec.covered_by.split("::")
            module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
            source = (ROOT / path).read_text()
            assert callable(getattr(module, name, None)), spec.covered_by
            body = source.split(f"def {name}(", 1)[1].split("\ndef ", 1)[0]
            assert f'readme_command("{command.split()[0]} {command.split()[1]}' in body, (command, spec.covered_by)


def _chain_id(chain: list[str]) -> str:
    """``rollart validate …`` → validate, ``rollart calibrate profile …`` → calibrate-profile, ``python -m pytest …`` → pytest."""
    words = [w for w in shlex.split(chain[0]) if not w.startswith("-")]
    return "-".join(words[1:3]) if words[1] == "calibrate" else words[1]


@pytest.mark.slow
@pytest.mark.parametrize("chain", _slow_chains(), ids=_chain_id)
def test_slow_readme_commands_run_in_order(chain: list[str], tmp_path: Path):
    """Each chain of slow commands (calibrate profile → fit, plan → simulate plan.yaml; reproduce, sweep and
    the benchmark alone): one folder, README order. validate and run are run as printed by the tests that
    check what they write (``Spec.covered_by``)."""
    for command in chain:
        check(command, COMMANDS[command], tmp_path)


@pytest.mark.slow
def test_listing_1_runs_as_printed(tmp_path: Path):
    (code,) = [body for lang, body in blocks() if lang == "python"]
    script = tmp_path / "listing1.py"
    script.write_text(code + "\nprint('listing ok')\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own Ray, as a fresh shell has
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "listing ok" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_sample_outputs_are_current():
    """The README shows what the commands print now (scripts/readme_outputs.py regenerates it)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_outputs.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
