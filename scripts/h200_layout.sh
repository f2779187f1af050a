#!/usr/bin/env bash
# After the move into stage packages (issue 22): prove the GPU paths still work on the
# H200. Carry .whl and .golden (the golden vectors, copied from ../shared/golden).
set -o pipefail
source scripts/device_prelude.sh
python3 -m autotune kernels check 2>&1 | tee "$OUT/kernels_check.log"
timeout "${VALIDATE_TIMEOUT:-330}" python3 -m autotune validate --table tables/h200.py 2>&1 \
  | tee "$OUT/validate.log"
python3 -m autotune conformance --table tables/h200.py .golden/*.pt 2>&1 | tee "$OUT/conformance.log"
