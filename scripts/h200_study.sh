#!/usr/bin/env bash
# Issue 4/5 on the H200: kernel checks, then a budgeted, resumable study of cases 1-13.
# Usage (device): STUDY_TIMEOUT=380 N_TRIALS=40 bash scripts/h200_study.sh
set -o pipefail
source scripts/device_prelude.sh
python3 -m autotune kernels check 2>&1 | tee "$OUT/kernels_check.log" | tail -3
python3 -m autotune study --gpu h200 --cases "${CASES:-1-13}" --n-trials "${N_TRIALS:-40}" \
  --timeout "${STUDY_TIMEOUT:-380}" --trial-timeout 120 --quiet 2>&1 | tee "$OUT/study.log"
cp studies.db "$OUT/studies.db"
