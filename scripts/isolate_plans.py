"""Each plan on one case in its own process, with export's gate (5 + 5 padded seeds) and
timing: which plan faults the device (a fault ends only its process), and how.

    CUDA_LAUNCH_BLOCKING=1 python3 scripts/isolate_plans.py --case 13 PLAN_JSON [PLAN_JSON ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

CHILD = """
import sys, traceback
from autotune.core.cases import get_case
from autotune.core.device import detect_device
from autotune.evaluate import evaluate_many
from autotune.judge.gate import SELECTION_GATE, CaseBench
from autotune.plan import parse_plan
from autotune.ship.select import SELECTION_TIMING
plan = parse_plan(sys.argv[2])
bench = CaseBench(get_case(sys.argv[1]), detect_device('auto'))
try:
    (o,) = evaluate_many(bench, [plan], timing=SELECTION_TIMING, gate=SELECTION_GATE, prune=False)
except Exception:
    traceback.print_exc()
    sys.exit(3)
t = o.timing
print('outcome', o.kind.value, o.message[:300], o.report.summary() if o.report else '',
      f'speedup {t.speedup:.2f}x {t.cand_median_ms:.4f} ms' if t else '')
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("--timeout", type=float, default=150)
    parser.add_argument("plans", nargs="+")
    args = parser.parse_args()
    worst = 0
    for plan in args.plans:
        print(f"== case {args.case}: {plan}", flush=True)
        try:
            done = subprocess.run(
                [sys.executable, "-c", CHILD, args.case, plan], timeout=args.timeout, check=False
            )
            rc = done.returncode
        except subprocess.TimeoutExpired:
            rc = 124
        print(f"-> exit {rc}", flush=True)
        worst = max(worst, rc)
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
