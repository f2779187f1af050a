#!/usr/bin/env bash
# Session 22 (issue 17; docs/kernels_h200.md, "Session 22"): `ffn_gelu=poly`, the fused
# layers' FFN GELU as v * sigmoid(p(v)) (kernels._common.gelu_poly: one exp2 and a fast
# division, within 2.6e-5 of the erf GELU) instead of libdevice's erf. Why: Nsight Compute's
# PC sampling of the post rows kernel (docs/logs/s22/ncu_post/) puts 21% of case 6's stall
# samples and 13% of case 1's on the erf GELU line, mostly issuing and fixed-latency waits;
# offline (`autotune kernels inspect`, Triton 3.6) case 6's post rows go from 3,064 to 2,776
# SASS instructions (the FFN step's body, run 4 times a tile).
# Prediction, written before the run: case 6 post rows -8..-12%, the forward -4..-6% (10.05
# -> 9.5-9.65 ms); case 1 -3..-5% (109 -> 104-106 us); case 13 -2.5..-4% (816 -> 785-795 us);
# every plan within the rule (compare gates each).
# In one call, about 4 minutes: kernels check --match gelu compiled; the GPU layer tests -k
# gelu; case 6's kernel profile with poly; one compare a case (6, 13, 1, 11, 5): the
# table's entry, and with ffn_gelu=poly.
# Returned: s22_gelu.log, compare_s22_gelu_c<case>.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s22_gelu.log"
TOTAL=${TOTAL:-330}
left() { echo $(( TOTAL - SECONDS )); }
quiet() { grep -v -i warn | grep -v "retry ="; }
step "kernels check --match gelu (compiled)"
timeout 90 python3 -m autotune kernels check --match gelu 2>&1 | quiet | tail -6 | tee -a "$LOG"
step "GPU layer tests -k gelu ($(left) s left)"
KERNELS_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_layer.py -k gelu 2>&1 | tail -2 | tee -a "$LOG"
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("6", "13", "1", "11", "5"):
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(dict(plan, ffn_gelu="poly"), open(f"/tmp/s22_gelu_{c}.json", "w"))
PY
step "case 6 kernel profile with poly ($(left) s left)"
timeout 60 python3 scripts/kernel_profile.py --case 6 --forwards 5 @/tmp/s22_gelu_6.json 2>&1 \
  | quiet | tee -a "$LOG"
for c in 6 13 1 11 5; do
  [ "$(left)" -gt 45 ] || { echo "case $c skipped: $(left) s left" | tee -a "$LOG"; continue; }
  step "case $c: entry, ffn_gelu=poly ($(left) s left)"
  timeout "$(( $(left) - 10 ))" python3 -m autotune compare --gpu h200 --cases $c \
    --table tables/h200.py --plan "@/tmp/s22_gelu_$c.json" \
    --json "$OUT/compare_s22_gelu_c$c.json" 2>&1 | quiet | tee -a "$LOG" | tail -3
done
step "done"
