#!/usr/bin/env bash
# Case 8's entry of tables/h200.py re-exported under the host headroom (session 19): the
# campaign's plan (sdpa_cudnn under compile=default, no graph) ran host-bound in session 19's
# bench (2.158 ms, 2.27 ms of host a call, 1.12 ms of GPU time). Export now ranks finalists
# by max(median, HOST_HEADROOM x host time a call). Four finalists from the campaign's case-8
# study bring in the graph-captured plans (the Triton attention with the epilogue, trial 13;
# cuDNN under reduce-overhead, trial 16) beside the two compile plans; the v40 entry is the
# incumbent. About 2-3 minutes.
# Usage (device): AUTOTUNE_COMMIT=... bash scripts/h200_s19_case8.sh
# Returned: h200.py (tables/h200.py with case 8 re-exported), s19_case8.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s19_case8.log"
cp tables/h200.py "$OUT/h200.py"
step "export case 8 into tables/h200.py, 4 finalists, host headroom"
timeout "${EXPORT_S:-400}" python3 -m autotune export --gpu h200 \
  --storage sqlite:///docs/results/h200/campaign/studies.db --out "$OUT/h200.py" --cases 8 \
  --finalists 4 --anchors sdpa+reduce-overhead 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -12
python3 - 2>&1 <<'PY' | tee -a "$LOG"
import json, os
from autotune.runtime import load_table
t = load_table(os.environ["OUT"] + "/h200.py")
e = next(e for e in t.entries.values() if e.get("case") == "8")
print("version", t.version, "case 8:", e["evidence"]["reason"])
for f in e["evidence"]["finalists"]:
    print(json.dumps(f))
PY
step "done"
