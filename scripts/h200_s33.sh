#!/usr/bin/env bash
# Session 33's first call, on an H100 or the H200 (the buckets only on the H200), on main
# with two branches' kernel files beside it, untracked at the root:
#   git show s32-heads-pipeline:kernels/gluon_heads.py > gluon_heads_pipeline.py
#   git show s32-post-rows-lnsmem:kernels/gluon_rows.py > gluon_rows_next.py
#   git show s32-post-rows-lnsmem:tests/kernels/test_gluon_rows.py > test_gluon_rows_next.py
# 1. where case 6's kernels wait (ncu PC sampling, scripts/h200_s31_ncu.sh): main's heads
#    attention and post rows, then the pipelined heads attention (session 32: 13% slower,
#    cause open; docs/kernels_h200.md, "Session 32"; afterwards, on the CPU: python3
#    scripts/ncu_summary.py ncu_src_c6_heads.csv --against ncu_src_c6_heads_pipeline.csv);
# 2. the post rows of branch s32-post-rows-lnsmem (the residual load beside the last GEMM,
#    s32-post-rows-w2, and the late LayerNorm's weight and bias in shared memory) against
#    main's, after the Gluon GPU tests (scripts/h200_s32_ab.sh, cases 6 and 5);
# 3. on an H200, in what is left: the buckets rebuilt (resumes from its journal in $OUT).
# Returned (8 files at most): s33.log, ncu_src_c6_heads.csv, ncu_src_c6_post.csv,
# ncu_src_c6_heads_pipeline.csv, s32_ab.log, s32_tests.log, h200.py, h200.buckets.jsonl.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s33.log"
TOTAL=${TOTAL:-570}  # fits (device_prelude.sh) counts against it
END=$TOTAL
for f in gluon_heads_pipeline.py gluon_rows_next.py test_gluon_rows_next.py; do
  [ -f "$f" ] || { echo "$f missing (see the header of $0)" | tee -a "$LOG"; exit 2; }
done
cp kernels/gluon_heads.py /tmp/gluon_heads_main.py
cp kernels/gluon_rows.py /tmp/gluon_rows_main.py
cp tests/kernels/test_gluon_rows.py /tmp/test_gluon_rows_main.py
restore() {
  cp /tmp/gluon_heads_main.py kernels/gluon_heads.py
  cp /tmp/gluon_rows_main.py kernels/gluon_rows.py
  cp /tmp/test_gluon_rows_main.py tests/kernels/test_gluon_rows.py
}
trap restore EXIT

step "ncu: main's heads attention and post rows (case 6)"
NCU_LOG=s33.log TOTAL=$(( END - SECONDS - 300 )) \
  ITEMS="6:heads:_heads_attention_gluon_kernel:5 6:post:_post_rows_gluon_kernel:5" \
  bash scripts/h200_s31_ncu.sh
step "ncu: the pipelined heads attention (case 6)"
cp gluon_heads_pipeline.py kernels/gluon_heads.py
NCU_LOG=s33.log TOTAL=$(( END - SECONDS - 250 )) TAG=_pipeline \
  ITEMS="6:heads:_heads_attention_gluon_kernel:5" bash scripts/h200_s31_ncu.sh
restore

if fits 240 "the post rows' A/B"; then
  step "A/B: branch s32-post-rows-lnsmem's post rows against main's"
  cp gluon_rows_next.py kernels/gluon_rows.py  # and its tests (its shared-bytes formula)
  cp test_gluon_rows_next.py tests/kernels/test_gluon_rows.py
  KERNEL=kernels/gluon_rows.py BASE=/tmp/gluon_rows_main.py CASES="6 5" \
    TESTS="tests/kernels/test_gluon_rows.py tests/kernels/test_gluon_heads.py" \
    bash scripts/h200_s32_ab.sh 2>&1 | tail -30 | tee -a "$LOG"
  restore
fi

if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  left=$(( END - SECONDS - 10 ))
  if [ "$left" -gt 60 ]; then
    step "buckets of tables/h200.py ($left s; resumable)"
    timeout "$left" python3 -m autotune buckets --table tables/h200.py --gpu h200 \
      --out "$OUT/h200.py" 2>&1 | grep -v -i warn | tail -20 | tee -a "$LOG"
  fi
else
  echo "not an H200: no buckets" | tee -a "$LOG"
fi
step "done"
