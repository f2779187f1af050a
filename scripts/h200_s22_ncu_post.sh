#!/usr/bin/env bash
# Session 22, for the next kernel work (docs/kernels_h200.md, "Where the mid cases go"): the
# post rows kernel paces cases 1, 6, 9, 10 and 13, a dependent chain with 1-2 programs an
# SM. Where in the chain its warps wait, per SASS instruction and source line: Nsight
# Compute's PC sampling (SourceCounters) of one launch of the post rows kernel of case 6's
# entry (1.2 ms a launch: many samples) and of case 1's (chained, 17 us), both without a
# graph, exported as the source page with the CUDA source lines beside the SASS where ncu
# can (Triton emits line info), else SASS only.
# About 2 minutes. Returned: s22_ncu_post.log, ncu_src_post_c{6,1}.csv, the reports.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s22_ncu_post.log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
"$NCU" --version | tail -1 | tee -a "$LOG"
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("6", "1"):
    plan = dict(next(e["plan"] for e in t.entries.values() if e.get("case") == c))
    plan.pop("cuda_graph", None)
    plan.pop("pdl", None)
    json.dump(plan, open(f"/tmp/s22_post_{c}.json", "w"))
    print(c, plan)
PY
for c in 6 1; do
  step "ncu source counters, case $c post rows"
  timeout 150 "$NCU" --clock-control none --kernel-name "regex:_post_rows_kernel" \
    --launch-skip 4 --launch-count 1 --section SourceCounters --section WarpStateStats \
    --section LaunchStats --section Occupancy --import-source yes -o "$OUT/ncu_post_c$c" -f \
    python3 scripts/kernel_profile.py --case $c --warmup 1 --forwards 1 @/tmp/s22_post_$c.json \
    > /dev/null 2>> "$LOG"
  echo "rc $?" | tee -a "$LOG"
  timeout 60 "$NCU" -i "$OUT/ncu_post_c$c.ncu-rep" --page source --csv --print-source cuda,sass \
    > "$OUT/ncu_src_post_c$c.csv" 2>> "$LOG" \
    || timeout 60 "$NCU" -i "$OUT/ncu_post_c$c.ncu-rep" --page source --csv --print-source sass \
      > "$OUT/ncu_src_post_c$c.csv" 2>> "$LOG"
  echo "source page rc $? ($(wc -l < "$OUT/ncu_src_post_c$c.csv") lines)" | tee -a "$LOG"
  timeout 60 "$NCU" -i "$OUT/ncu_post_c$c.ncu-rep" --page details --print-details all 2>&1 \
    | grep -i "stall\|cycles per\|Duration\|Registers\|Occupancy\|Eligible\|Issued Warp" \
    | head -40 | tee -a "$LOG"
done
step "done"
