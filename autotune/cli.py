"""The ``autotune`` command line. Heavy modules are imported inside each command."""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

DEFAULT_GOLDEN = "../shared/golden/*.pt"


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


def _default_vectors(paths: Sequence[str]) -> list[str]:
    if paths:
        return list(paths)
    found = sorted(glob.glob(DEFAULT_GOLDEN))
    if not found:
        raise CliError(f"no vectors given and none found at {DEFAULT_GOLDEN}; pass .pt files")
    return found


# --- commands ------------------------------------------------------------------------
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

    for knob in KNOBS:
        print(f"{knob.name} [{knob.group}] default {knob.default!r}: {knob.help}")
        print(f"    values: {knob.describe_values()}")
        for value, need in knob.needs.items():
            print(f"    {value!r} needs {need}")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from autotune.core.profiles import PROFILES

    for p in PROFILES.values():
        print(
            f"{p.name:<8} {p.memory_bytes / 2**30:>6.1f} GiB  {p.describe_rule():<32} "
            f"{p.description}"
        )
    return 0


def _subject_for(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Pick what conformance checks: the reference, a plan, a table or the oracle."""
    if getattr(args, "plan", None):
        from autotune.build import build_candidate
        from autotune.core.device import detect_device
        from autotune.plan import parse_plan

        plan = parse_plan(args.plan)
        device = detect_device("cpu")

        def subject(config, state_dict):  # type: ignore[no-untyped-def]
            return build_candidate(plan, config, device, state_dict)

        return subject, None
    if getattr(args, "oracle", False):
        from autotune.judge.golden import REFERENCE_TOLERANCE
        from autotune.judge.oracle import StreamedOracle

        qc, kc = _chunks(args.oracle_chunks)

        def oracle_subject(config, state_dict):  # type: ignore[no-untyped-def]
            model = StreamedOracle(config, query_chunk=qc, key_chunk=kc)
            model.load_state_dict(state_dict)
            return model.eval()

        return oracle_subject, REFERENCE_TOLERANCE
    if getattr(args, "table", None):
        from autotune.runtime.dispatch import DispatchedTransformer, load_table

        table = load_table(args.table)

        def table_subject(config, state_dict):  # type: ignore[no-untyped-def]
            model = DispatchedTransformer(config, table=table)
            model.load_state_dict(state_dict)
            return model.eval()

        return table_subject, None
    from autotune.judge.golden import REFERENCE_TOLERANCE, reference_subject

    return reference_subject, REFERENCE_TOLERANCE


def _chunks(text: str) -> tuple[int, int]:
    try:
        q, k = (int(v) for v in text.split(","))
    except ValueError:
        raise CliError(f"--oracle-chunks takes 'QUERY,KEY' chunk sizes, got {text!r}") from None
    if q < 1 or k < 1:
        raise CliError(f"--oracle-chunks must be positive, got {text!r}")
    return q, k


def cmd_conformance(args: argparse.Namespace) -> int:
    from autotune.judge.golden import run_conformance

    subject, exact = _subject_for(args)
    _, failed = run_conformance(_default_vectors(args.vectors), subject, exact_tolerance=exact)
    return 1 if failed else 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    import json

    from autotune.core.cases import select_cases
    from autotune.core.profiles import select_profile
    from autotune.evaluate import evaluate_plan
    from autotune.judge.gate import CaseBench
    from autotune.measure import OFFICIAL_TIMING, STUDY_TIMING
    from autotune.plan import parse_plan

    selection = select_profile(args.gpu, emulate=args.emulate)
    cases = select_cases(args.case)
    plans = [parse_plan(text) for text in args.plan]
    timing = OFFICIAL_TIMING if args.official else STUDY_TIMING
    dev = selection.device
    records = []
    failures = 0
    for case in cases:
        bench = CaseBench(case, selection.effective_device())
        for plan in plans:
            outcome = evaluate_plan(
                bench, plan, timing=timing, capacity_bytes=selection.capacity_bytes
            )
            print(
                f"case {case.id} {case.key} on {dev.name} ({dev.sm}), profile "
                f"{selection.profile.name}" + (" (emulated)" if selection.emulated else "")
            )
            _print_outcome(plan, outcome)
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
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 1 if failures else 0


def _print_outcome(plan, outcome) -> None:  # type: ignore[no-untyped-def]
    print(f"plan {plan.hash} {plan.describe()}")
    if outcome.report is not None:
        print(
            f"correctness: {outcome.seeds_checked} seeds + {outcome.padded_seeds_checked} "
            f"padded: {outcome.report.summary()}"
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


# --- parser --------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotune",
        description="Tune a fixed Transformer layer per input shape under a hard "
        "per-element correctness rule, and export the winners as a dispatch table.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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

    p = sub.add_parser("evaluate", help="gate and time one plan on one case")
    _add_gpu(p)
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

    from autotune import cli_more

    cli_more.add_commands(sub)
    from autotune import cli_long

    cli_long.add_commands(sub)
    return parser


def _add_gpu(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu",
        default="cpu",
        help="GPU profile: cpu, auto, h200, h100, a100, rtx4090, rtx5080 (default cpu)",
    )
    p.add_argument(
        "--emulate",
        action="store_true",
        help="run a profile on another device, capping memory to the profile's",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv_text = [shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)][1:]
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return int(args.func(args) or 0)
    except (CliError, ValueError, RuntimeError, OSError) as exc:
        print(f"autotune {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        storage_error = type(exc).__module__.split(".")[0] == "sqlalchemy" or (
            type(exc).__name__ == "StorageInternalError"
        )
        if not storage_error:
            raise
        cause = exc.__cause__ or exc
        text = str(cause).strip()
        first = text.splitlines()[0] if text else type(cause).__name__
        print(
            f"autotune {args.command}: storage error: {first}; nothing was written by the "
            "failed step (each write is one transaction). Check that the database is not "
            "locked by another program, is writable, and is intact.",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print(f"autotune {args.command}: interrupted", file=sys.stderr)
        return 130
