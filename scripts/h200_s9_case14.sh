#!/usr/bin/env bash
# Issue 18 on the H200, about 6 minutes: case 14's whole batch on the 5 official seeds
# against one streamed-oracle output per seed: the exact route (Triton and cuDNN attention),
# and the polynomial route with row-normalised weights and a 2048-row exact prefix under
# h200 and under rtx5080 emulation (16 GiB cap, host I/O). Outputs become
# docs/results/h200/case14_exact.json and case14_guarded.json.
set -o pipefail
[ -n "${PRELUDE_DONE:-}" ] || source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
timeout "${C14_TIMEOUT:-540}" python3 -m autotune long --case 14 --seeds "${C14_SEEDS:-5}" \
  --route h200=@docs/plans/c14_poly_row.json \
  --route h200=@docs/plans/c14_exact_triton.json \
  --route h200=@docs/plans/c14_exact_cudnn.json \
  --route rtx5080=@docs/plans/c14_poly_row_host.json \
  --out "$OUT/case14.json" 2>&1 | grep -v -i warn | tee "$OUT/case14.log" | tail -30
