#!/usr/bin/env bash
# Session 10's last device minutes (the studies call was taken back mid-run), at most
# ~200 s: (1) issue 18, the guard on case 14 with every attention score doubled
# (--score-scale 2, seed 1234, the row-normalised polynomial route): does it send the
# chunks to exact attention, and is the output right? (2) if time is left, the plans of
# scripts/h200_s10_studies.sh for case 8, then cases 9 and 11, beside the shipped ones in
# one process per group (autotune compare: gate 5 + 5 padded seeds, interleaved timing).
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s10_short.log"
P=docs/plans
DEADLINE=${DEADLINE:-190}
step "case 14 polynomial, scores x2"
timeout 100 python3 -m autotune long --case 14 --seeds 1 --score-scale 2 \
  --route h200=@$P/c14_poly_row.json --out "$OUT/case14_scores_2.json" 2>&1 \
  | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -3
compare() {  # name cases plans...
  local name=$1 cases=$2; shift 2
  local left=$(( DEADLINE - SECONDS ))
  [ "$left" -gt 30 ] || { step "no time left for $name"; return; }
  step "compare $name"
  local args=(); for p in "$@"; do args+=(--plan "@$P/$p"); done
  timeout "$left" python3 -m autotune compare --gpu h200 --cases "$cases" \
    --table tables/h200.py "${args[@]}" --json "$OUT/compare_$name.json" 2>&1 \
    | grep -v -i warn | tee -a "$LOG"
}
compare c8 8 c8_cudnn_fp16_fused_ln.json c8_triton_fp16_fused_ln.json
compare c9_c11 9,11 rows_64_64_w4_s2_r64_w4.json rows_128_64_w8_s2_r64_w4.json
step "done"
