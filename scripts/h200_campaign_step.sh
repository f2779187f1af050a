#!/usr/bin/env bash
# Issue 20: one step of the campaign from an empty studies.db, resumable across device calls.
# The campaign's storage is docs/results/h200/campaign/studies.db (committed after every
# call and carried back in with the tree); a step starts from it (or from nothing: the
# first step), works at most $STEP_S seconds, and returns it through $OUT with a log line
# of the seconds it spent, so that the campaign's GPU-minutes of study and export add up
# from the logs (target: cases 1-14 within 25, cases 1-13 within 20).
#   PHASE=study  CASES=1-7 STUDY_S=480   studies (resumed: a case with trials continues)
#   PHASE=export CASES=1-7               export into docs/results/h200/campaign/h200.py
#                                        (kept entries of other cases; anchors measured beside,
#                                        ANCHORS=none for case 14, where no dense anchor runs)
#   PHASE=promote CASES=all              the campaign table, with buckets verified here, over
#                                        tables/h200.py (numbered after it) -> h200.py
#   PHASE=bench CASES=1-13               autotune bench of tables/h200.py with every anchor and
#                                        the hot path, resumable: docs/results/h200/bench.csv is
#                                        carried in only when its rows are of this table
# Usage (device): AUTOTUNE_COMMIT=... PHASE=study CASES=1-7 bash scripts/h200_campaign_step.sh
# Returned: campaign_studies.db, campaign_h200.py (export), h200.py (promote), bench.csv
# (bench), campaign_<phase>_<cases>.log.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
PHASE=${PHASE:?PHASE=study or export}
CASES=${CASES:?CASES=1-7 (a case spec)}
DIR=docs/results/h200/campaign
LOG="$OUT/campaign_${PHASE}_${CASES//,/_}.log"
# A step earlier in the same call has already brought the storage (and table) to $OUT and
# written to it there: never overwrite that with the tree's older copy.
if [ ! -f "$OUT/campaign_studies.db" ] && [ -f "$DIR/studies.db" ]; then
  cp "$DIR/studies.db" "$OUT/campaign_studies.db"
fi
DB="sqlite:///$OUT/campaign_studies.db"
if [ ! -f "$OUT/campaign_h200.py" ] && [ -f "$DIR/h200.py" ]; then
  cp "$DIR/h200.py" "$OUT/campaign_h200.py"
fi
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
      --anchors "${ANCHORS:-sdpa+reduce-overhead}" ${VERIFIED:+--verified "$VERIFIED"} 2>&1 \
      | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -18
    ;;
  promote)
    # The campaign table as this call has it: an export earlier in the same call wrote it.
    step "campaign promote: the campaign's h200.py with buckets over tables/h200.py"
    cp tables/h200.py "$OUT/h200.py"
    if ! timeout "${PROMOTE_S:-400}" python3 -m autotune buckets --table "$OUT/campaign_h200.py" \
        --gpu h200 --out "$OUT/h200.py" 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -14; then
      rm -f "$OUT/h200.py"  # not promoted: nothing comes back that looks like a new table
      echo "campaign promote FAILED (see above): tables/h200.py unchanged" | tee -a "$LOG"
    fi
    ;;
  bench)
    step "bench tables/h200.py, cases $CASES, every anchor, hot path"
    [ -f docs/results/h200/bench.csv ] && python3 -c "import sys; from autotune.tools.bench import read_csv
from autotune.runtime.table import load_table
h = load_table('tables/h200.py').content_hash
sys.exit(any(r.table_hash != h for r in read_csv('docs/results/h200/bench.csv')))" \
      && cp docs/results/h200/bench.csv "$OUT/bench.csv"
    timeout "${BENCH_S:-540}" python3 -m autotune bench --gpu h200 --table tables/h200.py \
      --cases "$CASES" --anchors all --hot-path --csv "$OUT/bench.csv" 2>&1 \
      | grep -v -i warn | tee -a "$LOG" | tail -22
    ;;
  *) echo "PHASE must be study, export, promote or bench, got '$PHASE'" >&2; exit 2 ;;
esac
echo "campaign $PHASE $CASES: $(( SECONDS - start )) s of device time" | tee -a "$LOG"
