#!/usr/bin/env bash
# Issue 18, planned in session 14, at most 9.5 minutes, log $OUT/s15_case14.log.
# Session 14 measured the new output kernel on the 5 seeds: 1.033 s a forward at four
# sequences a chunk (docs/logs/h200_s14_case14.json), but the export shipped the one-sequence
# variant (1.124 s, tables/h200.py version 35): the record did not hold the winner itself, so
# batch_chunk could not be taken from it. Here:
# - `autotune long` on the 5 official seeds: the table's plan (one sequence), four sequences,
#   and both with the prefix scan as one flat loop with 3 stages (8.14 against 8.72 ms a
#   sequence, scripts/poly_tiles.py) -> $OUT/case14_s15.json. Prediction: four sequences with
#   the flat prefix ~0.99 s (1.033 - 2 layers x 32 sequences x 0.58 ms);
# - the case-14 study at the long space's new hash, 4 trials, the flat plans enqueued;
# - export of case 14 with that record -> $OUT/h200.py (batch_chunk from the record now that
#   the winner's one-sequence form is in it).
# Returned: s15_case14.log, case14_s15.json, studies.db, h200.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s15_case14.log"
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
P=docs/plans
step "case 14: the table's plan, four sequences, and both with the flat prefix, 5 official seeds"
timeout 330 python3 -m autotune long --case 14 --seeds 5 --route h200=@$P/c14_poly_row_g225_sf.json \
  --route h200=@$P/c14_poly_row_g225_b4_sf.json --route h200=@$P/c14_poly_row_g225_sf_flat3.json \
  --route h200=@$P/c14_poly_row_g225_b4_sf_flat3.json \
  --out "$OUT/case14_s15.json" 2>&1 | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -6
step "case-14 study, 4 trials"
timeout -s INT 100 python3 -m autotune study --gpu h200 --cases 14 --n-trials 4 \
  --warm-start "@$P/c14_poly_row_g225_sf_flat3.json" --storage "$DB" \
  --quiet 2>&1 | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -3
left=$(( 560 - SECONDS ))
step "export case 14 ($left s left)"
[ "$left" -gt 60 ] && timeout "$left" python3 -m autotune export --gpu h200 --storage "$DB" \
  --out "$OUT/h200.py" --cases 14 --finalists 3 --anchors none --verified "$OUT/case14_s15.json" \
  2>&1 | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -6
step "done"
