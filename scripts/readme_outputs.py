#!/usr/bin/env python
"""Regenerate the sample outputs in README.md from the commands printed above them.

    python scripts/readme_outputs.py            # rewrite README.md in place
    python scripts/readme_outputs.py --check    # exit 1 and show a diff when README.md is stale

A ```text block is a sequence of ``$ rollart ...`` lines, each followed by the output it
printed; a command followed by no output lines is left as it is (tests/test_readme.py runs
it). The ```json block after a ``<!-- json sample: COMMAND -->`` comment is the abbreviated
JSON contract that COMMAND writes. Commands run from a temporary folder with an 80-column,
colourless console, as a user piping them would see them. Wall-clock figures ("0.7 s wall",
"effects/s") are the only parts that differ from run to run: ``--check`` ignores them."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
JSON_MARK = re.compile(r"<!-- json sample: (.+?) -->\n$")
# the figures that depend on the machine and the moment, masked when checking
WALL = [re.compile(r"in [\d.]+ s wall \([\d,]+ effects/s\)"), re.compile(r"[\d.]+ s wall")]


def rollart_exe() -> str:
    local = Path(sys.executable).parent / "rollart"
    return str(local) if local.is_file() else "rollart"


def command_of(line: str) -> str:
    """``$ rollart simulate --steps 4   # a comment`` → ``rollart simulate --steps 4``."""
    text = line[2:] if line.startswith("$ ") else line
    return re.sub(r"\s+#.*$", "", text).strip()


def run(command: str, cwd: Path) -> str:
    argv = shlex.split(command)
    if argv and argv[0] == "rollart":
        argv[0] = rollart_exe()
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"}
    env.pop("FORCE_COLOR", None)
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    text = proc.stdout + proc.stderr
    lines = [ln.rstrip() for ln in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def regenerate_text_block(body: str, cwd: Path) -> str:
    lines = body.rstrip("\n").split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            out.append(line)
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("$ "):
            j += 1
        out.append(line)
        if j > i + 1:  # the README shows this command's output: regenerate it
            out.append(run(command_of(line), cwd))
        i = j
    return "\n".join(out) + "\n"


def json_sample(command: str, cwd: Path) -> str:
    """The abbreviated JSON contract: every top-level key, the first step, the headline summary."""
    path = cwd / "readme-sample.json"
    argv = [*shlex.split(command), "--json", str(path), "-q"]
    run(shlex.join(argv), cwd)
    d = json.loads(path.read_text())

    def r(x: Any) -> Any:
        return round(x, 2) if isinstance(x, float) else {k: r(v) for k, v in x.items()} if isinstance(x, dict) else x

    step = d["steps"][0]
    sm = d["summary"]
    step_keys = ", ".join(f'"{k}": {json.dumps(r(step[k]))}' for k in ("step", "time_s"))
    bd = ", ".join(f'"{k}": {json.dumps(r(v))}' for k, v in list(step["breakdown_s"].items())[:2])
    head = ("step_time_s_mean", "trajectories_per_s", "tokens_per_s", "gpu_busy_fraction", "aborted_stale",
            "aborted_redundant", "env_failures", "mean_staleness", "cost_per_1k_trajectories_usd")
    summary = ",\n             ".join(", ".join(f'"{k}": {json.dumps(r(sm[k]))}' for k in head[i:i + 3])
                                     for i in range(0, len(head), 3))
    return (f'{{"scenario": {json.dumps(d["scenario"])}, "mode": {json.dumps(d["mode"])}, "seed": {d["seed"]}, '
            f'"backend": {json.dumps(d["backend"])}, "calibration": {{...}},\n'
            f' "steps": [{{{step_keys}, "breakdown_s": {{{bd}, ...}}, ...}}, ...],\n'
            f' "summary": {{{summary}, ...}},\n'
            f' "error": {json.dumps(d["error"])}}}\n')


def regenerate(text: str) -> str:
    with tempfile.TemporaryDirectory(prefix="rollart-readme-") as tmp:
        cwd = Path(tmp)
        out, pos = [], 0
        for m in FENCE.finditer(text):
            lang, body = m.group(1), m.group(2)
            out.append(text[pos:m.start()])
            mark = JSON_MARK.search(text[:m.start()])
            if lang == "text" and body.startswith("$ "):
                body = regenerate_text_block(body, cwd)
            elif lang == "json" and mark:
                body = json_sample(mark.group(1), cwd)
            out.append(f"```{lang}\n{body}```\n")
            pos = m.end()
        out.append(text[pos:])
    return "".join(out)


def masked(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        for pattern in WALL:
            line = pattern.sub("<wall>", line)
        lines.append(line)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when stale")
    ap.add_argument("--readme", type=Path, default=README)
    args = ap.parse_args()
    old = args.readme.read_text()
    new = regenerate(old)
    if args.check:
        diff = list(difflib.unified_diff(masked(old), masked(new), "README.md", "regenerated", lineterm=""))
        if diff:
            print("\n".join(diff))
            print("\nREADME.md's sample outputs are stale: run python scripts/readme_outputs.py", file=sys.stderr)
            return 1
        print("README.md's sample outputs are current")
        return 0
    if new != old:
        args.readme.write_text(new)
        print(f"updated {args.readme}")
    else:
        print(f"{args.readme} unchanged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
