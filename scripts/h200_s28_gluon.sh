#!/usr/bin/env bash
# Session 28 (no device lent that session): the first run of `row_gluon`, the post rows
# kernel of fused_layer=rows and heads, and rows' QKV rows kernel, in Gluon
# (kernels/gluon_rows.py): persistent programs with the layer's weights resident in shared
# memory, each GEMM one wgmma, the next tile's context copied in during this tile's FFN.
# Built and compiled offline only (Triton 3.6, sm_90: case 1's chained post rows at 8 warps
# 194 registers, 212 KiB, no spills; case 6's at 4 warps 253 registers, 112 KiB, 2 programs
# an SM; case 6's QKV rows 160 registers, 96 KiB).
# Predicted (docs/kernels_h200.md, "Session 28"): case 1's post rows 17 -> 7-10 us a launch,
# its GPU time 99.7 -> 70-80 us a forward; case 6's post rows ~1.0 -> 0.45-0.6 ms a launch
# and its QKV rows ~600 -> 420-480 us, its forward 9.2 -> 6.3-7.1 ms; case 2's post rows
# (heads, with row_next_norm) 6.2 -> 4-6 us a launch.
# One call: the compiled kernel checks and GPU tests (numerics against the Triton kernels
# and the rule, rows and heads); if they fail, scripts/gluon_rows_debug.py's sweep (which
# kernel and stage, which rows and columns are off); only if they pass, case 1's, 6's and
# 2's kernel profiles with and without it (one process a case), then the studies and export
# of cases 1 and 6 with the Gluon overlays (scripts/h200_s24_export.sh, OVERLAYS=gluon; the
# next calls take the other cases: OVERLAYS=gluon CASES=13,5,11 bash
# scripts/h200_s24_export.sh, and CASES=2,3,7,12). Returned: s28_gluon.log,
# s24_export.log, studies.db, h200.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s28_gluon.log"
TOTAL=${TOTAL:-570}
quiet() { grep -v -i warn | grep -v "retry ="; }
step "kernels check (compiled): the Gluon post rows' four layer checks"
timeout 120 python3 -m autotune kernels check --match gluon 2>&1 | quiet \
  | grep -E "FAIL|PASS|passed|failed" | tee -a "$LOG"
echo "kernels check rc=${PIPESTATUS[0]}" | tee -a "$LOG"
step "GPU tests: the Gluon post rows against the Triton kernel and the rule"
KERNELS_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_gluon_rows.py 2>&1 | tail -40 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "pytest rc=$rc" | tee -a "$LOG"
if [ "$rc" -ne 0 ]; then
  step "the kernel fails its tests: no profiles, no export; where it goes wrong, stage by stage"
  timeout $(( TOTAL - SECONDS - 15 )) python3 scripts/gluon_rows_debug.py 2>&1 | quiet \
    | tee -a "$LOG" | tail -60
  exit 1
fi
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("1", "6", "2"):
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(plan, open(f"/tmp/s28_c{c}.json", "w"))
PY
for c in 1 6 2; do
  if fits 100 "case $c profile"; then
    step "case $c kernel profile: the entry, then the Gluon post rows (one process)"
    timeout 100 python3 scripts/kernel_profile.py --case "$c" --forwards 5 \
      @/tmp/s28_c$c.json $(ls docs/plans/s28/c${c}_gluon_w*.json | sed 's/^/@/') 2>&1 | quiet | tee -a "$LOG" \
      | tail -30
  fi
done
left=$(( TOTAL - SECONDS - 10 ))
step "export script: CASES=${CASES:-1,6}, $left s"
OVERLAYS=${OVERLAYS:-gluon} CASES=${CASES:-1,6} TOTAL=$left bash scripts/h200_s24_export.sh
step "done"
