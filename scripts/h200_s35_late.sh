#!/usr/bin/env bash
# Session 35's H200 call (on an H100 it does nothing: both steps need the H200): case 13 of
# session 34's bench (scripts/h200_campaign_step.sh PHASE=bench CASES=13, appended to the
# carried docs/results/h200/bench.csv), then, in the time left, case 14's exact route
# (scripts/h200_s35_case14.sh).
# Returned: bench.csv, campaign_bench_13.log, s35_case14.log, case14_s35_exact.json.
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "not an H200: nothing run (give the machine back)"
  exit 3
fi
PHASE=bench CASES=13 BENCH_S=${BENCH_S:-300} bash scripts/h200_campaign_step.sh
if [ "$SECONDS" -lt "${CASE14_BY:-360}" ]; then
  bash scripts/h200_s35_case14.sh
else
  echo "case 14 skipped: $SECONDS s gone"
fi
