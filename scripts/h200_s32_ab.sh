#!/usr/bin/env bash
# A kernel file of the branch against main's, the same plans (the change is in the code, so
# an export cannot tell them apart): the GPU tests as a gate, then per case the table's
# entry profiled with the branch's file, main's, the branch's again (kernel sums, 5
# forwards, one process each, alternated in one call).
#   KERNEL  the file the branch changes           (default kernels/gluon_heads.py)
#   BASE    main's copy of it, untracked at the root (default gluon_heads_main.py)
#   TESTS   the GPU tests of the gate               (default tests/kernels/test_gluon_heads.py)
#   CASES   the cases profiled                      (default "6 1 5")
#   AB_TAG  appended to the logs' names (several A/Bs in one call; default none)
# Before the call, on the CPU: git show main:$KERNEL > $BASE (it travels with the tree).
# Session 32: AUTOTUNE_COMMIT=b3de370 bash scripts/h200_s32_ab.sh (the heads attention);
# then KERNEL=kernels/gluon_rows.py BASE=gluon_rows_main.py TESTS="tests/kernels/
# test_gluon_rows.py tests/kernels/test_gluon_heads.py" (the post rows).
# Returned: s32_ab$AB_TAG.log, s32_tests$AB_TAG.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
KERNEL=${KERNEL:-kernels/gluon_heads.py}
BASE=${BASE:-gluon_heads_main.py}
TESTS=${TESTS:-tests/kernels/test_gluon_heads.py}
CASES=${CASES:-6 1 5}
LOG="$OUT/s32_ab${AB_TAG:-}.log"
TESTS_LOG="$OUT/s32_tests${AB_TAG:-}.log"
[ -f "$BASE" ] || { echo "$BASE missing (git show main:$KERNEL > $BASE)" | tee -a "$LOG"; exit 2; }
quiet() { grep -v -i warn | grep -v "retry =" | grep -v "leaked"; }
step "GPU tests of the branch's $KERNEL: $TESTS"
# shellcheck disable=SC2086  # TESTS: several paths
KERNELS_TEST_DEVICE=cuda timeout 300 python3 -m pytest -v -rfE -p no:cacheprovider \
  $TESTS 2>&1 | quiet > "$TESTS_LOG"
rc=${PIPESTATUS[0]}
grep -v " PASSED \| SKIPPED " "$TESTS_LOG" | tail -25 | tee -a "$LOG"
echo "pytest rc=$rc" | tee -a "$LOG"
[ "$rc" -eq 0 ] || { step "the tests failed: no A/B"; exit 1; }
CASES="$CASES" python3 - <<'PY' || exit 1
import json, os
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in os.environ["CASES"].split():
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(plan, open(f"/tmp/s32_c{c}.json", "w"))
PY
cp "$KERNEL" /tmp/s32_branch.py
profile() {  # case, which file
  step "case $1, $2's $KERNEL"
  timeout 100 python3 scripts/kernel_profile.py --case "$1" --forwards 5 "@/tmp/s32_c$1.json" \
    2>&1 | quiet | tee -a "$LOG" | tail -6
}
for c in $CASES; do
  cp /tmp/s32_branch.py "$KERNEL"; profile "$c" branch
  cp "$BASE" "$KERNEL"; profile "$c" main
  cp /tmp/s32_branch.py "$KERNEL"; profile "$c" branch
done
cp /tmp/s32_branch.py "$KERNEL"
step "done"
