#!/usr/bin/env bash
# Issue 18, planned in session 11, at most 9.5 minutes, log $OUT/s12_case14.log.
# The guarded polynomial route spends most of its 1.5 s in the prefix-state scan, whose
# grid at one sequence a chunk is only B*H*37 = 592 programs on 132 SMs (kernels/polynomial.py:
# 11.5 of 16.6 ms a slice at 42 TFLOP/s). Two and four sequences a chunk double and
# quadruple the grid: prediction, the scan near 2x faster and the route ~1.1-1.2 s.
# - `autotune long` on the 5 official seeds: the 2.25-guard plan at batch_chunk 1, 2 and 4
#   against one oracle output per seed -> $OUT/case14_s12.json;
# - the case-14 study brought to 9 trials with the two new plans enqueued first;
# - export of case 14 with that record as evidence -> $OUT/h200.py.
# Returned: s12_case14.log, case14_s12.json, studies.db, h200.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s12_case14.log"
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
P=docs/plans
step "case 14: guard 2.25 at 1, 2 and 4 sequences a chunk, 5 official seeds"
timeout 330 python3 -m autotune long --case 14 --seeds 5 --route h200=@$P/c14_poly_row_g225.json \
  --route h200=@$P/c14_poly_row_g225_b2.json --route h200=@$P/c14_poly_row_g225_b4.json \
  --out "$OUT/case14_s12.json" 2>&1 | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -4
step "case-14 study to 9 trials"
timeout -s INT 100 python3 -m autotune study --gpu h200 --cases 14 --n-trials 9 \
  --warm-start "@$P/c14_poly_row_g225_b2.json,@$P/c14_poly_row_g225_b4.json" --storage "$DB" \
  --quiet 2>&1 | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -3
left=$(( 560 - SECONDS ))
step "export case 14 ($left s left)"
[ "$left" -gt 60 ] && timeout "$left" python3 -m autotune export --gpu h200 --storage "$DB" \
  --out "$OUT/h200.py" --cases 14 --finalists 3 --anchors none --verified "$OUT/case14_s12.json" \
  2>&1 | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -6
step "done"
