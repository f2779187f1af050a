#!/usr/bin/env bash
# Session 12, third call, TOTAL seconds (default 430; later steps skipped when short), log
# $OUT/s12_third.log. In this order:
# - Issue 18: case 14 exported with the second call's 5-seed record
#   (docs/logs/h200_s12_case14.json: 1.401 / 1.421 / 1.523 s at 4 / 2 / 1 sequences a
#   chunk); the export now takes batch_chunk, which the study's one-sequence subset cannot
#   rank, from that record (prediction: the 4-sequence plan ships, 1.40 s).
# - Issue 17: row_stage is a knob of the GPU space now (the first call: case 6's post rows
#   5.52 -> 4.93 ms, case 13 0.940 -> 0.902 ms of GPU time). New studies of cases 6 and 13
#   at the new space hash, the staged plans first (32 FFN columns too), each exported
#   beside the reduce-overhead anchor, the shipped plan re-measured as the incumbent. Prediction: case 6 ~11.2 ms, case 13 ~0.91 ms.
# - Before those: case 6's staged plan at 64 (default) and 32 FFN columns a step
#   (row_ffn_block, new), profiled, and the registers and spills at 32 (with row_stage post
#   rows still spills 14-22 a thread at 255 registers). Prediction: 32 columns, no spills,
#   post rows ~4.5 ms.
# - Case 14's 4-sequence plan profiled on its first 4 sequences (one chunk): which kernels
#   its 1.4 s goes to (about 175 ms for these 4 sequences).
# Returned: s12_third.log, studies.db, h200.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s12_third.log"
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
P=docs/plans
TOTAL=${TOTAL:-430}  # seconds this call may take; later steps are skipped when short
left() { echo $(( TOTAL - SECONDS )); }
step "export case 14"
timeout 100 python3 -m autotune export --gpu h200 --storage "$DB" --out "$OUT/h200.py" \
  --cases 14 --finalists 3 --anchors none --verified docs/logs/h200_s12_case14.json 2>&1 \
  | grep -v -i warn | grep -v "guard paths" | grep -v "retry =" | tee -a "$LOG" | tail -4
step "case 6, staged, at 64 / 32 FFN columns a step"
stage=$(cat $P/rows_64_64_w4_s2_r64_w4_stage.json)
for f in 0 32; do
  timeout 40 python3 scripts/kernel_profile.py --forwards 5 --case 6 \
    "${stage%\}},\"row_ffn_block\":$f}" 2>&1 | grep -v -i warn | tee -a "$LOG"
done
timeout 40 python3 scripts/kernel_regs.py --case 6 @$P/rows_64_64_w4_s2_r64_w4_stage_f32.json \
  2>&1 | grep -v -i warn | grep -v "  0 *0 *0$" | tee -a "$LOG"
step "case 14, first 4 sequences, the 4-sequence guard plan: where the time goes"
timeout 60 python3 scripts/kernel_profile.py --case 14 --batch 4 --warmup 1 --forwards 2 \
  @$P/c14_poly_row_g225_b4.json 2>&1 | grep -v -i warn | tee -a "$LOG"
study_export() {  # case seconds-for-the-study warm
  [ "$(left)" -gt $(( $2 + 90 )) ] || { step "case $1 skipped ($(left) s left)"; return; }
  step "study case $1 (to 3 trials, warm $3)"
  timeout -s INT "$2" python3 -m autotune study --gpu h200 --cases "$1" --n-trials 3 \
    --warm-start "$3" --storage "$DB" --quiet 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -3
  step "export case $1 ($(left) s left)"
  timeout "$(left)" python3 -m autotune export --gpu h200 --storage "$DB" --out "$OUT/h200.py" \
    --cases "$1" --finalists 2 --anchors sdpa+reduce-overhead 2>&1 | grep -v -i warn \
    | grep -v "retry =" | tee -a "$LOG" | tail -6
}
study_export 6 100 "@$P/rows_64_64_w4_s2_r64_w4_stage.json,@$P/rows_64_64_w4_s2_r64_w4_stage_f32.json"
study_export 13 60 "@$P/c13_rows_bounds_stage.json,@$P/c13_rows_bounds_stage_f32.json"
step "done"
