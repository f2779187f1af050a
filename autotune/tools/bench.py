"""``autotune bench``: the official protocol, reference against a table's dispatcher."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from autotune.core.cases import Case, case_sort_key
from autotune.core.device import DeviceInfo
from autotune.core.profiles import ProfileSelection
from autotune.core.reference import official_settings
from autotune.evaluate import Candidate, evaluate_many
from autotune.judge.gate import CaseBench, GateSettings
from autotune.measure import OFFICIAL_TIMING, TimingSettings
from autotune.plan import Plan
from autotune.runtime import DispatchedTransformer, DispatchTable

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
    # --anchors: name -> (verdict, speedup over the reference or None), each measured
    # against the reference in its own process (fresh Dynamo caches and limits).
    anchors: dict[str, tuple[str, float | None]] = dataclasses.field(default_factory=dict)
    detail: str = ""  # why a candidate that did not pass could not run

    def best_anchor(self) -> tuple[str, float] | None:
        passing = [(n, s) for n, (v, s) in self.anchors.items() if v == "PASS" and s]
        return max(passing, key=lambda t: t[1]) if passing else None


def _dispatcher(
    case: Case, bench: CaseBench, table: DispatchTable, device: DeviceInfo
) -> DispatchedTransformer:
    model = DispatchedTransformer(case.config, table=table)
    model.load_state_dict(bench.state_dict)
    return model.to(device.torch_device).eval()


def bench_case(
    case: Case,
    device: DeviceInfo,
    table: DispatchTable,
    timing: TimingSettings = OFFICIAL_TIMING,
    baseline: DispatchTable | None = None,
) -> BenchRow:
    if case.regime == "infeasible-dense":
        return BenchRow(case.id, "-", "SKIP (the dense reference cannot run this shape)")
    bench = CaseBench(case, device)
    model = _dispatcher(case, bench, table, device)
    candidates = [Candidate("table", model)]
    if baseline is not None:
        candidates.append(Candidate("baseline", _dispatcher(case, bench, baseline, device)))
    x, mask = bench.timing_inputs()
    with official_settings(), torch.inference_mode():
        routes = [str(c.module.explain(x, mask)) for c in candidates]
    outcomes = evaluate_many(bench, candidates, timing=timing, gate=BENCH_GATE)
    bench.release()
    for outcome, route, prefix in zip(outcomes, routes, ("", "baseline: "), strict=False):
        if not outcome.passed or outcome.timing is None:
            report = outcome.report
            return BenchRow(
                case.id,
                prefix + route,
                "FAIL",
                worst_share=report.budget_share if report else None,
                failed_elements=report.n_failed if report else 0,
                detail="" if report else f"{outcome.kind.value}: {outcome.message}",
            )
    table_out = outcomes[0]
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
    )
    if baseline is not None and outcomes[1].timing is not None:
        base = outcomes[1].timing
        row.baseline_ms = base.cand_median_ms
        row.baseline_speedup = base.speedup
        row.table_vs_baseline = base.cand_median_ms / stats.cand_median_ms
    return row


ANCHORS: dict[str, Plan] = {
    "sdpa": Plan(attention="sdpa_auto"),
    "sdpa+reduce-overhead": Plan(attention="sdpa_auto", compile="reduce-overhead"),
    "max-autotune": Plan(attention="sdpa_auto", compile="max-autotune"),
}


def bench_anchors(
    case: Case,
    selection: ProfileSelection,
    names: list[str],
    timing: TimingSettings = OFFICIAL_TIMING,
    timeout: float = 900.0,
) -> dict[str, tuple[str, float | None]]:
    """What a user would reach for instead, each paired with the reference in a fresh
    process: a failing anchor is reported as failing, never timed as a win."""
    from autotune.search.runner import TrialRunner

    out: dict[str, tuple[str, float | None]] = {}
    for name in names:
        runner = TrialRunner(
            {
                "profile": selection.profile.name,
                "emulated": selection.emulated,
                "case": case.as_dict(),
                "env": {},
            },
            trial_timeout=timeout,
        )
        try:
            outcome = runner.evaluate(ANCHORS[name].to_dict(), dataclasses.asdict(timing))
        finally:
            runner.close()
        if outcome.passed and outcome.timing is not None:
            out[name] = ("PASS", outcome.timing.speedup)
        elif outcome.kind.value == "wrong_result":
            out[name] = ("FAIL", None)
        else:
            out[name] = (outcome.kind.value, None)
    return out


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
    return (
        f"{r.case:<8} {r.verdict[:7]:<7} {f(r.ref_ms, '.3f', 9)} {f(r.table_ms, '.3f', 9)} "
        f"{f(r.speedup, '.2f', 8, 'x')} {f(noise, '.1f', 6, '%')} "
        f"{f(r.ref_peak_mib, '.0f', 9)} {f(r.table_peak_mib, '.0f', 9)}  {r.route}"
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
                cells.append(
                    f"{speed:>21.2f}x" if verdict == "PASS" and speed else f"{verdict:>22}"
                )
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
    if timed:
        geo = math.exp(sum(math.log(r.speedup) for r in timed) / len(timed))
        worst = min(timed, key=lambda r: r.speedup)
        lines.append(
            f"geometric mean {geo:.2f}x over {len(timed)} cases; worst case "
            f"{worst.case} {worst.speedup:.2f}x; "
            f"{sum(r.verdict == 'FAIL' for r in rows)} failed"
        )
    return "\n".join(lines)


def write_csv(rows: list[BenchRow], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[f.name for f in dataclasses.fields(BenchRow)])
        writer.writeheader()
        for r in rows:
            data = dataclasses.asdict(r)
            data["anchors"] = json.dumps(r.anchors, sort_keys=True)
            writer.writerow(data)


def anchor_names(spec: str | None) -> list[str]:
    """``--anchors`` (None: no anchors; "all"; or a comma list of ANCHORS names)."""
    if spec is None:
        return []
    names = list(ANCHORS) if spec == "all" else [a.strip() for a in spec.split(",")]
    unknown = [a for a in names if a not in ANCHORS]
    if unknown:
        raise ValueError(f"unknown anchors {unknown}; valid: {', '.join(ANCHORS)} or all")
    return names


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
    emit: Callable[[str], None] = print,
) -> list[BenchRow]:
    """Every case under the official protocol (with its anchors), its row printed as it
    ends. ``refused``: the runtime refuses the table here (said once by the caller), so
    the rows name the route only as that."""
    emit(ROW_HEADER)
    rows = []
    for case in cases:
        with warnings.catch_warnings():
            if refused:  # the caller said why once: not again per case
                warnings.filterwarnings("ignore", message="dispatch table .* refused")
            row = bench_case(case, selection.device, table, baseline=baseline)
        if refused and row.route.startswith("reference"):
            row.route = "reference (table refused)"
        if anchors and row.speedup:
            row.anchors = bench_anchors(case, selection, anchors)
        rows.append(row)
        emit(row_line(row))
    return rows
