#!/usr/bin/env bash
# Session 13, first call (planned in session 12), TOTAL seconds (default 540), log
# $OUT/s13_first.log. Ships what session 12 measured but could not commit (its case-6
# export dropped the table's buckets; exports keep them now):
# - case 14 exported with docs/logs/h200_s12_case14.json: batch_chunk 4 from the record
#   (1.401 s against 1.523 s a forward, 0 failed on 5 seeds);
# - cases 6 and 13 exported from their session-12 studies (row_stage + row_ffn_block 32:
#   11.035 / 0.900 ms at session 12's export), buckets rebuilt with the new plans;
# - cases 6, 13 benched beside the reduce-overhead anchor with kernel counts;
# - registers and spills of case 14's polynomial kernels on its first 4 sequences.
# Returned: s13_first.log, h200.py, bench_s13.csv.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s13_first.log"
cp tables/h200.py "$OUT/h200.py"
TOTAL=${TOTAL:-540}
left() { echo $(( TOTAL - SECONDS )); }
step "export case 14"
timeout 100 python3 -m autotune export --gpu h200 --out "$OUT/h200.py" --cases 14 --finalists 3 \
  --anchors none --verified docs/logs/h200_s12_case14.json 2>&1 | grep -v -i warn \
  | grep -v "guard paths" | grep -v "retry =" | tee -a "$LOG" | tail -4
step "export cases 6 and 13, buckets rebuilt"
timeout 300 python3 -m autotune export --gpu h200 --out "$OUT/h200.py" --cases 6,13 \
  --finalists 2 --anchors sdpa+reduce-overhead --buckets 2>&1 | grep -v -i warn \
  | grep -v "retry =" | tee -a "$LOG" | tail -12
step "bench cases 6 and 13 ($(left) s left)"
[ "$(left)" -gt 60 ] && timeout "$(( $(left) - 30 ))" python3 -m autotune bench --gpu h200 \
  --table "$OUT/h200.py" --cases 6,13 --anchors sdpa+reduce-overhead --hot-path \
  --csv "$OUT/bench_s13.csv" 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -6
step "case 14's polynomial kernels: registers and spills ($(left) s left)"
[ "$(left)" -gt 25 ] && timeout 25 python3 scripts/kernel_regs.py --case 14 --batch 4 \
  @docs/plans/c14_poly_row_g225_b4.json 2>&1 | grep -v -i warn | tee -a "$LOG"
step "done"
