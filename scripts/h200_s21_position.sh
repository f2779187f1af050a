#!/usr/bin/env bash
# Measurement check, planned in session 20: in scripts/h200_s20_pdl_end.sh the table's entry,
# listed first in `autotune compare`, ran 8.6-10.8 us slower than the same plan listed second
# on the heads cases 12, 7 and 2 (73-90 us forwards), and within 0.8 us on the rows cases.
# Here the same plan is listed three times (no --table), so only the position differs. The
# turns follow the Williams design (since session 20): within steps every plan follows the
# reference equally often; across step boundaries the first-listed plan follows it in 9 of
# 24 turns, the others in 6 (session 20's compare: 12, 0, 0 and 9 of 24), so a gap of ~10%
# at position 1 would not be adjacency:
# - if position 1 is slow again, the first-built or first-listed plan is handicapped, and
#   bench (the table first) and export (the best finalist first) inherit it;
# - if all three agree, session 20's gap was between the table's entry and a plan file, and
#   the next step is to diff how the two are built.
# compare prints each copy's host us a call beside its median (since session 20): a slow
# copy whose host time is also high points at the host side, one with equal host time at
# the device.
# About 1.5 minutes. Returned: s21_position.log, compare_s21_position_c<case>.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s21_position.log"
CASES=${CASES:-12 7 1}
rm -f /tmp/entry_*.json  # a warm machine keeps /tmp
python3 - $CASES <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json, sys
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in sys.argv[1:]:
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(plan, open(f"/tmp/entry_{c}.json", "w"))
PY
for c in $CASES; do
  [ -f "/tmp/entry_$c.json" ] || { echo "plan file for case $c not written: stop" | tee -a "$LOG"; exit 1; }
  step "case $c: the entry's plan three times in one process"
  timeout 120 python3 -m autotune compare --gpu h200 --cases "$c" --plan "@/tmp/entry_$c.json" \
    --plan "@/tmp/entry_$c.json" --plan "@/tmp/entry_$c.json" \
    --json "$OUT/compare_s21_position_c$c.json" 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -4
done
step "done"
