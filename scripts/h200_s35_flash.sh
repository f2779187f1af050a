#!/usr/bin/env bash
# The Gluon flash attention's first device run (session 34 built it offline,
# kernels/gluon_flash.py; docs/kernels_h200.md, "Session 34"), on an H100 or the H200:
# 1. its GPU tests (tests/kernels/test_gluon_flash.py: seven shapes against the reference
#    and the Triton kernel, keys past the bounds never read, pdl bit for bit, the rows
#    stack within the rule; where one fails, scripts/gluon_flash_debug.py's sweep says
#    which settings are off and where) and its compiled kernel checks (autotune kernels
#    check --match gluon-bn);
# 2. case 13's kernel profile, six plans in one process (5 forwards each): the table's
#    entry, with the Gluon post rows (chained, 8 warps; never measured on case 13), with
#    the Gluon flash attention (64 keys a step at 4 and 8 warps, 128 at 4), and with both;
# 3. where time is left, case 14's exact route on 4 sequences: the cuDNN plan (3.079 s a
#    forward in session 32) against the Gluon flash attention at head dim 64, 4 and 8 warps.
# The profiles run whatever the tests say (a failed test is named in the log; only plans
# whose tests pass may be exported).
# Returned: s35_flash.log, s35_flash_tests.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s35_flash.log"
TESTS_LOG="$OUT/s35_flash_tests.log"
TOTAL=${TOTAL:-575}
quiet() { grep -v -i warn | grep -v "retry =" | grep -v "leaked"; }
P=docs/plans/s34

step "GPU tests: tests/kernels/test_gluon_flash.py"
KERNELS_TEST_DEVICE=cuda timeout 240 python3 -m pytest -v -rfE -p no:cacheprovider \
  tests/kernels/test_gluon_flash.py 2>&1 | quiet > "$TESTS_LOG"
rc=${PIPESTATUS[0]}
echo "pytest rc=$rc" | tee -a "$LOG"
grep -v " PASSED \| SKIPPED " "$TESTS_LOG" | tail -30 | tee -a "$LOG"
if [ "$rc" -ne 0 ] && fits 400 "the debug sweep"; then  # which settings are off, and where
  step "debug sweep: scripts/gluon_flash_debug.py"
  timeout 120 python3 scripts/gluon_flash_debug.py 2>&1 | quiet | tail -60 | tee -a "$LOG"
fi

step "compiled checks: autotune kernels check --match gluon-bn"
timeout 120 python3 -m autotune kernels check --match gluon-bn 2>&1 | quiet | tail -8 \
  | tee -a "$LOG"

python3 - <<'PY' || exit 1
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
plan = next(e["plan"] for e in t.entries.values() if e.get("case") == "13")
json.dump(plan, open("/tmp/s35_c13.json", "w"))
PY
if fits 170 "case 13's profiles"; then
  # the plans without the new kernel first: a device fault ends the process
  step "case 13: the entry, + Gluon post rows, + Gluon flash (64 keys x 4, 8 warps; 128), + both"
  timeout 160 python3 scripts/kernel_profile.py --case 13 --forwards 5 @/tmp/s35_c13.json \
    "@$P/c13_row_gluon.json" "@$P/c13_gluon_flash.json" "@$P/c13_gluon_flash_w8.json" \
    "@$P/c13_gluon_flash_bn128.json" "@$P/c13_row_gluon_flash.json" 2>&1 | quiet \
    | tee -a "$LOG" | tail -48
fi
if fits 200 "case 14's exact route (4 sequences)"; then
  step "case 14, 4 sequences: cuDNN's exact route against the Gluon flash attention"
  timeout 190 python3 scripts/kernel_profile.py --case 14 --batch 4 --warmup 1 --forwards 1 \
    @docs/plans/c14_exact_cudnn_b4_ln.json "@$P/c14_exact_gluon_flash_w4.json" \
    "@$P/c14_exact_gluon_flash_w8.json" 2>&1 | quiet | tee -a "$LOG" | tail -40
fi
step "done"
