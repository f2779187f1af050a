#!/usr/bin/env bash
# The next session's first device call (planned at the end of session 8), at most 9.5 minutes
# (step limits sum to 570 s with the buckets step taking what is left).
# Every step appends to one log ($OUT/s9.log: the device returns at most 8 files).
# (1) issue 17, case 2: the shipped heads plan beside the same plan with wider key blocks
#     (one step over S=128 instead of a chain of four), one process;
# (2) issue 17, case 13: its study in the current space, the mask_bounds plan first, then
#     export of case 13 (the incumbent re-measured beside the winner and the anchor);
# (3) issue 19: the last 24 plans of case 8's efficiency cache; the emulated RTX 5080
#     studies resumed (cases 10, 13, 8, 6 unfinished);
# (4) issue 23: buckets rebuilt for the new table (covers the memory-cut cell).
# Returned: s9.log, compare_2.json, studies.db, h200.py (after export), h200_buckets.py,
# h200_case8.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s9.log"
cp studies.db "$OUT/studies.db"
DB="sqlite:///$OUT/studies.db"
heads='"attention":"triton","attn_precision":"fp16","cuda_graph":true,"fused_layer":"heads","gemm_precision":"fp16","row_block":16,"attn_block_m":32'
step "compare case 2: key-block width"
timeout 90 python3 -m autotune compare --gpu h200 --cases 2 --table tables/h200.py \
  --plan "{$heads,\"attn_block_n\":64}" --plan "{$heads,\"attn_block_n\":128}" \
  --plan "{$heads,\"attn_block_n\":128,\"attn_stages\":1}" --json "$OUT/compare_2.json" 2>&1 \
  | grep -v -i warn | tee -a "$LOG" | tail -6
step "study case 13 (mask_bounds first)"
timeout -s INT 110 python3 -m autotune study --gpu h200 --cases 13 --n-trials 12 \
  --warm-start @docs/plans/c13_rows_bounds.json,tables/h200.py --storage "$DB" --quiet 2>&1 \
  | grep -v -i warn | tee -a "$LOG" | tail -3
step "export case 13"
cp tables/h200.py "$OUT/h200.py"
timeout 100 python3 -m autotune export --gpu h200 --storage "$DB" --out "$OUT/h200.py" \
  --cases 13 --finalists 2 --anchors sdpa+reduce-overhead 2>&1 | grep -v -i warn \
  | tee -a "$LOG" | tail -4
step "efficiency case 8"
[ -f "$OUT/h200_case8.json" ] || cp docs/efficiency/h200_case8.json "$OUT/"
timeout 90 python3 -m autotune efficiency --gpu h200 --case 8 \
  --space docs/efficiency/space_gpu_reduced.py --cache "$OUT/h200_case8.json" \
  --measure-only --timeout 60 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -2
step "rtx5080 studies resumed"
timeout -s INT 100 python3 -m autotune study --gpu rtx5080 --emulate --cases 10,13,8,6 \
  --n-trials 10 --warm-start tables/h200.py --storage "$DB" --quiet 2>&1 \
  | grep -v -i warn | tee -a "$LOG" | tail -5
step "buckets"
timeout "${BUCKETS_TIMEOUT:-$(( SECONDS < 420 ? 570 - SECONDS : 150 ))}" python3 -m autotune buckets --table "$OUT/h200.py" --gpu h200 \
  --out "$OUT/h200_buckets.py" 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -12
step "done"
