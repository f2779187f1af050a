#!/usr/bin/env bash
# Issues 19 and 17, planned in session 15, at most 8 minutes, log $OUT/s16_second.log.
# - `autotune validate` of tables/rtx5080.py's case 14 against the streamed oracle, 5 seeds,
#   emulated under the 16 GiB cap (validate skipped that entry before d19148d);
# - case 8 benched beside the reduce-overhead anchor with the hot path, and its kernels
#   profiled: the first LayerNorm through the Triton kernel (b45b7e6) and the half bias
#   read by the GELU epilogue as it is (03a0b51). Prediction: case 8
#   ~1.25 ms (1.285 in session 14): a PyTorch LayerNorm (29.7 us) and the input's cast
#   (12 us) become one Triton LayerNorm (~15 us), the four bias casts (12.4 us) go; 5
#   kernels fewer.
# Returned: s16_second.log, bench_s16.csv.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s16_second.log"
quiet() { grep -v -i warn | grep -v "guard paths" | grep -v RetryHeartbeat; }
step "validate tables/rtx5080.py case 14 against the oracle"
timeout 300 python3 -m autotune validate --table tables/rtx5080.py --gpu rtx5080 --emulate \
  --cases 14 2>&1 | quiet | tee -a "$LOG" | tail -4
step "bench case 8 with the reduce-overhead anchor"
timeout 120 python3 -m autotune bench --table tables/h200.py --gpu h200 --cases 8 \
  --anchors sdpa+reduce-overhead --hot-path --csv "$OUT/bench_s16.csv" 2>&1 | quiet | tee -a "$LOG" | tail -6
step "case 8's kernels"
python3 - > /tmp/c8.json <<'PY'
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
print(json.dumps(next(e["plan"] for e in t.entries.values() if e.get("case") == "8")))
PY
timeout 60 python3 scripts/kernel_profile.py --case 8 @/tmp/c8.json 2>&1 | quiet | tee -a "$LOG" | tail -16
step "done"
