#!/usr/bin/env bash
# Issue 6 on the H200: native kernel checks (polynomial attention, the oracle's row
# kernels via the oracle), the reference-faithful oracle against the dense reference on
# cases 1-13, then case 14: every route on the whole batch of the 5 official seeds
# against one oracle output per seed, under h200 and rtx5080 (16 GB cap: emulated).
set -o pipefail
source scripts/device_prelude.sh
python3 -m autotune kernels check 2>&1 | tee "$OUT/kernels_check.log" | tail -8
timeout "${DENSE_TIMEOUT:-100}" python3 -m autotune long --case 1-13 --dense --seeds "${DENSE_SEEDS:-3}" \
  --oracle-chunks 96,160 --out "$OUT/oracle_vs_dense.json" 2>&1 | grep -v "^seed" \
  | tee "$OUT/oracle_vs_dense.log"
timeout "${C14_TIMEOUT:-420}" python3 -m autotune long --case 14 --seeds "${C14_SEEDS:-5}" \
  --route h200=@docs/plans/c14_exact_triton.json \
  --route h200=@docs/plans/c14_poly.json \
  --route h200=@docs/plans/c14_poly_noprefix.json \
  --route rtx5080=@docs/plans/c14_exact_triton_host.json \
  --route rtx5080=@docs/plans/c14_poly_host.json \
  --out "$OUT/case14.json" 2>&1 | tee "$OUT/case14.log"
