"""Results: bench and validate a table, compare plans, report and plot studies."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.cli.common import (
    CliError,
    add_gpu,
    add_storage,
    check_table_profile,
    open_storage,
    selection,
)
from autotune.core.files import write_atomic

if TYPE_CHECKING:
    from autotune.runtime.table import DispatchTable
    from autotune.tools.validate import Validation, Written


def cmd_bench(args: argparse.Namespace) -> int:
    from autotune.core.cases import select_cases
    from autotune.plan import parse_anchors
    from autotune.runtime import compatibility_problems, load_table
    from autotune.tools.bench import bench_table, serves, summarise, table_cases

    table = load_table(args.table)
    anchors = parse_anchors(args.anchors)
    baseline = load_table(args.baseline) if args.baseline else None
    cases = select_cases(args.cases or table_cases(table))
    tables = [t for t in (table, baseline) if t is not None]
    served = any(serves(t, c) for t in tables for c in cases)
    if args.cases and all(t.usable for t in tables) and not served:
        held = table_cases(table)
        raise CliError(
            f"--cases {args.cases!r} names no case that an entry or a bucket of "
            f"{table.source}" + (f" or {baseline.source}" if baseline else "") + " is for "
            f"(its entries: cases {held or 'none'}), so each would time the reference "
            "against itself: give one of them, or leave --cases out"
        )
    chosen = selection(args)
    refused = list(table.problems) + compatibility_problems(table, chosen.device)
    if refused:
        print(f"autotune bench: table refused: {'; '.join(refused)}", file=sys.stderr)
        if not args.allow_reference:
            print("(--allow-reference benches the reference serving in its place)", file=sys.stderr)
            return 1
    rows = bench_table(
        table,
        cases,
        chosen,
        baseline=baseline,
        anchors=anchors,
        refused=bool(refused),
        hot_path=args.hot_path,
        csv_path=args.csv,
        emit=lambda line: print(line, flush=True),
    )
    print(summarise(rows))
    if args.csv:
        print(f"wrote {args.csv} (a row per case, appended as each ended)")
    return 1 if any(r.verdict == "FAIL" for r in rows) else 0


def cmd_validate(args: argparse.Namespace) -> int:
    from autotune.core.cases import case_sort_key, select_cases
    from autotune.core.reference import ACCURACY_SEEDS
    from autotune.measure import OFFICIAL_TIMING, STUDY_TIMING
    from autotune.runtime import load_table
    from autotune.tools.validate import (
        update_target,
        validate_journal,
        validate_table,
        write_verified_table,
    )

    table = load_table(args.table)
    if args.out and Path(args.out).resolve() == Path(args.table).resolve():
        raise CliError(f"--out {args.out!r} is the table validated: write a new file")
    if args.update and not args.out:
        raise CliError(
            "--update needs --out: the table of this device whose entries for the validated "
            "cases are replaced (e.g. --cases 14 --out tables/h100.py --update)"
        )
    chosen = selection(args)
    # before minutes of verification (a folder or an unwritable place: check_outputs)
    update = update_target(Path(args.out), chosen) if args.update else None
    if args.out and table.problems:
        raise CliError(
            f"--out: {table.source} fails its integrity check ({'; '.join(table.problems)}); "
            "a table is only re-issued from an intact one: restore it, or leave --out out"
        )
    command = "autotune validate " + " ".join(args.argv_text)
    timing = STUDY_TIMING if args.quick else OFFICIAL_TIMING
    oracle_seeds = None if args.no_oracle else ACCURACY_SEEDS[: 1 if args.quick else None]
    journal = None
    if args.out:  # a run cut short resumes: the same command again
        journal = validate_journal(Path(args.out), table, chosen, timing, oracle_seeds)
    # this very command's table, written just before a cut ended the run (its records
    # still in the journal): the rerun reports from them and writes nothing
    finished = None
    if journal is not None and journal.done:
        finished = _written_before_cut(Path(args.out), journal.path, table, command)
    if args.out and Path(args.out).exists() and update is None and finished is None:
        raise CliError(
            f"--out {args.out!r} exists; validate writes a new table and never replaces "
            "a file (it may hold a study's export): give a path that does not exist, "
            "or move that file away first (--update replaces only the validated cases' "
            "entries of this device's table there)"
        )
    cases = {c.id for c in select_cases(args.cases)} if args.cases else None
    held = sorted({str(e.get("case")) for e in table.entries.values()}, key=case_sort_key)
    if cases is not None and not cases & set(held):
        raise CliError(
            f"--cases {args.cases!r} names no entry of {table.source} (its entries: cases "
            f"{', '.join(held) or 'none'}); give one of them, or leave --cases out"
        )
    if journal is not None:
        if journal.stale:
            print(f"{journal.stale} line(s) of {journal.path} are of another table, device, "
                  "code or protocol: not used")  # fmt: skip
        if journal.done:
            print(f"{len(journal.done)} checks recorded in {journal.path}: those of this "
                  "run are not run again")  # fmt: skip
    result = validate_table(
        table,
        chosen,
        timing,
        cases=cases,
        allow_reference=args.allow_reference,
        oracle_seeds=oracle_seeds,
        skip_buckets=f"--update keeps those of {args.out}" if update is not None else None,
        journal=journal,
    )
    if finished is not None:
        print(
            f"{args.out} already holds this run's table (version {finished.version}, "
            "written before the run was cut): not written again"
        )
    elif args.out and (result.checks or result.bucket_checks):
        done = write_verified_table(table, result, chosen, Path(args.out), command, update=update)
        print(_update_line(done, args.out) if update is not None else _written_line(done, result))
    if journal is not None:
        # its checks are in the table (or said) now; another table's run under this code
        # may still resume from its lines (an --update run into the same file)
        own = journal.stamp
        journal.finish(
            keep=lambda stamp: (
                stamp.get("table") not in (None, own["table"]) and stamp.get("code") == own["code"]
            )
        )
    return result.exit_code(allow_reference=args.allow_reference, allow_missing=args.allow_missing)


def _written_before_cut(
    out: Path, journal: Path, table: DispatchTable, command: str
) -> DispatchTable | None:
    """The table at ``out`` when this validation wrote it and was cut before removing its
    journal's records: same command, same validated content, written after the journal's
    last record (a run cut mid-validation leaves records newer than the table there)."""
    from autotune.runtime import load_table

    if not out.is_file() or out.stat().st_mtime < journal.stat().st_mtime:
        return None
    try:
        written = load_table(out)
    except ValueError:  # not a table: the refusal names the file
        return None
    source = written.provenance.get("validated_from") or {}
    if written.problems or written.provenance.get("command") != command:
        return None
    return written if source.get("content_hash") == table.content_hash else None


def _written_line(done: Written, result: Validation) -> str:
    """``validate --out``'s last line: what the new table holds of what was validated."""
    written = [c for c in result.checks if c.written]
    good = sum(c.reissued for c in written)
    parts = [f"{good} of {len(result.checks)} entries verified here"]
    if len(written) > good:
        parts.append(f"{len(written) - good} written as the reference (not verified here)")
    if len(result.checks) > len(written):
        parts.append(
            f"{len(result.checks) - len(written)} left out (skipped or never run here: "
            "the new table has no entry for them)"
        )
    if result.bucket_checks:
        kept = sum(c.bucket is not None for c in result.bucket_checks)
        parts.append(f"{kept} of {len(result.bucket_checks)} buckets")
    return f"wrote {done.path} (table version {done.version}): {'; '.join(parts)}"


