#!/usr/bin/env bash
# Issue 3's H200 log: the reference and hand-picked plans on cases 1-13.
# Usage (device): bash scripts/h200_harness.sh  -> $OUT/harness.log, $OUT/harness.json
set -o pipefail
source scripts/device_prelude.sh
mapfile -t PLANS < docs/plans/handpicked.txt
args=()
for p in "${PLANS[@]}"; do args+=(--plan "$p"); done
python3 -m autotune evaluate --gpu h200 --cases "${CASES:-1-13}" "${args[@]}" \
  --json "$OUT/harness.json" 2>&1 | tee "$OUT/harness.log"
