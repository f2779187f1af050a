"""``autotune long``: verify plans on the whole batch of a shape the dense reference
cannot run (case 14), against the streamed exact oracle, under one or more profiles."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def parse_route(text: str) -> tuple[str, str]:
    """``PROFILE=PLAN`` (PLAN: JSON, @file.json)."""
    profile, sep, plan = text.partition("=")
    if not sep or not profile or not plan:
        raise ValueError(
            f"--route takes PROFILE=PLAN (e.g. h200=@plan.json or rtx5080='{{...}}'), got {text!r}"
        )
    return profile.strip(), plan.strip()


def cmd_long(args: argparse.Namespace) -> int:
    from autotune.cases import select_cases
    from autotune.correctness import dense_reference_fits
    from autotune.device import detect_device, project_commit, software_versions
    from autotune.longrun import Route, verify_full_batch
    from autotune.plan import REFERENCE_PLAN, parse_plan
    from autotune.profiles import get_profile
    from autotune.reference import ACCURACY_SEEDS

    cases = select_cases(args.case)
    if not 1 <= args.seeds <= len(ACCURACY_SEEDS):
        raise ValueError(f"--seeds takes 1..{len(ACCURACY_SEEDS)}, got {args.seeds}")
    device = detect_device(args.device)
    routes = []
    for text in args.route or []:
        name, plan_text = parse_route(text)
        profile = get_profile(name)
        plan = parse_plan(plan_text)
        capacity = None
        label = f"{name} {plan.hash}"
        if not profile.matches(device):
            if device.type != "cuda":
                raise ValueError(f"profile {name!r} needs a CUDA GPU to emulate on; found the CPU")
            capacity = min(profile.memory_bytes, device.total_memory or profile.memory_bytes)
            label += f" (emulated: {capacity / 2**30:.1f} GiB cap)"
        routes.append(Route(label, plan, device, capacity))
    if args.dense:
        routes.append(Route("dense reference", REFERENCE_PLAN, device, None, dense_reference=True))
    if not routes:
        raise ValueError("give at least one --route PROFILE=PLAN (or --dense)")
    try:
        chunks = tuple(int(v) for v in args.oracle_chunks.split(","))
    except ValueError:
        chunks = ()
    if len(chunks) != 2 or min(chunks) < 1:
        raise ValueError(
            f"--oracle-chunks takes QUERY,KEY positive sizes, got {args.oracle_chunks}"
        )
    seeds = ACCURACY_SEEDS[: args.seeds]
    results: list[dict[str, Any]] = []
    for case in cases:
        if dense_reference_fits(case, device) and not args.force and not args.dense:
            raise ValueError(
                f"case {case.id} fits the dense reference on this device: 'autotune evaluate' "
                "judges it exactly; pass --force to verify against the oracle anyway"
            )
        if args.dense and not dense_reference_fits(case, device):
            raise ValueError(f"--dense: the dense reference cannot run case {case.id} here")
        print(
            f"case {case.id} ({case.config}): {len(routes)} route(s) x {len(seeds)} seed(s), "
            f"whole batch against the streamed oracle (chunks {chunks[0]}x{chunks[1]}) "
            f"on {device.name}",
            flush=True,
        )
        records = verify_full_batch(case, routes, seeds=seeds, oracle_chunks=chunks)  # type: ignore[arg-type]
        for s in (r.summary() for r in records):
            s["case"] = case.id
            results.append(s)
            verdict = "PASS" if s["passed"] else "FAIL"
            wall = f"{s['median_wall_s']:.3f} s" if s["median_wall_s"] is not None else "-"
            peak = f"{s['peak_memory_bytes'] / 2**30:.2f} GiB" if s["peak_memory_bytes"] else "-"
            worst = s["worst_budget_share"]
            print(
                f"{verdict} case {case.id} {s['label']}: median {wall} per forward, peak {peak}, "
                f"{s['failed']} failed of {s['elements']} elements over {len(s['seeds'])} seeds, "
                f"max abs err {s['max_abs_err']:.3g}, worst "
                f"{worst:.4f} of the allowance"
                + (
                    f", guard {s['guard_paths']} (max spread {s['guard_max_spread']:.3g})"
                    if s["guard_paths"]
                    else ""
                )
                + (f" -- {s['error']}" if s["error"] else ""),
                flush=True,
            )
    if args.out:
        record: dict[str, Any] = {
            "device": device.name,
            "versions": software_versions(),
            "commit": project_commit(),
            "command": "autotune long " + " ".join(args.argv_text),
            "oracle": {"query_chunk": chunks[0], "key_chunk": chunks[1], "batch_chunk": 1},
            "routes": results,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1, default=str) + "\n")
        print(f"wrote {args.out}")
    return 0 if all(s["passed"] for s in results) else 1


def cmd_compare(args: argparse.Namespace) -> int:
    from autotune.cases import select_cases
    from autotune.compare import compare_plans
    from autotune.correctness import CaseBench
    from autotune.measure import OFFICIAL_TIMING, STUDY_TIMING
    from autotune.plan import parse_plan
    from autotune.profiles import select_profile

    selection = select_profile(args.gpu, emulate=args.emulate)
    from autotune.plan import Plan
    from autotune.runtime import load_table

    plans = [parse_plan(t) for t in args.plan or []]
    tables = [load_table(t) for t in args.table or []]
    if not plans and not tables:
        raise ValueError("give at least one --plan or --table")
    timing = OFFICIAL_TIMING if args.official else STUDY_TIMING
    rows = []
    print("case | plan | kernels/forward | median us | x reference | x first plan | verdict")
    for case in select_cases(args.cases):
        bench = CaseBench(case, selection.effective_device())
        extra = []
        for table in tables:  # the plan each table ships for this case, first
            entry = table.entries.get(case.key.as_tuple())
            if entry and entry.get("admitted"):
                extra.append(Plan.from_dict(entry["plan"]))
        for row in compare_plans(bench, extra + plans, timing):
            rows.append(row.to_json())

            def fmt(v: float | None, spec: str) -> str:
                return "-" if v is None else format(v, spec)

            print(
                f"{row.case} | {row.plan} | {row.kernels if row.kernels is not None else '-'} | "
                f"{fmt(row.median_us, '.1f')} | {fmt(row.speedup, '.2f')} | "
                f"{fmt(row.vs_first, '.2f')} | "
                + ("pass" if row.passed else "FAIL")
                + (f" ({row.detail})" if row.detail and not row.passed else ""),
                flush=True,
            )
        bench.release()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["passed"] for r in rows) else 1


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from autotune.cli import _add_gpu

    p = sub.add_parser(
        "compare",
        help="plans side by side on cases: gate, interleaved timing, kernels per forward",
    )
    _add_gpu(p)
    p.add_argument("--cases", required=True, help="case spec: 1-5,7,9-12, smoke, ...")
    p.add_argument("--plan", action="append", help="plan JSON, @file.json or reference")
    p.add_argument(
        "--table", action="append", help="also the plan this table ships for each case (first)"
    )
    p.add_argument("--official", action="store_true", help="official timing (20 x 3 x 100)")
    p.add_argument("--json", help="write the rows as JSON here")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "long",
        help="whole-batch verification of plans for a shape the dense reference cannot run",
    )
    p.add_argument(
        "--case", default="14", help="case spec: 14, 1-13, ID,ID or custom shapes (default 14)"
    )
    p.add_argument(
        "--route",
        action="append",
        help="PROFILE=PLAN: a plan under a profile (a smaller profile than the device caps "
        "memory to its own: emulated); repeatable, the oracle runs once per seed for all",
    )
    p.add_argument("--seeds", type=int, default=5, help="official seeds to verify (1..5)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--oracle-chunks", default="1024,4096", help="oracle QUERY,KEY chunk sizes")
    p.add_argument("--force", action="store_true", help="run even where the dense reference fits")
    p.add_argument(
        "--dense",
        action="store_true",
        help="add the dense reference itself as a route: proves the oracle where both run",
    )
    p.add_argument("--out", help="write the records as JSON here")
    p.set_defaults(func=cmd_long)
