#!/usr/bin/env bash
# Issue 16 on the H200, first call: the kernels (the Triton attention now takes any key
# mask on the device), the shipped table re-verified on padded seeds too, then the hot
# path of the launch-bound cases against the reference and torch.compile
# (reduce-overhead) of the SDPA model, all in one process per case (resumable CSV).
set -o pipefail
source scripts/device_prelude.sh
python3 -m autotune kernels check 2>&1 | tee "$OUT/kernels_check.log" | tail -4
timeout "${VALIDATE_TIMEOUT:-150}" python3 -m autotune validate --table tables/h200.py --quick \
  2>&1 | tee "$OUT/validate.log" | tail -15
timeout "${BENCH_TIMEOUT:-330}" python3 -m autotune bench --table tables/h200.py \
  --cases "${CASES:-2,3,4,7,12}" --anchors "${ANCHORS:-sdpa,sdpa+reduce-overhead}" --hot-path \
  --csv "$OUT/bench.csv" 2>&1 | tee "$OUT/bench.log"
