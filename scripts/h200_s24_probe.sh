#!/usr/bin/env bash
# Planned in session 23, extended in session 24 (which had no device): device kernel times
# (scripts/kernel_profile.py, 5 warm forwards) of what sessions 23 and 24 built, one
# profile a plan in one process a case, and first the GPU tests of what they changed; the
# first call of the next session with a device, before the studies of
# scripts/h200_s24_export.sh.
# - Case 8's attention in the one-tile form (attn_head_chunk, session 24): the per-layer
#   Triton plan with the flash attention (32/32 tiles: 134 registers, 1 block of 8 warps an
#   SM offline) against the same plan with the one-tile attention (docs/plans/
#   c8_onetile_*.json: 80-140 registers, 2-4 blocks an SM). Predicted (docs/kernels_h200.md,
#   "Session 24"): the attention 263 -> 100-140 us a forward; the forward 1.22 ->
#   1.06-1.10 ms.
# - row_fold_residual on the table's entries of cases 6 and 13 (and 1 if time is left)
#   against the entries. Predicted (docs/kernels_h200.md, "row_fold_residual"): case 6's post
#   rows 3-8% lower, cases 1 and 13 1-4% lower; the other kernels unchanged.
# - The QKV rows kernel at 2 pipeline stages on case 6 (row_qkv_stages=2; offline, Triton
#   3.6: 3 stages hold 73.7 KB of shared memory, 3 blocks an SM; 2 stages 57.3 KB, 4 blocks).
#   Predicted: QKV rows (2,410 us in s23_first.log) 5-15% lower.
# - Session 25 (no device either): ffn_act=blas_tanh, the FFN's bias + GELU in the GEMM's
#   cuBLASLt epilogue (the tanh GELU): its GPU tests, and case 8's flash and one-tile plans
#   with it (docs/plans/c8_blas_flash.json, c8_onetile_64_w8_blas.json). Predicted
#   (docs/kernels_h200.md, "Session 25"): the four bias + GELU kernels (56 us a forward in
#   session 16) gone, the FFN GEMMs 1-3 us each longer: case 8 40-50 us lower a forward.
# Order: correctness first (compiled checks, GPU tests), then case 8's profiles, then case 6's,
# 13's and 1's (the fold's and row_qkv_stages's, which the export's studies also time).
# Each step runs only while its time limit fits in the call's 570 s (about 5-6 minutes in
# all on a warm machine). Returned: s24_probe.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s24_probe.log"
TOTAL=${TOTAL:-570}
quiet() { grep -v -i warn | grep -v "retry ="; }
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("1", "6", "13"):
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(plan, open(f"/tmp/s24_entry_{c}.json", "w"))
    json.dump(dict(plan, row_fold_residual=True), open(f"/tmp/s24_fold_{c}.json", "w"))
    json.dump(dict(plan, row_qkv_stages=2), open(f"/tmp/s24_qkv2_{c}.json", "w"))
PY
for what in fold onetile; do
  fits 90 "kernels check $what" || continue
  step "kernels check (compiled): $what"
  timeout 90 python3 -m autotune kernels check --match $what 2>&1 | quiet \
    | grep -E "FAIL|passed" | tee -a "$LOG"
  echo "kernels check rc=${PIPESTATUS[0]}" | tee -a "$LOG"
done
if fits 150 "GPU layer tests"; then
  step "GPU layer tests: fold, attn_maxnreg, the one-tile rows, qkv_stages, s23's five"
  KERNELS_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_layer.py \
    -k "fold or maxnreg or support_rules or mask_bounds or staged or ffn_block or one_tile or qkv_stages" \
    2>&1 | tail -2 | tee -a "$LOG"
  echo "pytest rc=${PIPESTATUS[0]}" | tee -a "$LOG"
fi
if fits 45 "GPU blas_tanh tests"; then
  step "GPU tests: ffn_act=blas_tanh, cuBLASLt's bias + GELU epilogue (session 25)"
  KERNELS_TEST_DEVICE=cuda timeout 45 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_ffn.py -k blas 2>&1 | tail -2 | tee -a "$LOG"
  echo "pytest rc=${PIPESTATUS[0]}" | tee -a "$LOG"
fi
if fits 90 "GPU attention tests"; then
  step "GPU attention tests: the one-tile form (precisions, bounds, refusals, head dim 256)"
  KERNELS_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_attention.py \
    -k "one_tile_form_takes or never_reads or one_tile_form_refuses or (one_tile and 256)" \
    2>&1 | tail -2 | tee -a "$LOG"
  echo "pytest rc=${PIPESTATUS[0]}" | tee -a "$LOG"
fi
if fits 150 "case 8 profiles"; then
  step "case 8: the flash attention's plan, the one-tile attention's four, each with blas_tanh"
  timeout 150 python3 scripts/kernel_profile.py --case 8 --forwards 5 \
    @docs/plans/c8_triton_fp16_fused_ln.json @docs/plans/c8_onetile_64_w8.json \
    @docs/plans/c8_onetile_32_w4.json @docs/plans/c8_onetile_64_w8_c128.json \
    @docs/plans/c8_onetile_64_w4_c32.json @docs/plans/c8_blas_flash.json \
    @docs/plans/c8_onetile_64_w8_blas.json 2>&1 | quiet | tee -a "$LOG"
fi
if fits 90 "case 6 profiles"; then
  step "case 6: the entry, the entry with row_fold_residual, with row_qkv_stages=2"
  timeout 90 python3 scripts/kernel_profile.py --case 6 --forwards 5 \
    @/tmp/s24_entry_6.json @/tmp/s24_fold_6.json @/tmp/s24_qkv2_6.json 2>&1 | quiet \
    | tee -a "$LOG"
fi
for c in 13 1; do
  fits 60 "case $c profiles" || continue
  step "case $c: the entry, then the entry with row_fold_residual"
  timeout 60 python3 scripts/kernel_profile.py --case $c --forwards 5 \
    @/tmp/s24_entry_$c.json @/tmp/s24_fold_$c.json 2>&1 | quiet | tee -a "$LOG"
done
step "done ($SECONDS s)"
