#!/usr/bin/env bash
# Session 51's call (carry .whl). On an H200: scripts/s43_call.sh as the README's next
# device call 1 (pass its variables through). On any other card (an H100): the export of
# H100 cases 1 and 3 again from the studies session 51 committed (docs/results/h100/studies.db),
# with the code that keeps the old table's provenance under updated_from, over tables/h100.py
# (v3), then the new table benched beside v3 (--baseline) and the one-line anchor in one run.
# Logs, the new table and the CSV in $OUT.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT} PYTHONUNBUFFERED=1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash scripts/s43_call.sh
fi
LOG="$OUT/s51_h100_export.log"
source scripts/device_prelude.sh > "$LOG" || exit 1; cat "$LOG"
cp tables/h100.py /tmp/h100_v3.py || exit 1
step "export --gpu h100 --cases 1,3 over tables/h100.py (commit $AUTOTUNE_COMMIT)"
timeout 150 python3 -m autotune export --gpu h100 --storage sqlite:///docs/results/h100/studies.db \
  --cases 1,3 --out tables/h100.py 2>&1 | grep -v -i "warn" | tee -a "$LOG"
step "export rc=$?"
cp tables/h100.py "$OUT/h100.py"
timeout 150 python3 -m autotune bench --table tables/h100.py --baseline /tmp/h100_v3.py \
  --cases 1,3 --anchors sdpa+reduce-overhead --hot-path --csv "$OUT/bench_h100_s51.csv" \
  2>&1 | grep -v -i "warn\|_cuda_set_sync_debug_mode" | tee -a "$LOG"
step "bench rc=$?"
