#!/usr/bin/env bash
# Issue 17, planned in session 16, at most 9 minutes, log $OUT/s17_attn_post.log.
# First device run of row_attn_post (72fe83b): fused_layer=rows in two launches a layer,
# the flash attention and the post rows in one kernel (kernels/layer.py
# _attn_post_rows_kernel; docs/kernels_h200.md "Session 16"). In one call:
# - `autotune kernels check` compiled on the H200 (four new rows/post cases);
# - registers and spills of the new kernel at cases 13 and 6 (scripts/kernel_regs.py);
# - per-kernel GPU time of the shipped plans against the attn_post variants
#   (scripts/kernel_profile.py, docs/plans/s17_c{13,6}_*.json);
# - `autotune compare` of the same plans per case (every plan gated on 5 + 5 padded seeds,
#   timed interleaved in one process) -> $OUT/compare_s17_c{13,6}.json.
# Prediction (docs/kernels_h200.md, written before the run): case 13 0.80-0.84 ms if the
# fused kernel stays under ~200 registers a thread; case 6 9.6-10.0 ms; slower if it spills.
# Returned: s17_attn_post.log, compare_s17_c13.json, compare_s17_c6.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s17_attn_post.log"
TOTAL=${TOTAL:-540}
left() { echo $(( TOTAL - SECONDS )); }
quiet() { grep -v -i warn | grep -v "retry ="; }
P=docs/plans
step "kernels check (compiled)"
timeout 200 python3 -m autotune kernels check 2>&1 | quiet | grep -E "layer/rows|FAIL|passed" | tee -a "$LOG"
step "registers of the fused kernel ($(left) s left)"
for f in $P/s17_c13_post3.json $P/s17_c6_post.json; do
  c=$(basename "$f" | sed 's/s17_c\([0-9]*\)_.*/\1/')
  timeout 40 python3 scripts/kernel_regs.py --case "$c" "@$f" 2>&1 | quiet \
    | grep -E "attn_post|post_rows|qkv_rows|==|spill" | tee -a "$LOG"
done
step "where the GPU time goes ($(left) s left)"
python3 - > /tmp/ship.txt <<'PY'
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("13", "6"):
    print(c, json.dumps(next(e["plan"] for e in t.entries.values() if e.get("case") == c)))
PY
while read -r c plan; do echo "$plan" > /tmp/ship_$c.json; done < /tmp/ship.txt
for c in 13 6; do
  plans=(@/tmp/ship_$c.json); for f in $P/s17_c${c}_post*.json; do plans+=("@$f"); done
  timeout 100 python3 scripts/kernel_profile.py --case $c --forwards 5 "${plans[@]}" 2>&1 | quiet \
    | tee -a "$LOG" | grep -E "==|device"
done
step "compare, gated and timed in one process per case ($(left) s left)"
for c in 13 6; do
  [ "$(left)" -gt 60 ] || break
  args=(); for f in $P/s17_c${c}_post*.json; do args+=(--plan "@$f"); done
  timeout "$(( $(left) - 10 ))" python3 -m autotune compare --gpu h200 --cases $c --table tables/h200.py \
    "${args[@]}" --json "$OUT/compare_s17_c$c.json" 2>&1 | quiet | tee -a "$LOG" | tail -6
done
step "done"
