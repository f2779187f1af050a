#!/usr/bin/env bash
# Planned in session 36 (H200, about 5 minutes): issue 17's case 2 (<= 40 us of GPU time a
# forward). Session 36's v55 entry (weights_first + pdl) ran 41.5 us a forward; with 16-row
# query blocks (32 heads programs) 39.9 us in a slower process (1.17x the entry there).
# 1. case 2's kernel profile, the v55 entry beside the variants, in one process: busy GPU
#    time a forward (busy_us: pdl's overlapping waits once, since c4b511a);
# 2. a study and export of cases 2 and 3 with the overlays (scripts/h200_s24_export.sh):
#    attn_block_m 16, with 8 attention warps, 8 warps alone.
# Returned: s37_c2.log, studies.db, h200.py, s24_export.log. Where the table changed, the
# whole bench follows in its own call (rows of two tables never mix):
#   AUTOTUNE_COMMIT=<head> PHASE=bench CASES=1-13 BENCH_S=540 bash scripts/h200_campaign_step.sh
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s37_c2.log"
P=docs/plans/s36
step "case 2: kernel profile (busy GPU time), the v55 entry and its variants"
timeout 120 python3 scripts/kernel_profile.py --case 2 --forwards 10 @$P/c2_wf_pdl.json \
  @$P/c2_wf_pdl_bm16.json @$P/c2_wf_pdl_aw8.json 2>&1 | grep -v -i warn | tee -a "$LOG"
step "cases 2, 3: study and export with the query-block overlays"
OVERLAYS='{"attn_block_m": 16};{"attn_block_m": 16, "attn_warps": 8};{"attn_warps": 8}' \
  CASES=2,3 bash scripts/h200_s24_export.sh 2>&1 | tail -12 | tee -a "$LOG"
step "done"
