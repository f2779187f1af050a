"""Tuning: evaluate plans, run studies, measure search efficiency."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autotune.cli.common import (
    add_gpu,
    add_storage,
    open_storage,
    selection,
    sqlite_path,
    storage_text,
)
from autotune.core.files import write_atomic


def cmd_evaluate(args: argparse.Namespace) -> int:
    from autotune.core.cases import select_cases
    from autotune.evaluate import evaluate_plan
    from autotune.judge.gate import CaseBench
    from autotune.measure import OFFICIAL_TIMING, STUDY_TIMING
    from autotune.plan import parse_plan

    chosen = selection(args)
    cases = select_cases(args.case)
    plans = [parse_plan(text) for text in args.plan]
    timing = OFFICIAL_TIMING if args.official else STUDY_TIMING
    dev = chosen.device
    records = []
    failures = 0
    for case in cases:
        bench = CaseBench(case, chosen.effective_device())
        for plan in plans:
            outcome = evaluate_plan(
                bench, plan, timing=timing, capacity_bytes=chosen.capacity_bytes
            )
            print(
                f"case {case.id} {case.key} on {dev.name} ({dev.sm}), profile "
                f"{chosen.profile.name}" + (" (emulated)" if chosen.emulated else "")
            )
            print_outcome(plan, outcome)
            records.append(
                {
                    "case": case.id,
                    "plan": plan.to_dict(full=False),
                    "plan_hash": plan.hash,
                    "outcome": outcome.to_json(),
                }
            )
            failures += not outcome.passed
        bench.release()
        del bench
    if args.json:
        write_atomic(args.json, json.dumps(records, indent=1))
    return 1 if failures else 0


def print_outcome(plan: Any, outcome: Any) -> None:
    print(f"plan {plan.hash} {plan.describe()}")
    if outcome.report is not None:
        # The gate stops at the first failing seed; the report is that seed's, else the
        # seed closest to the rule's edge (its element count is one seed's output).
        which = "the worst seed" if outcome.report.passed else "the failing seed"
        print(
            f"correctness: {outcome.seeds_checked} seeds + {outcome.padded_seeds_checked} "
            f"padded seeds checked; {which}: {outcome.report.summary()}"
        )
    if outcome.predicted_memory_bytes is not None:
        print(
            f"memory: predicted {outcome.predicted_memory_bytes / 2**20:.0f} MiB"
            + (
                f", measured {outcome.peak_memory_bytes / 2**20:.0f} MiB"
                if outcome.peak_memory_bytes is not None
                else ""
            )
            + (
                f", reference {outcome.ref_peak_memory_bytes / 2**20:.0f} MiB"
                if outcome.ref_peak_memory_bytes is not None
                else ""
            )
        )
    if outcome.timing is not None:
        t = outcome.timing
        print(
            f"timing: {t.rounds} rounds x {t.reps} reps ({t.clock}); per-round ref "
            + ", ".join(f"{v:.3f}" for v in t.ref_round_medians)
            + " ms; plan "
            + ", ".join(f"{v:.3f}" for v in t.cand_round_medians)
            + " ms"
        )
    print(outcome.summary_line(), flush=True)


def cmd_study(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from autotune.core.cases import select_cases
    from autotune.search.schedule import run_studies
    from autotune.search.space import available_spaces, select_space
    from autotune.search.study import StudyOptions

    options = StudyOptions(
        n_trials=args.n_trials,
        storage_url=args.storage,
        sampler=args.sampler,
        seed=args.seed,
        timeout=args.timeout,
        workers=args.workers,
        isolate=not args.no_isolation,
        trial_timeout=args.trial_timeout,
        heartbeat=args.heartbeat,
        oracle_batch=args.oracle_batch,
        warm_start=tuple(s.strip() for s in (args.warm_start or "").split(",") if s.strip()),
        space_files=tuple(args.space or ()),
        quiet=args.quiet,
    )
    chosen = selection(args)
    cases = select_cases(args.cases or ("smoke" if chosen.profile.name == "cpu" else "1-13"))
    if args.shapes:
        from autotune.core.cases import shape_grid

        if not args.cases:
            raise ValueError(
                "--shapes needs --cases: the case(s) whose d_model, heads, FFN and layers "
                "the grid keeps, e.g. --cases 2 --shapes '1-128/4 x 32-1024/4'"
            )
        cases = shape_grid(args.shapes, cases)
    spaces = available_spaces(args.space)
    new_file = sqlite_path(args.storage)
    if new_file is not None and not new_file.exists():
        for src in options.warm_start:  # a name is looked up among the storage's studies
            if not src.startswith("@") and not src.endswith(".py") and not Path(src).is_file():
                raise ValueError(
                    f"--warm-start {src!r}: no table file, and {new_file} holds no studies "
                    "yet (it does not exist); give a table, @plan.json, or a profile or study "
                    "in an existing --storage"
                )
    storage = open_storage(args.storage, args.heartbeat, must_exist=False)
    plan = [(c, select_space(chosen.profile.name, c, spaces)) for c in cases]
    print(
        f"profile {chosen.profile.name}"
        + (" (emulated)" if chosen.emulated else "")
        + f" on {chosen.device.name}; {len(plan)} case(s); storage {storage_text(args.storage)}; "
        f"sampler {args.sampler}; {args.n_trials} trials per study",
        flush=True,
    )

    def progress(case: Any) -> Any:
        bar = tqdm(
            total=args.n_trials,
            desc=f"case {case.id}",
            unit="trial",
            file=sys.stdout,
            disable=args.quiet,
            dynamic_ncols=True,
        )

        def show(state: Any) -> None:
            bar.total = state.total  # --n-trials, or more where named plans wait their turn
            bar.n = state.finished
            bar.set_postfix(state.postfix(), refresh=False)
            bar.refresh()

        return show, bar.close

    for summary in run_studies(chosen, plan, options, storage, progress=progress):
        best = f"{summary.best_speedup:.2f}x" if summary.best_speedup else "none"
        print(
            f"case {summary.case.id}: {summary.measured} measured trials ({summary.new_trials} "
            f"new, {summary.seconds:.0f} s; {summary.trials - summary.measured} free: repeats, "
            f"forbidden, refused, failed or surplus), {summary.feasible} feasible, best {best}; "
            f"study {summary.name!r}"
            + (
                f"; stopped at {summary.measured} of {summary.target}: {summary.stopped}"
                if summary.stopped
                else ""
            ),
            flush=True,
        )
    return 0


def cmd_efficiency(args: argparse.Namespace) -> int:
    from autotune.search.efficiency import EfficiencyOptions, run_efficiency

    options = EfficiencyOptions(
        case_id=args.case,
        space_path=args.space,
        cache=args.cache,
        out=args.out,
        samplers=tuple(s.strip() for s in args.samplers.split(",") if s.strip()),
        seeds=args.seeds,
        trials=args.trials,
        warm_from=args.warm_from,
        warm_k=args.warm_k,
        timeout=args.timeout,
        trial_timeout=args.trial_timeout,
        isolate=not args.no_isolation,
        measure_only=args.measure_only,
        replay=args.replay,
        budget_measured=args.budget_measured,
        max_free_streak=args.max_free_streak,
        stop_at_target=args.stop_at_target,
        max_trials_per_run=args.max_trials_per_run,
        command="autotune efficiency " + " ".join(args.argv_text),
    )
    complete, _ = run_efficiency(options, None if args.replay else selection(args))
    return 0 if complete else 3  # 3: measurement incomplete, the same command resumes


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("evaluate", help="gate and time one plan on one case")
    add_gpu(p)
    p.add_argument(
        "--case",
        "--cases",
        dest="case",
        required=True,
        help="case id (1-14, smoke-N), a spec such as 1-13, or a custom shape",
    )
    p.add_argument(
        "--plan",
        required=True,
        action="append",
        help="plan JSON, @file.json, or 'reference' (repeat for several plans)",
    )
    p.add_argument(
        "--official",
        action="store_true",
        help="the official timing protocol (20 warm-ups, 3 rounds of 100)",
    )
    p.add_argument("--json", help="also write every outcome as JSON to this path")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("study", help="run or resume Optuna studies, one per case")
    add_gpu(p)
    p.add_argument(
        "--cases",
        help="case spec: 1-13, all, smoke, ID,ID, or custom shapes "
        "(default: smoke on cpu, 1-13 on a GPU)",
    )
    p.add_argument(
        "--shapes",
        metavar="BATCHES x SEQS",
        help="a grid of batch sizes x sequence lengths around each --cases case's other dims, "
        "one study per shape (e.g. '1-128/4 x 32-1024/4': ranges step by the factor after "
        "/, 4 by default; or lists '1,8,64 x 32,256'); what buckets draw their evidence from",
    )
    p.add_argument(
        "--n-trials",
        type=int,
        default=30,
        help="measured trials each study should reach; repeats of a measured plan are free "
        "(rerun to resume)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        help="seconds for the whole run, shared by cases (weighted by regime: launch-bound "
        "0.6, capacity 1.8, long-sequence 1.6, projection-bound 1.4, others 1)",
    )
    add_storage(p)
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
        help="seed new studies with plans from @PLAN.json (one plan), a table file, a "
        "profile's studies (their fastest plans, by measured time) or a study name; "
        "comma-separated, measured in that order",
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

    p = sub.add_parser(
        "efficiency",
        help="samplers against exhaustive tuning on one case (measure every plan once, "
        "then replay samplers on the measurements)",
    )
    add_gpu(p)
    p.add_argument("--case", required=True, help="case id or custom shape")
    p.add_argument("--space", required=True, help="a (reduced) search-space file to exhaust")
    p.add_argument("--cache", required=True, help="JSON file of measurements (resumable)")
    p.add_argument("--samplers", default="tpe,gp,nsga2,random")
    p.add_argument("--seeds", type=int, default=5, help="seeds per sampler")
    p.add_argument(
        "--trials",
        type=int,
        help="trials per replayed study, repeats of measured plans included (default: space size)",
    )
    p.add_argument(
        "--budget-measured",
        type=int,
        metavar="N",
        help="instead of --trials: replay each study until N trials measured a new plan, as "
        "a study counts --n-trials (repeats, forbidden and refused plans are free); a run "
        "also stops after --max-free-streak free trials in a row, or once every plan is "
        "measured, and records why",
    )
    p.add_argument(
        "--max-free-streak",
        type=int,
        metavar="K",
        help="with --budget-measured: free trials in a row that stop a replayed study "
        "early (default 200: MAX_FREE_STREAK, where studies stop)",
    )
    p.add_argument(
        "--stop-at-target",
        action="store_true",
        help="with --budget-measured: end each replayed study at its first plan within 3%% "
        "of the exhaustive best (the trials to it are unchanged; free trials are then "
        "counted up to it; keeps GP, slow per trial, from running on)",
    )
    p.add_argument(
        "--max-trials-per-run",
        type=int,
        metavar="M",
        help="with --budget-measured: a replayed study also stops after M trials in all, "
        "free ones included, and records it (default: no limit, as studies; GP's trials "
        "cost seconds each past a few hundred on the CPU)",
    )
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
    p.set_defaults(func=cmd_efficiency, out_is="dir")
