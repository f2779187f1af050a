#!/usr/bin/env bash
# Issue 16 on the H200, session 5, third call: the export of case 13 faulted the device
# ("unspecified launch failure"); each of its candidates alone in a process with export's
# gate and CUDA_LAUNCH_BLOCKING=1, then the export of cases 1-12 in two halves.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
CUDA_LAUNCH_BLOCKING=1 timeout 260 python3 scripts/isolate_plans.py --case 13 --timeout 80 \
  '{"attention":"sdpa_cudnn","attn_precision":"fp16","gemm_precision":"fp16","heads":"strided","layernorm":"triton","qkv":"packed"}' \
  '{"attention":"sdpa_cudnn","attn_precision":"fp16","cuda_graph":true,"heads":"strided","qkv":"packed"}' \
  '{"attention":"sdpa_auto","compile":"reduce-overhead"}' 2>&1 | tee "$OUT/isolate_case13.log" | grep -v Warning | tail -40
FIRST=${FIRST:-2-4,7-8,12} SECOND=${SECOND:-1,5-6,9-11} FIRST_WALL=150 SECOND_WALL=150 \
  bash scripts/h200_s5_export.sh --no-prelude
