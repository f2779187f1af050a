#!/usr/bin/env bash
# Session 31 (after the H100 call, docs/kernels_h200.md "Session 31"): on the H200, the
# export of the Gluon heads plans for the rows cases (session 29's plans: case 6's heads
# form with both Gluon kernels, with and without pdl; one, two and four heads a program
# where the shape takes them), then, in what is left of the call, where the Gluon kernels
# wait (scripts/h200_s31_ncu.sh). Starts were scarce (session 30: eleven refused), so one
# call does both. Returned: s24_export.log, studies.db, h200.py, s31_ncu.log and the ncu
# source pages.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
END=${END:-575}  # the call's seconds in all
OVERLAYS=${OVERLAYS-} CASES=${CASES:-6,1,5,11} \
  EXTRA_PLANS=${EXTRA_PLANS-'docs/plans/s29/c{case}_heads_gluon4*.json docs/plans/s29/heads_gluon_g*.json'} \
  TOTAL=${EXPORT_S:-450} bash scripts/h200_s24_export.sh
echo "export: rc=$? after ${SECONDS}s" | tee -a "$OUT/s24_export.log"
TOTAL=$(( END - SECONDS )) bash scripts/h200_s31_ncu.sh
