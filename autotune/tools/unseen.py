"""``autotune unseen``: how a table serves shapes it has no entry for.

Random shapes (batch and sequence length log-uniform in the given ranges, the other dims
of a case; none of them a key of the table) are each run in a process of their own: the
table's dispatcher (``DispatchedTransformer``: an entry, a bucket, or the reference)
against the reference on 5 seeds + 5 padded seeds (every failed element counted), then
timed interleaved with the reference; on CUDA its steady calls run under
``torch.cuda.set_sync_debug_mode("error")``. With ``gate_unseen`` the dispatcher may gate
a plan for a shape outside every bucket on its first call (the route records the verdict).
Where a study of that exact shape exists in
``--storage``, its best plan is timed in the same run: how close the bucket comes to a
plan tuned for the shape. One CSV row per shape, appended as it ends (a rerun skips the
shapes the CSV holds), and a summary line.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import random
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.core.cases import Case, CaseKey
from autotune.core.files import csv_header, csv_rows

COLUMNS = (
    "batch",
    "seq",
    "route",
    "source",
    "served",
    "failed_elements",
    "worst_share",
    "ref_ms",
    "table_ms",
    "speedup",
    "noise",
    "tuned_ms",
    "tuned_speedup",
    "vs_tuned",
    "tuned_plan",
    "sync_free",
    "table_hash",
)
UNSEEN_TIMING = dict(warmup=5, rounds=3, reps=30, max_round_seconds=0.5, cuda_turn=4)


def draw_shapes(
    base: Case,
    count: int,
    batch: tuple[int, int],
    seq: tuple[int, int],
    seed: int,
    exclude: set[tuple[Any, ...]],
) -> list[tuple[int, int]]:
    """``count`` distinct (batch, seq), log-uniform in the ranges, none a key in ``exclude``."""
    rng = random.Random(seed)
    dims = CaseKey.from_config(base.config, base.dtype).as_tuple()[2:]
    out: list[tuple[int, int]] = []
    for _ in range(count * 200):
        if len(out) == count:
            break
        b = round(math.exp(rng.uniform(math.log(batch[0]), math.log(batch[1]))))
        s = round(math.exp(rng.uniform(math.log(seq[0]), math.log(seq[1]))))
        if (b, s) not in out and (b, s, *dims) not in exclude:
            out.append((b, s))
    if len(out) < count:
        raise ValueError(
            f"only {len(out)} shapes in batch {batch[0]}-{batch[1]} x seq {seq[0]}-{seq[1]} are "
            f"not in the table; ask for fewer (--count) or widen the ranges"
        )
    return out


@dataclasses.dataclass(frozen=True)
class ShapeJob:
    table: str
    profile: str
    emulated: bool
    key: tuple[Any, ...]
    tuned_plan: dict[str, Any] | None
    tuned_from: str
    gate_unseen: bool = False  # the dispatcher's opt-in one-time gate for shapes outside buckets


def measure_shape(job: ShapeJob) -> dict[str, Any]:
    """One shape: the dispatcher's route, correctness on 10 inputs, timing (and the tuned
    plan's, if given), and whether its steady calls synchronise."""
    import torch

    from autotune.build import build_candidate
    from autotune.core.cases import classify_regime
    from autotune.core.profiles import select_profile
    from autotune.core.reference import ACCURACY_SEEDS, check_outputs, generate_random_case
    from autotune.judge.gate import CaseBench
    from autotune.measure import (
        TimingSettings,
        measure_interleaved,
        paired_stats,
        steady_calls_sync_free,
    )
    from autotune.plan import Plan
    from autotune.runtime import DispatchedTransformer, serving
    from autotune.ship.buckets import config_at

    selection = select_profile(job.profile, emulate=job.emulated)
    device = selection.effective_device()
    b, s = job.key[0], job.key[1]
    config = config_at(tuple(job.key[2:]), b, s)
    case = Case(f"unseen-{b}x{s}", config, classify_regime(config))
    bench = CaseBench(case, device, reference="dense")  # the whole batch, never a subset
    where = device.torch_device
    model = DispatchedTransformer(config, table=job.table, gate_unseen=job.gate_unseen)
    model.load_state_dict(bench.state_dict)
    model = model.to(where).eval()
    cuda = where.type == "cuda"
    failed = 0
    worst = 0.0
    with serving():
        x, mask = bench.timing_inputs()
        with warnings.catch_warnings():  # the gate's verdict is this row's route
            warnings.simplefilter("ignore")
            model(x, mask)  # the first call: resolves the route (and gates, if asked)
        route = model.last_route
        assert route is not None
        for padding in (0.0, 0.25):
            for seed in ACCURACY_SEEDS:
                xs, ms = generate_random_case(config, where, torch.float32, seed, padding)
                report = check_outputs(model(xs, ms), bench.reference(xs, ms))
                failed += report.n_failed  # non-finite elements are counted in it
                worst = max(worst, report.budget_share)
        fns: list[Callable[[], Any]] = [lambda: bench.reference(x, mask), lambda: model(x, mask)]
        tuned = None
        if job.tuned_plan is not None:
            plan = Plan.from_dict(job.tuned_plan)
            tuned = build_candidate(plan, config, device, bench.state_dict)
            fns.append(lambda: tuned(x, mask))
        reps, medians = measure_interleaved(fns, TimingSettings(**UNSEEN_TIMING), cuda=cuda)
        sync_free = steady_calls_sync_free(lambda: model(x, mask)) if cuda else ""
    stats = paired_stats(medians[0], medians[1], reps, cuda)
    row: dict[str, Any] = {
        "batch": b,
        "seq": s,
        "route": route.target,
        "source": route.source if route.plan is not None else "; ".join(route.reasons),
        "served": "yes" if route.plan is not None else "no",
        "failed_elements": failed,
        "worst_share": round(worst, 4),
        "ref_ms": round(stats.ref_median_ms, 5),
        "table_ms": round(stats.cand_median_ms, 5),
        "speedup": round(stats.speedup, 3),
        "noise": round(stats.noise, 4),
        "tuned_ms": "",
        "tuned_speedup": "",
        "vs_tuned": "",
        "tuned_plan": "",
        "sync_free": sync_free,
        "table_hash": model.table.content_hash if model.table else "",
    }
    if tuned is not None:
        t = medians[2][0]
        row |= {
            "tuned_ms": round(t, 5),
            "tuned_speedup": round(stats.ref_median_ms / t, 3),
            "vs_tuned": round(t / stats.cand_median_ms, 3),
            "tuned_plan": f"{job.tuned_from}: {Plan.from_dict(job.tuned_plan).describe()}",
        }
    return row


