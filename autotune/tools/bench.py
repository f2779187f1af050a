"""``autotune bench``: the official protocol, reference against a table's dispatcher."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import statistics
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from autotune.build import build_candidate, not_supported_reasons
from autotune.core.cases import Case, case_sort_key
from autotune.core.device import DeviceInfo
from autotune.core.outcome import HOST_HEADROOM, OutcomeKind, paced_by
from autotune.core.profiles import ProfileSelection
from autotune.core.reference import official_settings
from autotune.evaluate import Candidate, evaluate_many
from autotune.judge.gate import CaseBench, GateSettings
from autotune.measure import (
    OFFICIAL_TIMING,
    TimingSettings,
    eager_launch_us,
    host_ms_per_call,
    steady_calls_sync_free,
)
from autotune.plan import ANCHORS, Plan
from autotune.runtime import DispatchedTransformer, DispatchTable
from autotune.runtime.buckets import find_bucket
from autotune.runtime.dispatch import Route

BENCH_GATE = GateSettings(padded_seeds=())  # the official protocol: 5 seeds, as given


@dataclasses.dataclass
class BenchRow:
    case: str
    route: str
    verdict: str
    ref_ms: float | None = None
    table_ms: float | None = None
    speedup: float | None = None
    noise: float | None = None
    ref_peak_mib: float | None = None
    table_peak_mib: float | None = None
    worst_share: float | None = None
    failed_elements: int = 0
    baseline_ms: float | None = None  # --baseline: another table, same interleaved run
    baseline_speedup: float | None = None
    table_vs_baseline: float | None = None  # baseline median / table median
    # --anchors: name -> (verdict, speedup over the reference or None), and each passing
    # anchor's median ms, timed interleaved with the reference and the table in one run.
    anchors: dict[str, tuple[str, float | None]] = dataclasses.field(default_factory=dict)
    anchor_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    detail: str = ""  # why a candidate that did not pass could not run
    table_hash: str = ""  # the content hash of the table benched (rows of one table only)
    # --hot-path (CUDA): the table's forward, where its time goes
    host_us: float | None = None  # host time of one call onto an idle device (median)
    gpu_us: float | None = None  # device time per forward (profiler, kernels + copies)
    kernels: float | None = None  # device kernels per forward
    ceiling: float | None = None  # reference median / gpu time: the speedup with no host cost
    sync_free: str = ""  # "yes", or the first host synchronisation a steady call made
    # --hot-path (CUDA): this process's host speed, us of host time per eager launch
    # (``eager_launch_us``); the reference's own time on launch-bound cases follows it.
    launch_us: float | None = None
    # What the row was benched with (JSON: anchors, baseline table hash, hot path): a CSV
    # resumes only under the same options. Empty in rows of versions before it.
    options: str = ""

    def best_anchor(self) -> tuple[str, float] | None:
        passing = [(n, s) for n, (v, s) in self.anchors.items() if v == "PASS" and s]
        return max(passing, key=lambda t: t[1]) if passing else None


def _dispatcher(
    case: Case, bench: CaseBench, table: DispatchTable, device: DeviceInfo
) -> DispatchedTransformer:
    model = DispatchedTransformer(case.config, table=table)
    model.load_state_dict(bench.state_dict)
    return model.to(device.torch_device).eval()


def _anchor(name: str, bench: CaseBench) -> Plan | Candidate:
    """An anchor as a user writes it: compiled outputs left as Inductor hands them out
    (no copy for the caller). A plan the device cannot run stays a plan, so that its
    outcome says why."""
    plan = ANCHORS[name]
    if not_supported_reasons(plan, bench.config, bench.device):
        return plan
    module = build_candidate(plan, bench.config, bench.device, bench.state_dict, owns_output=False)
    return Candidate(name, module)


def bench_case(
    case: Case,
    device: DeviceInfo,
    table: DispatchTable,
    timing: TimingSettings = OFFICIAL_TIMING,
    baseline: DispatchTable | None = None,
    anchors: list[str] | None = None,
    hot_path: bool = False,
) -> BenchRow:
    """One case in one process: the reference, the table's dispatcher, the baseline
    table's and every anchor, each gated on the official seeds, then timed interleaved
    with the official loop (absolute medians, each over this one reference)."""
    if case.regime == "infeasible-dense":
        return BenchRow(
            case.id,
            "-",
            "SKIP (the dense reference cannot run this shape)",
            table_hash=table.content_hash,
        )
    bench = CaseBench(case, device)
    model = _dispatcher(case, bench, table, device)
    candidates: list[Any] = [Candidate("table", model)]
    if baseline is not None:
        candidates.append(Candidate("baseline", _dispatcher(case, bench, baseline, device)))
    x, mask = bench.timing_inputs()
    with official_settings(), torch.inference_mode():
        explained = [c.module.explain(x, mask) for c in candidates]

    def unserved(route: Route, of: DispatchTable) -> bool:
        # an entry or a bucket for the shape whose plan cannot run here is a timed row, as
        # the table stands on this device; no entry or bucket at all, nothing to time
        return (
            of.usable and route.plan is None and route.pending_gate is None
            and route.key not in of.entries and find_bucket(of.buckets, route.key) is None
        )  # fmt: skip

    if unserved(explained[0], table) and (baseline is None or unserved(explained[1], baseline)):
        # nothing serves it: a row would time the reference against itself
        bench.release()
        return BenchRow(
            case.id,
            str(explained[0]),
            "SKIP (no entry or bucket of the table"
            + (" or the baseline" if baseline is not None else "")
            + " serves this case)",
            table_hash=table.content_hash,
        )
    routes = [str(r) for r in explained]
    names = list(anchors or [])
    candidates += [_anchor(name, bench) for name in names]
    outcomes = evaluate_many(bench, candidates, timing=timing, gate=BENCH_GATE, prune=False)
    mine = outcomes[: len(routes)]
    for outcome, route, prefix in zip(mine, routes, ("", "baseline: ")[: len(routes)], strict=True):
        if not outcome.passed or outcome.timing is None:
            bench.release()
            report = outcome.report
            return BenchRow(
                case.id,
                prefix + route,
                "FAIL",
                worst_share=report.budget_share if report else None,
                failed_elements=report.n_failed if report else 0,
                detail="" if report else f"{outcome.kind.value}: {outcome.message}",
                table_hash=table.content_hash,
            )
    table_out = mine[0]
    stats = table_out.timing
    assert stats is not None
    mib = 2**20
    row = BenchRow(
        case.id,
        routes[0],
        "PASS",
        stats.ref_median_ms,
        stats.cand_median_ms,
        stats.speedup,
        stats.noise,
        table_out.ref_peak_memory_bytes / mib if table_out.ref_peak_memory_bytes else None,
        table_out.peak_memory_bytes / mib if table_out.peak_memory_bytes else None,
        table_out.report.budget_share if table_out.report else None,
        0,
        table_hash=table.content_hash,
    )
    if baseline is not None and mine[1].timing is not None:
        base = mine[1].timing
        row.baseline_ms = base.cand_median_ms
        row.baseline_speedup = base.speedup
        row.table_vs_baseline = base.cand_median_ms / stats.cand_median_ms
    for name, outcome in zip(names, outcomes[len(routes) :], strict=True):
        if outcome.passed and outcome.timing is not None:
            row.anchors[name] = ("PASS", outcome.timing.speedup)
            row.anchor_ms[name] = outcome.timing.cand_median_ms
        elif outcome.kind is OutcomeKind.WRONG_RESULT:
            row.anchors[name] = ("FAIL", None)
        else:
            row.anchors[name] = (outcome.kind.value, None)
    if hot_path and device.type == "cuda":
        with official_settings(), torch.inference_mode():
            spent = measure_hot_path(lambda: model(x, mask))
        row.host_us, row.gpu_us, row.kernels, row.sync_free = spent
        row.launch_us = eager_launch_us(device=device.torch_device)
        row.ceiling = stats.ref_median_ms * 1e3 / row.gpu_us if row.gpu_us else None
    bench.release()
    return row


def busy_us(events: Iterable[Any]) -> float:
    """The union of the events' time ranges (profiler device events), in microseconds: the
    device's busy time. Kernels that overlap count once: with programmatic dependent launch a
    kernel's programs are resident, waiting, while the one before runs, and the sum of the
    kernels' times counts that wait twice."""
    total, start, end = 0.0, None, None
    for s, e in sorted((ev.time_range.start, ev.time_range.end) for ev in events):
        if end is None or s > end:
            if end is not None:
                total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    return total + (end - start if end is not None else 0.0)


