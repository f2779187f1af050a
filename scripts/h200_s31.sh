#!/usr/bin/env bash
# Session 31 (after the H100 call, docs/kernels_h200.md "Session 31"): on the H200, with the
# Gluon heads attention's key mask read once a sequence (cc4eca4: full and right-padded
# sequences masked by position, no byte loads a head; the scale folded into the exponent):
# 1. its GPU tests (tests/kernels/test_gluon_heads.py: holes, right-padded, mixed, full
#    masks; several sequences a program; pdl bit for bit) as the gate;
# 2. case 6's and 1's kernel profiles of the entry beside the Gluon heads plans (one
#    process a case: the prediction is checked against the same-process entry);
# 3. where the tests passed, the export of the Gluon heads plans for the rows cases
#    (session 29's plans: case 6's heads form, with and without pdl; one, two and four heads
#    a program where the shape takes them), in what is left after the ncu's share;
# 4. where the Gluon kernels wait (scripts/h200_s31_ncu.sh) in what is left.
# Returned (8 files): s31.log (with the ncu's lines), s31_tests.log, s24_export.log,
# studies.db, h200.py and the three ncu source pages.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/s31.log"
END=${END:-575}  # the call's seconds in all
quiet() { grep -v -i warn | grep -v "retry =" | grep -v "leaked"; }
step "GPU tests: the Gluon heads attention"
KERNELS_TEST_DEVICE=cuda timeout 200 python3 -m pytest -v -rfE -p no:cacheprovider \
  tests/kernels/test_gluon_heads.py 2>&1 | quiet > "$OUT/s31_tests.log"
rc=${PIPESTATUS[0]}
grep -v " PASSED \| SKIPPED " "$OUT/s31_tests.log" | tail -25 | tee -a "$LOG"
echo "pytest rc=$rc" | tee -a "$LOG"
if [ "$rc" -ne 0 ]; then
  step "the heads attention fails: stage by stage"
  timeout 90 python3 scripts/gluon_heads_debug.py 2>&1 | quiet | tee -a "$LOG" | tail -40
fi
python3 - <<'PY' || { echo "plan files not written: stop" | tee -a "$LOG"; exit 1; }
import json
from autotune.runtime import load_table
t = load_table("tables/h200.py")
for c in ("1", "6"):
    plan = next(e["plan"] for e in t.entries.values() if e.get("case") == c)
    json.dump(plan, open(f"/tmp/s31_c{c}.json", "w"))
PY
if [ "$rc" -eq 0 ]; then
  step "case 6 kernel profile: the entry, the heads form with both Gluon kernels (pdl end; post rows at 4 and 8 warps)"
  timeout 120 python3 scripts/kernel_profile.py --case 6 --forwards 5 @/tmp/s31_c6.json \
    @docs/plans/s29/c6_heads_gluon4_pdl_end.json @docs/plans/s31/c6_heads_gluon4_w8_pdl_end.json 2>&1 | quiet | tee -a "$LOG" | tail -14
  step "case 1 kernel profile: the entry, two heads a program"
  timeout 60 python3 scripts/kernel_profile.py --case 1 --forwards 5 @/tmp/s31_c1.json \
    @docs/plans/s29/heads_gluon_g2.json 2>&1 | quiet | tee -a "$LOG" | tail -14
fi
# the export measures into the H200's table: on any other card, the ncu takes the rest
if [ "$rc" -eq 0 ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  left=$(( END - SECONDS - 130 ))  # 130 s kept for the ncu of the heads attention
  echo "export: $left s" | tee -a "$LOG"
  OVERLAYS='' CASES=${CASES:-6,1,5,11} \
    EXTRA_PLANS=${EXTRA_PLANS-'docs/plans/s29/c{case}_heads_gluon4.json docs/plans/s29/c{case}_heads_gluon4_pdl_end.json docs/plans/s31/c{case}_*.json docs/plans/s29/heads_gluon_g*.json'} \
    TOTAL=$left bash scripts/h200_s24_export.sh
  echo "export: rc=$? at ${SECONDS}s" | tee -a "$LOG"
fi
NCU_LOG=s31.log TOTAL=$(( END - SECONDS )) bash scripts/h200_s31_ncu.sh
