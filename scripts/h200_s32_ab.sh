#!/usr/bin/env bash
# Branch s31-gluon-heads-next, its first device call: the heads attention with the next
# sequence's mask bytes loaded during this one and the biases in shared memory, against
# main's kernel (the same plans: the change is in the code, so an export cannot tell them
# apart; the A/B is two processes a case, alternated, in one call).
# Before the call, on the CPU: git show main:kernels/gluon_heads.py > gluon_heads_main.py
# (an untracked file at the repository root: it travels with the working tree).
# 1. the GPU tests of the heads attention (the branch's kernel): the gate;
# 2. per case (6, 1, 5), the table's entry profiled with the branch's kernel, then main's,
#    then the branch's again (kernel sums, 5 forwards each, one process each).
# Returned: s32_ab.log, s32_tests.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s32_ab.log"
[ -f gluon_heads_main.py ] || { echo "gluon_heads_main.py missing (git show main:kernels/gluon_heads.py)" | tee -a "$LOG"; exit 2; }
quiet() { grep -v -i warn | grep -v "retry =" | grep -v "leaked"; }
step "GPU tests: the branch's Gluon heads attention"
KERNELS_TEST_DEVICE=cuda timeout 200 python3 -m pytest -v -rfE -p no:cacheprovider \
  tests/kernels/test_gluon_heads.py 2>&1 | quiet > "$OUT/s32_tests.log"
rc=${PIPESTATUS[0]}
grep -v " PASSED \| SKIPPED " "$OUT/s32_tests.log" | tail -25 | tee -a "$LOG"
echo "pytest rc=$rc" | tee -a "$LOG"
[ "$rc" -eq 0 ] || { step "the tests failed: no A/B"; exit 1; }
python3 - <<'PY' || exit 1
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("6", "1", "5"):
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(plan, open(f"/tmp/s32_c{c}.json", "w"))
PY
cp kernels/gluon_heads.py /tmp/gluon_heads_branch.py
profile() {  # case, which kernel
  step "case $1, $2's kernel"
  timeout 100 python3 scripts/kernel_profile.py --case "$1" --forwards 5 "@/tmp/s32_c$1.json" \
    2>&1 | quiet | tee -a "$LOG" | tail -6
}
for c in 6 1 5; do
  cp /tmp/gluon_heads_branch.py kernels/gluon_heads.py; profile $c branch
  cp gluon_heads_main.py kernels/gluon_heads.py; profile $c main
  cp /tmp/gluon_heads_branch.py kernels/gluon_heads.py; profile $c branch
done
step "done"
