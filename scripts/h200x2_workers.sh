#!/usr/bin/env bash
# Issue 21 on nvidia-h200-x2 (planned in session 11; run it as soon as `status` lists the
# kind), at most 9.5 minutes, log $OUT/workers.log: cases 1-4, 40 trials each, two workers
# sharing each case's study in one SQLite storage, each pinned to its own GPU
# (CUDA_VISIBLE_DEVICES, by --workers), nvidia-smi sampled every second; then one worker on
# the same trials in a storage of its own for the wall-time comparison; then the checks
# (scripts/workers_check.py: exactly 40 measured trials per study, no plan measured twice,
# each GPU's busy share). Returned: workers.log, workers2.db, workers1.db, smi2.csv, smi1.csv.
set -o pipefail
source scripts/device_prelude.sh
export AUTOTUNE_COMMIT=${AUTOTUNE_COMMIT:?set AUTOTUNE_COMMIT}
LOG="$OUT/workers.log"
nvidia-smi -L | tee -a "$LOG"
run() {  # workers db smi seconds
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader \
    -l 1 > "$OUT/$3" & smi=$!
  local t0=$SECONDS
  timeout -s INT "$4" python3 -m autotune study --gpu h200 --cases 1-4 --n-trials 40 \
    --workers "$1" --storage "sqlite:///$OUT/$2" --quiet 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -6
  echo "workers $1: wall $(( SECONDS - t0 )) s" | tee -a "$LOG"
  kill "$smi"
}
step "two workers"
run 2 workers2.db smi2.csv 300
step "one worker, the same trials"
run 1 workers1.db smi1.csv $(( 560 - SECONDS ))
step "checks"
python3 scripts/workers_check.py --storage "sqlite:///$OUT/workers2.db" --n-trials 40 \
  --smi "$OUT/smi2.csv" 2>&1 | tee -a "$LOG"
python3 scripts/workers_check.py --storage "sqlite:///$OUT/workers1.db" --n-trials 40 \
  --smi "$OUT/smi1.csv" 2>&1 | tee -a "$LOG"
step "done"
