#!/usr/bin/env bash
# Session 50's second call (carry .whl). On an H200: scripts/s43_call.sh as the README's
# next device call 1 (pass its variables through). On any other card: `autotune validate
# --out` cut short and resumed, on the device: tables/h200.py's CASES (default 1-6) validated
# with --out under `timeout CUT_S` (default 45 s, a cut mid-way), then the same command again,
# which runs only the checks its journal (OUT.validate.jsonl) does not hold and writes the
# table. Logs in $OUT (s50_resume.log, with the seconds of each step).
set -o pipefail
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT} PYTHONUNBUFFERED=1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash scripts/s43_call.sh
fi
LOG="$OUT/s50_resume.log"
source scripts/device_prelude.sh > "$OUT/s50_resume_card.txt" || exit 1; cat "$OUT/s50_resume_card.txt"
validate() {
  timeout "$1" python3 -m autotune validate --table tables/h200.py --cases "${CASES:-1-6}" \
    --no-oracle --allow-reference --out "$OUT/validated.py" 2>&1 | grep -v -i "warn" \
    | tee -a "$LOG"
}
step "validate --cases ${CASES:-1-6}, cut at ${CUT_S:-45} s (commit $AUTOTUNE_COMMIT)"
validate "${CUT_S:-45}"
step "cut: rc=$?; journal lines: $(wc -l < "$OUT/validated.validate.jsonl" 2>/dev/null || echo none)"
validate "${RESUME_S:-200}"
step "resumed: rc=$?; journal left: $(ls "$OUT"/validated.validate.jsonl 2>/dev/null || echo none)"