def measure_hot_path(
    fn: Callable[[], Any], calls: int = 20, profiled: int = 10
) -> tuple[float, float, float, str]:
    """A warm forward's cost on CUDA: host microseconds per call (``host_ms_per_call``:
    the median of 5 x ``calls`` calls, each issued on an idle device), device microseconds
    (the union of the device events' spans, ``busy_us``: overlapping kernels count once) and
    kernels per forward (profiler over ``profiled`` forwards: kernels, copies and sets), and
    whether steady calls are free of host synchronisation (``set_sync_debug_mode("error")``)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    host = host_ms_per_call(fn, calls, bursts=5) * 1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(profiled):
            fn()
        torch.cuda.synchronize()
    device_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu = busy_us(device_events)
    kernels = sum(1 for e in device_events if not e.name.lower().startswith(("memcpy", "memset")))
    return host, gpu / profiled, kernels / profiled, steady_calls_sync_free(fn)


ROW_HEADER = (
    f"{'case':<8} {'verdict':<7} {'ref ms':>9} {'table ms':>9} {'speedup':>8} "
    f"{'noise':>6} {'ref MiB':>9} {'tbl MiB':>9}  route"
)


def row_line(r: BenchRow) -> str:
    """One case as a line of the table under ``ROW_HEADER`` (columns aligned, '-' for none)."""

    def f(v: float | None, spec: str, width: int, unit: str = "") -> str:
        text = format(v, spec) + unit if v is not None else "-"
        return f"{text:>{width}}"

    noise = 100 * r.noise if r.noise is not None else None
    verdict, _, why = r.verdict.partition(" ")  # "SKIP (why)": the why after the route
    return (
        f"{r.case:<8} {verdict:<7} {f(r.ref_ms, '.3f', 9)} {f(r.table_ms, '.3f', 9)} "
        f"{f(r.speedup, '.2f', 8, 'x')} {f(noise, '.1f', 6, '%')} "
        f"{f(r.ref_peak_mib, '.0f', 9)} {f(r.table_peak_mib, '.0f', 9)}  {r.route}"
        + (f"  {why}" if why else "")
    )


def summarise(rows: list[BenchRow]) -> str:
    """What follows the rows: the baseline and anchor tables, and the geometric mean."""
    timed = [r for r in rows if r.speedup]
    lines: list[str] = []
    if any(r.table_vs_baseline for r in rows):
        lines.append("")
        lines.append(
            f"{'case':<8} {'baseline ms':>11} {'baseline':>9} {'table':>8} {'table/baseline':>14}"
        )
        for r in rows:
            if r.table_vs_baseline:
                lines.append(
                    f"{r.case:<8} {r.baseline_ms:>11.3f} {r.baseline_speedup:>8.2f}x "
                    f"{r.speedup:>7.2f}x {r.table_vs_baseline:>13.2f}x"
                )
        vs = [r.table_vs_baseline for r in rows if r.table_vs_baseline]
        base_geo = math.exp(
            sum(math.log(r.baseline_speedup) for r in rows if r.baseline_speedup) / len(vs)
        )
        lines.append(
            f"baseline geometric mean {base_geo:.2f}x; table over baseline: "
            f"geometric mean {math.exp(sum(map(math.log, vs)) / len(vs)):.2f}x, "
            f"worst {min(vs):.2f}x"
        )
    if any(r.anchors for r in rows):
        names = list(dict.fromkeys(n for r in rows for n in r.anchors))
        lines.append("")
        lines.append(
            f"{'case':<8} {'table':>8} "
            + " ".join(f"{n:>22}" for n in names)
            + f" {'table/best anchor':>18}"
        )
        ratios = []
        for r in rows:
            cells = []
            for n in names:
                verdict, speed = r.anchors.get(n, ("-", None))
                ms = r.anchor_ms.get(n)
                if verdict == "PASS" and speed:
                    cells.append(f"{f'{speed:.2f}x' + (f' {ms:.3f}ms' if ms else ''):>22}")
                else:
                    cells.append(f"{verdict:>22}")
            best = r.best_anchor()
            ratio = r.speedup / best[1] if best and r.speedup else None
            if ratio:
                ratios.append(ratio)
            lines.append(
                f"{r.case:<8} {(r.speedup or 0):>7.2f}x "
                + " ".join(cells)
                + (f" {ratio:>17.2f}x" if ratio else f" {'-':>18}")
            )
        if ratios:
            lines.append(
                f"table over the fastest passing anchor: geometric mean "
                f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x, "
                f"worst {min(ratios):.2f}x"
            )
    if any(r.host_us for r in rows):
        lines.append("")
        lines.append(
            f"{'case':<8} {'table ms':>9} {'host us/call':>13} {'GPU us/fwd':>11} "
            f"{'kernels':>8} {'ceiling':>8}  {'paced by':<9} sync-free"
        )
        exposed = []
        for r in rows:
            if r.host_us is not None:
                pace = paced_by(r.host_us, r.gpu_us)
                if pace.startswith("host"):
                    exposed.append(r)
                lines.append(
                    f"{r.case:<8} {r.table_ms or 0:>9.3f} {r.host_us:>13.1f} "
                    f"{r.gpu_us or 0:>11.1f} {r.kernels or 0:>8.0f} "
                    f"{r.ceiling or 0:>7.1f}x  {pace:<9} {r.sync_free}"
                )
        probes = [r.launch_us for r in rows if r.launch_us]
        if probes:
            lines.append(
                f"host speed: {statistics.median(probes):.1f} us of host time per eager launch "
                f"(the median of {len(probes)} measurements, one as each case ended; a "
                "launch-bound reference slows with it: compare runs' speedups only with this "
                "figure beside them)"
            )
        if exposed:
            lines.append(
                f"paced by the host, now or with the host {HOST_HEADROOM:g}x slower: case "
                + ", ".join(str(r.case) for r in exposed)
                + f" (re-export: export ranks plans by their time with the host "
                f"{HOST_HEADROOM:g}x slower)"
            )
    failed = sum(r.verdict == "FAIL" for r in rows)
    skipped = sum(r.verdict.startswith("SKIP") for r in rows)
    tail = f"{failed} failed" + (f"; {skipped} skipped" if skipped else "")
    if timed:
        geo = math.exp(sum(math.log(r.speedup) for r in timed) / len(timed))
        worst = min(timed, key=lambda r: r.speedup)
        lines.append(
            f"geometric mean {geo:.2f}x over {len(timed)} cases; worst case "
            f"{worst.case} {worst.speedup:.2f}x; {tail}"
        )
    elif rows:
        lines.append(f"no case timed; {tail}")
    return "\n".join(lines)


CSV_FIELDS = [f.name for f in dataclasses.fields(BenchRow)]
_JSON_FIELDS = ("anchors", "anchor_ms")


def write_csv(rows: list[BenchRow], path: str | Path) -> None:
    """All rows, written atomically."""
    from autotune.core.files import write_atomic

    write_atomic(Path(path), "".join([_csv_text(None), *(_csv_text(r) for r in rows)]))


def append_csv(row: BenchRow, path: str | Path) -> None:
    """One case's row, appended as soon as the case ends (a run cut short keeps its rows);
    the header is written with the first row. A CSV an older version wrote (other
    columns) is rewritten whole, atomically, under this version's header first. Under the
    append's lock, a CSV that another run meanwhile gave rows of another table is refused
    (two benches of two tables on one CSV at once)."""
    from autotune.core.files import append_line

    path = Path(path)
    header = _csv_text(None)
    if path.is_file() and path.stat().st_size:
        with path.open(newline="") as fh:
            first = fh.readline()
        if first != header:
            write_csv([*read_csv(path), row], path)
            return

    def alone(text: str) -> None:
        for other in csv.DictReader(text.splitlines()):
            if other.get("table_hash") != row.table_hash:
                raise ValueError(
                    f"{path}: another bench wrote rows of table "
                    f"{str(other.get('table_hash'))[:16]} to it while this one (table "
                    f"{row.table_hash[:16]}) ran: give each table its own --csv"
                )

    append_line(path, header, _csv_text(row), check=alone)


def bench_options(anchors: list[str] | None, baseline: DispatchTable | None, hot_path: bool) -> str:
    """What a row is benched with, as the CSV's ``options`` column holds it."""
    return json.dumps(
        {
            "anchors": sorted(anchors or []),
            "baseline": baseline.content_hash if baseline is not None else "",
            "hot_path": hot_path,
        },
        sort_keys=True,
    )


