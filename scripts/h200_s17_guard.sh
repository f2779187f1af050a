#!/usr/bin/env bash
# Issue 18, planned in session 16, about 2 minutes, log $OUT/s17_guard.log.
# Since df0085d a call the guard refuses runs cuDNN's attention instead of the Triton
# kernel. Session 16 measured the shipped guarded plan with every score doubled (all 16
# calls exact) at 3.339 s a forward and the cuDNN exact route at 3.151 s
# (docs/logs/h200_s16_case14*.json). Here both, with scores doubled, against one oracle
# output (seed 1234). Prediction: the guarded plan ~3.17-3.20 s (the exact route plus the
# guard's sampling), 0 failed; the exact route unchanged (~3.15 s).
# Returned: s17_guard.log, case14_s17_scores2.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s17_guard.log"
P=docs/plans
step "case 14, scores x2: the guarded plan (exact path cuDNN) and the cuDNN exact route"
timeout 200 python3 -m autotune long --case 14 --seeds 1 --score-scale 2 \
  --route h200=@$P/c14_poly_row_g225_b4_sf_flat3_ln.json --route h200=@$P/c14_exact_cudnn_b4_ln.json \
  --out "$OUT/case14_s17_scores2.json" 2>&1 | grep -v -i warn | grep -v "guard paths" \
  | tee -a "$LOG" | tail -4
step "done"
