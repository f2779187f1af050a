#!/usr/bin/env bash
# Session 35: the whole forward in one launch (kernels.stack, plan knob one_launch) on the
# heads cases, on an H100 or the H200:
# 1. its GPU tests (tests/kernels/test_stack.py: many programs with a barrier between
#    phases, case 2's and 3's shapes in a CUDA graph), under a timeout (a barrier that
#    never opens hangs);
# 2. each case's kernel profile (GPU time a forward, kernels) of the
#    table's entry beside the one-launch plans (docs/plans/s35/), in one process;
# 3. `autotune compare` of the entry (the table's plan, first) against the one-launch
#    plans, interleaved in one process: the median forward, host time a call, the gate.
# Returned: s35_stack.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s35_stack.log"
TOTAL=${TOTAL:-540}
P=docs/plans/s35
step "GPU tests: kernels.stack"
KERNELS_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_stack.py 2>&1 | tail -20 | tee -a "$LOG"
rc=$?
echo "pytest rc=$rc" | tee -a "$LOG"
# On a failure the timings still run (each compare gates its plans itself): what failed is
# in the log above them.
step "compiled kernel checks: --match=-one"
timeout 120 python3 -m autotune kernels check --match=-one 2>&1 | grep -v -i warn | tail -5 \
  | tee -a "$LOG"
for c in 2 3 12 7; do
  fits 40 "case $c's profile" || break
  step "case $c: kernel profile, entry and one launch"
  plans="@$P/c${c}_entry.json"
  for f in "$P"/c${c}_one*.json; do plans="$plans @$f"; done
  timeout 120 python3 scripts/kernel_profile.py --case "$c" --forwards 5 $plans 2>&1 \
    | grep -v -i warn | tee -a "$LOG"
done
for c in 2 3 12 7; do
  fits 60 "case $c's compare" || break
  step "case $c: autotune compare, the table's entry first"
  plans=""
  for f in "$P"/c${c}_one*.json; do plans="$plans --plan @$f"; done
  timeout 150 python3 -m autotune compare --gpu auto --cases "$c" --table tables/h200.py \
    $plans 2>&1 | grep -v -i warn | tail -8 | tee -a "$LOG"
done
step "done"
