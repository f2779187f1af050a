#!/usr/bin/env bash
# Planned in session 22: the first device call of session 23, before the studies of
# scripts/h200_s23_gelu_export.sh. Measures what session 22 built after its device time ran
# out (docs/kernels_h200.md, "Packed QKV weights in the row kernels"): the row kernels'
# packed QKV projection (d39366c) and gelu_poly's final form (cfb0359).
# - the kernel checks compiled (every kernel, the gelu and nreg ones included), the GPU layer
#   tests and the graph-path tests;
# - device kernel times of the table's plans for cases 1, 6, 13 (scripts/kernel_profile.py),
#   to hold against session 22's (same plans, before the packing): case 1 post rows 69.2 us,
#   QKV rows 8.0 (docs/logs/s22/s22_ring.log); case 6 post rows 4,745.1, QKV rows 2,662.8
#   (s22_buckets.log); case 13 post rows 445.8, QKV rows 46.3 (s22_probe.log, pdl counted).
#   Predicted: chained post rows -2..-5%, QKV rows -0..-10%.
# About 4 minutes. Returned: s23_first.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s23_first.log"
quiet() { grep -v -i warn | grep -v "retry ="; }
step "kernels check (compiled)"
timeout 150 python3 -m autotune kernels check 2>&1 | quiet | grep -E "FAIL|passed" \
  | tee -a "$LOG"
step "GPU layer tests and graph-path tests"
KERNELS_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_layer.py 2>&1 | tail -2 | tee -a "$LOG"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/device \
  -k "graph or held or drops or ring" 2>&1 | tail -2 | tee -a "$LOG"
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("1", "6", "13"):
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(plan, open(f"/tmp/s23_entry_{c}.json", "w"))
PY
for c in 1 6 13; do
  step "case $c kernel profile (the table's entry)"
  timeout 60 python3 scripts/kernel_profile.py --case $c --forwards 5 @/tmp/s23_entry_$c.json \
    2>&1 | quiet | tee -a "$LOG"
done
step "done"
