#!/usr/bin/env bash
# Session 11, third call (issues 18 and 17), at most 9.5 minutes, one log ($OUT/s11_third.log):
# - the case-14 study in today's gpu-long space (guard values 1.0, 2.0, 2.25), warm-started
#   with the two plans session 11's second call verified on 5 official seeds
#   (docs/logs/h200_s11_case14_g225.json: guard 2.25 1.499 s, cuDNN exact 3.242 s, 0 failed);
# - export of case 14 into $OUT/h200.py with that record as --verified evidence (a winner
#   outside it is verified on the whole batch during the export);
# - if time is left: case 6 exported (its study found fused_layer=rows at 0.131 of the
#   reference against heads' 0.33) and the buckets rebuilt, into $OUT/h200_c6.py.
# Returned: s11_third.log, studies.db, h200.py, h200_c6.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s11_third.log"
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
P=docs/plans
step "study case 14 (6 trials)"
timeout -s INT 170 python3 -m autotune study --gpu h200 --cases 14 --n-trials 6 --timeout 150 \
  --warm-start "@$P/c14_poly_row_g225.json,@$P/c14_exact_cudnn.json" --storage "$DB" 2>&1 \
  | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -12
step "export case 14"
timeout 280 python3 -m autotune export --gpu h200 --storage "$DB" --out "$OUT/h200.py" \
  --cases 14 --finalists 2 --anchors none --verified docs/logs/h200_s11_case14_g225.json 2>&1 \
  | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -8
left=$(( 555 - SECONDS ))
if [ "$left" -gt 200 ]; then
  step "export case 6, then buckets"
  cp "$OUT/h200.py" /tmp/t6.py
  timeout 120 python3 -m autotune export --gpu h200 --storage "$DB" --out /tmp/t6.py \
    --cases 6 --finalists 2 --anchors sdpa+reduce-overhead 2>&1 | grep -v -i warn \
    | tee -a "$LOG" | tail -6
  left=$(( 560 - SECONDS ))
  timeout "$left" python3 -m autotune buckets --table /tmp/t6.py --gpu h200 \
    --out "$OUT/h200_c6.py" 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -12
fi
step "done"
