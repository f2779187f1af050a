#!/usr/bin/env bash
# Session 22, second call (issue 17; docs/kernels_h200.md, "Session 22"). The register cap
# on the row kernels lost (first call): occupancy of the post rows kernel is not what paces
# case 6. Three cheaper bets on case 6 (B = 10000) and one on case 13, measured here:
# - case 6 without the CUDA graph: its 655 MB output is over the graph's ring (64 MB), so a
#   graphed call clones it (the 310 us "Memcpy DtoD" of every case-6 profile since session
#   10); 12 launches of host time hide under 10 ms of GPU. Predicted 10.3 -> ~10.0 ms.
# - the flash attention's registers capped (kernel_profile.py --compile-option: Triton's
#   maxnreg on that kernel alone). Offline (autotune kernels inspect, Triton 3.6): case 6's
#   attention 95 registers, 5 blocks an SM; 80 -> 6 blocks, 24 B of stack; 64 -> 8 blocks,
#   256 B. 80,000 programs of 2-3 dependent steps each: more programs in flight should
#   help where nothing else does. Predicted 3.2 ms -> 2.8-3.0 (80), unknown at 64 (spills).
#   Case 13's attention: 111 registers, 4 blocks an SM; 96 -> 5.
# - the heads layer at 64-row attention tiles on case 6 (no qkv round trip through memory,
#   1.5x the key projections): measured at 32-row tiles only (session 10: 12.2 ms of heads
#   attention). Predicted slower than rows (~11-13 ms); measured to close the question.
# About 5 minutes. Returned: s22_probe.log, compare_s22_probe_c6.json.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s22_probe.log"
quiet() { grep -v -i warn | grep -v "retry ="; }
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("6", "13"):
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(plan, open(f"/tmp/s22_entry_{c}.json", "w"))
plan = next(e["plan"] for e in t.entries.values() if e.get("case") == "6")
json.dump(dict(plan, cuda_graph=False), open("/tmp/s22_nograph_6.json", "w"))
heads = dict(plan, fused_layer="heads", attn_block_m=64, attn_block_n=64, attn_warps=4,
             attn_stages=2)
json.dump(heads, open("/tmp/s22_heads_6.json", "w"))
json.dump(dict(heads, cuda_graph=False), open("/tmp/s22_heads_nograph_6.json", "w"))
PY
for opt in "" "--compile-option _attention_fwd_kernel:maxnreg=80" \
    "--compile-option _attention_fwd_kernel:maxnreg=64"; do
  step "case 6 kernel profile $opt"
  timeout 120 python3 scripts/kernel_profile.py --case 6 --forwards 5 $opt @/tmp/s22_entry_6.json \
    2>&1 | quiet | tee -a "$LOG"
done
for opt in "" "--compile-option _attention_fwd_kernel:maxnreg=96" \
    "--compile-option _attention_fwd_kernel:maxnreg=80"; do
  step "case 13 kernel profile $opt"
  timeout 90 python3 scripts/kernel_profile.py --case 13 $opt @/tmp/s22_entry_13.json \
    2>&1 | quiet | tee -a "$LOG"
done
step "case 6: entry, without the graph, heads 64/64, heads 64/64 without the graph"
timeout 200 python3 -m autotune compare --gpu h200 --cases 6 --table tables/h200.py \
  --plan @/tmp/s22_nograph_6.json --plan @/tmp/s22_heads_6.json \
  --plan @/tmp/s22_heads_nograph_6.json --json "$OUT/compare_s22_probe_c6.json" 2>&1 | quiet \
  | tee -a "$LOG" | tail -5
step "done"
