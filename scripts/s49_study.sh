#!/usr/bin/env bash
# Session 49's second call (carry .whl). On an H200: scripts/s43_call.sh as the README's next
# device call 1 (pass its variables through). On any other card (an H100): the tuning flow a
# user of that card runs, from the table validated there (tables/h100.py, scripts/s49_call.sh):
# a study of CASES (default 2,8) under the card's own profile, warm-started from that table's
# plans; an export against that table's entries as incumbents (a challenger ships only if it
# beats its incumbent by more than the noise); then the new table benched beside the old one
# (--baseline) and the one-line anchor in one run. Logs, the storage and both tables in $OUT.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT} PYTHONUNBUFFERED=1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash scripts/s43_call.sh
fi
LOG="$OUT/s49_study.log"
source scripts/device_prelude.sh > "$OUT/s49_study_card.txt" || exit 1; cat "$OUT/s49_study_card.txt"
profile=${PROFILE_NAME:-h100}
cases=${CASES:-2,8}
db="sqlite:///$OUT/${profile}_studies.db"
cp "tables/$profile.py" "$OUT/${profile}_before.py" || exit 1
step "study --gpu $profile --cases $cases (commit $AUTOTUNE_COMMIT)"
timeout "${STUDY_S:-200}" python3 -m autotune study --gpu "$profile" --cases "$cases" \
  --n-trials "${TRIALS:-20}" --timeout "${STUDY_T:-150}" --warm-start "tables/$profile.py" \
  --storage "$db" --quiet 2>&1 | grep -v -i "warn" | tee -a "$LOG"
step "study rc=$?"
timeout "${EXPORT_S:-180}" python3 -m autotune export --gpu "$profile" --storage "$db" \
  --cases "$cases" --out "tables/$profile.py" 2>&1 | grep -v -i "warn" | tee -a "$LOG"
step "export rc=$?"
cp "tables/$profile.py" "$OUT/${profile}_after.py"
timeout "${TABLE_BENCH_S:-150}" python3 -m autotune bench --table "tables/$profile.py" \
  --baseline "$OUT/${profile}_before.py" --cases "$cases" \
  --anchors "${ANCHORS:-sdpa+reduce-overhead}" --hot-path --csv "$OUT/bench_${profile}_study.csv" \
  2>&1 | grep -v -i "warn\|_cuda_set_sync_debug_mode" | tee -a "$LOG"
step "bench rc=$?"
