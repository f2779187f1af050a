#!/usr/bin/env bash
# Session 21, last call: where case 2's heads and post rows kernels stall, per SASS
# instruction. Nsight Compute's PC sampling (the SourceCounters section) of one launch each
# of the table's case-2 plan without the graph, exported as the source page (SASS, CSV: the
# samples and stall reasons of every instruction). Why: 8 warps cut the heads kernel's
# instructions by a third (`autotune kernels inspect`: 4,568 -> 3,048 SASS) but its time by
# 4% (s21_warps.log), so what paces it is a chain of waits, not issue; this says which.
# About 1.5 minutes. Returned: s21_stalls.log, ncu_src_c2_{heads,post}.csv, the two reports.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s21_stalls.log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
"$NCU" --version | tail -1 | tee -a "$LOG"
python3 - <<'PY' || { echo "plan file not written: stop" | tee -a "$LOG"; exit 1; }
import json
plan = {"attention": "triton", "attn_block_m": 32, "attn_block_n": 128, "attn_precision": "fp16",
        "attn_stages": 1, "fused_layer": "heads", "gemm_precision": "fp16", "row_block": 16}
json.dump(plan, open("/tmp/c2_heads_nograph.json", "w"))
PY
for pair in "heads:_heads_attention_kernel" "post:_post_rows_kernel"; do
  name=${pair%%:*}; kernel=${pair#*:}
  step "ncu source counters, case 2 $name"
  timeout 100 "$NCU" --clock-control none --kernel-name "regex:$kernel" --launch-skip 4 \
    --launch-count 1 --section SourceCounters --section WarpStateStats --import-source yes \
    -o "$OUT/ncu_c2_$name" -f python3 scripts/kernel_profile.py --case 2 --warmup 1 --forwards 1 \
    @/tmp/c2_heads_nograph.json > /dev/null 2>> "$LOG"
  echo "rc $?" | tee -a "$LOG"
  timeout 60 "$NCU" -i "$OUT/ncu_c2_$name.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/ncu_src_c2_$name.csv" 2>> "$LOG"
  echo "source page rc $? ($(wc -l < "$OUT/ncu_src_c2_$name.csv") lines)" | tee -a "$LOG"
  head -2 "$OUT/ncu_src_c2_$name.csv" | cut -c1-600 | tee -a "$LOG"
  timeout 60 "$NCU" -i "$OUT/ncu_c2_$name.ncu-rep" --page details --section WarpStateStats \
    --print-details all 2>&1 | grep -i "stall\|cycles per" | head -30 | tee -a "$LOG"
done
step "done"
