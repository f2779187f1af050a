#!/usr/bin/env bash
# Issue 17 on the H200, session 6, second call: (1) which fused-layer plan faulted case 6
# in the first call (each alone, CUDA_LAUNCH_BLOCKING=1); (2) where the device time of the
# best fused-layer plans goes (profiler, per kernel); (3) studies of every case the fused
# layers serve (new space: fused_layer priors first; export re-measures the incumbent);
# (4) export one case per process until the call's deadline.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
base='"attention":"triton","attn_precision":"fp16","gemm_precision":"fp16","cuda_graph":true'
plan() {  # variant block_m block_n warps stages row_block row_warps
  echo "{$base,\"fused_layer\":\"$1\",\"attn_block_m\":$2,\"attn_block_n\":$3,\"attn_warps\":$4,\"attn_stages\":$5,\"row_block\":$6,\"row_warps\":$7}"
}
CUDA_LAUNCH_BLOCKING=1 timeout 75 python3 scripts/isolate_plans.py --case 6 --timeout 70 \
  "$(plan heads 64 64 4 2 64 4)" \
  2>&1 | grep -v -i warn | tail -40 | tee "$OUT/case6_isolate.log"
for c in "2 $(plan heads 32 32 4 2 16 4)" "13 $(plan rows 64 64 4 2 64 4)"; do
  timeout 60 python3 scripts/kernel_profile.py --case ${c%% *} "${c#* }" 2>&1 | grep -v -i warn \
    | tee -a "$OUT/kernel_profile.log"
done
timeout -s INT "${STUDY_WALL:-230}" python3 -m autotune study --gpu h200 --cases "${CASES:-2,3,4,7,12,13,1,5,9,10,11}" \
  --n-trials "${TRIALS:-4}" --timeout "${BUDGET:-200}" --quiet 2>&1 \
  | grep -v -i warn | tee "$OUT/study.log" | tail -14
cp studies.db "$OUT/studies.db"
for c in ${EXPORT_CASES:-2 3 4 7 12 13 1 5 10 11 9}; do
  [ "$SECONDS" -lt "${EXPORT_DEADLINE:-500}" ] || { echo "export: deadline before case $c" | tee -a "$OUT/export.log"; break; }
  timeout 90 python3 -m autotune export --gpu h200 --finalists 2 --anchors sdpa+reduce-overhead \
    --cases "$c" 2>&1 | grep -v -i warn | tee -a "$OUT/export.log" | tail -2
done
cp tables/h200.py "$OUT/h200.py"
