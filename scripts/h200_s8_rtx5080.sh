#!/usr/bin/env bash
# Issue 19 part 1 on the H200: RTX 5080 studies under emulation (16 GiB allocator cap,
# the profile's shared-memory limit), warm-started from the H200 table (the entry of the
# same shape first), into studies.db (carried in from the repo, brought back in $OUT); then
# cold studies of two cases in a storage of their own, to count the trials the warm start
# saved (scripts/warm_vs_cold.py, run anywhere). Both are resumable: rerun to continue.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
[ -f "$OUT/studies.db" ] || cp studies.db "$OUT/studies.db"
[ -f docs/results/rtx5080/cold_studies.db ] && cp docs/results/rtx5080/cold_studies.db "$OUT/"
timeout -s INT "${WARM_WALL:-330}" python3 -m autotune study --gpu rtx5080 --emulate \
  --cases "${CASES:-2,3,4,7,12,1,5,9,10,11,13,8,6}" --n-trials "${TRIALS:-10}" \
  --warm-start tables/h200.py --storage "sqlite:///$OUT/studies.db" --quiet 2>&1 \
  | grep -v -i warn | tee "$OUT/rtx5080_study.log" | tail -16
timeout -s INT "${COLD_WALL:-150}" python3 -m autotune study --gpu rtx5080 --emulate \
  --cases "${COLD_CASES:-2,13}" --n-trials "${TRIALS:-10}" \
  --storage "sqlite:///$OUT/cold_studies.db" --quiet 2>&1 \
  | grep -v -i warn | tee "$OUT/rtx5080_cold.log" | tail -4
