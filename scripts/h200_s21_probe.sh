#!/usr/bin/env bash
# Session 21, first call: the position check (scripts/h200_s21_position.sh, see there), then
# where case 2's two kernels spend their time (issue 17: case 2 at ~60 us of GPU time in 8
# kernels against a 40 us target; session 16's profile: heads attention 8.5 us a launch,
# post rows 6.4 us a launch, each a chain of dependent loads and small products in 8-16
# programs). Nsight Compute, one launch each of the table's case-2 plan without the CUDA
# graph (node launches), with the warp-state and source-counter sections: which stall
# dominates (long scoreboard = waiting on global loads; barrier; math pipe) and where.
# Then which MMA form Triton chose for each fused-layer kernel (ttgir: warp_group_dot is
# Hopper's wgmma, tt.dot with an #mma encoding is mma.sync).
# About 3 minutes. Returned: s21_position.log (both parts), compare_s21_position_c*.json,
# ncu_c2_heads.txt, ncu_c2_post.txt.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
bash scripts/h200_s21_position.sh
LOG="$OUT/s21_position.log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-not found}" | tee -a "$LOG"
python3 - <<'PY' || { echo "case 2 plan file not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
plan = dict(next(e["plan"] for e in t.entries.values() if e.get("case") == "2"))
plan.pop("cuda_graph", None)
json.dump(plan, open("/tmp/c2_nograph.json", "w"))
print("case 2 plan without the graph:", plan)
PY
SECTIONS="--section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters --section InstructionStats"
for pair in "heads:_heads_attention_kernel" "post:_post_rows_kernel"; do
  name=${pair%%:*}; kernel=${pair#*:}
  step "ncu case 2 $name ($kernel)"
  timeout 120 "$NCU" --clock-control none --kernel-name "regex:$kernel" --launch-skip 4 \
    --launch-count 1 $SECTIONS python3 scripts/kernel_profile.py --case 2 --warmup 1 \
    --forwards 1 @/tmp/c2_nograph.json > "$OUT/ncu_c2_$name.txt" 2>&1
  echo "rc $?" | tee -a "$LOG"
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Size|Grid Size|Compute \(SM\) Throughput|Memory Throughput|Stall|Warp Cycles Per Issued|No Eligible|Eligible Warps|Executed Instructions  " \
    "$OUT/ncu_c2_$name.txt" | head -40 | tee -a "$LOG"
done
step "MMA forms in the compiled fused-layer kernels"
python3 - <<'PY' 2>&1 | tee -a "$LOG"
import glob, os, re
for path in sorted(glob.glob(os.path.expanduser("~/.triton/cache/**/*.ttgir"), recursive=True)):
    name = os.path.basename(path)[:-6]
    if not re.search(r"rows|heads|attention|seq_layer", name):
        continue
    text = open(path).read()
    wg = text.count("warp_group_dot")
    mma = len(re.findall(r"tt\.dot ", text))
    ver = sorted(set(re.findall(r"versionMajor = (\d)", text)))
    print(f"{name:32s} wgmma {wg:3d}  tt.dot {mma:3d}  mma versions {ver}  {os.path.dirname(path)[-12:]}")
PY
step "done"
