#!/usr/bin/env bash
# Session 38's call. On an H200: version 56's bench finished (scripts/h200_s38_call.sh
# PHASES=bench), then case 14's chunks over 1 and 2 streams (scripts/s38_c14_streams.py)
# with the clocks sampled. On any other card (an A/B only, no H200 record): case 3's
# version 56 plan against it with 8 attention warps, and with 16 query rows + 8 warps
# (session 37's case 2 winner), kernel busy time and interleaved timing, to decide whether
# case 3's export with that overlay is worth an H200 call.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT} PYTHONUNBUFFERED=1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  PHASES=bench BENCH_S=${BENCH_S:-420} bash scripts/h200_s38_call.sh
  source scripts/device_prelude.sh >/dev/null
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active \
    --format=csv -lms 100 > "$OUT/s38_streams_clocks_h200.csv" & P=$!
  timeout 100 python3 scripts/s38_c14_streams.py --streams 1,2 --rounds 3 \
    @docs/plans/c14_exact_cudnn_b4_ln.json 2>&1 | grep -v -i warn | tee "$OUT/s38_streams_h200.log"
  kill $P
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/device/test_batch_streams.py 2>&1 \
    | tail -3 | tee -a "$OUT/s38_streams_h200.log"
  exit 0
fi
if [ "${AB:-}" = streams ]; then  # the batch_streams knob on the device: its test, its timing
  source scripts/device_prelude.sh >/dev/null
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/device/test_batch_streams.py 2>&1 \
    | tail -3 | tee "$OUT/s38_knob.log"
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active \
    --format=csv -lms 100 > "$OUT/s38_knob_clocks.csv" & P=$!
  timeout 120 python3 scripts/s38_c14_streams.py --streams 1,2 --rounds 3 \
    @docs/plans/c14_exact_cudnn_b4_ln.json 2>&1 | grep -v -i warn | tee -a "$OUT/s38_knob.log"
  kill $P
  exit 0
fi
[ -n "${AB:-}" ] || { echo "not an H200: nothing run (AB=1: case 3's A/B; AB=sdpa: layouts; AB=streams: batch_streams)"; exit 3; }
source scripts/device_prelude.sh >/dev/null
if [ "$AB" = sdpa ]; then  # case 14's attention through each SDPA backend and layout
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active \
    --format=csv -lms 100 > "$OUT/s38_sdpa_clocks.csv" & P=$!
  timeout 200 python3 scripts/s38_sdpa_layouts.py 2>&1 | grep -v -i warn | tee "$OUT/s38_sdpa.log"
  kill $P
  exit 0
fi
base='"attention": "triton", "attn_block_n": 128, "attn_precision": "fp16", "attn_stages": 1, "cuda_graph": true, "ffn_gelu": "poly", "fused_layer": "heads", "gemm_precision": "fp16", "pdl": true, "row_block": 16, "row_fold_residual": true, "row_next_norm": true, "row_warps": 8, "weights_first": true'
v56="{$base, \"attn_block_m\": 32}"
aw8="{$base, \"attn_block_m\": 32, \"attn_warps\": 8}"
bm16="{$base, \"attn_block_m\": 16, \"attn_warps\": 8}"
LOG="$OUT/s38_c3_ab.log"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$LOG"
timeout 150 python3 scripts/kernel_profile.py --case 3 --forwards 200 "$v56" "$aw8" "$bm16" 2>&1 \
  | grep -v -i warn | tee -a "$LOG"
timeout 200 python3 -m autotune compare --gpu h100 --cases 3 --plan "$v56" --plan "$aw8" \
  --plan "$bm16" 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -20
