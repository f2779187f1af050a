#!/usr/bin/env bash
# Session 47's call (carry .whl). On an H200: scripts/s43_call.sh as the README's next device
# call 1 (version 56's bench of cases 9-13, then the exact route at attn_drop_bits 0 and 2;
# pass its variables through). On any other card: the device tests (tests/device, among them
# an in-place edit after a graph's capture), then the cost of watching the parameters for
# in-place edits, on and off in one process (scripts/watch_edits_ab.py on the plans of
# tables/h200.py's launch-bound cases; AB=0 skips it). Logs in $OUT.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT} PYTHONUNBUFFERED=1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash scripts/s43_call.sh
fi
source scripts/device_prelude.sh > "$OUT/s47_card.txt" || exit 1; cat "$OUT/s47_card.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/device 2>&1 \
  | grep -v -i "benchmarkwarning\|warner(" | tee "$OUT/s47_device_tests.log" | tail -25
[ "${AB:-1}" = 1 ] || exit 0  # AB=0: the device tests only
timeout 200 python3 scripts/watch_edits_ab.py --table tables/h200.py \
  --cases "${AB_CASES:-2,3,4,7,12,8}" 2>&1 | grep -v -i warn | tee "$OUT/s47_watch_edits_ab.log"
