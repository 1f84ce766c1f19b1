#!/usr/bin/env bash
# The GPU check of issue 18 in one command: kernel timings → fitted kernel profile + the
# datasheet roofline's error per kernel family, the Megatron GRPO step (and its resume), and
# TorchEngine + the torch GRPO trainer on the Digits task in one process (no Ray).
#
#   benchmarks/gpu/run.sh OUTDIR                        # on the GPU machine (~3-4 min)
#   ROLLART_GPU_DRYRUN=1 benchmarks/gpu/run.sh OUTDIR   # here: device cpu, tiny shapes (~1 min)
#
# Before a device run, fetch the wheels it installs there (git-ignored, ~5 MB):
#   benchmarks/gpu/fetch_wheels.sh
# and name benchmarks/gpu/wheels in the device tool's carry. OUTDIR receives at most 8 files
# (what the device tool brings back): kernels/{gemm,attn_prefill,attn_decode,copy}.csv,
# kernels/provenance.json, <gpu>.yaml, checks.json, summary.md.
#
# Environment: PYTHON (default python3), ROLLART_GPU_DRYRUN=1, ROLLART_GPU_NAME (default: the
# preset the device is, e.g. H200), ROLLART_GPU_STEPS (Digits steps; 20, or 2 dry).
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
case "$PY" in  # absolute, since the stages run from a temporary folder (symlinks kept: a venv's python is one)
  */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;;
esac
mkdir -p "$1" || exit 2
OUTDIR=$(cd "$1" && pwd)
SITE=$(mktemp -d "${TMPDIR:-/tmp}/rollart-gpu-XXXXXX")
trap 'rm -rf "$SITE"' EXIT
export PYTHONUNBUFFERED=1
T0=$(date +%s)

if [ "${ROLLART_GPU_DRYRUN:-0}" = "1" ]; then
  MODE=dry-run DEVICE=cpu SHAPES=tiny STEPS=${ROLLART_GPU_STEPS:-2}
  KERNEL_LIMIT=240 MEGATRON_LIMIT=120 DIGITS_LIMIT=240
else
  MODE=gpu DEVICE=cuda SHAPES=full STEPS=${ROLLART_GPU_STEPS:-20}
  # worst case 200 + 60 + 120 + 90 s: the whole script stays under 8 minutes
  KERNEL_LIMIT=200 MEGATRON_LIMIT=120 DIGITS_LIMIT=90
fi
echo "== rollart GPU check ($MODE: device $DEVICE, shapes $SHAPES) → $OUTDIR"

# 1. the wheels brought along and an importable rollart ------------------------------------
ENVLINE=$("$PY" "$ROOT/benchmarks/gpu/setup_env.py" "$SITE") || { echo "setup failed" >&2; exit 1; }
export "${ENVLINE?}"
# Run from outside the tree: Python puts the working directory first on sys.path, and the
# tree's rollart/ (without sim/ and calibration/ inside) would shadow the copy.
cd "$SITE" || exit 1
"$PY" -c "import rollart, torch; print(f'rollart from {rollart.__file__}; torch {torch.__version__}, '
           f'cuda {torch.version.cuda}, GPU: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}')" \
  || { echo "rollart does not import" >&2; exit 1; }
if [ "$DEVICE" = "cuda" ] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  echo "no CUDA device visible; for a CPU dry run set ROLLART_GPU_DRYRUN=1" >&2
  exit 1
fi
GPU=${ROLLART_GPU_NAME:-$("$PY" -c "from rollart.calibration.gpu_kernels import preset_name; print(preset_name('$DEVICE'))")}
PROFILE="$OUTDIR/$(echo "$GPU" | tr '[:upper:]' '[:lower:]').yaml"
CLI=(-c "from rollart.cli import app; app()")
STATUS=0
stage() { echo "-- $1 ($(( $(date +%s) - T0 )) s)"; }

# 2. kernel timings, the fit and the roofline table ---------------------------------------
stage "kernels: calibrate profile --engine kernels --device $DEVICE --shapes $SHAPES"
rm -rf "$OUTDIR/kernels"
timeout "$KERNEL_LIMIT" "$PY" "${CLI[@]}" calibrate profile --engine kernels --device "$DEVICE" --shapes "$SHAPES" \
  --out "$OUTDIR/kernels" 2>&1 | grep -v "^\s*$" || STATUS=1
