#!/usr/bin/env bash
# Session 11, fourth call (issues 18 and 17), at most 6 minutes, one log ($OUT/s11_fourth.log):
# case 14 exported again now that export lets an oracle-judged case ship a plan that reads
# the mask on the host (the third call's export dropped every finalist for that), with the
# second call's 5-seed record as evidence; then the official bench of case 6 (fused_layer=rows,
# exported in the third call) with the reduce-overhead anchor.
# Returned: s11_fourth.log, studies.db, h200.py, bench_s11_c6.csv.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s11_fourth.log"
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
step "export case 14"
timeout 200 python3 -m autotune export --gpu h200 --storage "$DB" --out "$OUT/h200.py" \
  --cases 14 --finalists 2 --anchors none --verified docs/logs/h200_s11_case14_g225.json 2>&1 \
  | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -8
left=$(( 330 - SECONDS ))
if [ "$left" -gt 40 ]; then
  step "bench case 6"
  timeout "$left" python3 -m autotune bench --gpu h200 --table "$OUT/h200.py" --cases 6 \
    --anchors sdpa+reduce-overhead --hot-path --csv "$OUT/bench_s11_c6.csv" 2>&1 \
    | grep -v -i warn | tee -a "$LOG" | tail -8
fi
step "done"
