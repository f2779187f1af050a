#!/usr/bin/env bash
# Session 37 (H200, about 5 minutes): 1. cases 2 and 3 studied (12 lost 1.14x busy at 16 rows on the H100) and exported with the
# 16-row query-block overlays (attn_block_m 16 is in the GPU space since 0e1f7ae; the first
# call of the session measured none of them: see docs/kernels_h200.md, "Session 37");
# 2. case 14's exact cuDNN route at chunks of 4, 8 and 16 against one oracle output, each
# seed's second whole-batch forward timed (cc7cab0: the official protocol excludes first
# runs). Returned: s24_export.log, studies.db, h200.py, s37_case14_warm.log,
# case14_s37_exact_warm.json. Where the table changed, the bench follows in its own call:
#   AUTOTUNE_COMMIT=<head> PHASE=bench CASES=1-13 BENCH_S=540 bash scripts/h200_campaign_step.sh
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  # Not an H200: no export for tables/h200.py here (session 37 measured the A/B of cases 3
  # and 12 on an H100 already: docs/logs/s37/s37_ab_h100.log).
  echo "not an H200: nothing run"; exit 3
fi
OVERLAYS='{"attn_block_m": 16};{"attn_block_m": 16, "attn_warps": 8};{"attn_warps": 8}' \
  CASES=${CASES:-2,3} TOTAL=${EXPORT_S:-330} bash scripts/h200_s24_export.sh 2>&1 | tail -14
source scripts/device_prelude.sh >/dev/null
LOG="$OUT/s37_case14_warm.log"
P=docs/plans
step "case 14, exact cuDNN route: autotune long, one seed, chunks of 4, 8 and 16 (second forward timed)"
timeout 220 python3 -m autotune long --case 14 --seeds 1 \
  --route h200=@$P/c14_exact_cudnn_b4_ln.json --route h200=@$P/s36/c14_exact_cudnn_b8_ln.json \
  --route h200=@$P/s36/c14_exact_cudnn_b16_ln.json --out "$OUT/case14_s37_exact_warm.json" 2>&1 \
  | grep -v -i warn | tee -a "$LOG" | tail -8
step "done"
