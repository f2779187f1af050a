#!/usr/bin/env bash
# Issue 16 on the H200, second call: the fused block's on-device mask (kernels check, case
# 7's entry re-verified with padded seeds, its hot path and sync check), then the reference
# timed against itself with whole loops and with turns (issue 15: timing bias on the GPU).
set -o pipefail
source scripts/device_prelude.sh
python3 -m autotune kernels check 2>&1 | tee "$OUT/kernels_check.log" | tail -5
timeout 120 python3 -m autotune validate --table tables/h200.py --cases 7 --quick 2>&1 \
  | tee "$OUT/validate7.log" | tail -3
timeout 150 python3 -m autotune bench --table tables/h200.py --cases 7 --hot-path \
  --csv "$OUT/bench7.csv" 2>&1 | grep -v Warning | tee "$OUT/bench7.log" | tail -6
timeout 220 python3 scripts/timing_selfcheck.py --cases "${CASES:-1,2,13}" --runs "${RUNS:-10}" \
  2>&1 | tee "$OUT/timing_selfcheck.log"
