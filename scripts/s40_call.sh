#!/usr/bin/env bash
# Session 40's call: on an H200, finish version 56's bench (scripts/h200_s38_call.sh,
# PHASES=bench); on any other card, measure the key-bounds difference
# (scripts/key_bounds_diff.py) and rerun the kernel tests moved onto the device fixture
# in session 39 (test_rowsoftmax, test_ffn), compiled. Logs in $OUT.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export PYTHONUNBUFFERED=1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  PHASES=bench bash scripts/h200_s38_call.sh
  exit $?
fi
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/s40_card.txt"
source scripts/device_prelude.sh >/dev/null || exit 1
timeout 200 python3 scripts/key_bounds_diff.py 2>&1 | grep -v -i warn | tee "$OUT/s40_key_bounds.log"
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 --tb=line \
  tests/kernels/test_rowsoftmax.py tests/kernels/test_ffn.py 2>&1 | tail -15 | tee "$OUT/s40_moved_tests.log"
