#!/usr/bin/env bash
# Session 54's call (carry .whl): case 14's exact route with q, k, v rounded by sequence
# position (attn_drop_bits before attn_drop_late_from, attn_drop_bits_late from it on).
# Off an H200 nothing runs (exit 3) unless ANY_CARD=1. Logs and records in $OUT.
#   CHECKS=1 (default): tests/kernels/test_mantissa.py and `autotune kernels check --match
#     mantissa` compiled on the card.
#   ATTN=1 (default): the attention alone on q, k, v with each of DROPS_ALONE bits cleared
#     (scripts/operand_bits_power.py, under the power cap, SM clock and power beside it).
#   Then `autotune long --case 14 --seeds SEEDS`, one route per VARIANTS entry (knobs added
#     to docs/plans/c14_exact_cudnn_b4_ln.json, separated by ";"), each seed's oracle once,
#     each route's second whole-batch forward timed; within LONG_S seconds.
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT} PYTHONUNBUFFERED=1
card=$(nvidia-smi --query-gpu=name --format=csv,noheader)
if ! grep -q H200 <<< "$card" && [ "${ANY_CARD:-}" != 1 ]; then
  echo "$card: not an H200, nothing run (ANY_CARD=1 runs it here)"; exit 3
fi
source scripts/device_prelude.sh >/dev/null || exit 1
profile=h200; grep -q H200 <<< "$card" || profile=h100  # the lent kinds: H200 and H100
log="$OUT/s54_graded.log"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee "$log"
echo "commit $AUTOTUNE_COMMIT" | tee -a "$log"
if [ "${CHECKS:-1}" = 1 ]; then  # the rounding kernels compiled: bit for bit their reference
  KERNELS_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_mantissa.py 2>&1 | tail -3 | tee -a "$log"
  timeout 120 python3 -m autotune kernels check --match mantissa 2>&1 | tail -5 | tee -a "$log"
fi
if [ "${ATTN:-1}" = 1 ]; then
  timeout "${PROBE_S:-120}" python3 scripts/operand_bits_power.py --drop "${DROPS_ALONE:-0,2,4,6,7,8}" \
    --seconds "${PROBE_SECONDS:-2.5}" 2>&1 | grep -v -i "warn" | tee -a "$log"
fi
plan=$(cat docs/plans/c14_exact_cudnn_b4_ln.json)
routes=()
IFS=';' read -ra parts <<< "${VARIANTS:?set VARIANTS: knobs a route, separated by ;}"
for v in "${parts[@]}"; do
  [ -n "$v" ] && routes+=(--route "$profile=${plan%\}}, $v}")
done
timeout "${LONG_S:-420}" python3 -m autotune long --case 14 --seeds "${SEEDS:-1}" "${routes[@]}" \
  --out "$OUT/case14_s54_graded.json" 2>&1 | grep -v -i "warn" | tee "$OUT/case14_s54_graded.log"
