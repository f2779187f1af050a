#!/usr/bin/env bash
# Session 6, third call: tests/device (every entry of tables/h200.py sync-free under
# set_sync_debug_mode("error")), then the bench of the re-exported cases with the
# reduce-overhead anchor and the hot path, one process per case, until the deadline.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/device 2>&1 | tee "$OUT/device_tests.log" | tail -4
for c in ${BENCH_CASES:-2 12 13 3 4 7 1 5}; do
  [ "$SECONDS" -lt "${BENCH_DEADLINE:-330}" ] || { echo "bench: deadline before case $c" | tee -a "$OUT/bench.log"; break; }
  timeout 70 python3 -m autotune bench --table tables/h200.py --cases "$c" \
    --anchors sdpa+reduce-overhead --hot-path --csv "$OUT/bench.csv" 2>&1 | grep -v -i warn \
    | tee -a "$OUT/bench.log" | tail -3
done
