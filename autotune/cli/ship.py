"""Shipping: ``autotune export`` writes the dispatch-table module from the studies."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune.cli.common import add_gpu, add_storage, check_table_profile, open_storage, selection


def cmd_export(args: argparse.Namespace) -> int:
    from autotune.core.cases import select_cases
    from autotune.plan import EXPORT_ANCHORS, parse_anchors
    from autotune.ship.export import ExportOptions, export_table

    if args.finalists < 1:
        raise ValueError(f"--finalists {args.finalists}: give 1 or more (default 3)")
    if args.max_memory is not None and not args.max_memory > 0:
        raise ValueError(
            f"--max-memory {args.max_memory:g}: give a cap in MiB above 0, or leave it out "
            "for the profile's"
        )
    if args.verified is not None and not Path(args.verified).is_file():
        raise ValueError(
            f"--verified {args.verified}: no such file; give the JSON 'autotune long --out' wrote"
        )
    chosen = selection(args)
    options = ExportOptions(
        storage_url=args.storage,
        out=Path(args.out if args.out is not None else f"tables/{chosen.profile.name}.py"),
        finalists=args.finalists,
        max_memory_bytes=int(args.max_memory * 2**20) if args.max_memory else None,
        fresh=args.fresh,
        exclude_triton=args.exclude_triton,
        verified=args.verified,
        cases=tuple(c.id for c in select_cases(args.cases)) if args.cases else None,
        isolate=not args.in_process,
        buckets=args.buckets,
        anchors=EXPORT_ANCHORS if args.anchors is None else tuple(parse_anchors(args.anchors)),
    )
    path, version, winners, failed = export_table(
        chosen, open_storage(args.storage), options, emit=lambda line: print(line, flush=True)
    )
    print(
        f"wrote {path} (table version {version}, {len(winners)} "
        f"{'entry' if len(winners) == 1 else 'entries'} selected, "
        f"{sum(w.admitted for w in winners)} tuned)"
    )
    if failed:
        print(
            f"autotune export: case(s) {', '.join(failed)} not selected again (see above); "
            "rerun with --cases " + ",".join(failed),
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_buckets(args: argparse.Namespace) -> int:
    from autotune.runtime.table import compatibility_problems, load_table
    from autotune.ship.export import add_buckets, check_out

    chosen = selection(args)
    table = load_table(args.table)
    if table.problems:
        print(f"autotune buckets: {table.source}: {'; '.join(table.problems)}", file=sys.stderr)
        return 2
    check_table_profile(table, chosen.profile.name)
    problems = compatibility_problems(table, chosen.device)
    if problems:
        print(
            f"autotune buckets: the runtime refuses {table.source} here ({'; '.join(problems)}); "
            "buckets are verified on the device and stack the table serves on",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out or args.table)
    check_out(out, chosen.profile.name, args.fresh, who="buckets")  # before any verification
    journal = Path(args.journal) if args.journal else None
    path, version, buckets = add_buckets(
        table, chosen, out, emit=lambda line: print(line, flush=True), journal=journal
    )
    print(f"wrote {path} (table version {version}, {len(buckets)} buckets)")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("export", help="select winners and write the dispatch-table module")
    add_gpu(p)
    add_storage(p)
    p.add_argument("--out", help="output path (default tables/PROFILE.py)")
    p.add_argument("--finalists", type=int, default=3, help="Pareto finalists to re-measure")
    p.add_argument(
        "--verified",
        metavar="JSON",
        help="an 'autotune long --out' record: where the dense reference cannot run, a "
        "winner whose plan it verified on the whole batch (5 seeds, same memory cap) is "
        "not verified again",
    )
    p.add_argument("--max-memory", type=float, help="memory cap in MiB (default: profile's)")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="ignore the table at --out (by default its entries are incumbents "
        "that a challenger must beat by more than the noise), and replace a file there "
        "that is not this profile's intact table (refused otherwise)",
    )
    p.add_argument(
        "--exclude-triton",
        action="store_true",
        help="only library plans (no project Triton kernels): a baseline table",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="select every case in this process (for debugging; by default each case runs in "
        "a process of its own, so a device fault ends that case only)",
    )
    p.add_argument(
        "--cases",
        help="select only these cases again (e.g. 8,13 or 1-5); the other entries of the "
        "table at --out are kept as they are",
    )
    p.add_argument(
        "--anchors",
        help="one-line alternatives measured beside the finalists in the same run; a faster "
        "one ships instead (default sdpa,sdpa+reduce-overhead; 'none', 'all', or a comma "
        "list of: sdpa, sdpa+reduce-overhead, max-autotune)",
    )
    p.add_argument(
        "--buckets",
        action="store_true",
        help="also group the entries into buckets of batch and sequence length, each "
        "verified at its corners and centre (otherwise the table's buckets are kept)",
    )
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "buckets",
        help="add verified buckets (ranges of batch and sequence length) to a table",
        description="Group a table's entries into buckets of batch size and sequence "
        "length, verify each bucket's plan on this device at its corners and centre (gate "
        "and timing against the reference), and write the table again with them.",
    )
    add_gpu(p)
    p.add_argument("--table", required=True, help="the table (e.g. tables/h200.py)")
    p.add_argument("--out", help="where to write (default: the table itself, a new version)")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="replace a file at --out that is not this profile's intact table, or a table "
        "edited by hand (its comments are lost; refused otherwise)",
    )
    p.add_argument(
        "--journal",
        help="where each finished verification is recorded as it ends, so a run cut short "
        "resumes there (default: OUT's name with .buckets.jsonl; removed once the table is "
        "written; lines from other code or another device are not reused)",
    )
    p.set_defaults(func=cmd_buckets)
