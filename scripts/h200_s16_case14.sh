#!/usr/bin/env bash
# Issue 18, planned in session 15, at most 9 minutes, log $OUT/s16_case14.log.
# Session 15 measured case 14 with the layer's elementwise work in Triton (residual add +
# LayerNorm, bias + GELU epilogue) on the 5 official seeds: 0.893 s a forward guarded
# (842c8b74057e), 3.142 s exact (90b7239af1ef), 0 failed (docs/logs/h200_s15_case14c.json,
# at e97753f). Since b45b7e6 the first LayerNorm goes through the Triton kernel too (no torch
# LayerNorm and cast before the first GEMM), so the evidence is measured again here:
# - `autotune long` of both plans on the 5 official seeds -> $OUT/case14_s16.json.
#   Prediction: guarded ~0.88 s, exact ~3.13 s (1.8 ms a four-sequence chunk less);
# - the case-14 study at the long space's new hash (d19148d), 4 trials, both plans enqueued;
# - export case 14 with that record -> $OUT/h200.py (the winner's evidence is in it);
# - the guard on the guarded plan with every score doubled (seed 1234): every call must go
#   exact and pass (issue 18, part 2).
# Returned: s16_case14.log, case14_s16.json, case14_s16_scores2.json, studies.db, h200.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s16_case14.log"
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
P=docs/plans
quiet() { grep -v -i warn | grep -v "guard paths" | grep -v RetryHeartbeat; }
step "case 14: guarded and exact with the Triton LayerNorm and GELU, 5 official seeds"
timeout 300 python3 -m autotune long --case 14 --seeds 5 \
  --route h200=@$P/c14_poly_row_g225_b4_sf_flat3_ln.json --route h200=@$P/c14_exact_cudnn_b4_ln.json \
  --out "$OUT/case14_s16.json" 2>&1 | quiet | tee -a "$LOG" | tail -4
step "case-14 study at the long space's new hash, 4 trials"
timeout -s INT 100 python3 -m autotune study --gpu h200 --cases 14 --n-trials 4 --storage "$DB" \
  --quiet 2>&1 | quiet | tee -a "$LOG" | tail -3
left=$(( 490 - SECONDS ))
step "export case 14 with this record ($left s left)"
[ "$left" -gt 60 ] && timeout "$left" python3 -m autotune export --gpu h200 --storage "$DB" \
  --out "$OUT/h200.py" --cases 14 --finalists 3 --anchors none --verified "$OUT/case14_s16.json" \
  2>&1 | quiet | tee -a "$LOG" | tail -5
left=$(( 565 - SECONDS ))
step "the guard with every score doubled, seed 1234 ($left s left)"
[ "$left" -gt 55 ] && timeout "$left" python3 -m autotune long --case 14 --seeds 1 --score-scale 2 \
  --route h200=@$P/c14_poly_row_g225_b4_sf_flat3_ln.json --out "$OUT/case14_s16_scores2.json" \
  2>&1 | quiet | tee -a "$LOG" | tail -2
step "done"
