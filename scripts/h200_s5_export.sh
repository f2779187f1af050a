#!/usr/bin/env bash
# Issue 16 on the H200, session 5, second call: the device tests again and case 2's hot
# path with the leaner call (no alias, the C replay, settings read in C), then the export
# of cases 1-13 from the new studies with the reduce-overhead anchor measured beside the
# finalists, in two halves (the first half's table is written before the second starts).
# Needs AUTOTUNE_COMMIT; the table and logs come back through $OUT.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
if [ "${1:-}" != --no-prelude ]; then
source scripts/device_prelude.sh
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/device -k "not shipped" 2>&1 \
  | tee "$OUT/device_tests.log" | tail -8
timeout 100 python3 -m autotune bench --table tables/h200.py --cases 2 --hot-path 2>&1 \
  | tee "$OUT/bench_case2_hot.log" | tail -4
timeout 60 python3 scripts/host_profile.py --case 2 --top 14 2>&1 \
  | tee "$OUT/host_profile_case2.log" | head -22
fi
for half in "${FIRST:-2-4,7-8,12-13}:${FIRST_WALL:-270}" "${SECOND:-1,5-6,9-11}:${SECOND_WALL:-200}"; do
  timeout "${half#*:}" python3 -m autotune export --gpu h200 --finalists 2 \
    --anchors sdpa+reduce-overhead --cases "${half%%:*}" 2>&1 | tee -a "$OUT/export.log" | tail -9
  cp tables/h200.py "$OUT/h200.py"
done
