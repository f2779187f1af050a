#!/usr/bin/env bash
# Session 34's late call, whichever card comes: on the H200 the full bench of tables/h200.py
# (cases 1-13, every anchor, the hot path; scripts/h200_campaign_step.sh PHASE=bench) with
# the merged s33-heads-ones-smem and s33-post-rows-rcp kernels; on an H100 (where the bench
# refuses to run) Nsight Compute on case 13's attention, the Triton flash kernel and the
# Gluon flash kernel (one launch each of a later layer, no graph or pdl), to see why the
# Gluon one's overlap bought nothing (docs/logs/s34/s35_flash.log: 481.7 against 473.1 us).
# Returned: the bench's bench.csv and log, or s34_late.log and ncu_src_c13_{triton,gluon}.csv.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  # session 32's bench.csv is of this table: the step would resume from it and skip every
  # case; this copy of the tree starts afresh (the repository keeps it until the new one)
  rm -f docs/results/h200/bench.csv
  PHASE=bench CASES=1-13 BENCH_S=${BENCH_S:-530} exec bash scripts/h200_campaign_step.sh
fi
source scripts/device_prelude.sh
LOG="$OUT/s34_late.log"
TOTAL=${TOTAL:-400}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
"$NCU" --version | tail -1 | tee -a "$LOG"
python3 - <<'PY' || exit 1
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
entry = next(e["plan"] for e in t.entries.values() if e.get("case") == "13")
for name, plan in (("triton", entry), ("gluon", json.load(open("docs/plans/s34/c13_gluon_flash.json")))):
    plan = {k: v for k, v in plan.items() if k not in ("cuda_graph", "pdl", "pdl_trigger")}
    json.dump(plan, open(f"/tmp/s34_c13_{name}.json", "w"))
    print(name, plan)
PY
for item in triton:_attention_fwd_kernel gluon:_flash_gluon_kernel; do
  IFS=: read -r name kernel <<< "$item"
  fits 120 "ncu, case 13 $name" || continue
  step "ncu, case 13 $name ($kernel, skip 5)"
  timeout 170 "$NCU" --clock-control none --kernel-name "regex:$kernel" --launch-skip 5 \
    --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section SourceCounters --section WarpStateStats \
    --section LaunchStats --section Occupancy --import-source yes -o "/tmp/ncu_c13_$name" -f \
    python3 scripts/kernel_profile.py --case 13 --warmup 1 --forwards 1 "@/tmp/s34_c13_$name.json" \
    > /dev/null 2>> "$LOG"
  echo "rc $?" | tee -a "$LOG"
  timeout 60 "$NCU" -i "/tmp/ncu_c13_$name.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/ncu_src_c13_$name.csv" 2>> "$LOG"
  echo "source page rc $? ($(wc -l < "$OUT/ncu_src_c13_$name.csv") lines)" | tee -a "$LOG"
  timeout 60 "$NCU" -i "/tmp/ncu_c13_$name.ncu-rep" --page details --print-details all 2>&1 \
    | grep -v "^ *-*$" | grep -iv "^ *OPT\|^ *INF\|estimated speedup" | head -150 >> "$LOG"
done
step "done"
