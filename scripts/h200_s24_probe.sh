#!/usr/bin/env bash
# Planned in session 23: device kernel times (scripts/kernel_profile.py, 5 warm forwards)
# of what session 23 built, one profile a plan in one process a case, and first the GPU
# tests of what it changed; the first call of session 24, before the studies of
# scripts/h200_s24_export.sh.
# - row_fold_residual on the table's entries of cases 6, 1 and 13 against the entries.
#   Predicted (docs/kernels_h200.md, "row_fold_residual"): case 6's post rows 3-8% lower,
#   cases 1 and 13 1-4% lower; the other kernels unchanged.
# - The QKV rows kernel with 2 or 1 pipeline stages on case 6 (offline, Triton 3.6: 3
#   stages hold 73.7 KB of shared memory, 3 blocks an SM; 2 stages 57.3 KB and 102
#   registers, 4 blocks an SM; 1 stage 32.8 KB, 120 registers, 4). Predicted: QKV rows
#   (2,410 us in s23_first.log) 5-15% lower at 2 stages; if so, a row_stages knob.
# - Case 8's attention in the one-tile form (attn_head_chunk, built in session 24, which had
#   no device): the per-layer Triton plan with the flash attention (32/32 tiles: 134
#   registers, 1 block of 8 warps an SM offline) against the same plan with the one-tile
#   attention (docs/plans/c8_onetile_*.json: 80-140 registers, 2-4 blocks an SM). Predicted
#   (docs/kernels_h200.md, "The one-tile attention"): the attention 263 -> 100-140 us a
#   forward; the forward 1.22 -> 1.08-1.12 ms.
# About 4 minutes. Returned: s24_probe.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s24_probe.log"
quiet() { grep -v -i warn | grep -v "retry ="; }
step "kernels check (compiled): the fold's four checks"
timeout 120 python3 -m autotune kernels check --match fold 2>&1 | quiet | grep -E "FAIL|passed" \
  | tee -a "$LOG"
echo "kernels check rc=${PIPESTATUS[0]}" | tee -a "$LOG"
step "kernels check (compiled): the one-tile attention's five checks"
timeout 120 python3 -m autotune kernels check --match onetile 2>&1 | quiet \
  | grep -E "FAIL|passed" | tee -a "$LOG"
echo "kernels check rc=${PIPESTATUS[0]}" | tee -a "$LOG"
step "GPU attention tests: the one-tile form"
KERNELS_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_attention.py -k "one_tile" 2>&1 | tail -2 | tee -a "$LOG"
echo "pytest rc=${PIPESTATUS[0]}" | tee -a "$LOG"
step "case 8: the flash attention's plan, then the one-tile attention's four"
timeout 150 python3 scripts/kernel_profile.py --case 8 --forwards 5 \
  @docs/plans/c8_triton_fp16_fused_ln.json @docs/plans/c8_onetile_64_w8.json \
  @docs/plans/c8_onetile_32_w4.json @docs/plans/c8_onetile_64_w8_c128.json \
  @docs/plans/c8_onetile_64_w4_c32.json 2>&1 | quiet | tee -a "$LOG"
step "GPU layer tests: the fold, attn_maxnreg, and the five that failed in s23_first.log"
KERNELS_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_layer.py -k "fold or maxnreg or support_rules or mask_bounds or staged or ffn_block" \
  2>&1 | tail -2 | tee -a "$LOG"
echo "pytest rc=${PIPESTATUS[0]}" | tee -a "$LOG"
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("1", "6", "13"):
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(plan, open(f"/tmp/s24_entry_{c}.json", "w"))
    json.dump(dict(plan, row_fold_residual=True), open(f"/tmp/s24_fold_{c}.json", "w"))
PY
for c in 6 1 13; do
  step "case $c: the entry, then the entry with row_fold_residual"
  timeout 90 python3 scripts/kernel_profile.py --case $c --forwards 5 \
    @/tmp/s24_entry_$c.json @/tmp/s24_fold_$c.json 2>&1 | quiet | tee -a "$LOG"
done
for st in 2 1; do
  step "case 6: the entry with the QKV rows kernel at num_stages=$st"
  timeout 60 python3 scripts/kernel_profile.py --case 6 --forwards 5 \
    --compile-option _qkv_rows_kernel:num_stages=$st @/tmp/s24_entry_6.json 2>&1 | quiet \
    | tee -a "$LOG"
done
step "done"
