#!/usr/bin/env bash
# Session 40's call: on an H200, finish version 56's bench (scripts/h200_s38_call.sh,
# PHASES=bench); on any other card, with OFF_H200=tests, the whole compiled kernel and
# device test run (~190-265 s on an H100), with OFF_H200=layers the layer-level equalities
# (scripts/key_bounds_diff.py --layers), else nothing (exit 3). TESTS narrows the test run
# (default: tests/kernels tests/device); on an H200, TESTS given runs those after the bench.
# Logs in $OUT.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export PYTHONUNBUFFERED=1
# The compiled tests (TESTS, default tests/kernels tests/device) under the device prelude,
# within $1 seconds, the last $2 lines of the log shown.
run_tests() {
  source scripts/device_prelude.sh >/dev/null || exit 1
  # shellcheck disable=SC2086  # TESTS is a list of paths and node ids
  timeout "$1" python3 -m pytest -q -p no:cacheprovider -n 8 --tb=short \
    ${TESTS:-tests/kernels tests/device} 2>&1 | grep -v -i "benchmarkwarning\|warner(" \
    | tee "$OUT/s40_kernels_gpu_full.log" | tail -"$2"
}
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  PHASES=bench bash scripts/h200_s38_call.sh
  rc=$?
  # TESTS given: those tests compiled after the bench too (kept short: ~1 min).
  [ -n "${TESTS:-}" ] && run_tests 120 20
  exit $rc
fi
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/s40_card.txt"
case "${OFF_H200:-}" in
  tests) ;;
  layers)
    source scripts/device_prelude.sh >/dev/null || exit 1
    timeout 150 python3 scripts/key_bounds_diff.py --layers 2>&1 | grep -v -i warn \
      | tee "$OUT/s40_layers_diff.log"
    exit $? ;;
  *) echo "not an H200: nothing run"; exit 3 ;;
esac
run_tests 420 60
