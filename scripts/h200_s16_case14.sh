#!/usr/bin/env bash
# Issues 18 and 19, planned in session 15, at most 9 minutes, log $OUT/s16_case14.log.
# Session 15 measured case 14 with the layer's elementwise work in Triton (residual add +
# LayerNorm, bias + GELU epilogue) on the 5 official seeds: 0.893 s a forward guarded
# (842c8b74057e), 3.142 s exact (90b7239af1ef), 0 failed (docs/logs/h200_s15_case14c.json).
# The long space searches those knobs now (new hash) and enqueues both plans first. Here:
# - the case-14 study at the new hash, 4 trials (~60 s);
# - export case 14 with that record -> $OUT/h200.py: the study's winner is the 0.893 s
#   plan, whose whole-batch evidence is in the record (nothing re-run);
# - the guard on that plan with every score doubled (seed 1234): every call must go exact
#   and pass (issue 18, part 2);
# - `autotune validate` of tables/rtx5080.py's case 14 against the streamed oracle, 5 seeds,
#   emulated under the 16 GiB cap (issue 19: the last entry validate had skipped).
# Returned: s16_case14.log, studies.db, h200.py, case14_s16_scores2.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s16_case14.log"
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
P=docs/plans
quiet() { grep -v -i warn | grep -v "guard paths" | grep -v RetryHeartbeat; }
step "case-14 study at the long space's new hash, 4 trials"
timeout -s INT 120 python3 -m autotune study --gpu h200 --cases 14 --n-trials 4 --storage "$DB" \
  --quiet 2>&1 | quiet | tee -a "$LOG" | tail -3
step "export case 14 with session 15's record"
timeout 200 python3 -m autotune export --gpu h200 --storage "$DB" --out "$OUT/h200.py" --cases 14 \
  --finalists 3 --anchors none --verified docs/logs/h200_s15_case14c.json 2>&1 | quiet | tee -a "$LOG" | tail -5
step "the guard with every score doubled, seed 1234"
timeout 100 python3 -m autotune long --case 14 --seeds 1 --score-scale 2 \
  --route h200=@$P/c14_poly_row_g225_b4_sf_flat3_ln.json --out "$OUT/case14_s16_scores2.json" \
  2>&1 | quiet | tee -a "$LOG" | tail -2
left=$(( 565 - SECONDS ))
step "validate tables/rtx5080.py case 14 against the oracle ($left s left)"
[ "$left" -gt 240 ] && timeout "$left" python3 -m autotune validate --table tables/rtx5080.py \
  --gpu rtx5080 --emulate --cases 14 2>&1 | quiet | tee -a "$LOG" | tail -4
step "done"
