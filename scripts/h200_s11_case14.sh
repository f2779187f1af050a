#!/usr/bin/env bash
# Issue 18, planned in session 10, at most 9.5 minutes, one log ($OUT/s11_case14.log):
# the row-normalised polynomial route with the guard at 2.25 (docs/plans/c14_poly_row_g225.json;
# session 10 found the 4.0 guard unsafe with doubled scores) on the 5 official seeds beside
# cuDNN exact (one oracle output per seed judges both) -> $OUT/case14_g225.json; then with
# every score scaled by 1.5 and by 2 (one seed each): the guard should send those chunks to
# exact attention and the output must pass -> $OUT/case14_g225_scores_*.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s11_case14.log"
P=docs/plans
step "case 14: guard 2.25 and cuDNN exact, 5 official seeds"
timeout 330 python3 -m autotune long --case 14 --seeds 5 --route h200=@$P/c14_poly_row_g225.json \
  --route h200=@$P/c14_exact_cudnn.json --out "$OUT/case14_g225.json" 2>&1 \
  | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -3
for scale in 2 1.5; do
  left=$(( 560 - SECONDS ))
  [ "$left" -gt 70 ] || { step "no time left for scores x$scale"; continue; }
  step "case 14 guard 2.25, scores x$scale"
  timeout "$(( left < 100 ? left : 100 ))" python3 -m autotune long --case 14 --seeds 1 \
    --score-scale "$scale" --route h200=@$P/c14_poly_row_g225.json \
    --out "$OUT/case14_g225_scores_$scale.json" 2>&1 | grep -v -i warn | grep -v "guard paths" \
    | tee -a "$LOG" | tail -2
done
step "done"
