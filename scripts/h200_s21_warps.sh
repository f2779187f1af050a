#!/usr/bin/env bash
# Issue 17, session 21, second call. Nsight Compute in the first call (docs/logs/s21/,
# ncu_c2_*.txt) found case 2's fused-layer kernels bound by instruction latency, not by
# memory: the heads kernel runs 16 programs of 4 warps (one warp a scheduler) issuing one
# instruction every 4.3 cycles, 4,545 instructions a warp, 255 registers; the post rows
# kernel 8 programs, one every 5.9 cycles, 2,365 a warp, 148 registers. 116-124 of 132 SMs idle.
# So more warps a program should help directly: each warp's share of the element-wise work
# (LayerNorms, GELU, softmax, casts) halves and each scheduler gets a second warp to issue
# from. The studies have barely tried it (case 2's studies: 27 trials over four spaces).
# Prediction, written before the run: on case 2, attn_warps 8 takes the heads kernel from
# ~8.5 to ~5.5-6.5 us a launch and row_warps 8 the post rows from ~6.4 to ~4.5-5.5, so
# both together 60-69 us -> 48-55 us a forward; the same direction on cases 3, 4, 12 and 7
# (programs a kernel: 4-256); the chained rows variant (3 kernels -> 2 a layer plus 1,
# every program smaller) within +-10% of the best heads plan.
# Per case, one `autotune compare` process: the table's entry, the entry with 8 warps in
# each kernel and in both, and the chained rows form with 16-row tiles and 8 row warps.
# Then case 2's kernel profiles of the entry, both kernels at 8 warps and the chained rows form.
# About 3-4 minutes. Returned: s21_warps.log, compare_s21_warps_c<case>.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s21_warps.log"
CASES=${CASES:-2 12 7 3 4}
rm -f /tmp/s21_*.json
python3 scripts/s21_warp_plans.py /tmp $CASES 2>&1 | tee -a "$LOG" || { echo "plans not written: stop" | tee -a "$LOG"; exit 1; }
for c in $CASES; do
  plans=()
  for f in /tmp/s21_c${c}_*.json; do plans+=(--plan "@$f"); done
  [ ${#plans[@]} -gt 0 ] || { echo "no plans for case $c: stop" | tee -a "$LOG"; exit 1; }
  step "case $c: $(( ${#plans[@]} / 2 )) plans"
  timeout 150 python3 -m autotune compare --gpu h200 --cases "$c" "${plans[@]}" \
    --json "$OUT/compare_s21_warps_c$c.json" 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -7
done
step "case 2 kernel profiles: the entry and 8 warps in both kernels"
timeout 90 python3 scripts/kernel_profile.py --case 2 @/tmp/s21_c2_entry.json @/tmp/s21_c2_aw8rw8.json \
  @/tmp/s21_c2_rows_chain.json 2>&1 | grep -v -i warn | tee -a "$LOG"
step "done"
