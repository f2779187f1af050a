#!/usr/bin/env bash
# Issue 16 on the H200, session 5, fourth call. Export faulted the device twice at the
# fourth case of one process (cases 2, 4, 3, then 13 or 8), while each case-13 candidate
# alone passed: each remaining case is exported in its own process. Then tests/device
# (every shipped entry under set_sync_debug_mode("error")), then the bench of cases 1-13
# with the reduce-overhead anchor and the hot path, one process per case, appended to
# the CSV, until the call's deadline.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
for c in ${EXPORT_CASES:-13 8 7 12 2 3 4}; do
  [ "$SECONDS" -lt "${EXPORT_DEADLINE:-230}" ] || { echo "export: deadline before case $c" | tee -a "$OUT/export.log"; break; }
  timeout 120 python3 -m autotune export --gpu h200 --finalists 2 --anchors sdpa+reduce-overhead \
    --cases "$c" 2>&1 | grep -v -i warning | tee -a "$OUT/export.log" | tail -2
done
cp tables/h200.py "$OUT/h200.py"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/device 2>&1 | tee "$OUT/device_tests.log" | tail -12
for c in ${BENCH_CASES:-2 3 4 7 12 1 5 9 10 11 8 13 6}; do
  [ "$SECONDS" -lt "${BENCH_DEADLINE:-540}" ] || { echo "bench: deadline before case $c" | tee -a "$OUT/bench.log"; break; }
  timeout 100 python3 -m autotune bench --table tables/h200.py --cases "$c" \
    --anchors sdpa+reduce-overhead --hot-path --csv "$OUT/bench.csv" 2>&1 | grep -v -i warn \
    | tee -a "$OUT/bench.log" | tail -3
done
