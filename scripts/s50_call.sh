#!/usr/bin/env bash
# Session 50's call (carry .whl). On an H200: scripts/s43_call.sh as the README's next device
# call 1 (pass its variables through). On an H100: the case-14 entry of tables/h200.py
# validated there and written into this card's table (`autotune validate --cases 14
# --update`): its whole batch against the streamed oracle on the 5 official seeds, then,
# where it held, timed on the oracle's batch subset and re-issued with this card's evidence;
# tables/h100.py's other entries and its buckets kept. Returns $OUT/h100.py (a copy of
# tables/h100.py, updated in place) and the log, with the seconds of each step.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT} PYTHONUNBUFFERED=1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash scripts/s43_call.sh
fi
LOG="$OUT/s50_validate_c14.log"
source scripts/device_prelude.sh > "$OUT/s50_card.txt" || exit 1; cat "$OUT/s50_card.txt"
cp tables/h100.py "$OUT/h100.py"
step "validate --cases 14 --update (commit $AUTOTUNE_COMMIT)"
timeout "${VALIDATE_S:-540}" python3 -m autotune validate --table tables/h200.py \
  --cases 14 --allow-reference --out "$OUT/h100.py" --update 2>&1 | grep -v -i "warn" \
  | tee -a "$LOG"
step "validate rc=$?"
cmp -s tables/h100.py "$OUT/h100.py" && rm "$OUT/h100.py"  # unchanged: nothing to bring back
step "done"
