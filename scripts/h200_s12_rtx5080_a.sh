#!/usr/bin/env bash
# Issue 19 part 1, first of three calls (planned in session 11), at most 9 minutes, log
# $OUT/s12_rtx5080_a.log: the two cases with no emulated RTX 5080 study yet, then the
# whole-batch record the export needs for case 14 under the 16 GiB cap:
# - case 11 (10 trials, warm-started from the H200 table: the entry of its shape first);
# - case 14 (6 trials, the host-I/O polynomial plan with the 2.25 guard and the host-I/O
#   Triton exact plan first; every plan without host I/O is refused before it runs);
# - `autotune long` of the host-I/O polynomial plan on the 5 official seeds under rtx5080
#   emulation -> $OUT/case14_rtx5080.json (export --verified takes it).
# Returned: s12_rtx5080_a.log, studies.db, case14_rtx5080.json. Resumable: rerun to continue.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s12_rtx5080_a.log"
cp studies.db "$OUT/studies.db"
DB="sqlite:///$OUT/studies.db"
P=docs/plans
step "rtx5080 emulated study, case 11"
timeout -s INT 120 python3 -m autotune study --gpu rtx5080 --emulate --cases 11 --n-trials 10 \
  --warm-start tables/h200.py --storage "$DB" --quiet 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -3
step "rtx5080 emulated study, case 14"
timeout -s INT 150 python3 -m autotune study --gpu rtx5080 --emulate --cases 14 --n-trials 6 \
  --warm-start "@$P/c14_poly_row_host_g225.json,@$P/c14_exact_triton_bounds_host.json" \
  --storage "$DB" 2>&1 | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -4
left=$(( 530 - SECONDS ))
step "case 14 under rtx5080 emulation, 5 official seeds ($left s left)"
timeout "$left" python3 -m autotune long --case 14 --seeds 5 \
  --route rtx5080=@$P/c14_poly_row_host_g225.json --out "$OUT/case14_rtx5080.json" 2>&1 \
  | grep -v -i warn | grep -v "guard paths" | tee -a "$LOG" | tail -3
step "done"