def _update_line(done: Written, out: str) -> str:
    """``validate --out --update``'s last line: how each entry of the table there fared."""
    counts = [
        (done.replaced, "replaced by plans verified here"),
        (done.added, "added, verified here"),
        (done.added_reference, "added as the reference (nothing held here)"),
        (done.demoted, "now the reference (the table's own plan failed here)"),
        (done.held_own, "kept (the validated plan did not hold here)"),
        (done.untouched, "other entries kept as they are"),
    ]
    parts = "; ".join(f"{n} {what}" for n, what in counts if n) or "no entries"
    if done.path is None:
        return f"nothing written to {out} (its version {done.version} stands): {parts}"
    return f"updated {done.path} (table version {done.version}): {parts}"


def cmd_compare(args: argparse.Namespace) -> int:
    from autotune.core.cases import select_cases
    from autotune.measure import OFFICIAL_TIMING, STUDY_TIMING
    from autotune.plan import parse_plan
    from autotune.runtime import load_table
    from autotune.tools.compare import compare_cases

    plans = [parse_plan(t) for t in args.plan or []]
    tables = [load_table(t) for t in args.table or []]
    if not plans and not tables:
        raise ValueError("give at least one --plan or --table")
    timing = OFFICIAL_TIMING if args.official else STUDY_TIMING
    cases, chosen = select_cases(args.cases), selection(args)  # bad input before any output
    for table in tables:
        for case in cases:
            entry = table.entries.get(case.key.as_tuple())
            if not (entry and entry.get("admitted")):
                print(
                    f"note: {table.source} ships no plan of its own for case {case.id} "
                    f"({'its entry keeps the reference' if entry else 'no entry'}): not a row",
                    file=sys.stderr,
                )
    rows = []
    # A markdown table: a header, its rule, a row per plan as it is measured.
    print(
        "| case | plan | kernels/forward | median us | host us/call | x reference | x first plan "
        "| verdict |\n|---|---|---:|---:|---:|---:|---:|---|"
    )
    for row in compare_cases(cases, chosen, plans, tables, timing):
        rows.append(row.to_json())

        def fmt(v: float | None, spec: str) -> str:
            return "-" if v is None else format(v, spec)

        def cell(text: str) -> str:  # an error message inside one markdown cell
            return " ".join(text.split()).replace("|", "/")

        print(
            f"| {row.case} | {row.plan} | {row.kernels if row.kernels is not None else '-'} | "
            f"{fmt(row.median_us, '.1f')} | {fmt(row.host_us, '.1f')} | "
            f"{fmt(row.speedup, '.2f')} | "
            f"{fmt(row.vs_first, '.2f')} | "
            + ("pass" if row.passed else "FAIL")
            + (f" ({cell(row.detail)})" if row.detail and not row.passed else "")
            + " |",
            flush=True,
        )
    if args.json:
        write_atomic(args.json, json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["passed"] for r in rows) else 1


