#!/usr/bin/env bash
# Session 35's H200 call (on an H100, case 2 against the Gluon heads plans): case 13 of
# session 34's bench (scripts/h200_campaign_step.sh PHASE=bench CASES=13, appended to the
# carried docs/results/h200/bench.csv), then, in the time left, case 14's exact route
# (scripts/h200_s35_case14.sh).
# Returned: bench.csv, campaign_bench_13.log, s35_case14.log, case14_s35_exact.json.
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  # On an H100: case 2's entry against the Gluon heads attention's plans (issue 17: the
  # Gluon attention is 11% faster on case 1 since session 32), kernel profiles and one
  # interleaved compare. Returned: s35_gheads_c2.log.
  source scripts/device_prelude.sh
  LOG="$OUT/s35_gheads_c2.log"
  plans=""; for f in docs/plans/s35/c2_gheads_*.json; do plans="$plans @$f"; done
  step "case 2: kernel profiles, the entry and the Gluon heads plans"
  timeout 150 python3 scripts/kernel_profile.py --case 2 --forwards 5 \
    @docs/plans/s35/c2_entry.json $plans 2>&1 | grep -v -i warn | tee -a "$LOG"
  step "case 2: autotune compare, the table's entry first"
  timeout 200 python3 -m autotune compare --gpu auto --cases 2 --table tables/h200.py \
    ${plans// @/ --plan @} 2>&1 | grep -v -i warn | tail -8 | tee -a "$LOG"
  step "done"
  exit 0
fi
PHASE=bench CASES=13 BENCH_S=${BENCH_S:-300} bash scripts/h200_campaign_step.sh
if [ "$SECONDS" -lt "${CASE14_BY:-360}" ]; then
  bash scripts/h200_s35_case14.sh
else
  echo "case 14 skipped: $SECONDS s gone"
fi
