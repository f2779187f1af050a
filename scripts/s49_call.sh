#!/usr/bin/env bash
# Session 49's call (carry .whl). On an H200: scripts/s43_call.sh as the README's next device
# call 1 (version 56's bench of cases 9-13, then the exact route at attn_drop_bits 0 and 2;
# pass its variables through). On any other card: the README's path for a user whose GPU is
# not the table's, measured: `autotune validate --table tables/h200.py --allow-reference
# --out` re-verifies and re-times tables/h200.py's entries here (CASES, default 1-13: its
# buckets are checked only without --cases) and writes those verified here as a table for
# this card's profile, with its provenance ($OUT/validated.py); then the device tests that serve a table made for
# this device (the shipped entries' and buckets' sync-free checks) run against it, and with
# BENCH_CASES the new table's bench on this card beside the one-line anchor (ANCHORS), and
# with UNSEEN=N N shapes the table has no entry for, served here (`autotune unseen`).
# Logs in $OUT; the seconds of each step in s49_validate.log.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT} PYTHONUNBUFFERED=1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash scripts/s43_call.sh
fi
LOG="$OUT/s49_validate.log"
source scripts/device_prelude.sh > "$OUT/s49_card.txt" || exit 1; cat "$OUT/s49_card.txt"
cases=()
[ "${CASES-1-13}" = all ] || cases=(--cases "${CASES-1-13}")
step "validate ${cases[*]} (commit $AUTOTUNE_COMMIT)"
timeout "${VALIDATE_S:-400}" python3 -m autotune validate --table tables/h200.py "${cases[@]}" \
  --no-oracle --allow-reference --out "$OUT/validated.py" 2>&1 | grep -v -i "warn" | tee -a "$LOG"
rc=$?
step "validate rc=$rc"
[ -f "$OUT/validated.py" ] || exit "$rc"
profile=$(sed -n "s/^PROFILE = '\(.*\)'$/\1/p" "$OUT/validated.py")
cp "$OUT/validated.py" "tables/$profile.py"  # on the device only: the tests glob tables/
step "device tests against tables/$profile.py"
timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider --tb=short tests/device \
  -k "shipped or bucket_plans" 2>&1 | grep -v -i "benchmarkwarning\|warner(" \
  | tee "$OUT/s49_device_tests.log" | tail -25
# BENCH_CASES: the new table benched on this card beside the one-line anchor (none: skip)
if [ "${BENCH_CASES:-none}" != none ]; then
  step "bench --cases $BENCH_CASES"
  timeout "${TABLE_BENCH_S:-200}" python3 -m autotune bench --table "tables/$profile.py" \
    --cases "$BENCH_CASES" --anchors "${ANCHORS:-sdpa+reduce-overhead}" --hot-path \
    --csv "$OUT/bench_$profile.csv" 2>&1 | grep -v -i "warn" | tee -a "$LOG"
fi
# UNSEEN: shapes of case 2's dims the table has no entry for, served by its buckets here
if [ "${UNSEEN:-0}" -gt 0 ]; then
  step "unseen --count $UNSEEN"
  timeout "${UNSEEN_S:-120}" python3 -m autotune unseen --gpu auto --table "tables/$profile.py" \
    --case 2 --count "$UNSEEN" --csv "$OUT/unseen_$profile.csv" 2>&1 | grep -v -i "warn" | tee -a "$LOG"
fi
step "done"
