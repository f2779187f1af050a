#!/usr/bin/env bash
# Issue 17, session 16, at most 9 minutes, log $OUT/s16_tiles.log.
# Cases 6 and 13 run the fused `rows` layer (QKV rows, flash attention, post rows) with the
# tiles of session 12; their studies measured few tile variants (studies.db: 15 trials each
# at the current space hashes, 2-3 of them `rows` plans). Here each study resumes with the
# variants in docs/plans/s16_c13_*.json (attention tiles; row tile, warps, FFN step) and
# docs/plans/s16_c6_*.json (row tile, warps, FFN step; attention stages, key block) as
# warm-start plans, then TPE to its time limit; export re-measures the finalists beside
# the incumbent in one process and replaces it only beyond the noise.
# Prediction (written before the run): case 13's attention (101 us a layer, 46% of 0.886
# ms) gains 5-15% from 128-key blocks or 3 stages -> case 13 ~0.84-0.86 ms; case 6 within
# 3% of 10.54 ms (session 11 swept its row tiles: 64 rows, 4 warps was best).
# Returned: s16_tiles.log, studies.db, h200.py, bench_s16_tiles.csv.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s16_tiles.log"
TOTAL=${TOTAL:-560}
left() { echo $(( TOTAL - SECONDS )); }
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
quiet() { grep -v -i warn | grep -v "guard paths" | grep -v RetryHeartbeat | grep -v "retry ="; }
plans() { ls docs/plans/s16_c"$1"_*.json | sed 's/^/@/' | paste -sd, -; }
step "case 13 study: $(ls docs/plans/s16_c13_*.json | wc -l) warm-start variants, then TPE"
timeout -s INT 140 python3 -m autotune study --gpu h200 --cases 13 --n-trials 40 --timeout 110 \
  --storage "$DB" --warm-start "$(plans 13)" --quiet 2>&1 | quiet | tee -a "$LOG" | tail -3
step "case 6 study: $(ls docs/plans/s16_c6_*.json | wc -l) warm-start variants, then TPE ($(left) s left)"
timeout -s INT 170 python3 -m autotune study --gpu h200 --cases 6 --n-trials 40 --timeout 130 \
  --storage "$DB" --warm-start "$(plans 6)" --quiet 2>&1 | quiet | tee -a "$LOG" | tail -3
step "export cases 13 and 6 ($(left) s left)"
[ "$(left)" -gt 90 ] && timeout "$(( $(left) - 80 ))" python3 -m autotune export --gpu h200 \
  --storage "$DB" --out "$OUT/h200.py" --cases 13,6 --finalists 2 --anchors none 2>&1 | quiet \
  | tee -a "$LOG" | tail -8
step "bench cases 13 and 6 beside the reduce-overhead anchor ($(left) s left)"
[ "$(left)" -gt 50 ] && timeout "$(( $(left) - 5 ))" python3 -m autotune bench --gpu h200 \
  --table "$OUT/h200.py" --cases 13,6 --anchors sdpa+reduce-overhead --hot-path \
  --csv "$OUT/bench_s16_tiles.csv" 2>&1 | quiet | tee -a "$LOG" | tail -8
step "done"
