"""``autotune validate``: re-verify and re-time every entry of a table on the device at hand.

For a table made elsewhere (another GPU or torch/triton, or an ``--emulate`` run) this is
what a user runs before trusting it: every admitted entry is checked on the official 5
seeds plus padded inputs and re-timed against the reference in one interleaved run.
Entries that are wrong make the command fail; entries that still pass but no longer beat
the reference beyond the noise are reported. A table the runtime refuses here is said so
once, and none of its entries "holds": an entry that passes is "verified here", and with
``--out`` the entries verified here are written as a new table whose provenance is this
device and stack (the table given is never edited). A table's buckets are verified again
at their corners and centre (gate and timing); those that hold are written too.

A shape the dense reference cannot run (case 14) is verified as the export verified it:
the entry's plan on every seed's whole batch against the streamed oracle (one seed with
``--quick``), under the profile's memory cap when emulated; it holds when no element
fails. There is no dense reference time at such a shape: its whole-batch time is quoted
beside the table's, and, where it held on the 5 official seeds, the plan is timed as the
export timed it, against the streamed oracle on the bench's batch subset; with that time
``--out`` re-issues the entry with this device's whole-batch evidence. ``--no-oracle``
skips these entries (the oracle runs ~40 s a seed on an H200).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from autotune.core.cases import Case, CaseKey, get_case, parse_custom
from autotune.core.files import Journal
from autotune.core.outcome import Outcome, OutcomeKind
from autotune.core.profiles import ProfileSelection
from autotune.core.reference import ACCURACY_SEEDS
from autotune.evaluate import evaluate_plan
from autotune.judge.gate import SELECTION_GATE, CaseBench
from autotune.measure import TimingSettings
from autotune.plan import REFERENCE_PLAN, Plan
from autotune.runtime import DispatchTable, compatibility_problems

HOLDS = "holds"
VERIFIED_HERE = "verified here"  # passes and wins here, but the runtime refuses the table
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
    key: tuple | None = None
    entry: dict | None = None
    full_batch: dict | None = None  # an oracle-judged shape's whole-batch evidence, here

    @property
    def written(self) -> bool:
        """Whether ``--out`` writes an entry for it (a skipped one has no key)."""
        return self.key is not None and self.entry is not None

    @property
    def reissued(self) -> bool:
        """Whether ``--out`` ships its plan: it held here and was timed here."""
        return self.written and self.verdict in (HOLDS, VERIFIED_HERE) and self.outcome is not None


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


def validate_on_oracle(
    key: tuple,
    case: Case,
    plan: Plan,
    entry: dict,
    selection: ProfileSelection,
    seeds: tuple[int, ...],
    refused: bool = False,
    log: Callable[[str], None] = print,
) -> EntryCheck:
    """An entry of a shape the dense reference cannot run: its plan on the whole batch of
    each seed against the streamed oracle (``autotune long``'s judge), capped to the
    profile's memory when emulated."""
    from autotune.judge.fullbatch import full_batch_evidence, route_for, verify_full_batch

    device = selection.device
    if device.type != "cuda":
        return EntryCheck(
            case.id,
            plan.describe(),
            CANNOT_RUN,
            "the streamed oracle of this shape needs a CUDA GPU (hours on the CPU); "
            "--no-oracle skips it",
        )
    try:
        route = route_for(selection.profile.name, plan, device)
        (record,) = verify_full_batch(case, [route], seeds=seeds, log=log)
    except (RuntimeError, ValueError) as exc:  # out of memory, a plan this stack refuses
        return EntryCheck(case.id, plan.describe(), CANNOT_RUN, f"{type(exc).__name__}: {exc}")
    if record.error:  # before the summary: a route that ended early has no medians
        return EntryCheck(case.id, plan.describe(), CANNOT_RUN, record.error)
    s = record.summary()
    was = (entry.get("evidence") or {}).get("full_batch", {}).get("median_wall_s")
    detail = (
        f"whole batch against the streamed oracle: {s['failed']} failed of {s['elements']} "
        f"elements over {len(s['seeds'])} seed(s), worst {s['worst_budget_share']:.3f} of the "
        f"allowance, {s['median_wall_s']:.3f} s a forward, peak "
        f"{s['peak_memory_bytes'] / 2**30:.2f} GiB"
        + (f", guard {s['guard_paths']}" if s["guard_paths"] else "")
        + (f"; table said {was:.3f} s" if was else "")
        + " (no dense reference time at this shape)"
    )
    verdict = WRONG if s["failed"] else (VERIFIED_HERE if refused else HOLDS)
    full = full_batch_evidence(s, "verified by validate")
    return EntryCheck(case.id, plan.describe(), verdict, detail, None, key, entry, full)


def timed_on_oracle_subset(
    check: EntryCheck, case: Case, plan: Plan, selection: ProfileSelection, timing: TimingSettings
) -> EntryCheck:
    """An oracle-judged entry whose whole batch held on the 5 official seeds, timed here as
    the export timed it: gated and timed against the streamed oracle on the bench's batch
    subset (rows are independent), and judged as a dense entry is (wrong, cannot run, no
    longer wins beyond the noise). Where it holds, ``--out`` re-issues it with this time."""
    subset = "against the streamed oracle on the bench's batch subset ('ref' is the oracle)"
    try:
        bench = CaseBench(case, selection.effective_device())
        try:
            outcome = evaluate_plan(
                bench,
                plan,
                timing=timing,
                gate=SELECTION_GATE,
                capacity_bytes=selection.capacity_bytes,
            )
        finally:
            bench.release()
    except (RuntimeError, ValueError) as exc:  # out of memory building the bench, say
        return dataclasses.replace(
            check, verdict=CANNOT_RUN, detail=f"{check.detail}; {subset}: "
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        )  # fmt: skip
    if outcome.kind is OutcomeKind.WRONG_RESULT:
        verdict = WRONG
    elif not outcome.passed or outcome.timing is None:
        verdict = CANNOT_RUN
    elif outcome.timing.speedup - 1.0 > outcome.timing.noise:
        verdict = check.verdict  # holds (or verified here)
    else:
        verdict = NO_LONGER_WINS
    return dataclasses.replace(
        check,
        verdict=verdict,
        detail=f"{check.detail}; {subset}: {outcome.summary_line()}",
        outcome=outcome if verdict == check.verdict else None,
    )


def validate_entry(
    key: tuple,
    entry: dict,
    selection: ProfileSelection,
    timing: TimingSettings,
    refused: bool = False,
    oracle_seeds: tuple[int, ...] | None = ACCURACY_SEEDS,
) -> EntryCheck:
    """``oracle_seeds``: the seeds of a shape the dense reference cannot run (None: skip
    such entries)."""
    case = case_for_key(key, entry.get("case"))
    plan = Plan.from_dict(entry.get("plan", {}))
    if not entry.get("admitted"):
        return EntryCheck(case.id, "reference", SKIPPED, "the entry keeps the reference")
    if case.regime == "infeasible-dense":
        if oracle_seeds is None:
            return EntryCheck(
                case.id,
                plan.describe(),
                SKIPPED,
                "the dense reference cannot run this shape (--no-oracle: not verified "
                "against the streamed oracle)",
            )
        check = validate_on_oracle(key, case, plan, entry, selection, oracle_seeds, refused)
        if check.verdict in (HOLDS, VERIFIED_HERE) and tuple(oracle_seeds) == ACCURACY_SEEDS:
            check = timed_on_oracle_subset(check, case, plan, selection, timing)
        return check
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
        verdict = (VERIFIED_HERE if refused else HOLDS) if wins else NO_LONGER_WINS
        was = entry.get("evidence", {}).get("speedup")
        detail = outcome.summary_line() + (f"; table said {was:.2f}x" if was else "")
    return EntryCheck(case.id, plan.describe(), verdict, detail, outcome, key, entry)


@dataclasses.dataclass
class BucketCheck:
    """One bucket verified again on this device at its corners and centre."""

    label: str
    plan: str
    verdict: str
    detail: str
    bucket: dict | None = None  # the bucket with this device's evidence, where it holds


def validate_bucket(
    bucket: dict, selection: ProfileSelection, refused: bool = False, isolate: bool = True
) -> BucketCheck:
    from autotune.core.isolate import call_isolated
    from autotune.ship import buckets as b

    draft = b.draft_of(bucket)
    ((plan, _),) = draft.plans
    job = b.VerifyJob(draft, selection.profile.name, selection.emulated)
    result, problem = call_isolated(b.verify_draft, job) if isolate else (b.verify_draft(job), "")
    if result is None:
        # The verifier's line names the plan again: said once, before it.
        problem = problem.removeprefix(plan.describe()).strip()
        return BucketCheck(draft.label(), plan.describe(), CANNOT_RUN, problem)
    fresh, notes = result
    if fresh is not None:
        points = fresh["evidence"]["points"]
        speedups = [p["speedup"] for p in points]
        detail = (
            f"{len(points)} shapes, worst share "
            f"{max(p['worst_budget_share'] or 0.0 for p in points):.3f}, "
            f"{min(speedups):.2f}x-{max(speedups):.2f}x"
        )
        return BucketCheck(
            draft.label(), plan.describe(), VERIFIED_HERE if refused else HOLDS, detail, fresh
        )
    kind, _, detail = notes[0].partition(": ") if notes else ("", "", "no result")
    verdict = {b.WRONG: WRONG, b.SLOWER: NO_LONGER_WINS}.get(kind, CANNOT_RUN)
    detail = detail.removeprefix(plan.describe()).strip()
    return BucketCheck(draft.label(), plan.describe(), verdict, detail)


_Check = TypeVar("_Check", "EntryCheck", "BucketCheck")


@dataclasses.dataclass
class Validation:
    """What ``validate_table`` found: each entry's check, and why the runtime refuses the
    table here (integrity first: a table whose content fails its hash is not run at all
    unless ``allow_reference``)."""

    checks: list[EntryCheck]
    integrity: list[str]
    compatibility: list[str]
    bucket_checks: list[BucketCheck] = dataclasses.field(default_factory=list)

    @property
    def refused(self) -> bool:
        return bool(self.integrity or self.compatibility)

    def count(self, verdict: str) -> int:
        return sum(c.verdict == verdict for c in [*self.checks, *self.bucket_checks])

    def exit_code(self, *, allow_reference: bool = False, allow_missing: bool = False) -> int:
        """1 for a wrong entry; for a table the runtime refuses (unless ``allow_reference``);
        for an entry that cannot run or crashed here (unless ``allow_missing``)."""
        if self.count(WRONG):
            return 1
        if self.refused and not allow_reference:
            return 1
        if self.count(CANNOT_RUN) and not allow_missing:
            return 1
        return 0


def validate_table(
    table: DispatchTable,
    selection: ProfileSelection,
    timing: TimingSettings,
    emit: Callable[[str], None] = print,
    cases: set[str] | None = None,
    allow_reference: bool = False,
    oracle_seeds: tuple[int, ...] | None = ACCURACY_SEEDS,
    skip_buckets: str | None = None,
    journal: Journal | None = None,
) -> Validation:
    """Every entry (of ``cases``) verified and timed here, then, unless ``cases`` or
    ``skip_buckets`` (why not) is given, every bucket. With a ``journal``
    (``validate_journal``), each finished check is recorded as it ends, and one recorded
    earlier is not run again (one that could not run here is tried again)."""
    integrity = list(table.problems)
    compatibility = compatibility_problems(table, selection.device)
    result = Validation([], integrity, compatibility)
    if integrity:
        emit(f"table refused: {'; '.join(integrity)}")
        if not allow_reference:
            emit("nothing validated (--allow-reference validates its entries anyway)")
            return result
    if compatibility:
        emit(
            f"the runtime refuses this table here: {'; '.join(compatibility)}; its entries "
            "are verified on this device below (none of them 'holds' for this table)"
        )
    from autotune.core.cases import case_sort_key

    def case_order(key: tuple[object, ...]) -> tuple[int, str]:
        return case_sort_key(str(table.entries[key].get("case", "")))

    recorded = f" (as recorded in {journal.path})" if journal is not None else ""
    for key in sorted(table.entries, key=case_order):
        if cases is not None and table.entries[key].get("case") not in cases:
            continue
        check, was = _journaled(
            journal,
            {"entry": list(key)},
            lambda key=key: validate_entry(
                key, dict(table.entries[key]), selection, timing, result.refused, oracle_seeds
            ),
            entry_check_to_json,
            entry_check_from_json,
        )
        note = recorded if was else ""
        emit(f"case {check.case:<8} {check.verdict:<15} {check.plan}  {check.detail}{note}")
        result.checks.append(check)
    if cases is not None:
        skip_buckets = skip_buckets or "--cases selects entries only"
    if table.buckets and skip_buckets:
        emit(f"{len(table.buckets)} buckets not checked ({skip_buckets})")
    for bucket in table.buckets if not skip_buckets else ():
        bcheck, was = _journaled(
            journal,
            {"bucket": bucket},
            lambda bucket=bucket: validate_bucket(dict(bucket), selection, result.refused),
            dataclasses.asdict,
            lambda d: BucketCheck(**d),
        )
        note = recorded if was else ""
        emit(f"bucket {bcheck.label}: {bcheck.verdict}: {bcheck.plan}  {bcheck.detail}{note}")
        result.bucket_checks.append(bcheck)
    verdicts = (HOLDS, VERIFIED_HERE, NO_LONGER_WINS, WRONG, CANNOT_RUN, SKIPPED)
    emit(
        ", ".join(
            f"{result.count(v)} {v}" for v in verdicts if v != VERIFIED_HERE or result.refused
        )
    )
    return result


def _journaled(
    journal: Journal | None,
    key: dict,
    run: Callable[[], _Check],
    dump: Callable[[_Check], dict],
    load: Callable[[dict], _Check],
) -> tuple[_Check, bool]:
    """A check as ``journal`` recorded it (and True), else run now (and False) and
    recorded unless it could not run or was skipped (a rerun tries those again)."""
    done = journal.get(key) if journal is not None else None
    if done is not None:
        return load(done), True
    check = run()
    if journal is not None and check.verdict not in (CANNOT_RUN, SKIPPED):
        journal.add(key, dump(check))
    return check, False


def entry_check_to_json(check: EntryCheck) -> dict:
    d = dataclasses.asdict(check) | {"outcome": check.outcome.to_json() if check.outcome else None}
    d["key"] = list(check.key) if check.key is not None else None
    return d


def entry_check_from_json(data: dict) -> EntryCheck:
    outcome = Outcome.from_json(data["outcome"]) if data.get("outcome") else None
    key = tuple(data["key"]) if data.get("key") is not None else None
    return EntryCheck(**(data | {"outcome": outcome, "key": key}))


def validate_journal(
    out: Path,
    table: DispatchTable,
    selection: ProfileSelection,
    timing: TimingSettings,
    oracle_seeds: tuple[int, ...] | None,
) -> Journal:
    """Where ``validate --out OUT`` records its finished checks (``OUT.validate.jsonl``,
    beside it): the same command run again after a cut (a device call's time limit,
    Ctrl-C) resumes there. A record counts for the same table content, device, software,
    code, timing protocol and oracle seeds only."""
    from autotune.core.profiles import CPU_THREADS_ENV
    from autotune.evaluate import FAULT_ENV
    from autotune.ship.buckets import code_digest

    env = selection.environment()
    stamp = {k: env[k] for k in ("profile", "emulated", "device", "versions")}
    stamp |= {
        "code": code_digest(),
        "table": table.content_hash,
        "timing": dataclasses.asdict(timing),
        "oracle_seeds": list(oracle_seeds) if oracle_seeds is not None else None,
        # CPU timing threads and (tests only) injected faults change verdicts too
        "env": {k: os.environ.get(k) for k in (CPU_THREADS_ENV, FAULT_ENV)},
    }
    return Journal(out.with_name(f"{out.stem}.validate.jsonl"), stamp)


def update_target(out: Path, selection: ProfileSelection) -> DispatchTable:
    """The table ``validate --update`` writes into: an intact, unedited table at ``out`` of
    the profile validated under, which the runtime serves on this device and stack (its
    kept entries were verified here); ``ValueError`` (one line, the value and the fix)
    otherwise, before anything is verified."""
    from autotune.ship.export import check_out

    profile = selection.profile.name
    if not out.is_file():
        raise ValueError(
            f"--update: --out {str(out)!r} is not a file; give the {profile!r} table whose "
            "entries for the validated cases are replaced, or leave --update out to write "
            "a new table"
        )
    fix = "give this device's table of that profile, or leave --update out and give a new --out"
    target = check_out(out, profile, fresh=False, who="validate --update", fix=fix)
    problems = compatibility_problems(target, selection.device)
    if problems:
        raise ValueError(
            f"--update: the runtime refuses {out} here ({'; '.join(problems)}): its entries "
            f"were not verified on this device and stack, and would be kept beside ones that "
            f"were: {fix}"
        )
    return target


@dataclasses.dataclass
class Written:
    """What ``write_verified_table`` did: the path and version written (None: nothing was,
    an update that changes no entry), and for an update how each entry fared."""

    path: Path | None
    version: int
    replaced: int = 0  # the table's entries replaced by plans verified here
    added: int = 0  # plans verified here where the table had no entry
    added_reference: int = 0  # the reference where the table had no entry (nothing held)
    demoted: int = 0  # the table's own plan failed here: the reference serves instead
    held_own: int = 0  # the validated plan did not hold here: the table's entry stays
    untouched: int = 0  # the table's entries of cases not validated


def write_verified_table(
    table: DispatchTable,
    validation: Validation,
    selection: ProfileSelection,
    out: Path,
    command: str,
    update: DispatchTable | None = None,
    emit: Callable[[str], None] = print,
) -> Written:
    """The entries verified here as a table for the profile validated under (provenance:
    this device and stack, and the table they came from); entries that do not hold here
    keep the reference.

    ``update`` (the table at ``out``, ``update_target``): an entry verified here replaces
    its entry of that case; where the validated plan does not hold here the table's own
    entry stays, unless it is that very plan and the plan was wrong or cannot run here (the
    reference serves then); its other entries are kept as they are, its buckets as export
    keeps them, and its provenance under ``updated_from`` (``export.updated_from``).
    Nothing is written where no entry changes, or where the file changed while the
    validation ran (``ValueError``)."""
    from autotune.ship.export import (
        entries_from_winners,
        kept_buckets,
        table_provenance,
        updated_from,
        write_table,
    )
    from autotune.ship.select import Winner

    if validation.integrity:
        raise ValueError(
            f"--out: {table.source} fails its integrity check; a table is only re-issued "
            "from an intact one"
        )
    if out.resolve() == Path(table.source).resolve():
        raise ValueError(f"--out {str(out)!r} is the table validated: write a new file")
    written: list[tuple[EntryCheck, Winner]] = []
    for check in validation.checks:
        if not check.written:
            continue
        assert check.key is not None and check.entry is not None
        ev = check.entry.get("evidence", {})
        o = check.outcome
        admitted = check.reissued
        plan = Plan.from_dict(check.entry.get("plan", {})) if admitted else REFERENCE_PLAN
        reason = f"validated here: {check.verdict}: {check.detail}"
        if check.verdict in (HOLDS, VERIFIED_HERE) and o is None:
            reason += (
                "; not re-issued: not timed here (an oracle-judged shape is timed only after "
                "its whole batch held on the 5 official seeds: not with --quick)"
            )
        winner = Winner(
            case_id=check.case,
            case_key=tuple(check.key),
            plan=plan,
            admitted=admitted,
            reason=reason,
            study=ev.get("study", ""),
            trial=ev.get("trial"),
            space_hash=ev.get("space_hash", ""),
            timing=o.timing if admitted and o else None,
            peak_memory_bytes=o.peak_memory_bytes if admitted and o else None,
            ref_peak_memory_bytes=o.ref_peak_memory_bytes if admitted and o else None,
            seeds=o.seeds_checked if admitted and o else 0,
            padded_seeds=o.padded_seeds_checked if admitted and o else 0,
            worst_budget_share=(o.report.budget_share if admitted and o and o.report else None),
            full_batch=check.full_batch,  # as export keeps a failed one's
        )
        written.append((check, winner))
    extra: dict = {
        "validated_from": {
            "table": table.source,
            "version": table.version,
            "content_hash": table.content_hash,
            "versions": dict(table.provenance.get("versions", {})),
            "device": dict(table.provenance.get("device", {})),
        }
    }
    # The new table is this device's (the profile validated under), not the given table's:
    # an H200 table validated on an H100 is an 'h100' table, as buckets, unseen, report and
    # plot on that device want.
    profile = selection.profile.name
    if update is None:
        buckets = [c.bucket for c in validation.bucket_checks if c.bucket is not None]
        provenance = table_provenance(selection, command, **extra)
        path, version = write_table(
            out, profile, provenance, [w for _, w in written], buckets=buckets
        )
        return Written(path, version)
    result = Written(None, update.version)
    winners = []
    for check, winner in written:
        own = update.entries.get(tuple(winner.case_key))
        if winner.admitted:
            winners.append(winner)
            if own is None:
                result.added += 1
            else:
                result.replaced += 1
        elif own is None:
            winners.append(winner)
            result.added_reference += 1
        elif (
            own.get("admitted")
            and own.get("plan_hash") == Plan.from_dict((check.entry or {}).get("plan", {})).hash
            and check.verdict in (WRONG, CANNOT_RUN)
        ):
            winners.append(winner)
            result.demoted += 1
        else:
            result.held_own += 1
    chosen = {tuple(w.case_key) for w in winners}
    kept = {tuple(k): dict(e) for k, e in update.entries.items() if tuple(k) not in chosen}
    result.untouched = len(kept) - result.held_own
    if not winners:
        return result
    from autotune.runtime.table import load_table

    now = load_table(out) if out.is_file() else None
    if now is None or now.content_hash != update.content_hash or now.version != update.version:
        raise ValueError(
            f"--update: {out} changed while this validation ran (version {update.version} "
            f"then, {now.version if now else 'no file'} now): nothing written; run the "
            "validation again"
        )
    extra["updated_from"] = updated_from(update)
    provenance = table_provenance(selection, command, **extra)
    emulate = " --emulate" if selection.emulated else ""
    rebuild = f"'autotune buckets --table {out} --gpu {profile}{emulate}'"
    final = kept | entries_from_winners(winners)
    buckets = kept_buckets(update, final, provenance, emit, rebuild=rebuild)
    result.path, result.version = write_table(
        out, profile, provenance, winners, kept=kept, buckets=buckets
    )
    return result