def tuned_plans(storage_url: str | None, profile: str) -> dict[tuple[Any, ...], tuple[dict, str]]:
    """Per case key, the fastest feasible plan of that shape's study in the storage (the
    current space's study first, else the one with the most trials)."""
    if not storage_url:
        return {}
    from autotune.search import trials

    storage = trials.open_storage(storage_url, heartbeat_interval=None, grace_period=None)
    out = {}
    for study in trials.studies_by_case(storage, profile, trials.current_study(profile)).values():
        best = trials.feasible_by_time(study.get_trials(deepcopy=False))
        plan = trials.trial_plan(best[0]) if best else None
        if plan is not None:
            out[trials.case_of(study).key.as_tuple()] = (
                plan.to_dict(full=False),
                f"study {study.study_name} trial {best[0].number}",
            )
    return out


def append_row(path: Path, row: dict[str, Any]) -> None:
    """One shape's row, appended as it ends (the header with the first row)."""
    import io

    from autotune.core.files import append_line

    header, line = io.StringIO(), io.StringIO()
    csv.DictWriter(header, fieldnames=COLUMNS, lineterminator="\n").writeheader()
    csv.DictWriter(line, fieldnames=COLUMNS, lineterminator="\n").writerow(
        {k: row.get(k, "") for k in COLUMNS}
    )
    append_line(path, header.getvalue(), line.getvalue())


