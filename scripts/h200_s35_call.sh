#!/usr/bin/env bash
# Session 35's call, whichever card comes: the one-launch stack's tests and timings
# (scripts/h200_s35_stack.sh, within STACK_S seconds), then on the H200 only, where the
# call's time allows, case 14's exact route (scripts/h200_s35_case14.sh, about 4 minutes).
# Returned: s35_stack.log; on the H200 s35_case14.log and case14_s35_exact.json.
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
TOTAL=${STACK_S:-330} bash scripts/h200_s35_stack.sh
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && [ "$SECONDS" -lt 330 ]; then
  bash scripts/h200_s35_case14.sh
fi
