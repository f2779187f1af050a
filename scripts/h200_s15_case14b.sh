#!/usr/bin/env bash
# Issue 18, session 15, second call, at most 9 minutes, log $OUT/s15_case14b.log.
# The first call shipped the flat prefix scan at four sequences a chunk: 1.003 s a forward
# (docs/logs/h200_s15_case14.json; target <= 1 s). Here, on the 5 official seeds against one
# oracle output per seed, in one process:
# - the study's winner at 1 sequence a chunk (so the export can take batch_chunk from this
#   record), and at 4, 8 and 16. Prediction: 8 ~0.98 s (4 gave 6.4% over 1; half of that
#   again), 16 no better (~97 GiB peak);
# - the exact route (cuDNN, fp16 GEMMs) at 1 and 4 sequences a chunk. Prediction: 3.24 s
#   and ~3.2 s (attention, ~2.9 s of it, is already wide at one sequence);
# then export case 14 with this record -> $OUT/h200.py.
# Returned: s15_case14b.log, case14_s15b.json, h200.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s15_case14b.log"
cp tables/h200.py "$OUT/h200.py"
P=docs/plans
step "case 14: flat prefix at 1, 4, 8, 16 sequences a chunk; exact cuDNN at 1 and 4; 5 official seeds"
timeout 400 python3 -m autotune long --case 14 --seeds 5 \
  --route h200=@$P/c14_poly_row_g225_sf_flat3.json --route h200=@$P/c14_poly_row_g225_b4_sf_flat3.json \
  --route h200=@$P/c14_poly_row_g225_b8_sf_flat3.json --route h200=@$P/c14_exact_cudnn.json \
  --route h200=@$P/c14_exact_cudnn_b4.json --route h200=@$P/c14_poly_row_g225_b16_sf_flat3.json \
  --out "$OUT/case14_s15b.json" 2>&1 | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -8
left=$(( 530 - SECONDS ))
step "export case 14 ($left s left)"
[ "$left" -gt 60 ] && timeout "$left" python3 -m autotune export --gpu h200 --storage sqlite:///studies.db \
  --out "$OUT/h200.py" --cases 14 --finalists 3 --anchors none --verified "$OUT/case14_s15b.json" \
  2>&1 | grep -v -i warn | grep -v "guard paths" | grep -v RetryHeartbeat | tee -a "$LOG" | tail -6
step "done"
