#!/usr/bin/env bash
# The next session's first device call (planned at the end of session 7), about 8 minutes:
# (1) kernels check on the device (35 checks: the key-mask bounds are new), (2) tests/device
# (the bucket tests are new), (3) case 13's shipped plan beside the same plan with
# mask_bounds in one process (issue 17), (4) the unseen-shapes measurement resumed from the
# committed CSV and studies (issue 23), (5) the efficiency space on case 2 until 540 s
# (issue 19). Logs, the CSV, the studies and the efficiency cache come back in $OUT.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
timeout 120 python3 -m autotune kernels check 2>&1 | tee "$OUT/kernels_check.log" | tail -1
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/device 2>&1 | tee "$OUT/device_tests.log" | tail -4
plan13='{"attention":"triton","attn_precision":"fp16","cuda_graph":true,"fused_layer":"rows","gemm_precision":"fp16","row_block":64,"mask_bounds":true}'
timeout 150 python3 -m autotune compare --gpu h200 --cases 13 --table tables/h200.py \
  --plan "$plan13" --json "$OUT/compare_13_bounds.json" 2>&1 | grep -v -i warn \
  | tee "$OUT/compare_13_bounds.log" | tail -6
CSV_IN=docs/results/h200/unseen_shapes.csv DB_IN=docs/results/h200/unseen_studies.db \
  STUDY_TIMEOUT=${STUDY_TIMEOUT:-90} UNSEEN_TIMEOUT=${UNSEEN_TIMEOUT:-200} \
  bash scripts/h200_s7_unseen.sh
# (5) what is left of the call measures the efficiency space on case 2 (issue 19, resumable)
PRELUDE_DONE=1 EFF_UNTIL=${EFF_UNTIL:-540} CASES=${EFF_CASES:-2} source scripts/h200_efficiency.sh
