#!/usr/bin/env bash
# Issue 17, planned in session 16, at most 9 minutes, log $OUT/s17_export.log. Run after
# scripts/h200_s17_attn_post.sh says which row_attn_post plans pass and win.
# The GPU space changed in session 16 (row_attn_post; hash 3b21b9fcc9efd882, capacity
# 38b6bf88bf337a4a): each case's study starts anew, warm-started from the table's own plan
# for the case (nearest first) and the plans docs/plans/${PREFIX}_c<case>_*.json, then the
# space's enqueued plans and TPE to STUDY_S seconds a case; export re-measures the finalists
# beside the incumbent in one process (a plan replaces it only beyond the noise); bench
# beside the reduce-overhead anchor.
#   CASES="13 6" PREFIX=s17 STUDY_S=100 AUTOTUNE_COMMIT=... bash scripts/h200_s17_export.sh
# Returned: s17_export.log, studies.db, h200.py, bench_s17.csv.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
CASES=${CASES:-13 6}
PREFIX=${PREFIX:-s17}
STUDY_S=${STUDY_S:-100}
LOG="$OUT/s17_export.log"
TOTAL=${TOTAL:-560}
left() { echo $(( TOTAL - SECONDS )); }
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
quiet() { grep -v -i warn | grep -v "guard paths" | grep -v RetryHeartbeat | grep -v "retry ="; }
for c in $CASES; do
  warm=tables/h200.py
  for f in docs/plans/${PREFIX}_c${c}_*.json; do [ -f "$f" ] && warm="$warm,@$f"; done
  [ "$(left)" -gt $(( STUDY_S + 150 )) ] || { echo "case $c: no time left for its study" | tee -a "$LOG"; break; }
  step "case $c study, ${STUDY_S} s ($(left) s left)"
  timeout -s INT $(( STUDY_S + 40 )) python3 -m autotune study --gpu h200 --cases "$c" \
    --n-trials 60 --timeout "$STUDY_S" --storage "$DB" --warm-start "$warm" --quiet 2>&1 | quiet \
    | tee -a "$LOG" | tail -2
done
spec=$(echo $CASES | tr ' ' ',')
step "export cases $spec ($(left) s left)"
[ "$(left)" -gt 90 ] && timeout "$(( $(left) - 70 ))" python3 -m autotune export --gpu h200 \
  --storage "$DB" --out "$OUT/h200.py" --cases "$spec" --finalists 2 --anchors none 2>&1 | quiet \
  | tee -a "$LOG" | tail -8
step "bench cases $spec beside the reduce-overhead anchor ($(left) s left)"
[ "$(left)" -gt 45 ] && timeout "$(( $(left) - 5 ))" python3 -m autotune bench --gpu h200 \
  --table "$OUT/h200.py" --cases "$spec" --anchors sdpa+reduce-overhead --hot-path \
  --csv "$OUT/bench_s17.csv" 2>&1 | quiet | tee -a "$LOG" | tail -8
step "done"