def _same_options(row: BenchRow, options: str) -> bool:
    """Whether a CSV's row was benched as this run benches (rows written before the
    column: the anchors they hold, and whether they have a baseline's time)."""
    if row.options:
        return row.options == options
    asked = json.loads(options)
    return sorted(row.anchors) == asked["anchors"] and (row.baseline_ms is not None) == bool(
        asked["baseline"]
    )


def read_csv(path: str | Path) -> list[BenchRow]:
    """The rows of a bench CSV (the ones this version writes)."""
    path = Path(path)
    if not path.is_file():
        return []
    from autotune.core.files import csv_header, csv_rows

    missing = [f for f in ("case", "verdict", "table_hash") if f not in csv_header(path)]
    if missing and path.stat().st_size:
        raise ValueError(
            f"{str(path)!r} is not a CSV that 'autotune bench --csv' writes (no "
            f"{', '.join(missing)} column); give one it wrote"
        )
    found, torn = csv_rows(path)
    if torn:
        warnings.warn(
            f"{path}: {torn} row(s) cut short (a run killed mid-write) left out; their "
            "cases run again",
            stacklevel=2,
        )
    return [_row_from_csv(data) for data in found]


def _csv_text(row: BenchRow | None) -> str:
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    if row is None:
        writer.writeheader()
    else:
        data = dataclasses.asdict(row)
        for name in _JSON_FIELDS:
            data[name] = json.dumps(data[name], sort_keys=True)
        writer.writerow(data)
    return buf.getvalue()


