#!/usr/bin/env bash
# Issue 17, planned in session 19: the rows cases re-studied in the GPU space that has
# row_next_qkv and pdl (its first priors are v40's two rows plans with the chain, then
# case 13's with pdl: session 20's pdl run), in the project's studies.db, then exported
# into tables/h200.py with 3 finalists each, ranked under the host headroom; the
# incumbents are tables/h200.py's entries. Run scripts/h200_s20_pdl.sh first: if pdl
# fails on the device, its priors here fail too (recorded, no trial counted twice).
# Session 19 measured the chain alone on case 13 at 843.6 us against 873.0 (one process).
# About 9 minutes: studies ${STUDY_S:-270} s, export ~3 min.
# Usage (device): AUTOTUNE_COMMIT=... bash scripts/h200_s20_chain.sh
# Returned: studies.db, h200.py (tables/h200.py after the export), s20_chain.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
CASES=${CASES:-13,1,9}
LOG="$OUT/s20_chain.log"
cp studies.db "$OUT/studies.db"
cp tables/h200.py "$OUT/h200.py"
DB="sqlite:///$OUT/studies.db"
step "study cases $CASES in the space with row_next_qkv, ${STUDY_S:-270} s"
timeout -s INT $(( ${STUDY_S:-270} + 60 )) python3 -m autotune study --gpu h200 --cases "$CASES" \
  --n-trials "${TRIALS:-12}" --timeout "${STUDY_S:-270}" --trial-timeout 90 --storage "$DB" \
  --quiet 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -8
step "export cases $CASES into tables/h200.py, 3 finalists"
timeout "${EXPORT_S:-240}" python3 -m autotune export --gpu h200 --storage "$DB" \
  --out "$OUT/h200.py" --cases "$CASES" --finalists 3 --anchors sdpa+reduce-overhead 2>&1 \
  | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -12
step "done"
