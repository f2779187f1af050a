#!/usr/bin/env bash
# Session 7, device call: (1) every shipped plan and the GPU space's Triton tiles under
# compute-sanitizer memcheck (scripts/memcheck_sweep.py, shards in parallel, to a
# deadline), then (2) buckets for tables/h200.py verified on the device (autotune
# buckets: corners and centre of each rectangle, gate + timing), written to $OUT only.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
if [ -z "${SKIP_MEMCHECK:-}" ]; then
  timeout $((${MEMCHECK_DEADLINE:-200} + 60)) python3 scripts/memcheck_sweep.py --shards 14 \
    --deadline "${MEMCHECK_DEADLINE:-200}" --out "$OUT/memcheck.csv" 2>&1 | tee "$OUT/memcheck.log" | tail -30
  tar czf "$OUT/memcheck_logs.tgz" -C "$OUT" memcheck.logs 2>/dev/null; rm -rf "$OUT/memcheck.logs"
fi
cp tables/h200.py /tmp/h200.py
timeout "${BUCKETS_TIMEOUT:-270}" python3 -m autotune buckets --table /tmp/h200.py --gpu h200 \
  --out "$OUT/h200.py" 2>&1 | grep -v -i warn | tee "$OUT/buckets.log" | tail -20