def _row_from_csv(data: dict[str, str]) -> BenchRow:
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(BenchRow):
        raw = data.get(f.name, "")
        if f.name in _JSON_FIELDS:
            value = json.loads(raw or "{}")
            kwargs[f.name] = (
                {k: tuple(v) for k, v in value.items()} if f.name == "anchors" else value
            )
        elif f.name == "failed_elements":
            kwargs[f.name] = int(raw or 0)
        elif f.type in ("str",):
            kwargs[f.name] = raw
        else:
            kwargs[f.name] = float(raw) if raw not in ("", "None") else None
    return BenchRow(**kwargs)


def _old_options(row: BenchRow) -> str:
    """What a row written before the ``options`` column shows of its options."""
    return f"anchors {sorted(row.anchors)}, " + (
        "a baseline" if row.baseline_ms is not None else "no baseline"
    )


def serves(table: DispatchTable, case: Case) -> bool:
    """Whether an entry or a bucket of ``table`` is for this case's key (its plan may
    still be one the device cannot run)."""
    key = case.key.as_tuple()
    return key in table.entries or find_bucket(table.buckets, key) is not None


def table_cases(table: DispatchTable) -> str:
    """The case spec of every entry of a table, in case order."""
    return ",".join(sorted({e["case"] for e in table.entries.values()}, key=case_sort_key))


