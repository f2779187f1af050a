#!/usr/bin/env bash
# Issue 17, planned in session 19, about 6 minutes, log $OUT/s20_pdl.log.
# First device run of pdl (programmatic dependent launch of every heads / rows kernel;
# kernels/layer.py, kernels/attention.py, docs/kernels_h200.md "Session 19: pdl").
# In one call:
# - `autotune kernels check` compiled (three pdl cases join on sm_90+: 58 checks);
# - the layer tests on the GPU with and without pdl, bit for bit (tests/kernels);
# - `autotune compare` per case, the table's entry against the same plan with pdl=True
#   (every plan gated on 5 + 5 padded seeds, timed interleaved in one process):
#   cases 2, 12, 7, 1, 13;
# - where the GPU time goes for case 2 with and without pdl (profiler: kernel time sums,
#   which with pdl include the time a program spends waiting for its predecessor).
# Prediction (docs/kernels_h200.md, written before the run): case 2 65 -> 57-62 us,
# 12 and 7 the same few microseconds, case 1 118 -> 108-115 us, case 13 within 1%.
# Returned: s20_pdl.log, compare_s20_pdl_c<case>.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s20_pdl.log"
TOTAL=${TOTAL:-540}
left() { echo $(( TOTAL - SECONDS )); }
quiet() { grep -v -i warn | grep -v "retry ="; }
step "kernels check (compiled)"
timeout 200 python3 -m autotune kernels check 2>&1 | quiet | grep -E "pdl|FAIL|passed" | tee -a "$LOG"
step "layer tests on the GPU, pdl against none ($(left) s left)"
KERNELS_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_layer.py -k programmatic 2>&1 | tail -3 | tee -a "$LOG"
python3 - <<'PY'
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("2", "12", "7", "1", "13"):
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(plan, open(f"/tmp/ship_{c}.json", "w"))
    json.dump(dict(plan, pdl=True), open(f"/tmp/pdl_{c}.json", "w"))
PY
[ -f /tmp/pdl_13.json ] || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
step "where the GPU time goes, case 2 ($(left) s left)"
timeout 100 python3 scripts/kernel_profile.py --case 2 --forwards 5 "@/tmp/ship_2.json" \
  "@/tmp/pdl_2.json" 2>&1 | quiet | tee -a "$LOG" | grep -E "==|device"
step "compare, gated and timed in one process per case ($(left) s left)"
for c in 2 12 7 1 13; do
  [ "$(left)" -gt 50 ] || break
  timeout "$(( $(left) - 10 ))" python3 -m autotune compare --gpu h200 --cases $c \
    --table tables/h200.py --plan "@/tmp/pdl_$c.json" --json "$OUT/compare_s20_pdl_c$c.json" \
    2>&1 | quiet | tee -a "$LOG" | tail -4
done
step "done"
