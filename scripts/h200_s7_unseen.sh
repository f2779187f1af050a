#!/usr/bin/env bash
# Issue 23's measurement on the H200: 30 random shapes (batch 1-128, seq 32-1024, case 2's
# other dims), none in the table, served by the table with buckets; 4 of them (spread over
# the list) also get a 10-trial study of their own (warm-started from the table), whose
# best plan is timed beside the bucket's. CSV appended per shape (resumable).
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
T=${TABLE:-tables/h200.py}
DB=${UNSEEN_DB:-sqlite:///$OUT/unseen_studies.db}
[ -f "${CSV_IN:-/nonexistent}" ] && cp "$CSV_IN" "$OUT/unseen.csv"
[ -f "${DB_IN:-/nonexistent}" ] && cp "$DB_IN" "$OUT/unseen_studies.db"
shapes=$(python3 -m autotune unseen --table "$T" --gpu h200 --case 2 --count 30 --list \
  | tr ';' '\n' | awk 'NR % 8 == 1' | paste -sd';')
if [ -f "$OUT/unseen.csv" ]; then  # resumed: tune only the shapes not yet measured
  shapes=$(python3 - "$shapes" "$OUT/unseen.csv" <<'PY'
import csv, sys
done = {(r["batch"], r["seq"]) for r in csv.DictReader(open(sys.argv[2]))}
print(";".join(s for s in sys.argv[1].split(";") if tuple(s.split(",")[:2]) not in done))
PY
)
fi
echo "tuned shapes: $shapes"
[ -n "$shapes" ] && timeout "${STUDY_TIMEOUT:-100}" python3 -m autotune study --gpu h200 --cases "$shapes" \
  --n-trials 10 --warm-start "$T" --storage "$DB" --quiet 2>&1 | grep -v -i warn \
  | tee "$OUT/unseen_study.log" | tail -6
timeout "${UNSEEN_TIMEOUT:-200}" python3 -m autotune unseen --table "$T" --gpu h200 --case 2 \
  --count 30 --csv "$OUT/unseen.csv" --tuned --storage "$DB" 2>&1 | grep -v -i warn \
  | tee "$OUT/unseen.log" | tail -34
