#!/usr/bin/env bash
# Next device call (issue 16 follow-up): reproduce the export fault seen in session 5
# ("unspecified launch failure" at the fourth case of one export process, after cases 2, 4,
# 3), find the kernel with CUDA_LAUNCH_BLOCKING=1, then again without the anchor (is the
# compiled anchor needed?). Writes only to /tmp tables. Then the library-only baseline
# re-exported under today's rules (its 13 entries synchronise: mask=elide) and tests/device.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
export TRITON_INTERPRET=0
cp tables/h200.py /tmp/repro.py
CUDA_LAUNCH_BLOCKING=1 timeout 240 python3 -m autotune export --gpu h200 --finalists 2 \
  --anchors sdpa+reduce-overhead --cases 2-4,8 --in-process --out /tmp/repro.py 2>&1 \
  | tee "$OUT/repro_anchor.log" | tail -30
cp tables/h200.py /tmp/repro2.py
timeout 150 python3 -m autotune export --gpu h200 --finalists 2 --anchors none \
  --cases 2-4,8 --in-process --out /tmp/repro2.py 2>&1 | tee "$OUT/repro_no_anchor.log" | tail -8
timeout 150 python3 -m autotune export --gpu h200 --exclude-triton --out tables/h200_library.py \
  2>&1 | tee "$OUT/export_library.log" | tail -16
cp tables/h200_library.py "$OUT/"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/device 2>&1 | tee "$OUT/device_tests.log" | tail -6
