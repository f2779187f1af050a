#!/usr/bin/env bash
# Session 3, first device call: native kernel checks; the fused block against the shipped
# table's graph-of-library plans (issue 9); the oracle against the dense reference on
# cases 1-13 (issue 6); case 14 on one seed, every route, to size the campaign.
set -o pipefail
source scripts/device_prelude.sh
python3 -m autotune kernels check 2>&1 | tee "$OUT/kernels_check.log" | tail -30
python3 -m autotune compare --gpu h200 --cases 1-5,7,9-12 --official \
  --table tables/h200_library.py --table tables/h200.py \
  --plan @docs/plans/fused_fp16.json --plan @docs/plans/fused_tf32.json \
  --json "$OUT/fused_compare.json" 2>&1 | tee "$OUT/fused_compare.log"
python3 -m autotune long --case 1-13 --dense --seeds 5 --oracle-chunks 96,160 \
  --out "$OUT/oracle_vs_dense.json" 2>&1 | grep -v "^seed" | tee "$OUT/oracle_vs_dense.log"
ROUTES="--route h200=@docs/plans/c14_exact_triton.json --route h200=@docs/plans/c14_exact_cudnn.json --route rtx5080=@docs/plans/c14_exact_triton_host.json"
if [ -n "${WITH_POLY:-}" ]; then
  ROUTES="$ROUTES --route h200=@docs/plans/c14_poly.json --route rtx5080=@docs/plans/c14_poly_host.json"
fi
timeout "${C14_TIMEOUT:-240}" python3 -m autotune long --case 14 --seeds 1 $ROUTES \
  --out "$OUT/case14_probe.json" 2>&1 | tee "$OUT/case14_probe.log"
