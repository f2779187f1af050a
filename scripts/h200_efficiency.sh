#!/usr/bin/env bash
# Issue 10 on the H200: measure every plan of docs/efficiency/space_gpu_reduced.py once on
# a launch-bound case (2) and a long-sequence case (13); caches resume where a cut-short
# call stopped. Samplers are then replayed on the caches anywhere (no device):
#   autotune efficiency --case 2 --space docs/efficiency/space_gpu_reduced.py \
#     --cache docs/efficiency/h200_case2.json --replay --out docs/efficiency/case2 \
#     [--warm-from docs/efficiency/h200_case13.json]
set -o pipefail
source scripts/device_prelude.sh
for c in ${CASES:-2 13}; do
  python3 -m autotune efficiency --gpu h200 --case "$c" \
    --space docs/efficiency/space_gpu_reduced.py --cache "docs/efficiency/h200_case$c.json" \
    --measure-only --timeout "${MEASURE_TIMEOUT:-270}" 2>&1 | tail -3 | tee -a "$OUT/efficiency.log"
  cp "docs/efficiency/h200_case$c.json" "$OUT/"
done