def bench_table(
    table: DispatchTable,
    cases: list[Case],
    selection: ProfileSelection,
    *,
    baseline: DispatchTable | None = None,
    anchors: list[str] | None = None,
    refused: bool = False,
    hot_path: bool = False,
    csv_path: str | Path | None = None,
    emit: Callable[[str], None] = print,
) -> list[BenchRow]:
    """Every case under the official protocol (with its anchors), its row printed as it
    ends. ``refused``: the runtime refuses the table here (said once by the caller), so
    the rows name the route only as that. ``csv_path``: each row is appended as its case
    ends, and the cases the CSV already holds for this table are not run again (a run
    spans calls); a CSV of another table is refused."""
    done: dict[str, BenchRow] = {}
    options = bench_options(anchors, baseline, hot_path)
    if csv_path is not None:
        for row in read_csv(csv_path):
            if row.table_hash != table.content_hash:
                raise ValueError(
                    f"{str(csv_path)!r} holds rows of another table (content hash "
                    f"{row.table_hash[:16]}, this is {table.content_hash[:16]}): give another "
                    "--csv, or remove it to start over"
                )
            if not _same_options(row, options):
                raise ValueError(
                    f"{str(csv_path)!r} holds case {row.case} benched with other options "
                    f"({row.options or _old_options(row)}; this run: {options}): a summary "
                    "over both would mix them; give another --csv, or the same --anchors, "
                    "--baseline and --hot-path to resume it"
                )
            done[row.case] = row
    emit(ROW_HEADER)
    rows = []
    for case in cases:
        if case.id in done:
            rows.append(done[case.id])
            emit(row_line(done[case.id]) + "  (from the CSV)")
            continue
        with warnings.catch_warnings():
            if refused:  # the caller said why once: not again per case
                warnings.filterwarnings("ignore", message="dispatch table .* refused")
            row = bench_case(
                case, selection.device, table, baseline=baseline, anchors=anchors,
                hot_path=hot_path,
            )  # fmt: skip
        if refused and row.route.startswith("reference"):
            row.route = "reference (table refused)"
        row.options = options
        rows.append(row)
        if csv_path is not None:
            append_csv(row, csv_path)
        emit(row_line(row))
    return rows
