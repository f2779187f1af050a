#!/usr/bin/env bash
# Session 14, first call (planned in session 13), TOTAL seconds (default 540), log
# $OUT/s14_first.log. What session 13 changed without a device, measured:
# - `autotune kernels check` on the device (the stats-first polynomial checks, the fp16
#   context of the flash and polynomial kernels);
# - the fp16 context (the attention kernels round once on their store, which the output
#   projection did after them: the same bits): benched on the table's entries it touches,
#   cases 8 and 10 (per-layer Triton attention, fp16 GEMMs), 6 and 13 (fused rows), beside
#   the reduce-overhead anchor, with kernel counts. Predictions: case 8 ~1.25 ms (the 4
#   fp32 -> fp16 casts gone, ~1.20 ms of GPU time, target <= 1.3), case 6 ~10.8 ms, case 13
#   ~0.88 ms, case 10 a few us less;
# - case 8's kernel profile (where its remaining ~0.65 ms above the floor goes);
# - case 14's prefix scan as one flat loop (pipelining across chunk boundaries; the same
#   sums): scripts/poly_tiles.py, shipped vs the output kernel's best with and without it.
# Returned: s14_first.log, bench_s14.csv.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s14_first.log"
TOTAL=${TOTAL:-540}
left() { echo $(( TOTAL - SECONDS )); }
step "kernels check"
timeout 150 python3 -m autotune kernels check 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -4
step "bench cases 8, 10, 6, 13 ($(left) s left)"
[ "$(left)" -gt 90 ] && timeout "$(( $(left) - 60 ))" python3 -m autotune bench --gpu h200 \
  --cases 8,10,6,13 --anchors sdpa+reduce-overhead --hot-path --csv "$OUT/bench_s14.csv" 2>&1 \
  | grep -v -i warn | tee -a "$LOG" | tail -10
step "case 8 profile ($(left) s left)"
[ "$(left)" -gt 30 ] && timeout "$(( $(left) - 5 ))" python3 scripts/kernel_profile.py --case 8 \
  "$(python3 -c "
import importlib.util, json
spec = importlib.util.spec_from_file_location('t', 'tables/h200.py')
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
print(json.dumps(m.ENTRIES[(64, 128, 1024, 4, 1024, 4, True, 'float32')]['plan']))
")" 2>&1 | grep -v -i warn | tee -a "$LOG"
step "case 14's polynomial kernels: kernel 1 as one flat loop ($(left) s left)"
[ "$(left)" -gt 40 ] && timeout "$(( $(left) - 5 ))" python3 scripts/poly_tiles.py \
  --until "$(( $(left) - 35 ))" shipped out_best out_best_flat out_best_flat_s3 out_best_flat_s4 \
  2>&1 | grep -v -i warn | tee -a "$LOG"
step "done"
