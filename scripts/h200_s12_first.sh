#!/usr/bin/env bash
# Issue 17, first call of session 12 (planned in session 11), at most 9 minutes, log
# $OUT/s12_first.log:
# - `autotune kernels check` on the device (43 checks: the staged post-rows kernel's two
#   new ones among them);
# - case 6's shipped plan against it with row_stage (x + attention kept in memory during
#   the FFN), each profiled in its own process (prediction, docs/kernels_h200.md: post rows
#   toward ~0.7 ms a layer, case 6 ~9.2 ms, if register pressure is the cause); without a
#   graph (no 312 us input copy; 13 launches of host time instead); and the one-launch
#   seq layer with 32-row tiles (never measured at case 6: the 64-row plan faulted first);
# - registers and spills of case 6's kernels (scripts/kernel_regs.py), both variants;
# - case 11 exported again now that finalists are ranked by absolute time (session 11's
#   export never re-measured the 64/64 rows plan its study timed at 0.204 ms against the
#   shipped 0.275 ms), and benched beside the reduce-overhead anchor;
# - before that, profiles of cases 13 and 2 with and without row_stage, and of case 8's
#   Triton and cuDNN fp16 plans (1.359 / 1.379 ms at export: where their 42+ kernels go).
# Returned: s12_first.log, h200.py, bench_s12_c11.csv.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s12_first.log"
cp tables/h200.py "$OUT/h200.py"
step "kernels check"
timeout 180 python3 -m autotune kernels check 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -4
step "case 6: shipped plan, then with row_stage"
base='"attention":"triton","attn_precision":"fp16","cuda_graph":true,"fused_layer":"rows","gemm_precision":"fp16","row_block":64'
for extra in '' ',"row_stage":true' ',"row_stage":true,"row_block":128,"row_warps":8' \
  ',"cuda_graph":false' ',"fused_layer":"seq","attn_block_m":32,"attn_warps":4' \
  ',"fused_layer":"seq","attn_block_m":32,"attn_warps":8'; do
  timeout 45 python3 scripts/kernel_profile.py --forwards 5 --case 6 "{$base$extra}" 2>&1 \
    | grep -v -i warn | tee -a "$LOG"
done
step "case 6: registers and spills of the row kernels, with and without row_stage"
for extra in '' ',"row_stage":true'; do
  timeout 40 python3 scripts/kernel_regs.py --case 6 "{$base$extra}" 2>&1 | grep -v -i warn \
    | grep -v "  0 *0 *0$" | tee -a "$LOG"
done
step "cases 13 and 2 (their post-rows kernels), with and without row_stage; case 8's two fp16 plans"
c13='"attention":"triton","attn_precision":"fp16","cuda_graph":true,"fused_layer":"rows","gemm_precision":"fp16","mask_bounds":true,"row_block":64'
c2='"attention":"triton","attn_block_m":32,"attn_block_n":128,"attn_precision":"fp16","attn_stages":1,"cuda_graph":true,"fused_layer":"heads","gemm_precision":"fp16","row_block":16'
for spec in "13 {$c13}" "13 {$c13,\"row_stage\":true}" "2 {$c2}" "2 {$c2,\"row_stage\":true}" \
  "8 @docs/plans/c8_triton_fp16_fused_ln.json" "8 @docs/plans/c8_cudnn_fp16_fused_ln.json"; do
  timeout 45 python3 scripts/kernel_profile.py --forwards 10 --case ${spec%% *} "${spec#* }" 2>&1 \
    | grep -v -i warn | tee -a "$LOG"
done
step "export case 11"
timeout 120 python3 -m autotune export --gpu h200 --out "$OUT/h200.py" --cases 11 --finalists 3 \
  --anchors sdpa+reduce-overhead 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -4
left=$(( 520 - SECONDS ))
[ "$left" -gt 40 ] && timeout "$left" python3 -m autotune bench --gpu h200 --table "$OUT/h200.py" \
  --cases 11 --anchors sdpa+reduce-overhead --hot-path --csv "$OUT/bench_s12_c11.csv" 2>&1 \
  | grep -v -i warn | tee -a "$LOG" | tail -6
step "done"
