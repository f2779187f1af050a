#!/usr/bin/env bash
# Session 36's call, whichever card comes. weights_first (the heads kernels' weight tiles
# loaded before anything else; with pdl before the wait for the previous kernel), issue 17's
# case 2 (<= 40 us of GPU time a forward):
# 1. the GPU tests (tests/kernels/test_layer.py -k "weights_first or programmatic": the rule,
#    pdl bit for bit against none) and the compiled kernel checks (--match wf);
# 2. case 2's kernel profile (GPU time a forward) of the entry beside pdl, weights_first and
#    both (trigger start and end), in one process; `autotune compare` of the same plans
#    (the table's entry first), interleaved in one process;
# 3. on an H100 (WF_CASES, default "3 12 7"): compares of cases 3, 12 and 7 with the same
#    knobs. On the H200 instead: case 13 of session 34's bench (appended to the carried
#    docs/results/h200/bench.csv), then case 14's exact route where CASE14_BY seconds allow.
# Returned: s36_wf.log; on the H200 also bench.csv, campaign_bench_13.log, s35_case14.log,
# case14_s35_exact.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s36_wf.log"
TOTAL=${TOTAL:-560}
P=docs/plans/s36
H200=0
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && H200=1
step "GPU tests: weights_first, pdl"
KERNELS_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_layer.py -k "weights_first or programmatic" 2>&1 | tail -15 | tee -a "$LOG"
step "compiled kernel checks: --match wf"
timeout 100 python3 -m autotune kernels check --match wf 2>&1 | grep -v -i warn | tail -6 \
  | tee -a "$LOG"
step "case 2: kernel profile, entry, pdl, weights_first, both"
timeout 120 python3 scripts/kernel_profile.py --case 2 --forwards 5 @$P/c2_entry.json \
  @$P/c2_pdl.json @$P/c2_wf.json @$P/c2_wf_pdl.json @$P/c2_wf_pdl_end.json 2>&1 \
  | grep -v -i warn | tee -a "$LOG"
step "case 2: autotune compare, the table's entry first"
timeout 150 python3 -m autotune compare --gpu auto --cases 2 --table tables/h200.py \
  --plan @$P/c2_pdl.json --plan @$P/c2_wf.json --plan @$P/c2_wf_pdl.json \
  --plan @$P/c2_wf_pdl_end.json 2>&1 | grep -v -i warn | tail -10 | tee -a "$LOG"
if [ "$H200" = 1 ]; then
  PHASE=bench CASES=13 BENCH_S=${BENCH_S:-240} bash scripts/h200_campaign_step.sh
  if [ "$SECONDS" -lt "${CASE14_BY:-400}" ]; then
    bash scripts/h200_s35_case14.sh
  else
    echo "case 14 skipped: $SECONDS s gone" | tee -a "$LOG"
  fi
  exit 0
fi
for c in ${WF_CASES:-3 12 7}; do
  fits 70 "case $c's compare" || break
  step "case $c: autotune compare, the table's entry first"
  plans=""
  for f in "$P"/c${c}_wf*.json; do plans="$plans --plan @$f"; done
  timeout 150 python3 -m autotune compare --gpu auto --cases "$c" --table tables/h200.py \
    $plans 2>&1 | grep -v -i warn | tail -8 | tee -a "$LOG"
done
step "done"
