#!/usr/bin/env bash
# Session 9's second device call, at most 9 minutes, one log ($OUT/s9b.log):
# (1) issue 18: case 14's whole batch on the official seeds against one streamed-oracle
#     output per seed (scripts/h200_s9_case14.sh: row-normalised polynomial route, exact
#     Triton and cuDNN routes, rtx5080 host-I/O polynomial route); $OUT/case14.json is
#     rewritten after every seed, so a cut run keeps the seeds it finished;
# (2) issue 17, case 2: its study with the wider key blocks first (call 1 measured
#     attn_block_n 128 at 64.5 us against 74.6 us shipped), then export of case 2 into
#     $OUT/h200.py (buckets of its dims dropped: the next call rebuilds them).
# Returned: s9b.log, case14.json, case14.log, studies.db, h200.py.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s9b.log"
cp studies.db "$OUT/studies.db"
DB="sqlite:///$OUT/studies.db"
step "case 14 routes"
PRELUDE_DONE=1 C14_TIMEOUT="${C14_TIMEOUT:-330}" bash scripts/h200_s9_case14.sh 2>&1 | tail -8 | tee -a "$LOG"
step "study case 2 (wider key blocks first)"
timeout -s INT 80 python3 -m autotune study --gpu h200 --cases 2 --n-trials 6 \
  --warm-start @docs/plans/c2_heads_bn128_s1.json,@docs/plans/c2_heads_bn128.json,tables/h200.py \
  --storage "$DB" --quiet 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -3
step "export case 2"
cp tables/h200.py "$OUT/h200.py"
timeout 100 python3 -m autotune export --gpu h200 --storage "$DB" --out "$OUT/h200.py" \
  --cases 2 --finalists 2 --anchors sdpa+reduce-overhead 2>&1 | grep -v -i warn \
  | tee -a "$LOG" | tail -4
step "done"
