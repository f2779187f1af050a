#!/usr/bin/env bash
# Sessions 28 and 29 (no device lent either session): the first run of the two Gluon kernels.
# - row_gluon (session 28, kernels/gluon_rows.py): the post rows of fused_layer=rows and
#   heads, and rows' QKV rows, persistent with the layer's weights resident in shared memory.
# - attn_gluon (session 29, kernels/gluon_heads.py): the heads attention, persistent, a group
#   of heads' q, k, v weights resident, every key in one tile, five wgmma a head.
# Both built and compiled offline only (Triton 3.6, sm_90; docs/kernels_h200.md, "Session
# 28" and "Session 29", with the predictions). This call replaced session 28's
# scripts/h200_s28_gluon.sh as the first one: the GPU tests of both; where a kernel fails,
# its debug sweep (scripts/gluon_rows_debug.py, scripts/gluon_heads_debug.py: which stage,
# which rows and columns are off) and no profile of it; then case 6's, 2's and 1's kernel
# profiles of the table's entry and the plans of the kernels that passed (one process a
# case); the compiled kernel checks last, where time is left. Returned: s29_first.log,
# s29_tests.log (every test's verdict). The next calls (README, "Next device calls") export.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s29_first.log"
TOTAL=${TOTAL:-570}
quiet() { grep -v -i warn | grep -v "retry =" | grep -v "leaked"; }
# Both kernels' GPU tests in one process (one CUDA context, one compile cache); a failure
# in one file leaves the other kernel's profiles.
step "GPU tests: the Gluon post rows and heads attention against the Triton kernels and the rule"
# -v: a test that hangs (a wait that never completes) is the last name in the log.
# TESTS_K: a pytest -k expression (session 30: the 13 tests that failed in the first run)
KERNELS_TEST_DEVICE=cuda timeout 360 python3 -m pytest -v -rfE -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} \
  tests/kernels/test_gluon_rows.py tests/kernels/test_gluon_heads.py 2>&1 | quiet \
  > "$OUT/s29_tests.log"
rc=${PIPESTATUS[0]}
cp "$OUT/s29_tests.log" /tmp/s29_tests.log
grep -v " PASSED \| SKIPPED " /tmp/s29_tests.log | tail -40 | tee -a "$LOG"
echo "pytest rc=$rc" | tee -a "$LOG"
ok_rows=1
ok_heads=1
if [ "$rc" -ne 0 ]; then
  grep -q "FAILED tests/kernels/test_gluon_rows.py\|ERROR tests/kernels/test_gluon_rows.py" \
    /tmp/s29_tests.log && ok_rows=0
  # the heads tests with the Gluon post rows count against the heads attention only where
  # the post rows passed their own
  heads_failed=$(grep "FAILED tests/kernels/test_gluon_heads.py\|ERROR tests/kernels/test_gluon_heads.py" \
    /tmp/s29_tests.log)
  [ "$ok_rows" -eq 0 ] && heads_failed=$(echo "$heads_failed" | grep -v "gluon_post")
  [ -n "$heads_failed" ] && ok_heads=0
  # cut by its limit or failed outside a test: neither is known to pass
  grep -q "passed\|failed" /tmp/s29_tests.log || { ok_rows=0; ok_heads=0; }
fi
echo "passed: post rows $ok_rows, heads attention $ok_heads" | tee -a "$LOG"
if [ "$ok_rows" -eq 0 ] && fits 60 "post rows debug sweep"; then
  step "the post rows fail: stage by stage"
  timeout 90 python3 scripts/gluon_rows_debug.py 2>&1 | quiet | tee -a "$LOG" | tail -40
fi
if [ "$ok_heads" -eq 0 ] && fits 60 "heads debug sweep"; then
  step "the heads attention fails: stage by stage"
  timeout 90 python3 scripts/gluon_heads_debug.py 2>&1 | quiet | tee -a "$LOG" | tail -40
fi
[ "$ok_rows" -eq 1 ] || [ "$ok_heads" -eq 1 ] || { step "neither passed: no profiles"; exit 1; }
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("1", "6", "2"):
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(plan, open(f"/tmp/s29_c{c}.json", "w"))
PY
# Per case: the entry, then the post rows' plan (session 28) where it passed, then the heads
# plans (session 29, with the Gluon post rows: only where both passed; the Triton post rows
# variant of case 6 where only the heads passed).
plans_for() {
  local c=$1
  local out="@/tmp/s29_c$c.json"
  [ "$ok_rows" -eq 1 ] && out="$out $(ls docs/plans/s28/c${c}_gluon_w*.json | sed 's/^/@/' | xargs)"
  if [ "$ok_heads" -eq 1 ]; then
    case $c in
      6) [ "$ok_rows" -eq 1 ] && out="$out @docs/plans/s29/c6_heads_gluon4.json @docs/plans/s29/c6_heads_gluon4_pdl_end.json"
         out="$out @docs/plans/s29/c6_heads_gluon4_triton_post.json" ;;
      2) [ "$ok_rows" -eq 1 ] && out="$out $(ls docs/plans/s29/c2_heads_gluon1*.json | sed 's/^/@/' | xargs)" ;;
      1) [ "$ok_rows" -eq 1 ] && out="$out @docs/plans/s29/heads_gluon_g1.json @docs/plans/s29/heads_gluon_g2.json" ;;
    esac
  fi
  echo "$out"
}
for c in ${PROFILE_CASES:-6 2 1}; do  # PROFILE_CASES: which cases' profiles, in order
  if fits 150 "case $c profile"; then
    step "case $c kernel profile: $(plans_for $c)"
    # shellcheck disable=SC2046
    timeout 150 python3 scripts/kernel_profile.py --case "$c" --forwards 5 $(plans_for $c) \
      2>&1 | quiet | tee -a "$LOG" | tail -40
  fi
done
if fits 160 "the compiled kernel checks"; then
  step "kernels check (compiled): the Gluon layer checks (post rows, heads attention)"
  timeout 150 python3 -m autotune kernels check --match gluon --match gheads 2>&1 | quiet \
    | grep -E "FAIL|PASS|passed|failed" | tee -a "$LOG"
fi
step "done"
