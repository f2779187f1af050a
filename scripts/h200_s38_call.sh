#!/usr/bin/env bash
# Planned in session 37 (H200, at most ~9 minutes; PHASES picks a subset, in this order):
#   bench  finish version 56's bench (cases 9-13; cases 1-8 of bench_v56_partial.csv are
#          skipped), into $OUT/bench.csv: commit it as docs/results/h200/bench.csv (move the
#          old one to bench_s36.csv first) and regenerate the report (README, "Next device
#          calls");
#   c3     case 3 studied and exported with the overlay that won case 2 in session 37 (16
#          query rows a program, 8 attention warps): $OUT/h200.py, studies.db;
#   c14    case 14's whole 32-sequence exact forward profiled (busy against wall, each
#          kernel's sum): where the 77 ms between the 8-sequence profile (x4: 2.991 s) and
#          the timed forward (3.068 s) go.
# Returned: bench.csv, campaign_bench_1-13.log, s24_export.log, studies.db, h200.py,
# s38_c14.log. A table changed by c3 is version 57: its bench is a whole new one, in its own
# call (rows of two tables never mix; the bench above stays version 56's record).
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
PHASES=${PHASES:-bench c3 c14}
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "not an H200: nothing run"; exit 3
fi
for phase in $PHASES; do
  case "$phase" in
    bench)
      cp docs/results/h200/bench_v56_partial.csv docs/results/h200/bench.csv
      PHASE=bench CASES=1-13 BENCH_S=${BENCH_S:-330} bash scripts/h200_campaign_step.sh 2>&1 | tail -30
      ;;
    c3)
      OVERLAYS='{"attn_block_m": 16, "attn_warps": 8}' CASES=3 TOTAL=${EXPORT_S:-200} \
        bash scripts/h200_s24_export.sh 2>&1 | tail -8
      ;;
    c14)
      source scripts/device_prelude.sh >/dev/null
      LOG="$OUT/s38_c14.log"
      step "case 14: the whole exact forward (32 sequences, chunks of 4), profiled"
      timeout 120 python3 scripts/kernel_profile.py --case 14 --batch 32 --warmup 1 --forwards 1 \
        @docs/plans/c14_exact_cudnn_b4_ln.json 2>&1 | grep -v -i warn | tee -a "$LOG" | head -30
      ;;
    *) echo "PHASES: bench, c3, c14; got '$phase'" >&2; exit 2 ;;
  esac
done
