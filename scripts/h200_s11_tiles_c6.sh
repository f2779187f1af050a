#!/usr/bin/env bash
# Session 11, last call (issue 17): case 6's fused rows plan with other row tiles and warps,
# and 128-row attention tiles, each profiled in its own process (a fault ends one plan
# only): which of the three kernels moves with the tiles. $OUT/s11_tiles_c6.log.
source scripts/device_prelude.sh
LOG="$OUT/s11_tiles_c6.log"
base='"attention":"triton","attn_precision":"fp16","cuda_graph":true,"fused_layer":"rows","gemm_precision":"fp16"'
for extra in '"row_block":64,"row_warps":4' '"row_block":128,"row_warps":8' \
  '"row_block":32,"row_warps":4' '"row_block":64,"row_warps":8' '"row_block":128,"row_warps":4' \
  '"row_block":64,"row_warps":4,"attn_block_m":128,"attn_warps":8'; do
  [ "$SECONDS" -gt 150 ] && { echo "out of time before {$extra}" | tee -a "$LOG"; break; }
  timeout 40 python3 scripts/kernel_profile.py --forwards 5 --case 6 "{$base,$extra}" 2>&1 \
    | grep -v -i warn | tee -a "$LOG"
done
