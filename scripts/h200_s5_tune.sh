#!/usr/bin/env bash
# Issue 16 on the H200, session 5, first call: the captured forward's input binding and
# output ring (tests/device), the hot path of case 2 on the shipped table with them, a
# host profile of that call, then the studies of cases 1-13 in the new GPU space
# (torch.compile knob, no mask=elide), warm-started from the shipped table.
# Needs AUTOTUNE_COMMIT; studies.db comes back through $OUT.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/device -k "not shipped" 2>&1 \
  | tee "$OUT/device_tests.log" | tail -8
timeout 100 python3 -m autotune bench --table tables/h200.py --cases 2 --hot-path 2>&1 \
  | tee "$OUT/bench_case2_hot.log" | tail -6
timeout 60 python3 scripts/host_profile.py --case 2 2>&1 | tee "$OUT/host_profile_case2.log" \
  | head -32
timeout -s INT "${STUDY_WALL:-400}" python3 -m autotune study --gpu h200 --cases "${CASES:-1-13}" \
  --warm-start tables/h200.py --n-trials "${TRIALS:-40}" --timeout "${BUDGET:-280}" 2>&1 \
  | tee "$OUT/study.log" | tail -20
cp studies.db "$OUT/studies.db"
