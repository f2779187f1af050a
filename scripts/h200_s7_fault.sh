#!/usr/bin/env bash
# Session 7, second call: case 6 benched into the carried CSV (resumed), then the case-6
# "illegal memory access" of session 6 (four plans in one `autotune compare` process):
# every plan under compute-sanitizer's memcheck, eagerly, at B=16 (with the reference) and
# at case 6's B=10000, then the same compare again with CUDA_LAUNCH_BLOCKING=1.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
cp docs/results/h200/bench.csv "$OUT/bench.csv"
timeout 100 python3 -m autotune bench --table tables/h200.py --cases 6 \
  --anchors sdpa+reduce-overhead --hot-path --csv "$OUT/bench.csv" 2>&1 | grep -v -i warn \
  | tee -a "$OUT/bench.log" | tail -4
base='"attention":"triton","attn_precision":"fp16","gemm_precision":"fp16"'
block="{$base,\"fused_block\":true,\"attn_stages\":3,\"attn_warps\":8}"
heads64="{$base,\"fused_layer\":\"heads\",\"attn_block_m\":64,\"attn_block_n\":64,\"row_block\":64}"
heads128="{$base,\"fused_layer\":\"heads\",\"attn_block_m\":128,\"attn_block_n\":64,\"attn_warps\":8,\"row_block\":128,\"row_warps\":8}"
rows64="{$base,\"fused_layer\":\"rows\",\"attn_block_m\":64,\"attn_block_n\":64,\"row_block\":64}"
san="compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20"
for shape in 16,128,128,4,128,4 10000,128,128,4,128,4; do
  extra=(); [ "${shape%%,*}" = 16 ] || extra=(--no-reference)
  echo "== memcheck at $shape" | tee -a "$OUT/sanitizer.log"
  timeout 170 $san python3 scripts/sanitize_plans.py --shape "$shape" "${extra[@]}" \
    "$heads128" "$rows64" "$heads64" "$block" 2>&1 | tee -a "$OUT/sanitizer.log" | tail -25
  echo "-> exit $?" | tee -a "$OUT/sanitizer.log"
done
[ "$SECONDS" -lt 420 ] || exit 0
CUDA_LAUNCH_BLOCKING=1 timeout 150 python3 -m autotune compare --gpu h200 --cases 6 \
  --table tables/h200.py --plan "$block" --plan "$heads128" --plan "$rows64" 2>&1 \
  | grep -v -i warn | tee "$OUT/compare_case6.log" | tail -30
