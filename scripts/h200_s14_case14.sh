#!/usr/bin/env bash
# Issue 18, planned in session 13, at most 9.5 minutes, log $OUT/s14_case14.log.
# Session 13 measured case 14's output kernel at 9.54 ms a sequence with 54 spilled
# registers a thread, and 3.25 ms with the row statistics first, 32 keys a step and 3
# stages (scripts/poly_tiles.py, docs/logs/h200_s13_poly*.log). Prediction: the 1.401 s
# forward (table version 34) falls to ~1.0 s (the output kernel was 43% of it).
# - `autotune long` on the 5 official seeds: the table's plan (batch_chunk 4) and the same
#   with the output-kernel knobs, against one oracle output per seed -> $OUT/case14_s14.json;
# - the case-14 study at the long space's new hash, 4 trials (the new plan enqueued first);
# - export of case 14 with that record as evidence -> $OUT/h200.py.
# Returned: s14_case14.log, case14_s14.json, studies.db, h200.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s14_case14.log"
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
P=docs/plans
step "case 14: the table's plan and the output-kernel knobs, 5 official seeds"
timeout 330 python3 -m autotune long --case 14 --seeds 5 --route h200=@$P/c14_poly_row_g225_b4.json \
  --route h200=@$P/c14_poly_row_g225_b4_sf.json \
  --out "$OUT/case14_s14.json" 2>&1 | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -4
step "case-14 study, 4 trials"
timeout -s INT 100 python3 -m autotune study --gpu h200 --cases 14 --n-trials 4 \
  --warm-start "@$P/c14_poly_row_g225_b4_sf.json" --storage "$DB" \
  --quiet 2>&1 | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -3
left=$(( 560 - SECONDS ))
step "export case 14 ($left s left)"
[ "$left" -gt 60 ] && timeout "$left" python3 -m autotune export --gpu h200 --storage "$DB" \
  --out "$OUT/h200.py" --cases 14 --finalists 3 --anchors none --verified "$OUT/case14_s14.json" \
  2>&1 | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -6
step "done"
