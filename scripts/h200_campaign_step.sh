#!/usr/bin/env bash
# Issue 20: one step of the campaign from an empty studies.db, resumable across device calls.
# The campaign's storage is docs/results/h200/campaign/studies.db (committed after every
# call and carried back in with the tree); a step starts from it (or from nothing: the
# first step), works at most $STEP_S seconds, and returns it through $OUT with a log line
# of the seconds it spent, so that the campaign's GPU-minutes of study and export add up
# from the logs (target: cases 1-14 within 25, cases 1-13 within 20).
#   PHASE=study  CASES=1-7 STUDY_S=480   studies (resumed: a case with trials continues)
#   PHASE=export CASES=1-7               export into docs/results/h200/campaign/h200.py
#                                        (kept entries of other cases; anchors measured beside)
# Usage (device): AUTOTUNE_COMMIT=... PHASE=study CASES=1-7 bash scripts/h200_campaign_step.sh
# Returned: campaign_studies.db, campaign_h200.py (export), campaign_<phase>_<cases>.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
PHASE=${PHASE:?PHASE=study or export}
CASES=${CASES:?CASES=1-7 (a case spec)}
DIR=docs/results/h200/campaign
LOG="$OUT/campaign_${PHASE}_${CASES//,/_}.log"
if [ -f "$DIR/studies.db" ]; then cp "$DIR/studies.db" "$OUT/campaign_studies.db"; fi
DB="sqlite:///$OUT/campaign_studies.db"
[ -f "$DIR/h200.py" ] && cp "$DIR/h200.py" "$OUT/campaign_h200.py"
start=$SECONDS
case "$PHASE" in
  study)
    step "campaign study, cases $CASES, ${STUDY_S:-480} s"
    timeout -s INT $(( ${STUDY_S:-480} + 60 )) python3 -m autotune study --gpu h200 \
      --cases "$CASES" --n-trials "${TRIALS:-40}" --timeout "${STUDY_S:-480}" \
      --trial-timeout 90 --storage "$DB" --quiet 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -16
    ;;
  export)
    step "campaign export, cases $CASES"
    timeout "${EXPORT_S:-540}" python3 -m autotune export --gpu h200 --storage "$DB" \
      --out "$OUT/campaign_h200.py" --cases "$CASES" --finalists 2 \
      --anchors sdpa+reduce-overhead ${VERIFIED:+--verified "$VERIFIED"} 2>&1 \
      | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -18
    ;;
  *) echo "PHASE must be study or export, got '$PHASE'" >&2; exit 2 ;;
esac
echo "campaign $PHASE $CASES: $(( SECONDS - start )) s of device time" | tee -a "$LOG"
