#!/usr/bin/env bash
# Session 31, after the Gluon kernels' first timing (docs/logs/s31/h100_first.log, H100):
# case 6's Gluon heads attention took 1,240 us a launch against session 29's 420-550
# prediction, its Gluon post rows 890 us against 450-650, and case 2's Gluon kernels tied
# or lost to the Triton ones. Where they wait: Nsight Compute on one launch each, without
# a graph or pdl (speed of light, the pipes' utilisation, warp states, PC sampling by SASS
# instruction), for case 6's heads attention (a later layer: the LayerNorm1 rows from the
# post rows), case 6's post rows and case 2's heads attention. About 3 minutes.
# Returned: s31_ncu.log, ncu_src_{c6_heads,c6_post,c2_heads}.csv (the source page, SASS).
# ITEMS (case:name:kernel:launches to skip, space-separated) picks the kernels; TAG is
# appended to each source page's name (h200_s33.sh: a branch's kernel beside main's).
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/${NCU_LOG:-s31_ncu.log}"  # h200_s31.sh: its own log (8 files come back)
TOTAL=${TOTAL:-560}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
"$NCU" --version | tail -1 | tee -a "$LOG"
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
for c, f in (("6", "c6_heads_gluon4"), ("2", "c2_heads_gluon1")):
    plan = json.load(open(f"docs/plans/s29/{f}.json"))
    plan.pop("cuda_graph", None)
    plan.pop("pdl", None)
    plan.pop("pdl_trigger", None)
    json.dump(plan, open(f"/tmp/s31_c{c}.json", "w"))
    print(c, plan)
PY
# case:name:kernel:launches to skip (a forward is 4 launches of each; skip the warm-up
# forward and the measured forward's first layer, which normalises the residual itself)
ITEMS=${ITEMS:-"6:heads:_heads_attention_gluon_kernel:5 6:post:_post_rows_gluon_kernel:5 2:heads:_heads_attention_gluon_kernel:5"}
for item in $ITEMS; do
  IFS=: read -r c name kernel skip <<< "$item"
  name="$name${TAG:-}"
  fits 100 "ncu, case $c $name" || continue
  step "ncu, case $c $name ($kernel, skip $skip)"
  timeout 150 "$NCU" --clock-control none --kernel-name "regex:$kernel" --launch-skip "$skip" \
    --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section SourceCounters --section WarpStateStats \
    --section LaunchStats --section Occupancy --import-source yes -o "/tmp/ncu_c${c}_$name" -f \
    python3 scripts/kernel_profile.py --case "$c" --warmup 1 --forwards 1 "@/tmp/s31_c$c.json" \
    > /dev/null 2>> "$LOG"
  echo "rc $?" | tee -a "$LOG"
  timeout 60 "$NCU" -i "/tmp/ncu_c${c}_$name.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/ncu_src_c${c}_$name.csv" 2>> "$LOG"
  echo "source page rc $? ($(wc -l < "$OUT/ncu_src_c${c}_$name.csv") lines)" | tee -a "$LOG"
  timeout 60 "$NCU" -i "/tmp/ncu_c${c}_$name.ncu-rep" --page details --print-details all 2>&1 \
    | grep -v "^ *-*$" | grep -iv "^ *OPT\|^ *INF\|estimated speedup" | head -150 >> "$LOG"
done
step "done"
