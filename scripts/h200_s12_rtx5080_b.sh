#!/usr/bin/env bash
# Issue 19 part 1, second call (planned in session 11), at most 9.5 minutes, log
# $OUT/s12_rtx5080_b.log: `autotune export --gpu rtx5080 --emulate` of the cases in $CASES
# (default 1-7) into $OUT/rtx5080.py, starting from $TABLE_IN when given (a carried partial
# table: the entries it has for other cases are kept), with case 14's whole batch taken
# from the first call's record ($VERIFIED). Run it twice (CASES=1-7, then CASES=8-14 with
# TABLE_IN set to the first run's table) so that no call runs past its limit.
# Returned: s12_rtx5080_b.log, rtx5080.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s12_rtx5080_b.log"
[ -n "${TABLE_IN:-}" ] && cp "$TABLE_IN" "$OUT/rtx5080.py"
step "export rtx5080 (emulated), cases ${CASES:-1-7}"
timeout 560 python3 -m autotune export --gpu rtx5080 --emulate --storage sqlite:///studies.db \
  --out "$OUT/rtx5080.py" --cases "${CASES:-1-7}" --finalists 2 \
  --anchors sdpa+reduce-overhead ${VERIFIED:+--verified "$VERIFIED"} 2>&1 \
  | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -20
step "done"
