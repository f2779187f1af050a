"""Session 49: the step `autotune validate` now adds for an oracle-judged entry that held
on the 5 seeds (case 14), run alone on the device at hand: the table's case-14 plan gated
and timed against the streamed oracle on the bench's batch subset under the official
protocol, as the export timed it (autotune.tools.validate.timed_on_oracle_subset). The
whole-batch check before it (5 seeds, ~40 s each) is not run here; its verdict is assumed.
Prints the detail line and the seconds it took.

    python3 scripts/s49_c14_timing.py [--table tables/h200.py] [--gpu auto]
"""

from __future__ import annotations

import argparse
import time

from autotune.core.profiles import select_profile
from autotune.measure import OFFICIAL_TIMING
from autotune.plan import Plan
from autotune.runtime import load_table
from autotune.tools import validate as v


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", default="tables/h200.py")
    p.add_argument("--gpu", default="auto")
    args = p.parse_args()
    table = load_table(args.table)
    ((key, entry),) = [(k, e) for k, e in table.entries.items() if e.get("case") == "14"]
    case = v.case_for_key(key, "14")
    plan = Plan.from_dict(entry["plan"])
    selection = select_profile(args.gpu)
    held = v.EntryCheck("14", plan.describe(), v.VERIFIED_HERE, "(whole batch assumed held)")
    start = time.perf_counter()
    check = v.timed_on_oracle_subset(held, case, plan, selection, OFFICIAL_TIMING)
    took = time.perf_counter() - start
    print(f"case 14 on {selection.device.name}: {check.verdict}: {check.detail}")
    issued = check.outcome is not None
    print(f"timed on the oracle's batch subset in {took:.1f} s; re-issued: {issued}")
    was = entry.get("evidence", {})
    print(f"the table said {was.get('speedup')}x ({was.get('plan_median_ms')} ms against "
          f"{was.get('ref_median_ms')} ms)")  # fmt: skip
    return 0 if check.outcome is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
