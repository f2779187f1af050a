"""Commands of the study pipeline: study, export, plot, bench, kernels."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from autotune.cli import _add_gpu

DEFAULT_STORAGE = "sqlite:///studies.db"


def _storage(url: str, heartbeat: int | None = None) -> Any:
    from autotune.search.study import open_storage

    return open_storage(url, heartbeat, 3 * heartbeat if heartbeat else None)


def _cases_default(args: argparse.Namespace, profile: str) -> str:
    return args.cases or ("smoke" if profile == "cpu" else "1-13")


def cmd_study(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from autotune.core.cases import select_cases
    from autotune.core.profiles import select_profile
    from autotune.search.space import available_spaces, select_space
    from autotune.search.study import SAMPLERS, run_case_study

    if args.sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {args.sampler!r}; valid samplers: {', '.join(SAMPLERS)}")
    if args.n_trials < 1:
        raise ValueError(f"--n-trials must be at least 1, got {args.n_trials}")
    selection = select_profile(args.gpu, emulate=args.emulate)
    cases = select_cases(_cases_default(args, selection.profile.name))
    spaces = available_spaces(args.space)
    storage = _storage(args.storage, args.heartbeat)
    plan = [(c, select_space(selection.profile.name, c, spaces)) for c in cases]
    if args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    print(
        f"profile {selection.profile.name}"
        + (" (emulated)" if selection.emulated else "")
        + f" on {selection.device.name}; {len(plan)} case(s); storage {args.storage}; "
        f"sampler {args.sampler}; {args.n_trials} trials per study",
        flush=True,
    )
    import time

    deadline = time.monotonic() + args.timeout if args.timeout else None
    for i, (case, space) in enumerate(plan):
        timeout = None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"time budget spent; {len(plan) - i} case(s) left for the next run")
                break
            weights = [_budget_weight(c) for c, _ in plan[i:]]
            timeout = left * weights[0] / sum(weights)
        if args.workers > 1:
            _run_many(args, selection, case, space, storage)
            continue
        bar = tqdm(
            total=args.n_trials,
            desc=f"case {case.id}",
            unit="trial",
            file=sys.stdout,
            disable=args.quiet,
            dynamic_ncols=True,
        )

        def progress(state: Any, bar: Any = bar) -> None:
            bar.n = state.finished
            bar.set_postfix(state.postfix(), refresh=False)
            bar.refresh()

        try:
            summary = run_case_study(
                selection,
                case,
                space,
                storage=storage,
                n_trials=args.n_trials,
                timeout=timeout,
                sampler=args.sampler,
                seed=args.seed,
                progress=progress,
                isolate=not args.no_isolation,
                trial_timeout=args.trial_timeout,
                warm=_warm(args, storage, selection, case),
                oracle_batch=args.oracle_batch,
            )
        finally:
            bar.close()
        best = f"{summary.best_speedup:.2f}x" if summary.best_speedup else "none"
        print(
            f"case {case.id}: {summary.trials} trials ({summary.new_trials} new, "
            f"{summary.seconds:.0f} s), {summary.feasible} feasible, best {best}; "
            f"study {summary.name!r}",
            flush=True,
        )
    return 0


def _warm(args: argparse.Namespace, storage: Any, selection: Any, case: Any) -> Any:
    from autotune.search.study import warm_start_plans

    if not args.warm_start:
        return None
    sources = [s.strip() for s in args.warm_start.split(",") if s.strip()]
    return warm_start_plans(sources, storage, selection.profile.name, str(case.key))


def _run_many(
    args: argparse.Namespace, selection: Any, case: Any, space: Any, storage: Any
) -> None:
    import torch

    from autotune.search.study import _study_for, completed_trials
    from autotune.search.workers import WorkerJob, run_workers

    study = _study_for(
        selection,
        case,
        space,
        storage,
        args.sampler,
        args.seed,
        _warm(args, storage, selection, case),
    )
    job = WorkerJob(
        storage_url=args.storage,
        profile=selection.profile.name,
        emulated=selection.emulated,
        case_id=case.id,
        case_spec=case.as_dict(),
        space_files=tuple(args.space or ()),
        sampler=args.sampler,
        seed=args.seed,
        n_trials=args.n_trials,
        trial_timeout=args.trial_timeout,
        heartbeat_interval=args.heartbeat,
        grace_period=3 * args.heartbeat,
        isolate=not args.no_isolation,
    )
    gpus = torch.cuda.device_count() if selection.device.type == "cuda" else 0
    before = completed_trials(study)
    run_workers(job, args.workers, gpus)
    after = completed_trials(study)
    print(
        f"case {case.id}: {after} trials ({after - before} new) by {args.workers} workers; "
        f"study {study.study_name!r}",
        flush=True,
    )


def _studies_by_case(storage: Any, profile: str) -> dict[str, Any]:
    """One study per case key: the one with the most finished trials."""
    import optuna

    from autotune.search.study import FINISHED

    best: dict[str, Any] = {}
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        name = summary.study_name
        if name.split("|", 1)[0] != profile:
            continue
        study = optuna.load_study(study_name=name, storage=storage)
        key = study.user_attrs.get("case_key", name)
        n = len(study.get_trials(deepcopy=False, states=FINISHED))
        if key not in best or n > best[key][0]:
            best[key] = (n, study)
    return {k: v[1] for k, v in sorted(best.items())}


def _case_of(study: Any) -> Any:
    from autotune.core.cases import get_case, parse_custom

    data = study.user_attrs["case"]
    try:
        case = get_case(data["id"])
    except ValueError:
        case = None
    if case is None or case.config.as_dict() != data["config"]:
        cfg = data["config"]
        spec = (
            f"{cfg['batch_size']},{cfg['seq_len']},{cfg['d_model']},{cfg['num_heads']},"
            f"{cfg['ffn_dim']},{cfg['num_layers']},"
            f"{'causal' if cfg['causal'] else 'noncausal'}"
        )
        case = parse_custom(spec)
    return case


# Share of a --timeout each case gets, by regime: launch-bound shapes converge in few
# (fast) trials; capacity, long and projection-bound shapes have slow trials and more to find.
BUDGET_WEIGHTS = {
    "launch-bound": 0.6,
    "capacity": 1.8,
    "long-sequence": 1.6,
    "projection-bound": 1.4,
    "infeasible-dense": 2.0,
}


def _budget_weight(case: Any) -> float:
    return BUDGET_WEIGHTS.get(case.regime, 1.0)


def cmd_export(args: argparse.Namespace) -> int:
    from autotune.core.profiles import select_profile
    from autotune.judge.gate import CaseBench
    from autotune.search.study import environment
    from autotune.ship.export import write_table
    from autotune.ship.select import select_winner

    selection = select_profile(args.gpu, emulate=args.emulate)
    storage = _storage(args.storage)
    studies = _studies_by_case(storage, selection.profile.name)
    if not studies:
        raise ValueError(
            f"no studies for profile {selection.profile.name!r} in {args.storage}; "
            f"run 'autotune study --gpu {selection.profile.name}' first"
        )
    out = Path(args.out or f"tables/{selection.profile.name}.py")
    incumbents = _incumbents(out, selection.profile.name) if not args.fresh else {}
    winners = []
    for study in studies.values():
        case = _case_of(study)
        bench = CaseBench(case, selection.effective_device())
        max_memory = int(args.max_memory * 2**20) if args.max_memory else None
        winner = select_winner(
            study,
            selection,
            bench,
            k=args.finalists,
            max_memory=max_memory,
            exclude_triton=args.exclude_triton,
            incumbent=incumbents.get(study.user_attrs.get("case_key")),
        )
        bench.release()
        if bench.reference_kind == "oracle" and winner.admitted:
            from autotune.judge.fullbatch import verified_on_full_batch

            winner = verified_on_full_batch(winner, case, selection, args.verified)
        winners.append(winner)
        ev = winner.evidence()
        verdict = (
            f"{winner.plan.describe()} {ev['speedup']:.2f}x (noise {100 * ev['noise']:.1f}%)"
            if winner.admitted
            else "reference"
        )
        print(f"case {case.id}: {verdict} -- {winner.reason}", flush=True)
    env = environment(selection)
    provenance = {
        "device": env["device"] | {"total_memory": None, "multiprocessors": None},
        "versions": env["versions"],
        "commit": env["commit"],
        "emulated": env["emulated"],
        "capacity_bytes": env["capacity_bytes"],
        "storage": args.storage,
        "command": "autotune export --gpu "
        + selection.profile.name
        + (" --emulate" if selection.emulated else "")
        + (" --exclude-triton" if args.exclude_triton else "")
        + (" --fresh" if args.fresh else "")
        + (f" --verified {args.verified}" if args.verified else ""),
    }
    if provenance["device"]["type"] == "cpu":
        provenance["device"]["name"] = "cpu"
    path, version = write_table(out, selection.profile.name, provenance, winners)
    print(
        f"wrote {path} (table version {version}, {len(winners)} entries, "
        f"{sum(w.admitted for w in winners)} tuned)"
    )
    return 0


def _incumbents(path: Path, profile: str) -> dict[str, Any]:
    """Per case key, the plan the table at ``path`` already ships (if it is intact)."""
    from autotune.core.cases import CaseKey
    from autotune.plan import Plan
    from autotune.runtime.dispatch import load_table
    from autotune.ship.select import Incumbent

    if not path.is_file():
        return {}
    try:
        table = load_table(path)
    except ValueError:
        return {}
    if table.profile != profile or not table.usable:
        return {}
    out = {}
    for key, entry in table.entries.items():
        if entry.get("admitted"):
            ev = entry.get("evidence", {})
            out[str(CaseKey(*key))] = Incumbent(
                Plan.from_dict(entry.get("plan", {})), ev.get("study"), ev.get("trial")
            )
    return out


def cmd_plot(args: argparse.Namespace) -> int:
    from autotune.runtime.dispatch import load_table
    from autotune.tools.report import plot_studies

    storage = _storage(args.storage)
    studies = _studies_by_case(storage, args.gpu)
    if args.case:
        from autotune.core.cases import get_case

        key = str(get_case(args.case).key)
        studies = {k: v for k, v in studies.items() if k == key}
    if not studies:
        raise ValueError(
            f"no studies for profile {args.gpu!r}"
            + (f" and case {args.case!r}" if args.case else "")
            + f" in {args.storage}"
        )
    winners: dict[str, int | None] = {}
    table_path = Path(args.table or f"tables/{args.gpu}.py")
    if table_path.is_file():
        table = load_table(table_path)
        for entry in table.entries.values():
            ev = entry.get("evidence", {})
            winners[ev.get("study", "")] = ev.get("trial")
    ordered = sorted(studies.values(), key=lambda s: _case_sort(s.user_attrs["case"]["id"]))
    out = plot_studies(ordered, args.out or f"docs/pareto_{args.gpu}.png", winners)
    print(f"wrote {out} ({len(ordered)} studies)")
    return 0


def _case_sort(case_id: str) -> tuple[int, str]:
    return (int(case_id), "") if case_id.isdigit() else (10**6, case_id)


def cmd_bench(args: argparse.Namespace) -> int:
    from autotune.core.cases import select_cases
    from autotune.core.profiles import select_profile
    from autotune.runtime.dispatch import load_table
    from autotune.tools.bench import bench_case, summarise, write_csv

    table = load_table(args.table)
    selection = select_profile(args.gpu, emulate=args.emulate)
    device = selection.device
    spec = args.cases or ",".join(
        sorted({e["case"] for e in table.entries.values()}, key=_case_sort)
    )
    baseline = load_table(args.baseline) if args.baseline else None
    from autotune.tools.bench import ANCHORS, bench_anchors

    anchors = (
        []
        if args.anchors is None
        else (
            list(ANCHORS) if args.anchors == "all" else [a.strip() for a in args.anchors.split(",")]
        )
    )
    unknown = [a for a in anchors if a not in ANCHORS]
    if unknown:
        raise ValueError(f"unknown anchors {unknown}; valid: {', '.join(ANCHORS)} or all")
    rows = []
    for case in select_cases(spec):
        row = bench_case(case, device, table, baseline=baseline)
        if anchors and row.speedup:
            row.anchors = bench_anchors(case, selection, anchors)
        rows.append(row)
        print(
            f"case {case.id}: {row.verdict} "
            + (f"{row.speedup:.2f}x" if row.speedup else "")
            + f"  {row.route}",
            flush=True,
        )
    print(summarise(rows))
    if args.csv:
        write_csv(rows, args.csv)
        print(f"wrote {args.csv}")
    return 1 if any(r.verdict == "FAIL" for r in rows) else 0


def cmd_validate(args: argparse.Namespace) -> int:
    from autotune.core.profiles import select_profile
    from autotune.measure import OFFICIAL_TIMING, STUDY_TIMING
    from autotune.runtime.dispatch import load_table
    from autotune.tools.validate import CANNOT_RUN, WRONG, validate_table

    table = load_table(args.table)
    selection = select_profile(args.gpu, emulate=args.emulate)
    from autotune.core.cases import select_cases

    cases = {c.id for c in select_cases(args.cases)} if args.cases else None
    checks = validate_table(
        table, selection, STUDY_TIMING if args.quick else OFFICIAL_TIMING, cases=cases
    )
    if any(c.verdict == WRONG for c in checks):
        return 1
    if args.strict and any(c.verdict == CANNOT_RUN for c in checks):
        return 1
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autotune.runtime.dispatch import load_table
    from autotune.tools.report import evaluation_markdown, write_report

    if args.evaluations:
        print(evaluation_markdown(args.evaluations))
        return 0

    if args.notes and not Path(args.notes).is_file():
        raise ValueError(f"--notes {args.notes!r} does not exist; give a markdown file")
    storage = _storage(args.storage)
    studies = sorted(
        _studies_by_case(storage, args.gpu).values(),
        key=lambda s: _case_sort(s.user_attrs["case"]["id"]),
    )
    table_path = Path(args.table or f"tables/{args.gpu}.py")
    table = load_table(table_path) if table_path.is_file() else None
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
    )
    print(f"wrote {path}")
    return 0


def cmd_kernels_check(args: argparse.Namespace) -> int:
    import torch

    from kernels.registry import iter_checks

    device = "cuda" if torch.cuda.is_available() else "cpu"
    passed = failed = 0
    for check in iter_checks():
        try:
            result = check.run(device)
        except Exception as exc:  # a kernel that cannot run fails its check, with why
            print(f"{check.name:<48} FAIL  {type(exc).__name__}: {exc}")
            failed += 1
            continue
        verdict = "PASS" if result.passed else "FAIL"
        print(f"{check.name:<48} {verdict}  max abs err {result.max_abs_err:.2e}  {result.detail}")
        passed += result.passed
        failed += not result.passed
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("study", help="run or resume Optuna studies, one per case")
    _add_gpu(p)
    p.add_argument(
        "--cases",
        help="case spec: 1-13, all, smoke, ID,ID, or custom shapes "
        "(default: smoke on cpu, 1-13 on a GPU)",
    )
    p.add_argument(
        "--n-trials",
        type=int,
        default=30,
        help="finished trials each study should reach (rerun to resume)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        help="seconds for the whole run, shared by cases (weighted by regime: launch-bound "
        "0.6, capacity 1.8, long-sequence 1.6, projection-bound 1.4, others 1)",
    )
    p.add_argument("--storage", default=DEFAULT_STORAGE, help="any SQLAlchemy URL")
    p.add_argument("--sampler", default="tpe", help="tpe, nsga2, gp, random or grid")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--space",
        action="append",
        help="a search-space file (.py or .json) that overrides the built-in spaces (repeatable)",
    )
    p.add_argument(
        "--oracle-batch",
        type=int,
        default=1,
        help="where the dense reference cannot run: sequences of the batch checked "
        "and timed against the streamed oracle during search (recorded)",
    )
    p.add_argument(
        "--warm-start",
        metavar="FROM",
        help="seed new studies with plans from a table file, a profile's studies "
        "(their fastest Pareto plans) or a study name; comma-separated",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes on this host (one GPU each when there are GPUs)",
    )
    p.add_argument(
        "--trial-timeout",
        type=float,
        default=600.0,
        help="seconds a trial may take before its runner is killed (timeout)",
    )
    p.add_argument(
        "--no-isolation",
        action="store_true",
        help="evaluate in this process (faster start; a crash ends the study)",
    )
    p.add_argument(
        "--heartbeat",
        type=int,
        default=10,
        help="seconds between worker heartbeats; a trial silent for 3 beats is failed and retried",
    )
    p.set_defaults(func=cmd_study)

    p = sub.add_parser("export", help="select winners and write the dispatch-table module")
    _add_gpu(p)
    p.add_argument("--storage", default=DEFAULT_STORAGE)
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
        "that a challenger must beat by more than the noise)",
    )
    p.add_argument(
        "--exclude-triton",
        action="store_true",
        help="only library plans (no project Triton kernels): a baseline table",
    )
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("plot", help="PNG Pareto fronts of latency against peak memory")
    p.add_argument("--gpu", default="cpu", help="profile whose studies to plot")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--case", help="one case")
    g.add_argument("--all", action="store_true", help="every case (the default)")
    p.add_argument("--storage", default=DEFAULT_STORAGE)
    p.add_argument("--table", help="table whose winners to mark (default tables/PROFILE.py)")
    p.add_argument("--out", help="PNG path (default docs/pareto_PROFILE.png)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("bench", help="official protocol: reference vs a table's dispatcher")
    p.add_argument("--table", required=True)
    p.add_argument("--cases", help="case spec (default: the table's cases)")
    p.add_argument("--baseline", help="another table, timed in the same interleaved run")
    p.add_argument(
        "--anchors",
        nargs="?",
        const="all",
        help="also the anchors a user would pick (sdpa, sdpa+reduce-overhead, "
        "max-autotune; default all), each against the reference in its own process",
    )
    _add_gpu(p)
    p.set_defaults(gpu="auto")
    p.add_argument("--csv", help="also write the rows as CSV")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("validate", help="re-verify and re-time every entry of a table here")
    p.add_argument("--table", required=True)
    _add_gpu(p)
    p.set_defaults(gpu="auto")
    p.add_argument("--cases", help="only these cases (a case spec; default: every entry)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="study timing (seconds) instead of the official protocol",
    )
    p.add_argument(
        "--strict", action="store_true", help="also fail when an entry cannot run on this device"
    )
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("report", help="a markdown page with tables and figures")
    p.add_argument("--gpu", default="cpu", help="profile whose studies and table to report")
    p.add_argument("--storage", default=DEFAULT_STORAGE)
    p.add_argument("--table", help="table (default tables/PROFILE.py)")
    p.add_argument("--bench", help="a CSV from 'autotune bench --csv' (with --anchors)")
    p.add_argument("--out", help="folder (default docs/results/PROFILE)")
    p.add_argument(
        "--evaluations",
        metavar="JSON",
        help="instead: print markdown tables of 'autotune evaluate --json' records",
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
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("kernels", help="the project's Triton kernels")
    ksub = p.add_subparsers(dest="kernels_command", required=True, metavar="ACTION")
    k = ksub.add_parser("check", help="every kernel against its reference at small, odd shapes")
    k.set_defaults(func=cmd_kernels_check)
