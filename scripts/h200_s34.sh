#!/usr/bin/env bash
# Session 34's first call, on an H100 or the H200, on main with the session 33 branches'
# files beside it, untracked at the root:
#   git show s33-heads-kv-fused:kernels/gluon_heads.py > gluon_heads_next.py
#   git show s33-heads-kv-fused:tests/kernels/test_gluon_heads.py > test_gluon_heads_next.py
#   git show s33-heads-ones-smem:kernels/gluon_heads.py > gluon_heads_ones.py
#   git show s33-post-rows-rcp:kernels/gluon_rows.py > gluon_rows_next.py
# 1. the heads attention of branch s33-heads-kv-fused (on s33-heads-ones-smem: the biases'
#    A operand in shared memory, the context divided through a reciprocal a row; then k and
#    v of a slot in one wgmma) against main's, after its GPU tests (scripts/h200_s32_ab.sh,
#    cases 6, 1, 5, 11);
# 2. only where the stack's tests failed in 1: s33-heads-ones-smem's heads attention alone
#    against main's on case 6, gated by all of the heads tests (session 34: where they
#    passed, its time goes to the next calls);
# 3. the post rows of branch s33-post-rows-rcp (the GELU's division as the hardware
#    reciprocal, LayerNorm's rsqrt) against main's, after the Gluon rows' GPU tests (cases
#    6, 5, 1).
# Each A/B restores main's files after it. Merge a branch where its tests passed and it was
# faster (docs/kernels_h200.md, "Session 33", says what each predicts).
# Returned: s34.log, s32_ab_heads.log, s32_tests_heads.log, s32_ab_ones.log,
# s32_tests_ones.log, s32_ab_rows.log, s32_tests_rows.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s34.log"
TOTAL=${TOTAL:-575}  # fits (device_prelude.sh) counts against it
for f in gluon_heads_next.py test_gluon_heads_next.py gluon_heads_ones.py gluon_rows_next.py; do
  [ -f "$f" ] || { echo "$f missing (see the header of $0)" | tee -a "$LOG"; exit 2; }
done
cp kernels/gluon_heads.py /tmp/gluon_heads_main.py
cp kernels/gluon_rows.py /tmp/gluon_rows_main.py
cp tests/kernels/test_gluon_heads.py /tmp/test_gluon_heads_main.py
restore() {
  cp /tmp/gluon_heads_main.py kernels/gluon_heads.py
  cp /tmp/gluon_rows_main.py kernels/gluon_rows.py
  cp /tmp/test_gluon_heads_main.py tests/kernels/test_gluon_heads.py
}
trap restore EXIT
ab() {  # tag, kernel file, branch's copy, cases, tests; its status: the A/B script's
  cp "$3" "$2"
  AB_TAG="_$1" KERNEL="$2" BASE="/tmp/$(basename "$2" .py)_main.py" CASES="$4" TESTS="$5" \
    bash scripts/h200_s32_ab.sh 2>&1 | tail -30 | tee -a "$LOG"
  local rc=$?
  restore
  return "$rc"
}

step "A/B: branch s33-heads-kv-fused's heads attention against main's"
cp test_gluon_heads_next.py tests/kernels/test_gluon_heads.py  # its shared-bytes formula
ab heads kernels/gluon_heads.py gluon_heads_next.py "6 1 5 11" tests/kernels/test_gluon_heads.py
stack=$?
# Session 34: the part alone only where the stack's tests failed (then it is the candidate
# to merge, gated by the whole test file); where they passed, its ~100 s go to the next
# calls (which part of the stack gained is then left unmeasured).
if [ "$stack" -ne 0 ] && fits 260 "the two A/Bs after the first"; then
  step "A/B: branch s33-heads-ones-smem's heads attention alone (stack rc $stack)"
  cp test_gluon_heads_next.py tests/kernels/test_gluon_heads.py
  ab ones kernels/gluon_heads.py gluon_heads_ones.py "6" tests/kernels/test_gluon_heads.py
fi
if fits 170 "the post rows' A/B"; then
  step "A/B: branch s33-post-rows-rcp's post rows against main's"
  ab rows kernels/gluon_rows.py gluon_rows_next.py "6 5 1" tests/kernels/test_gluon_rows.py
fi
step "done"
