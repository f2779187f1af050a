#!/usr/bin/env bash
# Issue 17, planned in session 21 (docs/kernels_h200.md, "Session 21"): `row_maxnreg`, a
# cap on the row kernels' registers a thread, measured on the device for the first time.
# `autotune kernels inspect` (offline, Triton 3.6): case 6's post rows at 64-row tiles hold
# 252 registers with 4 warps (2 blocks, 8 warps an SM) and 151 with 8 warps (1 block, 8
# warps an SM); capped at 128 with 8 warps, 126 and no spill: 2 blocks, 16 warps an SM. The
# chained post rows (cases 13, 5, 1) spill 40 bytes a thread at that cap.
# Prediction, written before the run: case 6 10.5 -> 9.0-9.8 ms (the post rows, 4.7 ms of
# it and latency-bound at 8 warps an SM, 20-30% faster with twice the warps); case 13 within
# +-3%; case 1 within +-5% (one wave of 128 programs: occupancy does not bind).
# In one call, about 7 minutes:
# - kernels check compiled, the two `nreg` checks (row kernels capped at 64: spilled code);
# - the layer test on the GPU: capped against uncapped, bit for bit;
# - registers and spills of case 6's capped plan on the device's own compile (kernel_regs.py);
# - one `autotune compare` a case: the table's entry, with 8 row warps, with 8 row warps
#   and the cap (cases 6, 13, 1).
# Returned: s22_maxnreg.log, compare_s22_maxnreg_c<case>.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s22_maxnreg.log"
TOTAL=${TOTAL:-540}
left() { echo $(( TOTAL - SECONDS )); }
quiet() { grep -v -i warn | grep -v "retry ="; }
step "kernels check --match nreg (compiled)"
timeout 120 python3 -m autotune kernels check --match nreg 2>&1 | quiet | tee -a "$LOG"
step "layer test on the GPU, capped against uncapped ($(left) s left)"
KERNELS_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_layer.py -k maxnreg 2>&1 | tail -3 | tee -a "$LOG"
rm -f /tmp/s22_*.json
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("6", "13", "1"):
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(dict(plan, row_warps=8), open(f"/tmp/s22_w8_{c}.json", "w"))
    json.dump(dict(plan, row_warps=8, row_maxnreg=128), open(f"/tmp/s22_cap_{c}.json", "w"))
PY
step "registers on the device's own compile, case 6 capped ($(left) s left)"
timeout 90 python3 scripts/kernel_regs.py --case 6 @/tmp/s22_cap_6.json 2>&1 | quiet | tee -a "$LOG"
for c in 6 13 1; do
  [ "$(left)" -gt 60 ] || { echo "case $c skipped: $(left) s left" | tee -a "$LOG"; continue; }
  step "case $c: entry, 8 row warps, 8 row warps capped at 128 ($(left) s left)"
  timeout "$(( $(left) - 10 ))" python3 -m autotune compare --gpu h200 --cases $c \
    --table tables/h200.py --plan "@/tmp/s22_w8_$c.json" --plan "@/tmp/s22_cap_$c.json" \
    --json "$OUT/compare_s22_maxnreg_c$c.json" 2>&1 | quiet | tee -a "$LOG" | tail -4
done
step "done"
