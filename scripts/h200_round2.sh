#!/usr/bin/env bash
# Issue 5, second H200 round: attention alone with fp16 q/k/v fed to the Triton kernel
# (as SDPA's fp16 rows are), a short resumed study with the fp16 hand-off, re-export,
# and the new table benched against the previous one in one interleaved run.
set -o pipefail
source scripts/device_prelude.sh
python3 -m kernels.bench --shapes 13,14,1,8 --budget-s "${KBUDGET:-100}" 2>&1 \
  | tee "$OUT/kernels_bench_2.log" | tail -40
python3 -m autotune study --gpu h200 --cases 1-13 --n-trials "${N_TRIALS:-45}" \
  --timeout "${STUDY_TIMEOUT:-150}" --trial-timeout 60 --quiet 2>&1 | tee "$OUT/study_2.log"
cp studies.db "$OUT/studies.db"
cp tables/h200.py /tmp/h200_previous.py
python3 -m autotune export --gpu h200 --finalists 3 2>&1 | tee "$OUT/export_2.log" | tail -3
cp tables/h200.py "$OUT/h200.py"
python3 -m autotune bench --table tables/h200.py --baseline /tmp/h200_previous.py \
  --cases 1-13 --csv "$OUT/bench_vs_previous.csv" 2>&1 | tee "$OUT/bench_vs_previous.log" | tail -22
