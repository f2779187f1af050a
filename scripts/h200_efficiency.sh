#!/usr/bin/env bash
# Issue 19 on the H200: measure every plan of docs/efficiency/space_gpu_reduced.py once per
# case (default 2 13 8: launch-bound, long-sequence, projection-bound). Each cache starts
# from the committed one (docs/efficiency/h200_caseC.json) and is written in $OUT after
# every plan, so a call cut short keeps what it measured and the next call resumes.
# FRESH=1: start every cache empty (a re-measurement that records absolute times, session 11).
# EFF_UNTIL: stop starting plans this many seconds after the calling script began ($SECONDS).
# Samplers are then replayed on the caches anywhere (no device):
#   autotune efficiency --case 2 --space docs/efficiency/space_gpu_reduced.py \
#     --cache docs/efficiency/h200_case2.json --replay --out docs/efficiency/case2
set -o pipefail
[ -n "${PRELUDE_DONE:-}" ] || source scripts/device_prelude.sh
for c in ${CASES:-2 13 8}; do
  left=$(( ${EFF_UNTIL:-560} - SECONDS ))
  [ "$left" -gt 20 ] || { echo "efficiency: no time left for case $c" | tee -a "$OUT/efficiency.log"; break; }
  [ -z "${FRESH:-}" ] && [ -f "docs/efficiency/h200_case$c.json" ] \
    && [ ! -f "$OUT/h200_case$c.json" ] && cp "docs/efficiency/h200_case$c.json" "$OUT/"
  python3 -m autotune efficiency --gpu h200 --case "$c" \
    --space docs/efficiency/space_gpu_reduced.py --cache "$OUT/h200_case$c.json" \
    --measure-only --timeout "$left" 2>&1 | grep -v -i warn | tee -a "$OUT/efficiency.log" | tail -3
done
