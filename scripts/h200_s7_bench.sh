#!/usr/bin/env bash
# Session 7, first call (issue 16, item 6): the shipped kernels checked on the device after
# session 6's folds (kernels check, tests/device), then tables/h200.py benched with the
# reduce-overhead anchor and the hot path, one process per case, appended per case to
# $OUT/bench.csv (resumable: a later call with the same CSV skips the finished cases).
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
{ command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer; } 2>&1 | head -2
[ -f "${BENCH_CSV_IN:-/nonexistent}" ] && cp "$BENCH_CSV_IN" "$OUT/bench.csv"
if [ -z "${SKIP_CHECKS:-}" ]; then
  timeout 120 python3 -m autotune kernels check 2>&1 | tee "$OUT/kernels_check.log" | tail -1
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/device 2>&1 | tee "$OUT/device_tests.log" | tail -4
fi
for c in ${BENCH_CASES:-2 3 4 7 12 1 5 9 10 11 8 13 6}; do
  [ "$SECONDS" -lt "${BENCH_DEADLINE:-470}" ] || { echo "bench: deadline before case $c" | tee -a "$OUT/bench.log"; break; }
  timeout 80 python3 -m autotune bench --table tables/h200.py --cases "$c" \
    --anchors sdpa+reduce-overhead --hot-path --csv "$OUT/bench.csv" 2>&1 | grep -v -i warn \
    | tee -a "$OUT/bench.log" | tail -3
done
