#!/usr/bin/env bash
# Session 6, fourth call (run as one command line): case 6 in the new space (3 trials), its
# export with the reduce-overhead anchor, and its bench with the hot path.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
timeout -s INT 80 python3 -m autotune study --gpu h200 --cases 6 --n-trials 3 --timeout 70 --quiet \
  2>&1 | grep -v -i warn | tee "$OUT/case6_study.log" | tail -3
cp studies.db "$OUT/"
timeout 90 python3 -m autotune export --gpu h200 --finalists 2 --anchors sdpa+reduce-overhead \
  --cases 6 2>&1 | grep -v -i warn | tee "$OUT/case6_export.log" | tail -3
cp tables/h200.py "$OUT/"
timeout 70 python3 -m autotune bench --table tables/h200.py --cases 6 --anchors sdpa+reduce-overhead \
  --hot-path --csv "$OUT/bench6.csv" 2>&1 | grep -v -i warn | tee "$OUT/case6_bench.log" | tail -4
