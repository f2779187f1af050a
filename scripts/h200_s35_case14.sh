#!/usr/bin/env bash
# Issue 18, planned in session 35 (about 4 minutes, H200 for the time): the cuDNN exact
# route of case 14 since session 29's changes (the context handed to the output projection
# in fp16, no fp32 round trip; the final LayerNorm writing the output rows itself), which
# predicted 3.05-3.16 s a forward against session 18's 3.079 s.
# 1. the kernels of one chunk (4 sequences, both layers) with their times: where the time
#    outside cuDNN's attention goes;
# 2. `autotune long --case 14 --seeds 1` of the exact plan (its oracle output computed once).
# Returned: s35_case14.log, case14_s35_exact.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s35_case14.log"
P=docs/plans
step "case 14, exact cuDNN route: the kernels of 4 sequences"
timeout 150 python3 scripts/kernel_profile.py --case 14 --batch 4 --warmup 1 --forwards 1 \
  @$P/c14_exact_cudnn_b4_ln.json 2>&1 | grep -v -i warn | head -40 | tee -a "$LOG"
step "case 14, exact cuDNN route: autotune long, one seed"
timeout 240 python3 -m autotune long --case 14 --seeds 1 \
  --route h200=@$P/c14_exact_cudnn_b4_ln.json --out "$OUT/case14_s35_exact.json" 2>&1 \
  | grep -v -i warn | tee -a "$LOG" | tail -6
step "done"
