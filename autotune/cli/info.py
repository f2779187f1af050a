"""What can be tuned and checked: cases, knobs, profiles, conformance, kernel checks."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from autotune.cli.common import DEFAULT_GOLDEN, CliError, chunk_pair, default_vectors
from autotune.core.files import write_atomic


def cmd_cases(args: argparse.Namespace) -> int:
    from autotune.core.cases import all_cases, select_cases

    cases = select_cases(args.cases) if args.cases else all_cases()
    print(
        f"{'case':<10} {'B':>6} {'S':>7} {'D':>5} {'H':>3} {'hd':>4} {'FFN':>5} {'L':>2} "
        f"{'causal':>6}  {'regime':<17} key"
    )
    for c in cases:
        cfg = c.config
        print(
            f"{c.id:<10} {cfg.batch_size:>6} {cfg.seq_len:>7} {cfg.d_model:>5} "
            f"{cfg.num_heads:>3} {cfg.head_dim:>4} {cfg.ffn_dim:>5} {cfg.num_layers:>2} "
            f"{cfg.causal!s:>6}  {c.regime:<17} {c.key}"
            + (f"  (padding {c.padding_ratio})" if c.padding_ratio else "")
        )
    return 0


def cmd_knobs(args: argparse.Namespace) -> int:
    from autotune.plan import KNOBS

    print(
        "[harness]: how the layer is put together (backends, precision, layout, graphs, "
        "streams); [kernels]: tiles, warps and variants of the project's Triton kernels. "
        "Values as a JSON plan writes them ('knob=value' on the command line takes them too)."
    )
    for knob in KNOBS:
        print(f"{knob.name} [{knob.group}] default {json.dumps(knob.default)}: {knob.help}")
        print(f"    values: {knob.describe_values()}")
        for value, need in knob.needs.items():
            print(f"    {json.dumps(value)} needs {need}")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from autotune.core.profiles import PROFILES

    for p in PROFILES.values():
        print(
            f"{p.name:<8} {p.memory_bytes / 2**30:>6.1f} GiB  {p.describe_rule():<32} "
            f"{p.description}"
        )
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    from autotune.judge import golden

    subject, exact = golden.reference_subject, golden.REFERENCE_TOLERANCE
    if args.plan:
        from autotune.plan import parse_plan

        subject, exact = golden.plan_subject(parse_plan(args.plan)), None
    elif args.oracle:
        subject = golden.oracle_subject(*chunk_pair(args.oracle_chunks, "--oracle-chunks"))
    elif args.table:
        subject, exact = golden.table_subject(args.table), None
    vectors = default_vectors(args.vectors)
    for path in args.vectors or ():  # a file named on the line that is no vector is bad input
        try:
            golden.load_vector(path)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    _, failed = golden.run_conformance(vectors, subject, exact_tolerance=exact)
    return 1 if failed else 0


def cmd_kernels_check(args: argparse.Namespace) -> int:
    import os

    import torch

    from autotune.backends import kernel_checks

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise CliError(
            "the kernels compile for a CUDA GPU and there is none here: run the checks "
            "through Triton's interpreter on the CPU, TRITON_INTERPRET=1 autotune kernels check"
        )

    passed = failed = 0
    for check in kernel_checks(match=args.match or ""):
        print(f"{check.name:<48} {'PASS' if check.passed else 'FAIL'}  {check.detail}")
        passed += check.passed
        failed += not check.passed
    if args.match and not passed + failed:
        named = " ".join(f"--match {text!r}" for text in args.match)
        raise ValueError(
            f"{named} names no kernel check here (checks of compiled-only features join on "
            "a GPU that has them); without --match every check runs, each printed by name"
        )
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def cmd_kernels_inspect(args: argparse.Namespace) -> int:
    from autotune.core.cases import select_cases
    from autotune.core.profiles import get_profile
    from autotune.plan import Plan, parse_plan
    from autotune.runtime import load_table
    from autotune.tools.kernel_inspect import (
        format_stats,
        inspect_plan,
        parse_compile_options,
        to_json,
    )

    profile = get_profile(args.gpu)
    overrides = parse_compile_options(args.compile_option or [])
    plans = [parse_plan(t) for t in args.plan or []]
    table = load_table(args.table) if args.table else None
    if not plans and table is None:
        raise ValueError("give at least one --plan or --table")
    records = []
    for case in select_cases(args.cases):
        picked = list(plans)
        if table is not None:
            entry = table.entries.get(case.key.as_tuple())
            if not entry:
                raise ValueError(f"{args.table} has no entry for case {case.id}; pass --plan")
            picked.insert(0, Plan.from_dict(entry["plan"]))
        for plan in picked:
            stats = inspect_plan(case, plan, profile, overrides)
            print("\n".join(format_stats(case, plan, stats, overrides)), flush=True)
            records.append(to_json(case, plan, stats, overrides))
    if args.json:
        write_atomic(args.json, "[\n" + ",\n".join(records) + "\n]\n")
    return 0


def cmd_floors(args: argparse.Namespace) -> int:
    from autotune.core.cases import case_sort_key, select_cases
    from autotune.tools.floors import ceilings_for, floor_of, floors_table

    if args.launches_per_layer < 1:
        raise ValueError(f"--launches-per-layer must be at least 1, got {args.launches_per_layer}")
    for flag in ("fp16_tflops", "tf32_tflops", "tb_per_s", "launch_us"):
        value = getattr(args, flag)
        if value is not None and not 0 < value < math.inf:
            name = "--" + flag.replace("_", "-")
            raise ValueError(f"{name} {value:g}: give the hardware's rate, a number above 0")
    if args.bench:
        bench = Path(args.bench)
        if not bench.is_file():
            raise ValueError(f"--bench {args.bench!r} is not a file; give an 'autotune bench "
                             "--hot-path --csv' file")  # fmt: skip
    ceilings = ceilings_for(
        args.gpu,
        {
            "fp16_tflops": args.fp16_tflops,
            "tf32_tflops": args.tf32_tflops,
            "tb_per_s": args.tb_per_s,
            "launch_us": args.launch_us,
        },
    )
    cases = sorted(select_cases(args.cases), key=lambda c: case_sort_key(c.id))
    floors = [floor_of(c, ceilings, args.launches_per_layer) for c in cases]
    measured = None
    if args.bench:
        from autotune.tools.bench import read_csv

        measured = {r.case: r for r in read_csv(Path(args.bench))}
    print(
        f"ceilings: {ceilings['fp16_tflops']:g} TFLOP/s fp16, {ceilings['tf32_tflops']:g} tf32, "
        f"{ceilings['tb_per_s']:g} TB/s, {ceilings['launch_us']:g} us a launch; "
        f"{args.launches_per_layer} launch(es) per layer"
    )
    print(floors_table(floors, measured))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "floors", help="per case: FLOPs, fewest bytes, and the hardware's floor per forward"
    )
    p.add_argument("--gpu", default="h200", help="profile whose measured ceilings to use")
    p.add_argument("--cases", default="1-13", help="case spec (default 1-13)")
    p.add_argument("--bench", help="an 'autotune bench --hot-path --csv' file: measured beside")
    p.add_argument("--launches-per-layer", type=int, default=2)
    p.add_argument("--fp16-tflops", type=float)
    p.add_argument("--tf32-tflops", type=float)
    p.add_argument("--tb-per-s", type=float)
    p.add_argument("--launch-us", type=float)
    p.set_defaults(func=cmd_floors)

    p = sub.add_parser("cases", help="list the official, smoke and custom cases")
    p.add_argument("--cases", help="a case spec, e.g. 1-13, smoke, 8,256,128,4,512,2,causal")
    p.set_defaults(func=cmd_cases)

    p = sub.add_parser("knobs", help="every plan knob, its values and what each needs")
    p.set_defaults(func=cmd_knobs)

    p = sub.add_parser("profiles", help="the GPU profiles and how each is recognised")
    p.set_defaults(func=cmd_profiles)

    p = sub.add_parser("conformance", help="check golden vectors (reference, --plan or --table)")
    p.add_argument("vectors", nargs="*", help=f"golden .pt files (default {DEFAULT_GOLDEN})")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--plan", help="check this plan (JSON, @file.json or 'reference') on the CPU")
    g.add_argument("--table", help="check a generated table's dispatcher")
    g.add_argument(
        "--oracle",
        action="store_true",
        help="check the streamed exact oracle (within 1e-5, like the reference)",
    )
    p.add_argument(
        "--oracle-chunks",
        default="7,5",
        help="query,key chunk sizes for --oracle (small, to cross chunk edges)",
    )
    p.set_defaults(func=cmd_conformance)

    p = sub.add_parser("kernels", help="the project's Triton kernels")
    ksub = p.add_subparsers(dest="kernels_command", required=True, metavar="ACTION")
    k = ksub.add_parser("check", help="every kernel against its reference at small, odd shapes")
    k.add_argument(
        "--match",
        action="append",
        default=[],
        metavar="TEXT",
        help="only the checks whose name contains TEXT (repeat: any of them)",
    )
    k.set_defaults(func=cmd_kernels_check)
    k = ksub.add_parser(
        "inspect",
        help="a fused-layer plan's kernels compiled for a GPU profile on this machine (no GPU): "
        "registers, spills, shared memory, blocks an SM, SASS instructions by class",
    )
    k.add_argument("--gpu", default="h200", help="CUDA profile whose architecture to compile for")
    k.add_argument("--cases", required=True, help="case spec, e.g. 2 or 1-5")
    k.add_argument("--plan", action="append", help="plan JSON or @file.json (repeatable)")
    k.add_argument("--table", help="also the plan this table ships for each case (first)")
    k.add_argument(
        "--compile-option",
        action="append",
        metavar="[KERNEL:]KEY=INT",
        help="replace a compile option of every kernel (maxnreg=168, num_stages=2) or of one "
        "(_attention_fwd_kernel:maxnreg=64); repeatable",
    )
    k.add_argument("--json", help="write the kernels' facts as JSON here")
    k.set_defaults(func=cmd_kernels_inspect)
