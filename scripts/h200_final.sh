#!/usr/bin/env bash
# Session 3, last device call: the campaign table benched against the reference and the
# SDPA anchor (official protocol, each anchor in its own process), then the polynomial
# route with a larger exact prefix (its 1024-row prefix failed the rule at rows ~1100-1800).
set -o pipefail
source scripts/device_prelude.sh
timeout "${BENCH_TIMEOUT:-250}" python3 -m autotune bench --table tables/h200.py --cases 1-13 \
  --anchors sdpa --csv "$OUT/bench.csv" 2>&1 | tee "$OUT/bench.log"
timeout "${C14_TIMEOUT:-170}" python3 -m autotune long --case 14 --seeds "${C14_SEEDS:-2}" \
  --route h200=@docs/plans/c14_poly_p8192.json \
  --route rtx5080=@docs/plans/c14_poly_p8192_host.json \
  --out "$OUT/case14_poly.json" 2>&1 | grep -v "^seed" | tee "$OUT/case14_poly.log"
