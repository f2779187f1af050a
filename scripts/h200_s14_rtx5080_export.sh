#!/usr/bin/env bash
# Issue 19 part 1, resumable (session 14): `autotune export --gpu rtx5080 --emulate`, one
# case per process, so that a call that runs out of time keeps every case it finished.
# The table accumulates in $OUT/rtx5080.py (each export keeps the entries of the other
# cases); $TABLE_IN, when given, is the partial table of an earlier call to continue from.
# $CASES: the case ids still to export, in order (default 1..14); case 14's whole batch is
# taken from the 5-seed record under the 16 GiB cap (docs/results/rtx5080/case14_rtx5080.json).
# A case starts only while more than $PER_CASE seconds (default 110) are left of $TOTAL
# (default 540); the log ends with the ids still to export, for the next call's $CASES.
# Returned: s14_rtx5080_export.log, rtx5080.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s14_rtx5080_export.log"
TOTAL=${TOTAL:-540}
PER_CASE=${PER_CASE:-110}
[ -n "${TABLE_IN:-}" ] && cp "$TABLE_IN" "$OUT/rtx5080.py"
left() { echo $(( TOTAL - SECONDS )); }
todo=()
for c in ${CASES:-1 2 3 4 5 6 7 8 9 10 11 12 13 14}; do
  if [ "$(left)" -le "$PER_CASE" ]; then todo+=("$c"); continue; fi
  step "export rtx5080 (emulated), case $c ($(left) s left)"
  extra=()
  [ "$c" = 14 ] && extra=(--verified docs/results/rtx5080/case14_rtx5080.json)
  timeout "$(( $(left) - 10 ))" python3 -m autotune export --gpu rtx5080 --emulate \
    --storage sqlite:///studies.db --out "$OUT/rtx5080.py" --cases "$c" --finalists 2 \
    --anchors sdpa+reduce-overhead "${extra[@]}" 2>&1 \
    | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -4
  rc=$?
  [ "$rc" -ne 0 ] && { echo "case $c: export exited $rc" | tee -a "$LOG"; todo+=("$c"); }
done
step "still to export: ${todo[*]:-none}"
