#!/usr/bin/env bash
# Download the wheels benchmarks/gpu/run.sh installs on the GPU machine (Python 3.12, x86-64
# manylinux, no network there) into the git-ignored benchmarks/gpu/wheels (~5 MB). The GPU
# image has torch 2.11, numpy, packaging and triton; megatron-core 0.19.2 needs only those.
# pydantic (+ pydantic-core, annotated-types, typing-inspection, typing-extensions) and simpy
# are rollart's own dependencies that the image's package list does not show; setup_env.py
# installs each only where its module is missing. Versions match the CPU venv's.
set -euo pipefail
DEST="$(cd "$(dirname "$0")" && pwd)/wheels"
mkdir -p "$DEST"
"${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DEST" \
  megatron-core==0.19.2 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing-extensions==4.16.0 simpy==4.1.2
ls -la "$DEST"
