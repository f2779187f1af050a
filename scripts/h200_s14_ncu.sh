#!/usr/bin/env bash
# Planned in session 13 (issues 17 and 18): where the two slowest kernels stall, from
# Nsight Compute's counters (H200.md: on Firecracker ncu reads them with --clock-control
# none; on gVisor it cannot, and this says so in the log). One launch each:
# - case 14's prefix scan (`_prefix_state_kernel`, 8.5 ms a sequence, ~14x its FLOP floor);
# - case 14's output kernel with the row statistics first, 32 keys a step, 3 stages (3.25 ms);
# - case 6's post rows kernel (`_post_rows_kernel`, 1.22 ms a layer, 3.2x its byte floor;
#   the table's plan without the CUDA graph).
# Sections: launch, occupancy, compute and memory throughput, warp state (stall reasons),
# scheduler. TOTAL seconds (default 300); log $OUT/s14_ncu.log, reports $OUT/ncu_*.txt.
set -o pipefail
source scripts/device_prelude.sh
LOG="$OUT/s14_ncu.log"
TOTAL=${TOTAL:-300}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-not found}" | tee -a "$LOG"
SECTIONS="--section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
run_ncu() {  # NAME KERNEL_REGEX COMMAND...
  local name=$1 kernel=$2; shift 2
  step "ncu $name ($(( TOTAL - SECONDS )) s left)"
  [ $(( TOTAL - SECONDS )) -gt 40 ] || { echo "skipped: no time" | tee -a "$LOG"; return; }
  timeout $(( TOTAL - SECONDS - 10 )) "$NCU" --clock-control none --kernel-name "regex:$kernel" \
    --launch-skip 2 --launch-count 1 $SECTIONS "$@" > "$OUT/ncu_$name.txt" 2>&1
  echo "rc $?" | tee -a "$LOG"
  grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Compute \(SM\) Throughput|Memory Throughput|Stall|Warp Cycles Per Issued|Issue Slot|No Eligible|Eligible Warps" \
    "$OUT/ncu_$name.txt" | head -40 | tee -a "$LOG"
  tail -3 "$OUT/ncu_$name.txt" | tee -a "$LOG"
}
run_ncu prefix _prefix_state_kernel python3 scripts/poly_tiles.py --reps 1 shipped
run_ncu output_sf _output_kernel python3 scripts/poly_tiles.py --reps 1 stats_first_bn32_stages3
run_ncu post_rows_c6 _post_rows_kernel python3 scripts/kernel_profile.py --case 6 --warmup 1 \
  --forwards 1 @docs/plans/c6_rows_stage_ffn32.json
step "done"
