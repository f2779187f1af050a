#!/usr/bin/env bash
# Session 37's last call (H200, at most ~9 minutes): 1. cases 2 and 3 studied and exported
# with the 16-row query-block overlays (scripts/h200_s24_export.sh); 2. case 14's exact cuDNN
# route at chunks of 4, 8 and 16 against one oracle output, each seed's second whole-batch
# forward timed (cc7cab0); 3. where the export changed the table, the bench of the new
# table, cases 2 and 3 first, then the rest as time allows, into $OUT/bench.csv (resumable:
# the next call carries it as docs/results/h200/bench.csv and finishes it with
#   AUTOTUNE_COMMIT=<head> PHASE=bench CASES=1-13 BENCH_S=540 bash scripts/h200_campaign_step.sh).
# Returned: s24_export.log, studies.db, h200.py, s37_final.log, case14_s37_exact_warm.json,
# bench.csv (where the table changed).
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
TOTAL=${TOTAL:-550}
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "not an H200: nothing run"; exit 3
fi
OVERLAYS='{"attn_block_m": 16};{"attn_block_m": 16, "attn_warps": 8};{"attn_warps": 8}' \
  CASES=2,3 TOTAL=${EXPORT_S:-200} bash scripts/h200_s24_export.sh 2>&1 | tail -8
source scripts/device_prelude.sh >/dev/null
LOG="$OUT/s37_final.log"
P=docs/plans
step "case 14, exact cuDNN route: chunks of 4, 8 and 16, second forward timed"
timeout 170 python3 -m autotune long --case 14 --seeds 1 \
  --route h200=@$P/c14_exact_cudnn_b4_ln.json --route h200=@$P/s36/c14_exact_cudnn_b8_ln.json \
  --route h200=@$P/s36/c14_exact_cudnn_b16_ln.json --out "$OUT/case14_s37_exact_warm.json" 2>&1 \
  | grep -v -i warn | tee -a "$LOG" | tail -8
if python3 - "$OUT/h200.py" <<'PY'
import sys
from autotune.runtime import load_table
old, new = load_table("tables/h200.py"), load_table(sys.argv[1])
plans = lambda t: {k: e.get("plan") if e.get("admitted") else None for k, e in t.entries.items()}
sys.exit(0 if plans(old) != plans(new) else 1)
PY
then
  cp "$OUT/h200.py" tables/h200.py
  left=$(( TOTAL - SECONDS - 10 ))
  step "table changed: bench of the new table, cases 2 and 3 first ($left s left)"
  for cases in 2,3 1,4-13; do
    left=$(( TOTAL - SECONDS - 10 ))
    [ "$left" -gt 45 ] || break
    timeout "$left" python3 -m autotune bench --gpu h200 --table tables/h200.py \
      --cases "$cases" --anchors all --hot-path --csv "$OUT/bench.csv" 2>&1 \
      | grep -v -i warn | tee -a "$LOG" | tail -20
  done
else
  step "table unchanged: no bench"
fi
step "done"
