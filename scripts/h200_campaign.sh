#!/usr/bin/env bash
# Issue 8, piece 1 on the H200: cases 1-13 from an empty studies.db (budget weighted by
# regime), then a fresh export of tables/h200.py. Every artefact is copied to $OUT as
# soon as it exists, so a call cut short still brings back what it finished.
# Usage (device): STUDY_TIMEOUT=360 bash scripts/h200_campaign.sh
set -o pipefail
source scripts/device_prelude.sh
rm -f studies.db
start=$(date +%s)
python3 -m autotune study --gpu h200 --cases 1-13 --n-trials 80 \
  --timeout "${STUDY_TIMEOUT:-360}" --trial-timeout 90 --quiet 2>&1 | tee "$OUT/study.log"
echo "study wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/study.log"
cp studies.db "$OUT/studies.db"
start=$(date +%s)
timeout "${EXPORT_TIMEOUT:-170}" python3 -m autotune export --gpu h200 --fresh 2>&1 \
  | tee "$OUT/export.log"
echo "export wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/export.log"
cp tables/h200.py "$OUT/h200.py"
