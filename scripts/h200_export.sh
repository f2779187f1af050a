#!/usr/bin/env bash
# Issue 4 on the H200: select and export tables/h200.py, bench it, plot the fronts.
set -o pipefail
source scripts/device_prelude.sh
python3 -m autotune export --gpu h200 2>&1 | tee "$OUT/export.log"
python3 -m autotune bench --table tables/h200.py --cases "${CASES:-1-13}" --csv "$OUT/bench.csv" \
  2>&1 | tee "$OUT/bench.log"
python3 -m autotune plot --gpu h200 --out "$OUT/pareto_h200.png" 2>&1 | tail -1
cp tables/h200.py "$OUT/h200.py"
