#!/usr/bin/env bash
# Session 43's call (carry .whl and .whl-cudnn). On an H200: version 56's bench finished
# (scripts/s40_call.sh; BENCH_S passes through), then with PROBE=bits the operand bits probe
# below. On any other card, with PROBE=1: case 14's attention
# through every cuDNN execution plan and knob the cuDNN frontend can build
# (scripts/cudnn_attention_plans.py), timed under the power cap against PyTorch's SDPA,
# with the SM clock, power and throttle reasons sampled beside it; with PROBE=bits (session
# 44), the same attention on q, k, v with their lowest mantissa bits cleared
# (scripts/operand_bits_power.py; needs only .whl); otherwise nothing (exit 3). H200_ONLY=1:
# nothing off an H200 (exit 3 at once), whatever PROBE says. Logs in $OUT.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT} PYTHONUNBUFFERED=1
# PROBE=bits: case 14's attention on q, k, v with their low mantissa bits cleared, then the
# exact route at attn_drop_bits 0, 1, 2 (DROPS; or any knobs, VARIANTS) judged against one
# seed's oracle output: failed elements, worst share, a forward's time each. ATTN=0 skips the
# attention alone, LONG=0 the route.
operand_bits() {
  source scripts/device_prelude.sh >/dev/null || exit 1
  local log="$OUT/s44_operand_bits.log" plan routes=() parts=() v
  nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee "$log"
  [ "${ATTN:-1}" = 1 ] && timeout "${PROBE_S:-150}" python3 scripts/operand_bits_power.py \
    ${PROBE_ARGS:-} 2>&1 | grep -v -i "warn" | tee -a "$log"
  [ "${LONG:-1}" = 1 ] || return 0
  plan=$(cat docs/plans/c14_exact_cudnn_b4_ln.json)
  # VARIANTS: knobs added to the plan, one route each, separated by ";" (default: DROPS)
  local variants=${VARIANTS:-$(printf '"attn_drop_bits": %s;' ${DROPS:-0 1 2})}
  IFS=';' read -ra parts <<< "$variants"
  for v in "${parts[@]}"; do  # profile h100 off an H200: the lent kinds are H100 and H200
    [ -n "$v" ] && routes+=(--route "$1=${plan%\}}, $v}")
  done
  timeout "${LONG_S:-240}" python3 -m autotune long --case 14 --seeds 1 "${routes[@]}" \
    --out "$OUT/s44_drop_bits_long.json" 2>&1 | grep -v -i "warn" | tee "$OUT/s44_drop_bits_long.log"
}
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash scripts/s40_call.sh  # the bench first; the probe after it where PROBE=bits
  rc=$?
  [ "${PROBE:-}" = bits ] && operand_bits h200
  exit $rc
fi
if [ "${H200_ONLY:-}" = 1 ]; then  # the bench (and its probe) or nothing: exit at once
  nvidia-smi --query-gpu=name --format=csv,noheader; echo "not an H200: nothing run"; exit 3
fi
if [ "${PROBE:-}" = bits ]; then
  operand_bits h100
  exit $?
fi
[ "${PROBE:-}" = 1 ] || { nvidia-smi --query-gpu=name --format=csv,noheader; echo "not an H200: nothing run (PROBE=1: the cuDNN plans probe; PROBE=bits: the operand bits probe)"; exit 3; }
source scripts/device_prelude.sh >/dev/null || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site_cudnn .whl-cudnn/*.whl || exit 1
python3 -m zipfile -e .whl-cudnn/nvidia_cudnn_frontend-*-trimmed.zip /tmp/site_cudnn || exit 1
export PYTHONPATH=/tmp/site_cudnn:$PYTHONPATH
LOG="$OUT/s43_cudnn_plans.log"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee "$LOG"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active \
  --format=csv -lms 100 > "$OUT/s43_cudnn_plans_clocks.csv" & P=$!
timeout "${PROBE_S:-420}" python3 scripts/cudnn_attention_plans.py ${PROBE_ARGS:-} 2>&1 \
  | grep -v -i "warn" | tee -a "$LOG"
rc=$?
kill $P
exit $rc
