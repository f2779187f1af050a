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
    from autotune.core.cases import select_cases
    from autotune.core.device import detect_device
    from autotune.core.profiles import get_profile
    from autotune.core.reference import ACCURACY_SEEDS
    from autotune.judge.fullbatch import Route, verify_full_batch
    from autotune.judge.gate import dense_reference_fits
    from autotune.plan import REFERENCE_PLAN, parse_plan

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

        def save(partial: list[Any], case: Any = case) -> None:  # a cut-short run keeps its seeds
            if args.out:
                rows = [r.summary() | {"case": case.id, "partial": True} for r in partial]
                _write_long(args, device, chunks, results + rows)

        records = verify_full_batch(
            case,
            routes,
            seeds=seeds,
            oracle_chunks=chunks,  # type: ignore[arg-type]
            on_seed=save,
        )
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
        _write_long(args, device, chunks, results)
        print(f"wrote {args.out}")
    return 0 if all(s["passed"] for s in results) else 1


def _write_long(args: argparse.Namespace, device: Any, chunks: Any, rows: list[Any]) -> None:
    from autotune.core.device import project_commit, software_versions
    from autotune.core.files import write_atomic

    record: dict[str, Any] = {
        "device": device.name,
        "versions": software_versions(),
        "commit": project_commit(),
        "command": "autotune long " + " ".join(args.argv_text),
        "oracle": {"query_chunk": chunks[0], "key_chunk": chunks[1], "batch_chunk": 1},
        "routes": rows,
    }
    write_atomic(Path(args.out), json.dumps(record, indent=1, default=str) + "\n")


def cmd_compare(args: argparse.Namespace) -> int:
    from autotune.core.cases import select_cases
    from autotune.core.profiles import select_profile
    from autotune.judge.gate import CaseBench
    from autotune.measure import OFFICIAL_TIMING, STUDY_TIMING
    from autotune.plan import parse_plan
    from autotune.tools.compare import compare_plans

    selection = select_profile(args.gpu, emulate=args.emulate)
    from autotune.plan import Plan
    from autotune.runtime.dispatch import load_table

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


