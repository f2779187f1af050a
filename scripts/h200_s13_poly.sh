#!/usr/bin/env bash
# Session 13, last call: case 14's polynomial kernels under other tiles and warps, and the
# stats-first output kernel (row statistics before the prefix dots: one accumulator
# fewer, meant to end the output kernel's 54 spilled registers a thread at 4 warps), on one
# sequence of case 14 (S 100,000, 16 heads of 64), in one process: us per call of each
# kernel, registers and spills, error against float64 on the first 4096 rows. Then the
# polynomial kernel checks on the device. TOTAL seconds (default 270), log $OUT/s13_poly.log.
set -o pipefail
source scripts/device_prelude.sh
LOG="$OUT/s13_poly.log"
TOTAL=${TOTAL:-270}
step "polynomial kernels: tiles, warps, stats-first"
timeout $(( TOTAL - 40 )) python3 scripts/poly_tiles.py --until $(( TOTAL - 90 )) 2>&1 \
  | grep -v -i warn | tee -a "$LOG"
step "polynomial kernel checks on the device ($(( TOTAL - SECONDS )) s left)"
[ $(( TOTAL - SECONDS )) -gt 15 ] && timeout $(( TOTAL - SECONDS )) python3 -c "
from kernels import registry
for c in registry.iter_checks():
    if c.name.startswith('polynomial'):
        r = c.run('cuda')
        print('PASS' if r.passed else 'FAIL', c.name, r.detail)
" 2>&1 | grep -v -i warn | tee -a "$LOG"
step "done"
