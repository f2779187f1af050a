#!/usr/bin/env bash
# Session 12, third call, at most 9.5 minutes, log $OUT/s12_third.log.
# - Issue 18: case 14 exported with the second call's 5-seed record
#   (docs/logs/h200_s12_case14.json: 1.401 / 1.421 / 1.523 s at 4 / 2 / 1 sequences a
#   chunk); the export now takes batch_chunk, which the study's one-sequence subset cannot
#   rank, from that record (prediction: the 4-sequence plan ships, 1.40 s).
# - Issue 17: row_stage is a knob of the GPU space now (the first call: case 6's post rows
#   5.52 -> 4.93 ms, case 13 0.940 -> 0.902 ms of GPU time). New studies of cases 6 and 13
#   at the new space hash, the staged plan and the shipped one first, then both exported
#   beside the reduce-overhead anchor. Prediction: case 6 ~11.2 ms, case 13 ~0.91 ms.
# - Before those: case 6's staged plan at 64 (default) and 32 FFN columns a step
#   (row_ffn_block, new), profiled, and the registers and spills at 32 (with row_stage post
#   rows still spills 14-22 a thread at 255 registers). Prediction: 32 columns, no spills,
#   post rows ~4.5 ms.
# Returned: s12_third.log, studies.db, h200.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s12_third.log"
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
P=docs/plans
step "case 6, staged, at 64 / 32 FFN columns a step"
stage=$(cat $P/rows_64_64_w4_s2_r64_w4_stage.json)
for f in 0 32; do
  timeout 40 python3 scripts/kernel_profile.py --forwards 5 --case 6 \
    "${stage%\}},\"row_ffn_block\":$f}" 2>&1 | grep -v -i warn | tee -a "$LOG"
done
timeout 40 python3 scripts/kernel_regs.py --case 6 @$P/rows_64_64_w4_s2_r64_w4_stage_f32.json \
  2>&1 | grep -v -i warn | grep -v "  0 *0 *0$" | tee -a "$LOG"
study() {  # case n_trials seconds warm
  step "study case $1 (to $2 trials, warm $4)"
  timeout -s INT "$3" python3 -m autotune study --gpu h200 --cases "$1" --n-trials "$2" \
    --warm-start "$4" --storage "$DB" --quiet 2>&1 | grep -v -i warn | grep -v "guard paths" \
    | tee -a "$LOG" | tail -3
}
step "export case 14"
timeout 100 python3 -m autotune export --gpu h200 --storage "$DB" --out "$OUT/h200.py" \
  --cases 14 --finalists 3 --anchors none --verified docs/logs/h200_s12_case14.json 2>&1 \
  | grep -v -i warn | grep -v "guard paths" | grep -v "retry =" | tee -a "$LOG" | tail -4
study 6 3 100 "@$P/rows_64_64_w4_s2_r64_w4_stage.json,@$P/rows_64_64_w4_s2_r64_w4_stage_f32.json"
study 13 3 60 "@$P/c13_rows_bounds_stage.json,@$P/c13_rows_bounds_stage_f32.json"
left=$(( 430 - SECONDS ))
step "export cases 6 and 13 ($left s left)"
[ "$left" -gt 60 ] && timeout "$left" python3 -m autotune export --gpu h200 --storage "$DB" \
  --out "$OUT/h200.py" --cases 13,6 --finalists 2 --anchors sdpa+reduce-overhead 2>&1 \
  | grep -v -i warn | grep -v "retry =" | tee -a "$LOG" | tail -8
step "done"