def cmd_efficiency(args: argparse.Namespace) -> int:
    import dataclasses
    import time

    import pandas as pd

    from autotune.core.cases import get_case
    from autotune.core.profiles import select_profile
    from autotune.measure import STUDY_TIMING
    from autotune.plan import Plan
    from autotune.search.efficiency import (
        WITHIN,
        Measured,
        exhaustive_best,
        load_cache,
        measure_space,
        plot_runs,
        replay,
        summarise_runs,
        warm_plans,
    )
    from autotune.search.space import load_space_file
    from autotune.search.study import SAMPLERS, _evaluator

    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    bad = [s for s in samplers if s not in SAMPLERS or s == "grid"]
    if bad:
        raise ValueError(f"unknown sampler(s) {bad}; valid: tpe, gp, nsga2, random")
    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    case = get_case(args.case)
    space = load_space_file(args.space)
    size = space.size()
    if size < 2:
        raise ValueError(f"space {args.space!r} has {size} plan(s): nothing to search")
    cache = Path(args.cache)
    if args.replay:  # no device needed: the measurements are the device's
        data = load_cache(cache)
        header = data.get("header", {})
        measured = {h: Measured(**m) for h, m in data["plans"].items()}
        missing = [p.describe() for p in space.enumerate() if p.hash not in measured]
        if header.get("space_hash") != space.content_hash or missing:
            raise ValueError(
                f"--replay needs a complete cache of this space: {str(cache)!r} has "
                f"space hash {header.get('space_hash')!r} (space: {space.content_hash!r}) "
                f"and lacks {len(missing)} plan(s); measure on the device first"
            )
        capacity = header.get("capacity_bytes")
    else:
        selection = select_profile(args.gpu, emulate=args.emulate)
        capacity = selection.capacity_bytes
        header = {
            "profile": selection.profile.name,
            "emulated": selection.emulated,
            "capacity_bytes": capacity,
            "case": case.id,
            "case_key": str(case.key),
            "space": args.space,
            "space_hash": space.content_hash,
            "device": selection.device.name,
        }
        evaluate, close = _evaluator(
            selection, case, STUDY_TIMING, not args.no_isolation, args.trial_timeout
        )
        deadline = time.monotonic() + args.timeout if args.timeout else None
        try:
            measured, complete = measure_space(space, evaluate, cache, header, deadline=deadline)
        finally:
            close()
        if not complete:
            print("measurement incomplete: run the same command again to resume")
            return 3
        if args.measure_only:
            return 0
    best = exhaustive_best(measured, capacity)
    exhaustive_s = sum(m.seconds for m in measured.values())
    print(
        f"exhaustive: {size} plans, {exhaustive_s:.0f} s; best {1 / best.latency:.2f}x "
        f"({Plan.from_dict(best.plan).describe()})"
    )
    trials = args.trials or size
    target = best.latency * (1 + WITHIN)
    warm = []
    if args.warm_from:
        warm = warm_plans(load_cache(args.warm_from), space, capacity, args.warm_k)
        print(f"warm start: {len(warm)} plans from {args.warm_from}")
    runs = []
    for sampler in samplers:
        for seed in range(args.seeds):
            runs.append(replay(space, measured, sampler, seed, trials, capacity))
            if warm:
                runs.append(replay(space, measured, sampler, seed, trials, capacity, warm))
    rows = summarise_runs(runs, target, size, exhaustive_s)
    print(
        f"trials and GPU seconds to within {100 * WITHIN:.0f}% of the exhaustive best "
        f"(budget {trials} trials; a seed that never got there counts as budget + 1):"
    )
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3g"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot_runs(runs, best.latency, out / "efficiency.png")
    record = {
        "header": header,
        "command": "autotune efficiency " + " ".join(args.argv_text),
        "space_size": size,
        "exhaustive_seconds": exhaustive_s,
        "exhaustive_best": dataclasses.asdict(best),
        "within": WITHIN,
        "trials_budget": trials,
        "rows": rows,
        "runs": [
            {
                "sampler": r.sampler,
                "seed": r.seed,
                "warm": r.warm,
                "best": r.best,
                "seconds": r.seconds,
            }
            for r in runs
        ],
    }
    (out / "efficiency.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"wrote {out / 'efficiency.json'} and {out / 'efficiency.png'}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from autotune.cli import _add_gpu

    p = sub.add_parser(
        "efficiency",
        help="samplers against exhaustive tuning on one case (measure every plan once, "
        "then replay samplers on the measurements)",
    )
    _add_gpu(p)
    p.add_argument("--case", required=True, help="case id or custom shape")
    p.add_argument("--space", required=True, help="a (reduced) search-space file to exhaust")
    p.add_argument("--cache", required=True, help="JSON file of measurements (resumable)")
    p.add_argument("--samplers", default="tpe,gp,nsga2,random")
    p.add_argument("--seeds", type=int, default=5, help="seeds per sampler")
    p.add_argument("--trials", type=int, help="trials per replayed study (default: space size)")
    p.add_argument("--warm-from", help="another case's measurement cache: its best plans first")
    p.add_argument("--warm-k", type=int, default=5, help="plans taken from --warm-from")
    p.add_argument("--timeout", type=float, help="seconds for measuring (resume later)")
    p.add_argument("--trial-timeout", type=float, default=120.0)
    p.add_argument("--no-isolation", action="store_true", help="measure in this process")
    p.add_argument("--measure-only", action="store_true", help="only fill the cache")
    p.add_argument(
        "--replay",
        action="store_true",
        help="only replay samplers on a complete cache (no device needed)",
    )
    p.add_argument("--out", default="docs/efficiency", help="folder for the JSON and PNG")
    p.set_defaults(func=cmd_efficiency)

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
