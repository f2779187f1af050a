#!/usr/bin/env bash
# Session 22, third call (issue 17/20 hot path; docs/kernels_h200.md, "Session 22").
# 1. The CUDA graph's ring buffer handed to the fused layers inside the capture: their last
#    kernel stores the output there, where before the forward went to the graph's own output
#    and a device copy moved it into the ring buffer (the "memcpy" of every graphed profile:
#    case 13 16.7 us of its 988 us, docs/logs/s22/s22_probe.log). Predicted per forward: the
#    copy and its graph node gone, ~2-3 us on cases 1-5, 7, 9-12 (1-4%), ~17 us on case 13
#    (2%); case 8 (the per-layer path) and case 6 (output over the ring: cloned) unchanged.
#    GPU tests of the graph path (tests/device -k "graph or held or drops or ring"), then
#    scripts/ring_ab.py: old and new hand-off of the table's plan, one process a case, timed
#    interleaved, each checked against the reference.
# 2. Kernel profiles of cases 1, 5, 11 (the mid cases, for the record of where they go).
# 3. Case 6 re-studied with the graph-free plan first (s22_probe: 10.04 ms against 10.33
#    with the graph, one compare), then exported (2 finalists, the incumbent re-measured).
# About 8 minutes. Returned: s22_ring.log, studies.db, h200.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s22_ring.log"
quiet() { grep -v -i warn | grep -v "retry ="; }
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
step "GPU tests of the graph path"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/device \
  -k "graph or held or drops or ring" 2>&1 | tail -4 | tee -a "$LOG"
step "old and new output hand-off, cases 1-5, 7-13"
timeout 240 python3 scripts/ring_ab.py --table tables/h200.py --cases 1-5,7-13 2>&1 | quiet \
  | tee -a "$LOG"
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("1", "5", "11", "6"):
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(plan, open(f"/tmp/s22_entry_{c}.json", "w"))
    if c == "6":
        json.dump(dict(plan, cuda_graph=False), open("/tmp/s22_nograph_6.json", "w"))
PY
for c in 1 5 11; do
  step "case $c kernel profile"
  timeout 60 python3 scripts/kernel_profile.py --case $c @/tmp/s22_entry_$c.json 2>&1 | quiet \
    | tee -a "$LOG"
done
step "case 6: study (the graph-free plan first, then the table's), ${STUDY_S:-150} s"
timeout -s INT $(( ${STUDY_S:-150} + 50 )) python3 -m autotune study --gpu h200 --cases 6 \
  --n-trials "${TRIALS:-3}" --timeout "${STUDY_S:-150}" --trial-timeout 90 --storage "$DB" \
  --warm-start @/tmp/s22_nograph_6.json,tables/h200.py --quiet 2>&1 | quiet | tee -a "$LOG" \
  | tail -8
step "export case 6 into tables/h200.py, 2 finalists"
timeout "${EXPORT_S:-200}" python3 -m autotune export --gpu h200 --storage "$DB" \
  --out "$OUT/h200.py" --cases 6 --finalists 2 --anchors sdpa+reduce-overhead 2>&1 \
  | quiet | grep -v "guard paths" | tee -a "$LOG" | tail -12
step "done"
