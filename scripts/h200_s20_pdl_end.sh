#!/usr/bin/env bash
# Issue 17, session 20: programmatic dependent launch with the trigger at each kernel's end
# (pdl_trigger=end: gdc_launch_dependents after the last store) against the trigger at the
# start (session 20's first pdl run: 0.82-0.89x on cases 12, 7, 1) and against no pdl.
# About 3-4 minutes, log $OUT/s20_pdl_end.log. In one call:
# - the pdl kernel checks compiled (`autotune kernels check --match pdl`: 5 on sm_90+);
# - the GPU layer tests, pdl (both triggers) against none, bit for bit;
# - `autotune compare` per case, in one process a case, gated on 5 + 5 padded seeds, timed
#   interleaved: the table's entry, then the same plan without pdl, with pdl (start) and
#   with pdl (end). Cases 12, 1, 5, 13, 7, 2 while time lasts.
# Prediction (docs/kernels_h200.md, session 20, written before the run): end is never slower
# than no pdl by more than the noise, and saves 0.5-1 us a kernel boundary at most: case 12
# 58-62 us, case 1 within 3% of no pdl.
# Returned: s20_pdl_end.log, compare_s20_pdl_end_c<case>.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s20_pdl_end.log"
TOTAL=${TOTAL:-270}
CASES=${CASES:-12 1 5 13 7 2}
left() { echo $(( TOTAL - SECONDS )); }
quiet() { grep -v -i warn | grep -v "retry ="; }
step "kernels check --match pdl (compiled)"
timeout 90 python3 -m autotune kernels check --match pdl 2>&1 | quiet | tee -a "$LOG" | tail -6
step "layer tests on the GPU, pdl (start, end) against none ($(left) s left)"
KERNELS_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_layer.py -k programmatic 2>&1 | tail -3 | tee -a "$LOG"
rm -f /tmp/none_*.json /tmp/start_*.json /tmp/end_*.json  # a warm machine keeps /tmp
python3 - $CASES <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json, sys
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in sys.argv[1:]:
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    base = {k: v for k, v in plan.items() if k not in ("pdl", "pdl_trigger")}
    for name, extra in (("none", {}), ("start", {"pdl": True}),
                        ("end", {"pdl": True, "pdl_trigger": "end"})):
        json.dump(dict(base, **extra), open(f"/tmp/{name}_{c}.json", "w"))
PY
step "compare, gated and timed in one process per case ($(left) s left)"
for c in $CASES; do
  [ "$(left)" -gt 35 ] || { echo "case $c skipped: $(left) s left" | tee -a "$LOG"; continue; }
  timeout "$(( $(left) - 5 ))" python3 -m autotune compare --gpu h200 --cases "$c" \
    --table tables/h200.py --plan "@/tmp/none_$c.json" --plan "@/tmp/start_$c.json" \
    --plan "@/tmp/end_$c.json" --json "$OUT/compare_s20_pdl_end_c$c.json" \
    2>&1 | quiet | tee -a "$LOG" | tail -5
done
step "done"
