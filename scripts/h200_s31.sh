#!/usr/bin/env bash
# Session 31: the first call and the first export in one call, because starts were scarce
# (session 30: one call ran, eleven starts were refused). Step 1 is scripts/h200_s29_first.sh
# with the tests session 30 fixed (TESTS_K) and case 6's and 2's profiles (the entry beside
# the Gluon plans); step 2 is scripts/h200_s24_export.sh with the Gluon post rows' overlays
# and session 29's heads plans for cases 6 and 2, in what is left of the call. The export
# judges every plan by the rule on its own, so it runs whatever the tests said. Returned:
# s29_first.log, s29_tests.log, s24_export.log, studies.db, h200.py.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
END=${END:-575}  # the call's seconds in all
TESTS_K=${TESTS_K-"right or support or several_a_program"} PROFILE_CASES=${PROFILE_CASES-"6 2"} \
  TOTAL=${FIRST_S:-330} bash scripts/h200_s29_first.sh
echo "first step: rc=$? after ${SECONDS}s" | tee -a "$OUT/s29_first.log"
OVERLAYS=${OVERLAYS-gluon} CASES=${CASES:-6,2} EXTRA_PLANS=${EXTRA_PLANS-'docs/plans/s29/c{case}_*.json'} \
  TOTAL=$(( END - SECONDS )) bash scripts/h200_s24_export.sh
