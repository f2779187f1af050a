#!/usr/bin/env bash
# Issue 17 on the H200, session 10: the one-launch layer (fused_layer=seq, kernels/layer.py)
# on the device, then compared per case with the plan tables/h200.py ships, every plan gated
# (5 + 5 padded seeds) and timed interleaved with the reference in one process per group of
# cases (autotune compare, kernels per forward); 128-row tiles in processes of their own (a
# miscompiled tile can fault the device: it ends only its process). Then where the device
# time of the shipped plans of cases 6, 8 and 13 goes, per kernel. One log, $OUT/s10_seq.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s10_seq.log"
step "kernels check"
timeout 100 python3 -m autotune kernels check 2>&1 | tee "$OUT/kernels_check.log" \
  | grep -E "layer/|passed" | tee -a "$LOG"
base='"attention":"triton","attn_precision":"fp16","gemm_precision":"fp16","cuda_graph":true'
seq() {  # block_m warps stages
  echo "{$base,\"fused_layer\":\"seq\",\"attn_block_m\":$1,\"attn_warps\":$2,\"attn_stages\":$3}"
}
rows() {  # block_m block_n warps stages row_block row_warps
  echo "{$base,\"fused_layer\":\"rows\",\"attn_block_m\":$1,\"attn_block_n\":$2,\"attn_warps\":$3,\"attn_stages\":$4,\"row_block\":$5,\"row_warps\":$6}"
}
run() {  # name cases deadline plans...
  local name=$1 cases=$2 deadline=$3; shift 3
  [ "$SECONDS" -lt "$deadline" ] || { step "deadline: $name skipped"; return; }
  step "compare $name (cases $cases)"
  local args=(); for p in "$@"; do args+=(--plan "$p"); done
  timeout 150 python3 -m autotune compare --gpu h200 --cases "$cases" --table tables/h200.py \
    "${args[@]}" --json "$OUT/compare_$name.json" 2>&1 | grep -v -i warn | tee -a "$LOG"
}
run c6 6 200 "$(seq 64 4 1)" "$(seq 64 8 1)" "$(seq 32 4 1)"
run c6_128 6 260 "$(seq 128 8 1)" "$(seq 128 16 1)"
run mid 1,5,9,10,11 330 "$(seq 64 4 1)" "$(seq 64 8 1)" "$(rows 64 64 4 2 64 4)"
run small 2,3,4,7,12 390 "$(seq 16 4 1)" "$(seq 32 4 1)" "$(seq 32 8 1)"
run mid_128 1,5,9,10,11 440 "$(seq 128 8 1)" "$(seq 128 16 1)"
[ "$SECONDS" -lt 500 ] && {
  step "kernel profiles: the shipped plans of cases 6, 8, 13"
  for c in 6 8 13; do
    plan=$(python3 -c "import json, sys; sys.path.insert(0, 'tables'); import h200; print(json.dumps([e for e in h200.ENTRIES.values() if e['case'] == '$c'][0]['plan']))")
    [ -n "$plan" ] && timeout 60 python3 scripts/kernel_profile.py --case "$c" "$plan" 2>&1 | grep -v -i warn | tee -a "$LOG"
  done
}
step "done"
