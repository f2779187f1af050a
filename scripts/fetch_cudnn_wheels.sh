#!/usr/bin/env bash
# Download the cuDNN frontend (Python graph API: every cuDNN execution plan and knob, not
# only the one PyTorch's heuristics pick) and the CUDA driver bindings it needs, for the GPU
# host's Python 3.12, into .whl-cudnn/ (git-ignored). The frontend wheel is cut down to a
# zip without its C++ headers and the kernel families no probe here uses (GEMM, linear and
# sparse attention, MoE, HSTU): ~14 MB in all, so the device call's copy of the working tree
# stays under its 64 MiB. Carry .whl-cudnn beside .whl; scripts/s43_call.sh extracts the
# zip and installs the wheels into /tmp/site_cudnn.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .whl-cudnn
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 -d .whl-cudnn \
  nvidia-cudnn-frontend==1.32.0 cuda-bindings==13.5.0 cuda-pathfinder==1.9.1 2>&1 \
  | grep -v 'is ignored' || true
python3 - <<'PY'
import glob, os, zipfile
drop = ("include/", "cudnn/gemm/", "cudnn/linear_attention/", "cudnn/gated_attention_block/",
        "cudnn/deepseek_sparse_attention/", "cudnn/moe_ep/", "cudnn/block_sparse_attention/",
        "cudnn/hstu/")
for whl in glob.glob(".whl-cudnn/nvidia_cudnn_frontend-*.whl"):
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(whl[:-4] + "-trimmed.zip", "w",
                                                      zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if not info.filename.startswith(drop):
                dst.writestr(info, src.read(info))
    os.remove(whl)
PY
ls -la .whl-cudnn
