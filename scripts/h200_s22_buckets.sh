#!/usr/bin/env bash
# Session 22, last call: table version 46's buckets rebuilt (case 6's entry changed plan to
# the graph-free rows plan in the third call; export kept the 11 buckets, chosen before the
# change), and case 6's kernel profile without the graph (the 310 us output clone gone?).
# About 4 minutes. Returned: h200.py (the rebuilt table), s22_buckets.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s22_buckets.log"
quiet() { grep -v -i warn | grep -v "retry ="; }
python3 - <<'PY' || { echo "plan file not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
plan = next(e["plan"] for e in t.entries.values() if e.get("case") == "6")
json.dump(plan, open("/tmp/s22_entry_6.json", "w"))
PY
step "case 6 kernel profile (the table's entry)"
timeout 90 python3 scripts/kernel_profile.py --case 6 --forwards 5 @/tmp/s22_entry_6.json 2>&1 \
  | quiet | tee -a "$LOG"
step "buckets of tables/h200.py rebuilt"
timeout "${BUCKETS_S:-420}" python3 -m autotune buckets --table tables/h200.py --gpu h200 \
  --out "$OUT/h200.py" 2>&1 | quiet | tee -a "$LOG" | tail -20
step "done"
