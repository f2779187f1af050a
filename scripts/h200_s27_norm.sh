#!/usr/bin/env bash
# Session 27: `row_next_norm` (fused_layer=heads): each layer's post rows kernel but the
# last's also writes the next layer's LayerNorm1 rows as fp16 operands, and the next heads
# attention loads them instead of normalising up to S key rows and its query rows in every
# program. Offline (`autotune kernels inspect --cases 2`, Triton 3.6): the heads kernel
# 4,568 -> 2,040 SASS instructions (FP32 2,284 -> 474, shuffles 440 -> 40), 255 -> 237
# registers; the post rows 984 -> 1,184.
# Predicted (docs/kernels_h200.md, "Session 27"): case 2's heads kernel 8.5 -> 5-6.5 us a
# launch in layers 2-4, the post rows +0.3-0.8 us in layers 1-3: GPU time 56.5 -> 46-51 us
# a forward; cases 3, 7, 12 a few us lower each.
# One call: the compiled kernel checks and GPU tests of the chain, case 2's kernel profile
# with and without it (one process), then the studies and export of the heads cases and
# of 12 and 4 (not studied in session 26) with the norm overlays beside session 24's
# (scripts/h200_s24_export.sh). Returned: s27_norm.log, s24_export.log, studies.db, h200.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s27_norm.log"
TOTAL=${TOTAL:-570}
quiet() { grep -v -i warn | grep -v "retry ="; }
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
plan = next(e["plan"] for e in t.entries.values() if e.get("case") == "2")
json.dump(plan, open("/tmp/s27_c2.json", "w"))
json.dump(dict(plan, row_next_norm=True), open("/tmp/s27_c2_norm.json", "w"))
PY
if fits 100 "kernels check chain"; then
  step "kernels check (compiled): chain (rows: next qkv; heads: next LayerNorm1)"
  timeout 100 python3 -m autotune kernels check --match chain 2>&1 | quiet \
    | grep -E "FAIL|passed" | tee -a "$LOG"
  echo "kernels check rc=${PIPESTATUS[0]}" | tee -a "$LOG"
fi
if fits 100 "GPU layer tests"; then
  step "GPU layer tests: next_norm, next_qkv"
  KERNELS_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_layer.py -k "next_layers" 2>&1 | tail -3 | tee -a "$LOG"
  echo "pytest rc=${PIPESTATUS[0]}" | tee -a "$LOG"
fi
if fits 90 "case 2 profile"; then
  step "case 2 kernel profile: the entry, then with row_next_norm (one process)"
  timeout 90 python3 scripts/kernel_profile.py --case 2 --forwards 5 \
    @/tmp/s27_c2.json @/tmp/s27_c2_norm.json 2>&1 | quiet | tee -a "$LOG" | tail -40
fi
left=$(( TOTAL - SECONDS - 10 ))
step "export script: CASES=${CASES:-2,12,3,7,4}, $left s"
OVERLAYS=${OVERLAYS:-'{"row_next_norm": true};{"row_next_norm": true, "row_fold_residual": true};{"row_next_norm": true, "row_fold_residual": true, "ffn_gelu": "poly"};{"row_fold_residual": true};{"ffn_gelu": "poly"};{"ffn_gelu": "poly", "row_fold_residual": true};{"row_fold_residual": true, "attn_maxnreg": 96};{"row_fold_residual": true, "attn_maxnreg": 80};{"row_fold_residual": true, "attn_head_chunk": "head"}'} \
  CASES=${CASES:-2,12,3,7,4} TOTAL=$left bash scripts/h200_s24_export.sh
step "done"