def summary(rows: list[dict[str, Any]]) -> str:
    """The summary line: share served by a tuned plan, speedups, against tuned plans,
    failed elements, sync-free calls."""
    n = len(rows)
    if not n:
        return "no shapes measured"
    served = [r for r in rows if str(r["served"]) == "yes"]
    speedups = sorted(float(r["speedup"]) for r in served)
    vs = [float(r["vs_tuned"]) for r in rows if str(r.get("vs_tuned", "")) not in ("", "None")]
    failed = sum(int(r["failed_elements"]) for r in rows)
    syncs = [r for r in served if str(r.get("sync_free")).startswith("no")]

    def geomean(values: list[float]) -> float:
        return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0

    # Shapes left on the reference time the reference against itself: their ratios are noise.
    on_reference = []
    for r in rows:
        try:  # a shape that errored has no time (no key, or "" read back from a CSV)
            value = float(r.get("speedup") or "nan") if str(r["served"]) == "no" else math.nan
        except ValueError:
            value = math.nan
        if value > 0:
            on_reference.append(value)
    errors = sum(str(r["served"]) == "error" for r in rows)
    parts = [
        f"{len(served)} of {n} unseen shapes ({100 * len(served) / n:.0f}%) served by a tuned plan",
        f"speedup over the reference: geometric mean {geomean(speedups):.2f}x, min "
        f"{speedups[0]:.2f}x"
        if speedups
        else "no speedups: "
        + (f"{errors} shape(s) errored, the rest " if errors else "every shape ")
        + "ran on the reference"
        + (
            f" (timed against itself: {geomean(on_reference):.2f}x, the noise)"
            if on_reference
            else ""
        ),
        f"{failed} failed elements",
    ]
    if vs:
        parts.append(
            f"against a plan tuned for the exact shape ({len(vs)} shapes): median "
            f"{statistics.median(vs):.2f}x its speed (min {min(vs):.2f}x)"
        )
    parts.append(f"{len(syncs)} served shapes synchronise per call" if syncs else "sync-free")
    return "; ".join(parts)


def run_unseen(
    table_path: str,
    base: Case,
    profile: str,
    emulated: bool,
    *,
    count: int,
    batch: tuple[int, int],
    seq: tuple[int, int],
    seed: int,
    csv_path: Path | None,
    storage_url: str | None,
    isolate: bool = True,
    gate_unseen: bool = False,
    emit: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Measure ``count`` unseen shapes (resuming from ``csv_path``); returns every row of
    this table (the CSV's earlier ones included)."""
    from autotune.core.isolate import call_isolated
    from autotune.runtime import load_table

    table = load_table(table_path)
    dims = CaseKey.from_config(base.config, base.dtype).as_tuple()[2:]
    shapes = draw_shapes(base, count, batch, seq, seed, set(table.entries))
    tuned = tuned_plans(storage_url, profile)
    rows: list[dict[str, Any]] = []  # this table's rows of these shapes, measured before
    if csv_path is not None and csv_path.is_file() and csv_path.stat().st_size:
        header = csv_header(csv_path)
        if header != list(COLUMNS):  # appending would mix its rows into another file
            raise ValueError(
                f"--csv {csv_path} is not a CSV that 'autotune unseen --csv' writes (its "
                f"header is {','.join(header)[:80]!r}); give another --csv"
            )
        found, torn = csv_rows(csv_path)
        if torn:
            emit(f"{csv_path}: {torn} row(s) cut short (a run killed mid-write) left out")
        rows = [
            r
            for r in found
            if r.get("table_hash") == table.content_hash
            and (int(r["batch"]), int(r["seq"])) in shapes
        ]
    done = {(int(r["batch"]), int(r["seq"])) for r in rows}
    emit(f"{len(shapes)} unseen shapes of {base.id}'s dims; {len(done)} already in the CSV")
    for b, s in shapes:
        if (b, s) in done:
            continue
        key = (b, s, *dims)
        plan, origin = tuned.get(key, (None, ""))
        job = ShapeJob(table_path, profile, emulated, key, plan, origin, gate_unseen)
        row, problem = call_isolated(measure_shape, job) if isolate else (measure_shape(job), "")
        if row is None:
            row = {"batch": b, "seq": s, "route": f"error: {problem}", "served": "error",
                   "failed_elements": 0, "table_hash": table.content_hash}  # fmt: skip
        emit(
            f"batch {b:>4} seq {s:>5}: {row.get('route', '')[:60]:<60} "
            f"{row.get('speedup', '')}x failed {row.get('failed_elements', '')}"
            + (f" vs tuned {row['vs_tuned']}x" if row.get("vs_tuned") not in (None, "") else "")
        )
        if csv_path is not None:
            append_row(csv_path, row)
        rows.append(row)
    return rows