def _table_or_none(path: str | None, profile: str):  # type: ignore[no-untyped-def]
    """The table given (it must exist, and be ``profile``'s), else ``tables/PROFILE.py``
    where there is one, else None."""
    from autotune.runtime import load_table

    table_path = Path(path or f"tables/{profile}.py")
    if path is None and not table_path.is_file():
        return None, table_path
    table = load_table(table_path)  # one that is missing or no table: one line, exit 2
    check_table_profile(table, profile)
    return table, table_path


def _studied_profile(name: str) -> str:
    """The profile whose studies plot and report read: ``auto`` is the device's here; an
    unknown name is refused in one line (not as a profile with no studies)."""
    from autotune.core.profiles import get_profile, select_profile

    return select_profile("auto").profile.name if name == "auto" else get_profile(name).name


def cmd_plot(args: argparse.Namespace) -> int:
    from autotune.tools.report import plot_studies, profile_studies, table_winners

    args.gpu = _studied_profile(args.gpu)
    table, _ = _table_or_none(args.table, args.gpu)  # a bad --table before any reading
    studies = profile_studies(open_storage(args.storage), args.gpu, args.case)
    if not studies:
        raise ValueError(
            f"no studies for profile {args.gpu!r}"
            + (f" and case {args.case!r}" if args.case else "")
            + f" in {args.storage}"
        )
    out = args.out or f"docs/results/{args.gpu}/pareto.png"
    out = plot_studies(studies, out, table_winners(table))
    print(f"wrote {out} ({len(studies)} studies)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autotune.tools.report import evaluation_markdown, profile_studies, write_report

    if args.evaluations:
        print(evaluation_markdown(args.evaluations))
        return 0
    args.gpu = _studied_profile(args.gpu)
    if args.notes and not Path(args.notes).is_file():
        raise ValueError(f"--notes {args.notes!r} does not exist; give a markdown file")
    if args.target is not None and not args.bench:
        raise ValueError(
            f"--target {args.target:g} needs --bench (an 'autotune bench --hot-path --csv' file)"
        )
    if args.target is not None and not 1.0 < args.target < float("inf"):
        raise ValueError(
            f"--target {args.target:g} is not a speedup above 1; give e.g. --target 25"
        )
    if args.bench_before and not args.bench:
        raise ValueError(f"--bench-before {args.bench_before!r} needs --bench (this run's CSV)")
    if args.bench_before and not Path(args.bench_before).is_file():
        raise ValueError(
            f"--bench-before {args.bench_before!r} does not exist; give an earlier "
            "'autotune bench --csv' file"
        )
    if args.bench_history and not args.bench:
        raise ValueError(
            f"--bench-history {args.bench_history[0]!r} needs --bench (this run's CSV)"
        )
    for path in args.bench_history or []:
        if not Path(path).is_file():
            raise ValueError(
                f"--bench-history {path!r} does not exist; give earlier 'autotune bench "
                "--csv' files"
            )
    if args.bench and not Path(args.bench).is_file():
        raise ValueError(
            f"--bench {args.bench!r} does not exist; give this run's 'autotune bench --csv' "
            "file, or leave --bench out"
        )
    if args.unseen and not Path(args.unseen).is_file():
        raise ValueError(f"--unseen {args.unseen!r} does not exist; give an 'autotune unseen' CSV")
    from autotune.tools.report import bench_frame, check_efficiency_record, check_unseen_csv

    for path in [args.bench, args.bench_before, *(args.bench_history or [])]:
        if path and Path(path).is_file():  # before anything is written
            bench_frame(path)
    if args.unseen:
        check_unseen_csv(args.unseen)
    for path in args.efficiency or []:
        check_efficiency_record(path)
    studies = profile_studies(open_storage(args.storage), args.gpu)
    table, table_path = _table_or_none(args.table, args.gpu)
    if not studies and table is None:
        raise ValueError(
            f"nothing to report for profile {args.gpu!r}: no studies in "
            f"{args.storage} and no {table_path}"
        )
    command = (
        " ".join(["autotune report", *sys.argv[2:]])
        if sys.argv[1:2] == ["report"]
        else f"autotune report --gpu {args.gpu}"
    )
    path = write_report(
        profile=args.gpu,
        studies=studies,
        table=table,
        bench_csv=args.bench,
        out_dir=args.out or f"docs/results/{args.gpu}",
        command=command,
        notes=args.notes,
        efficiency=args.efficiency,
        unseen_csv=args.unseen,
        target=args.target,
        bench_before=args.bench_before,
        bench_history=args.bench_history,
    )
    print(f"wrote {path}")
    return 0


def _span(text: str, name: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    if not (lo.isdigit() and hi.isdigit()) or not sep or not 1 <= int(lo) <= int(hi):
        raise ValueError(f"--{name} {text!r}: write LO-HI with 1 <= LO <= HI, e.g. 1-128")
    return int(lo), int(hi)


def cmd_unseen(args: argparse.Namespace) -> int:
    from autotune.core.cases import get_case
    from autotune.tools.unseen import draw_shapes, run_unseen, summary

    if args.count < 1:
        raise CliError(f"--count {args.count}: give the number of shapes to draw, 1 or more")
    chosen = selection(args)
    base = get_case(args.case)
    batch, seq = _span(args.batch, "batch"), _span(args.seq, "seq")
    if args.tuned:
        open_storage(args.storage)  # refuses one that does not exist, not creating it
    from autotune.runtime import load_table

    table = load_table(args.table)
    check_table_profile(table, chosen.profile.name)
    if args.list:
        shapes = draw_shapes(base, args.count, batch, seq, args.seed, set(table.entries))
        c = base.config
        kind = "causal" if c.causal else "noncausal"
        print(";".join(f"{b},{s},{c.d_model},{c.num_heads},{c.ffn_dim},{c.num_layers},{kind}"
                       for b, s in shapes))  # fmt: skip
        return 0
    rows = run_unseen(
        args.table,
        base,
        chosen.profile.name,
        chosen.emulated,
        count=args.count,
        batch=batch,
        seq=seq,
        seed=args.seed,
        csv_path=Path(args.csv) if args.csv else None,
        storage_url=args.storage if args.tuned else None,
        isolate=not args.in_process,
        gate_unseen=args.gate_unseen,
        emit=lambda line: print(line, flush=True),
    )
    print(summary(rows))
    wrong = sum(int(r.get("failed_elements") or 0) for r in rows)
    return 1 if wrong or any(r.get("served") == "error" for r in rows) else 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bench", help="official protocol: reference vs a table's dispatcher")
    p.add_argument("--table", required=True)
    p.add_argument("--cases", help="case spec (default: the table's cases)")
    p.add_argument("--baseline", help="another table, timed in the same interleaved run")
    p.add_argument(
        "--anchors",
        nargs="?",
        const="all",
        help="also the anchors a user would pick (sdpa, sdpa+reduce-overhead, "
        "max-autotune; default all), built and timed in the same run as the table",
    )
    p.add_argument(
        "--hot-path",
        action="store_true",
        help="also the table's host microseconds per call, device microseconds and kernels "
        "per forward (profiler), the ceiling, and whether steady calls sync (CUDA)",
    )
    add_gpu(p, default="auto")
    p.add_argument(
        "--csv",
        help="append each case's row to this CSV as it ends; cases it already holds for "
        "this table are not run again (resumable across calls)",
    )
    p.add_argument(
        "--allow-reference",
        action="store_true",
        help="bench a table the runtime refuses here (the reference serves; exit 0)",
    )
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("validate", help="re-verify and re-time every entry of a table here")
    p.add_argument("--table", required=True)
    add_gpu(p, default="auto")
    p.add_argument("--cases", help="only these cases (a case spec; default: every entry)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="study timing (seconds) instead of the official protocol; one seed for a shape "
        "verified against the streamed oracle",
    )
    p.add_argument(
        "--no-oracle",
        action="store_true",
        help="skip entries of shapes the dense reference cannot run (case 14): by default "
        "their whole batch is verified against the streamed oracle (~40 s a seed on an H200)",
    )
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="entries that cannot run (or crash) on this device do not fail the command",
    )
    p.add_argument(
        "--allow-reference",
        action="store_true",
        help="a table the runtime refuses here does not fail the command (its entries are "
        "verified anyway; an edited table's too)",
    )
    p.add_argument(
        "--out",
        help="write the entries verified here as a new table for the profile validated "
        "under (--gpu), with this device's provenance; each finished check is recorded "
        "in OUT.validate.jsonl beside it, so the same command run again after a cut "
        "resumes (its records removed once the table is written; those of another "
        "table's --update run cut short into the same OUT stay)",
    )
    p.add_argument(
        "--update",
        action="store_true",
        help="--out is this device's table of that profile: only its entries for the "
        "cases validated change (e.g. --cases 14; a plan that does not hold here leaves "
        "its own entry), its others and its buckets are kept (none checked); a long "
        "validation done in parts",
    )
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "compare",
        help="plans side by side on cases: gate, interleaved timing, kernels per forward",
    )
    add_gpu(p)
    p.add_argument("--cases", required=True, help="case spec: 1-5,7,9-12, smoke, ...")
    p.add_argument("--plan", action="append", help="plan JSON, @file.json or reference")
    p.add_argument(
        "--table", action="append", help="also the plan this table ships for each case (first)"
    )
    p.add_argument("--official", action="store_true", help="official timing (20 x 3 x 100)")
    p.add_argument("--json", help="write the rows as JSON here")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("report", help="a markdown page with tables and figures")
    p.add_argument("--gpu", default="cpu", help="profile whose studies and table to report")
    add_storage(p)
    p.add_argument("--table", help="table (default tables/PROFILE.py)")
    p.add_argument("--bench", help="a CSV from 'autotune bench --csv' (with --anchors)")
    p.add_argument("--out", help="folder (default docs/results/PROFILE)")
    p.add_argument(
        "--evaluations",
        metavar="JSON",
        help="instead: print markdown tables of 'autotune evaluate --json' records",
    )
    p.add_argument(
        "--unseen",
        metavar="CSV",
        help="an 'autotune unseen' CSV: its rows for this table, summarised and drawn",
    )
    p.add_argument(
        "--efficiency",
        action="append",
        metavar="JSON",
        help="an 'autotune efficiency' record (efficiency.json) to include (repeatable)",
    )
    p.add_argument(
        "--notes",
        help="a markdown file appended to the page (targets, misses and what would close them)",
    )
    p.add_argument(
        "--target",
        type=float,
        metavar="X",
        help="a speedup over the reference: with a --bench CSV from --hot-path, the time "
        "each case needs for it beside its floor, and the cases that cannot reach it",
    )
    p.add_argument(
        "--bench-before",
        metavar="CSV",
        help="an earlier 'autotune bench --csv' file: the table's and the reference's "
        "medians case by case, and this run's table at its reference times",
    )
    p.add_argument(
        "--bench-history",
        nargs="+",
        metavar="CSV",
        help="earlier 'autotune bench --csv' files: this run's table at each case's median "
        "reference over them and this run, and at the fastest run's references",
    )
    p.set_defaults(func=cmd_report, out_is="dir")

    p = sub.add_parser("plot", help="PNG Pareto fronts of latency against peak memory")
    p.add_argument("--gpu", default="cpu", help="profile whose studies to plot")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--case", help="one case")
    g.add_argument("--all", action="store_true", help="every case (the default)")
    add_storage(p)
    p.add_argument("--table", help="table whose winners to mark (default tables/PROFILE.py)")
    p.add_argument("--out", help="PNG path (default docs/results/PROFILE/pareto.png)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser(
        "unseen",
        help="how a table serves shapes it has no entry for (buckets, gate, reference)",
        description="Random shapes around a case's dims, none in the table: the dispatcher "
        "against the reference (10 inputs, failed elements), timed, sync-checked; with "
        "--tuned, against the best plan of each shape's own study in --storage.",
    )
    add_gpu(p)
    p.add_argument("--table", required=True, help="the table whose dispatcher serves them")
    p.add_argument("--case", default="2", help="the case whose other dims the shapes keep")
    p.add_argument("--count", type=int, default=30, help="shapes to draw (default 30)")
    p.add_argument("--batch", default="1-128", help="batch range LO-HI (log-uniform)")
    p.add_argument("--seq", default="32-1024", help="sequence-length range LO-HI (log-uniform)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--csv", help="append a row per shape; a rerun skips the shapes it holds")
    p.add_argument(
        "--tuned",
        action="store_true",
        help="time each shape's own tuned plan too, where --storage has a study of it",
    )
    add_storage(p)
    p.add_argument(
        "--gate-unseen",
        action="store_true",
        help="build the dispatcher with gate_unseen=True: a shape outside every bucket gets "
        "the one-time gate of the nearest plan on its first call",
    )
    p.add_argument("--list", action="store_true", help="print the shapes as a --cases spec")
    p.add_argument("--in-process", action="store_true", help="no child process per shape")
    p.set_defaults(func=cmd_unseen)
