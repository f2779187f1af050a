#!/usr/bin/env bash
# Planned in session 36 (H200, about 4 minutes): issue 18's exact route. Session 36 measured
# 3.162 s a forward (batch chunks of 4) against 3.05 s of kernels summed from a profile of
# one chunk: about 0.11 s a forward is outside the kernels (gaps between them, the chunk
# loop, allocations). Fewer, larger chunks (8 or 16 sequences; peak memory about 41 and 58
# GiB, estimated from session 36's 32.9 at 4) cut the chunk boundaries.
# 1. kernel profile of 8 sequences at chunks of 4 and of 8: the kernels' sum, busy time and
#    wall time of the forward (scripts/kernel_profile.py: wall minus busy is idle);
# 2. `autotune long --case 14 --seeds 1` of the three chunk sizes against one oracle output.
# Returned: s37_case14.log, case14_s37_exact.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s37_case14.log"
P=docs/plans
step "case 14, exact cuDNN route: the kernels of 8 sequences, chunks of 4 and of 8"
timeout 150 python3 scripts/kernel_profile.py --case 14 --batch 8 --warmup 1 --forwards 1 \
  @$P/c14_exact_cudnn_b4_ln.json @$P/s36/c14_exact_cudnn_b8_ln.json 2>&1 | grep -v -i warn \
  | grep -E "^==|device|cudnn" | tee -a "$LOG"
step "case 14, exact cuDNN route: autotune long, one seed, chunks of 4, 8 and 16"
timeout 360 python3 -m autotune long --case 14 --seeds 1 \
  --route h200=@$P/c14_exact_cudnn_b4_ln.json --route h200=@$P/s36/c14_exact_cudnn_b8_ln.json \
  --route h200=@$P/s36/c14_exact_cudnn_b16_ln.json --out "$OUT/case14_s37_exact.json" 2>&1 \
  | grep -v -i warn | tee -a "$LOG" | tail -8
step "done"
