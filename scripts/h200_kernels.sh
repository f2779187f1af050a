#!/usr/bin/env bash
# Issue 5 on the H200: attention alone vs SDPA with floors; a library-only baseline
# table from the same studies; the kernel table and the baseline, benched in one run.
set -o pipefail
source scripts/device_prelude.sh
python3 -m kernels.bench --shapes 1,8,11,13,14 --budget-s "${KBUDGET:-150}" 2>&1 \
  | tee "$OUT/kernels_bench.log" | tail -60
python3 -m autotune export --gpu h200 --exclude-triton --out tables/h200_library.py 2>&1 \
  | tee "$OUT/export_library.log" | tail -2
python3 -m autotune bench --table tables/h200.py --baseline tables/h200_library.py \
  --cases 1-13 --csv "$OUT/bench_vs_library.csv" 2>&1 | tee "$OUT/bench_vs_library.log" | tail -20
cp tables/h200_library.py "$OUT/h200_library.py"
