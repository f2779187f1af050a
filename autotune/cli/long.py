"""``autotune long``: verify plans on the whole batch of a shape the dense reference
cannot run (case 14), against the streamed exact oracle, under one or more profiles."""

from __future__ import annotations

import argparse

from autotune.cli.common import chunk_pair

# Far above any stress test (2 and 4), far below where the reference's own float32
# arithmetic overflows (at case 14's d_model the LayerNorm's squares pass the float32
# maximum at scales past about 1e17; 1e20 failed every element of a small case's
# reference): a verdict there would be about nothing.
MAX_SCALE = 1e6


def parse_route(text: str) -> tuple[str, str]:
    """``PROFILE=PLAN`` (PLAN: JSON, @file.json)."""
    profile, sep, plan = text.partition("=")
    if not sep or not profile or not plan:
        raise ValueError(
            f"--route takes PROFILE=PLAN (e.g. h200=@plan.json or rtx5080='{{...}}'), got {text!r}"
        )
    return profile.strip(), plan.strip()


def cmd_long(args: argparse.Namespace) -> int:
    from autotune.core.cases import select_cases
    from autotune.core.device import detect_device
    from autotune.core.reference import ACCURACY_SEEDS
    from autotune.judge.fullbatch import Route, route_for, verify_cases
    from autotune.plan import REFERENCE_PLAN, parse_plan

    cases = select_cases(args.case)
    if not 1 <= args.seeds <= len(ACCURACY_SEEDS):
        raise ValueError(f"--seeds takes 1..{len(ACCURACY_SEEDS)}, got {args.seeds}")
    chunks = chunk_pair(args.oracle_chunks, "--oracle-chunks")
    for flag, value, what in (
        ("--input-scale", args.input_scale, "the official inputs"),
        ("--score-scale", args.score_scale, "the official weights"),
    ):
        if not 0 < value <= MAX_SCALE:  # nan and inf fail too
            raise ValueError(
                f"{flag} takes a positive number up to {MAX_SCALE:g} (1: {what}; the rule's "
                f"stress tests use 2 and 4), got {value}"
            )
    device = detect_device(args.device)
    routes = [
        route_for(name, parse_plan(plan), device)
        for name, plan in map(parse_route, args.route or [])
    ]
    if args.dense:
        routes.append(Route("dense reference", REFERENCE_PLAN, device, None, dense_reference=True))
    summaries = verify_cases(
        cases,
        routes,
        seeds=ACCURACY_SEEDS[: args.seeds],
        oracle_chunks=chunks,
        out=args.out,
        command="autotune long " + " ".join(args.argv_text),
        force=args.force,
        log=lambda line: print(line, flush=True),
        input_scale=args.input_scale,
        score_scale=args.score_scale,
    )
    stress = [f"inputs x{args.input_scale:g}"] if args.input_scale != 1.0 else []
    stress += [f"scores x{args.score_scale:g}"] if args.score_scale != 1.0 else []
    scaled = f" ({', '.join(stress)})" if stress else ""
    for s in summaries:
        verdict = "PASS" if s["passed"] else "FAIL"
        wall = f"{s['median_wall_s']:.3f} s" if s["median_wall_s"] is not None else "-"
        peak = f"{s['peak_memory_bytes'] / 2**30:.2f} GiB" if s["peak_memory_bytes"] else "-"
        err = f"{s['max_abs_err']:.3g}" if s["max_abs_err"] is not None else "-"
        worst = f"{s['worst_budget_share']:.4f}" if s["worst_budget_share"] is not None else "-"
        print(
            f"{verdict} case {s['case']} {s['label']}{scaled}: median {wall} per forward, "
            f"peak {peak}, "
            f"{s['failed']} failed of {s['elements']} elements over {len(s['seeds'])} seeds, "
            f"max abs err {err}, worst {worst} of the allowance"
            + (
                f", guard {s['guard_paths']} (max spread {s['guard_max_spread']:.3g})"
                if s["guard_paths"]
                else ""
            )
            + (f" -- {s['error']}" if s["error"] else ""),
            flush=True,
        )
    if args.out:
        print(f"wrote {args.out}")
    return 0 if all(s["passed"] for s in summaries) else 1


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
    p.add_argument("--device", default="auto", choices=("cpu", "cuda", "auto"))
    p.add_argument("--oracle-chunks", default="1024,4096", help="oracle QUERY,KEY chunk sizes")
    p.add_argument("--force", action="store_true", help="run even where the dense reference fits")
    p.add_argument(
        "--dense",
        action="store_true",
        help="add the dense reference itself as a route: proves the oracle where both run",
    )
    p.add_argument(
        "--input-scale",
        type=float,
        default=1.0,
        help="multiply the official inputs by this (recorded per route, and export never "
        "takes a scaled record as evidence; a pre-norm layer normalises its input, so the "
        "attention scores stay as they are)",
    )
    p.add_argument(
        "--score-scale",
        type=float,
        default=1.0,
        help="multiply every layer's q projection by this in the routes and the oracle "
        "alike, so every attention score scales by it (a stress test of approximations and "
        "guards; recorded per route, never evidence for export)",
    )
    p.add_argument("--out", help="write the records as JSON here")
    p.set_defaults(func=cmd_long)
