#!/usr/bin/env bash
# The next session's first device call (planned at the end of session 9), at most 9.5 min,
# one log ($OUT/s10.log), records rewritten after every seed:
# (1) issue 18, 5 official seeds against one oracle output per seed: the per-layer Triton
#     attention with key-mask bounds (new in session 9) beside cuDNN (3.23 s in session 9)
#     and the row-normalised polynomial route (1.49 s), all in one process
#     -> $OUT/case14_exact.json (the Triton route without bounds ran 8.17 s in session 9);
# (2) issue 18, the row-normalised polynomial route on inputs scaled by 2 and by 4 (one
#     seed each, at most 2 if time allows) -> $OUT/case14_scaled_2.json, _4.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s10.log"
step "case 14 routes (exact and guarded)"
timeout "${EXACT_TIMEOUT:-380}" python3 -m autotune long --case 14 --seeds 5 \
  --route h200=@docs/plans/c14_exact_triton_bounds.json \
  --route h200=@docs/plans/c14_exact_cudnn.json \
  --route h200=@docs/plans/c14_poly_row.json \
  --out "$OUT/case14_exact.json" 2>&1 | grep -v -i warn | grep -v "guard paths" \
  | tee -a "$LOG" | tail -4
for scale in 2 4; do
  left=$(( 560 - SECONDS ))
  [ "$left" -gt 60 ] || { step "no time left for scale $scale"; continue; }
  step "case 14 polynomial, inputs x$scale"
  timeout "$(( left < 110 ? left : 110 ))" python3 -m autotune long --case 14 --seeds 1 \
    --input-scale "$scale" --route h200=@docs/plans/c14_poly_row.json \
    --out "$OUT/case14_scaled_$scale.json" 2>&1 | grep -v -i warn | grep -v "guard paths" \
    | tee -a "$LOG" | tail -2
done
step "done"
