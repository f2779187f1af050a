#!/usr/bin/env bash
# Session 10's last device minutes (the studies call was taken back mid-run): the plans of
# scripts/h200_s10_studies.sh for cases 8, 9 and 11 beside the shipped ones in one process
# per group (autotune compare: gate 5 + 5 padded seeds, interleaved timing, kernel counts),
# then the guard on case 14 with every score doubled if time is left. At most 200 s.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s10_short.log"
P=docs/plans
step "compare case 8"
timeout 60 python3 -m autotune compare --gpu h200 --cases 8 --table tables/h200.py \
  --plan @$P/c8_cudnn_fp16_fused_ln.json --plan @$P/c8_triton_fp16_fused_ln.json \
  --json "$OUT/compare_c8.json" 2>&1 | grep -v -i warn | tee -a "$LOG"
step "compare cases 9, 11"
timeout 70 python3 -m autotune compare --gpu h200 --cases 9,11 --table tables/h200.py \
  --plan @$P/rows_64_64_w4_s2_r64_w4.json --plan @$P/rows_128_64_w8_s2_r64_w4.json \
  --json "$OUT/compare_c9_c11.json" 2>&1 | grep -v -i warn | tee -a "$LOG"
left=$(( 195 - SECONDS ))
if [ "$left" -gt 55 ]; then
  step "case 14 polynomial, scores x2"
  timeout "$left" python3 -m autotune long --case 14 --seeds 1 --score-scale 2 \
    --route h200=@$P/c14_poly_row.json --out "$OUT/case14_scores_2.json" 2>&1 \
    | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -3
fi
step "done"
