#!/usr/bin/env bash
# Issue 17, planned in session 18, about 6 minutes, log $OUT/s19_next_qkv.log.
# First device run of row_next_qkv (fused_layer=rows: each layer's post rows but the last
# also writes the next layer's qkv; kernels/layer.py, docs/kernels_h200.md "Session 18").
# In one call:
# - `autotune kernels check` compiled on the H200 (the three new rows/chain cases);
# - registers and spills of the post-rows kernel with and without the chain (cases 13, 6);
# - per-kernel GPU time of the shipped plans against the chained ones (cases 13, 6);
# - `autotune compare` per case (every plan gated on 5 + 5 padded seeds, timed interleaved
#   with the table's entry in one process): cases 13, 6, 1, 11, 9.
# Prediction (docs/kernels_h200.md, written before the run): case 13 0.83-0.85 ms (from
# 0.863), case 1 ~110 us (from ~119), case 6 within +-0.5 ms of 10.3 (the QKV work moves
# into a kernel that runs at lower occupancy), registers of the chained kernel within 10
# of the unchained one.
# Returned: s19_next_qkv.log, compare_s19_c<case>.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s19_next_qkv.log"
TOTAL=${TOTAL:-540}
left() { echo $(( TOTAL - SECONDS )); }
quiet() { grep -v -i warn | grep -v "retry ="; }
P=docs/plans
step "kernels check (compiled)"
timeout 200 python3 -m autotune kernels check 2>&1 | quiet | grep -E "chain|FAIL|passed" | tee -a "$LOG"
python3 - > /tmp/ship.txt <<'PY'
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("13", "6", "1", "11", "9"):
    print(c, json.dumps(next(e["plan"] for e in t.entries.values() if e.get("case") == c)))
PY
while read -r c plan; do echo "$plan" > /tmp/ship_$c.json; done < /tmp/ship.txt
step "registers, post rows with and without the chain ($(left) s left)"
for c in 13 6; do
  for f in /tmp/ship_$c.json $P/s19_c${c}_chain.json; do
    timeout 60 python3 scripts/kernel_regs.py --case "$c" "@$f" 2>&1 | quiet \
      | grep -E "post_rows|qkv_rows|==|spill" | tee -a "$LOG"
  done
done
step "where the GPU time goes ($(left) s left)"
for c in 13 6; do
  timeout 100 python3 scripts/kernel_profile.py --case $c --forwards 5 "@/tmp/ship_$c.json" \
    "@$P/s19_c${c}_chain.json" 2>&1 | quiet | tee -a "$LOG" | grep -E "==|device"
done
step "compare, gated and timed in one process per case ($(left) s left)"
for c in 13 6 1 11 9; do
  [ "$(left)" -gt 50 ] || break
  f=$P/s19_c${c}_chain.json; [ -f "$f" ] || f=$P/s19_c1_chain.json  # 11: case 1's plan
  timeout "$(( $(left) - 10 ))" python3 -m autotune compare --gpu h200 --cases $c --table tables/h200.py \
    --plan "@$f" --json "$OUT/compare_s19_c$c.json" 2>&1 | quiet | tee -a "$LOG" | tail -5
done
step "done"
