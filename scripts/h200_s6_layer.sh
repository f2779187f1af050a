#!/usr/bin/env bash
# Issue 17 on the H200, session 6, first call: the fused layers for any batch
# (kernels/layer.py, knob fused_layer) checked on the device, then compared per case with
# the plan tables/h200.py ships, all timed interleaved with the reference in one process
# per group of cases (autotune compare: gate on 5 + 5 padded seeds, kernels per forward).
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
timeout 120 python3 -m autotune kernels check 2>&1 | tee "$OUT/kernels_check.log" | grep -E "layer/|passed"
base='"attention":"triton","attn_precision":"fp16","gemm_precision":"fp16","cuda_graph":true'
plan() {  # variant block_m block_n warps stages row_block row_warps
  echo "{$base,\"fused_layer\":\"$1\",\"attn_block_m\":$2,\"attn_block_n\":$3,\"attn_warps\":$4,\"attn_stages\":$5,\"row_block\":$6,\"row_warps\":$7}"
}
run() {  # cases deadline plans...
  local cases=$1 deadline=$2; shift 2
  [ "$SECONDS" -lt "$deadline" ] || { echo "compare: deadline before cases $cases" | tee -a "$OUT/compare.log"; return; }
  local args=(); for p in "$@"; do args+=(--plan "$p"); done
  timeout 150 python3 -m autotune compare --gpu h200 --cases "$cases" --table tables/h200.py \
    "${args[@]}" --json "$OUT/compare_${cases//,/_}.json" 2>&1 | grep -v -i warn | tee -a "$OUT/compare.log"
}
run 2,3,4,7,12 300 "$(plan heads 16 16 4 1 16 4)" "$(plan heads 32 32 4 2 16 4)" "$(plan heads 64 64 4 2 32 4)"
run 1,5,9,10,11 380 "$(plan heads 32 32 4 2 32 4)" "$(plan heads 64 64 4 2 64 4)" "$(plan heads 64 32 8 2 64 8)"
run 6 440 "$(plan heads 64 64 4 2 64 4)" "$(plan heads 128 64 8 2 128 8)" "$(plan rows 64 64 4 2 64 4)"
run 13 500 "$(plan rows 64 64 4 2 64 4)" "$(plan rows 128 64 8 2 64 4)" "$(plan rows 64 32 4 3 32 4)"
