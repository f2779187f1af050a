"""``autotune validate``: re-verify and re-time every entry of a table on the device at hand.

For a table made elsewhere (another GPU, or an ``--emulate`` run) this is what a user runs
before trusting it: every admitted entry is checked on the official 5 seeds plus padded
inputs and re-timed against the reference in one interleaved run. Entries that are wrong
make the command fail; entries that still pass but no longer beat the reference beyond the
noise are reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from autotune.core.cases import Case, CaseKey, get_case, parse_custom
from autotune.core.outcome import Outcome, OutcomeKind
from autotune.core.profiles import ProfileSelection
from autotune.evaluate import evaluate_plan
from autotune.judge.gate import SELECTION_GATE, CaseBench
from autotune.measure import TimingSettings
from autotune.plan import Plan
from autotune.runtime.dispatch import DispatchTable, compatibility_problems

HOLDS = "holds"
NO_LONGER_WINS = "no longer wins"
WRONG = "WRONG"
CANNOT_RUN = "cannot run here"
SKIPPED = "skipped"


@dataclasses.dataclass
class EntryCheck:
    case: str
    plan: str
    verdict: str
    detail: str
    outcome: Outcome | None = None


def case_for_key(key: tuple, case_id: str | None) -> Case:
    """The registered case with this key (by the id the table recorded), else a custom one."""
    ck = CaseKey(*key)
    if case_id:
        try:
            case = get_case(case_id)
            if case.key == ck:
                return case
        except ValueError:
            pass
    kind = "causal" if ck.causal else "noncausal"
    return parse_custom(
        f"{ck.batch_size},{ck.seq_len},{ck.d_model},{ck.num_heads},"
        f"{ck.ffn_dim},{ck.num_layers},{kind}"
    )


def validate_entry(
    key: tuple, entry: dict, selection: ProfileSelection, timing: TimingSettings
) -> EntryCheck:
    case = case_for_key(key, entry.get("case"))
    plan = Plan.from_dict(entry.get("plan", {}))
    if not entry.get("admitted"):
        return EntryCheck(case.id, "reference", SKIPPED, "the entry keeps the reference")
    if case.regime == "infeasible-dense":
        return EntryCheck(
            case.id,
            plan.describe(),
            SKIPPED,
            "the dense reference cannot run this shape (needs the oracle route)",
        )
    bench = CaseBench(case, selection.effective_device())
    outcome = evaluate_plan(
        bench, plan, timing=timing, gate=SELECTION_GATE, capacity_bytes=selection.capacity_bytes
    )
    bench.release()
    if outcome.kind is OutcomeKind.WRONG_RESULT:
        verdict, detail = WRONG, outcome.summary_line()
    elif not outcome.passed:
        verdict, detail = CANNOT_RUN, outcome.summary_line()
    else:
        t = outcome.timing
        assert t is not None
        wins = t.speedup - 1.0 > t.noise
        verdict = HOLDS if wins else NO_LONGER_WINS
        was = entry.get("evidence", {}).get("speedup")
        detail = outcome.summary_line() + (f"; table said {was:.2f}x" if was else "")
    return EntryCheck(case.id, plan.describe(), verdict, detail, outcome)


def validate_table(
    table: DispatchTable,
    selection: ProfileSelection,
    timing: TimingSettings,
    emit: Callable[[str], None] = print,
    cases: set[str] | None = None,
) -> list[EntryCheck]:
    notes = list(table.problems) + compatibility_problems(table, selection.device)
    for n in notes:
        emit(f"note: {n} (validating anyway: this run is the check)")
    checks = []
    for key in sorted(table.entries, key=str):
        if cases is not None and table.entries[key].get("case") not in cases:
            continue
        check = validate_entry(key, dict(table.entries[key]), selection, timing)
        emit(f"case {check.case:<8} {check.verdict:<15} {check.plan}  {check.detail}")
        checks.append(check)
    counts = {
        v: sum(c.verdict == v for c in checks)
        for v in (HOLDS, NO_LONGER_WINS, WRONG, CANNOT_RUN, SKIPPED)
    }
    emit(", ".join(f"{n} {v}" for v, n in counts.items()))
    return checks
