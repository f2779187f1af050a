#!/usr/bin/env bash
# Download the cuDNN frontend (Python graph API: every cuDNN execution plan and knob, not
# only the one PyTorch's heuristics pick) and the CUDA driver bindings it needs, for the GPU
# host's Python 3.12, into .whl-cudnn/ (git-ignored; ~20 MB). Carry it in a device call
# beside .whl; scripts/s43_call.sh installs it into /tmp/site_cudnn.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .whl-cudnn
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 -d .whl-cudnn \
  nvidia-cudnn-frontend==1.32.0 cuda-bindings==13.5.0 cuda-pathfinder==1.9.1 2>&1 \
  | grep -v 'is ignored' || true
ls .whl-cudnn
