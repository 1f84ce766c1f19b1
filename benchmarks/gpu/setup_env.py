"""Make rollart and the wheels brought along importable on the GPU machine (no network there).

    python benchmarks/gpu/setup_env.py SITE     # prints the PYTHONPATH to export

1. Every wheel in ``benchmarks/gpu/wheels/`` whose module this interpreter cannot import, and
   which this interpreter can install (its tags match), goes into ``SITE/lib`` with
   ``pip install --no-index --no-deps --target``; a wheel for another interpreter (the cp312
   megatron-core wheel under a CPU dry-run's Python) is left alone and reported.
2. ``SITE/src/rollart`` becomes an importable copy of the package as ``pyproject.toml`` maps it
   (``rollart/`` with ``sim/``, ``calibration/`` and ``scenarios/`` inside), so nothing needs
   installing from the tree.

Prints ``PYTHONPATH=SITE/src:SITE/lib`` on its last line; everything else goes to stderr."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(__file__).resolve().parent / "wheels"
# distribution name (as in a wheel file name) → the module that shows it is importable
MODULES = {"megatron_core": "megatron.core", "pydantic": "pydantic", "pydantic_core": "pydantic_core",
           "annotated_types": "annotated_types", "typing_inspection": "typing_inspection", "simpy": "simpy",
           "typing_extensions": "typing_extensions"}
# rollart.<name> → folder in the tree (pyproject.toml's package-dir)
MAPPED = {"sim": "sim", "calibration": "calibration", "scenarios": "scenarios"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _installable(wheel: Path) -> bool:
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    _, _, _, tags = parse_wheel_filename(wheel.name)
    return bool(set(tags) & set(sys_tags()))


def install_wheels(lib: Path) -> list[str]:
    """Install what is missing; returns one line per wheel saying what happened."""
    from packaging.utils import parse_wheel_filename

    notes, todo = [], []
    for wheel in sorted(WHEELS.glob("*.whl")):
        dist = str(parse_wheel_filename(wheel.name)[0]).replace("-", "_")
        module = MODULES.get(dist, dist)
        if _importable(module):
            notes.append(f"{wheel.name}: {module} already importable")
        elif not _installable(wheel):
            notes.append(f"{wheel.name}: not for this interpreter (Python {sys.version.split()[0]}), skipped")
        else:
            todo.append(wheel)
    # pydantic 2.14 needs typing_extensions ≥ 4.16; an older one in the image would break it
    if any(w.name.startswith("pydantic") for w in todo):
        todo += [w for w in WHEELS.glob("typing_extensions-*.whl") if w not in todo]
    if todo:
        lib.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(lib), *map(str, todo)]
        subprocess.run(cmd, check=True)
        notes += [f"{w.name}: installed into {lib}" for w in todo]
    return notes


def build_source(src: Path) -> Path:
    """An importable ``rollart`` under ``src`` laid out as the installed package is."""
    pkg = src / "rollart"
    if pkg.exists():
        shutil.rmtree(pkg)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "rollart", pkg, ignore=ignore)
    for name, folder in MAPPED.items():
        shutil.copytree(ROOT / folder, pkg / name, ignore=ignore)
    return pkg


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        log("usage: setup_env.py SITE")
        return 2
    site = Path(argv[0]).resolve()
    lib, src = site / "lib", site / "src"
    for line in install_wheels(lib):
        log(line)
    build_source(src)
    log(f"rollart source copied to {src / 'rollart'}")
    print(f"PYTHONPATH={src}:{lib}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