FIT_LOG="$SITE/fit.txt"
stage "fit: calibrate fit kernels --gpu $GPU"
if timeout 60 "$PY" "${CLI[@]}" calibrate fit "$OUTDIR/kernels" --gpu "$GPU" --out "$PROFILE" >"$FIT_LOG" 2>&1; then
  cat "$FIT_LOG"
else
  cat "$FIT_LOG"; STATUS=1
fi

# 3. the trainers ---------------------------------------------------------------------
stage "megatron: one GRPO step on a tiny megatron-core GPT, then resume"
timeout "$MEGATRON_LIMIT" "$PY" "$ROOT/benchmarks/gpu/checks.py" megatron --device "$DEVICE" \
  --out "$SITE/megatron.json" 2>"$SITE/megatron.err" | tee "$SITE/megatron.txt" || STATUS=1
[ -s "$SITE/megatron.txt" ] || { echo "megatron: no result (timed out or crashed)"; tail -5 "$SITE/megatron.err"; }
stage "digits: TorchEngine + GRPOTrainer, $STEPS steps in process"
timeout "$DIGITS_LIMIT" "$PY" "$ROOT/benchmarks/gpu/checks.py" digits --device "$DEVICE" --steps "$STEPS" \
  --out "$SITE/digits.json" 2>"$SITE/digits.err" | tee "$SITE/digits.txt" || STATUS=1
[ -s "$SITE/digits.txt" ] || { echo "digits: no result (timed out or crashed)"; tail -5 "$SITE/digits.err"; }

# 4. one JSON of the checks and the summary ------------------------------------------------
WALL=$(( $(date +%s) - T0 ))
"$PY" - "$SITE" "$OUTDIR" "$MODE" "$GPU" "$PROFILE" "$WALL" "$STATUS" <<'EOF'
import json, sys
from pathlib import Path

site, out, mode, gpu, profile, wall, status = sys.argv[1:]
site, out = Path(site), Path(out)
checks = {}
for name in ("megatron", "digits"):
    p = site / f"{name}.json"
    checks[name] = json.loads(p.read_text()) if p.is_file() else {"ok": False, "error": "no result (timed out or crashed)",
                                                                   "stderr": (site / f"{name}.err").read_text()[-2000:]
                                                                   if (site / f"{name}.err").is_file() else ""}
(out / "checks.json").write_text(json.dumps(checks, indent=1) + "\n")
prov = out / "kernels" / "provenance.json"
p = json.loads(prov.read_text()) if prov.is_file() else {}
fit = (site / "fit.txt").read_text() if (site / "fit.txt").is_file() else "(no fit)\n"
lines = [f"# rollart GPU check ({mode})", "",
         f"* device: {p.get('gpu', '?')} · driver {p.get('driver', '?')} · torch {p.get('torch', '?')} · "
         f"CUDA {p.get('cuda')} · {p.get('date', '?')}",
         f"* kernels: {p.get('rows')} in {p.get('wall_s')} s · matmul peak {p.get('peak_tflops')} TFLOP/s · "
         f"copy {p.get('copy_tbps')} TB/s · {p.get('method', '')}",
         f"* profile: {Path(profile).name} (fitted as {gpu})",
         f"* wall time of the whole script: {wall} s; status {'ok' if status == '0' else 'something failed (see above)'}",
         "", "## fit", "", "```", fit.rstrip(), "```", "", "## checks", ""]
for name, r in checks.items():
    if r.get("skipped"):
        lines.append(f"* {name}: skipped ({r.get('reason')})")
    elif "error" in r:
        lines.append(f"* {name}: FAILED {r['error']}")
    else:
        lines.append(f"* {name}: {'ok' if r.get('ok') else 'NOT OK'} · " + json.dumps(
            {k: v for k, v in r.items() if k not in ('steps', 'traceback')}, default=str))
        if name == "digits":
            lines.append("  reward by step: " + " → ".join(f"{h['reward_mean']:.3f}" for h in r["steps"]))
text = "\n".join(lines) + "\n"
(out / "summary.md").write_text(text)
EOF
echo "== summary ($WALL s; files in $OUTDIR)"
grep -E "^(prefill|decode|held-out MAPE|gemm|attn|\|)" "$FIT_LOG" 2>/dev/null | head -20
cat "$SITE/megatron.txt" "$SITE/digits.txt" 2>/dev/null
ls -1 "$OUTDIR" "$OUTDIR/kernels" 2>/dev/null | tr '\n' ' '; echo
exit $STATUS
