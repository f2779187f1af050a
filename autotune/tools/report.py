"""Tables and figures for people: pandas and matplotlib live here, never in the runtime."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from autotune.core.cases import case_sort_key, get_case
from autotune.core.files import (
    atomic_path,
    save_figure,
    together,
    whole_csv_text,
    write_atomic,
)
from autotune.core.outcome import HOST_HEADROOM, paced_by
from autotune.search import trials
from autotune.tools.floors import CEILINGS, floor_of


def evaluation_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (case, plan) from ``autotune evaluate --json`` records."""
    rows = []
    for r in records:
        out = r["outcome"]
        timing = out.get("timing") or {}
        report = out.get("report") or {}
        plan = r["plan"]
        rows.append(
            {
                "case": r["case"],
                "plan": " ".join(f"{k}={v}" for k, v in sorted(plan.items())) or "reference",
                "verdict": "PASS" if out["kind"] == "passed" else f"FAIL {out['kind']}",
                "speedup": timing.get("speedup"),
                "ref_ms": timing.get("ref_median_ms"),
                "plan_ms": timing.get("cand_median_ms"),
                "noise_%": 100 * timing["noise"] if timing else None,
                "peak_MiB": (out.get("peak_memory_bytes") or 0) / 2**20 or None,
                "worst_share": report.get("budget_share"),
            }
        )
    return pd.DataFrame(rows)


def evaluation_markdown(path: str | Path) -> str:
    frame = evaluation_frame(json.loads(Path(path).read_text()))
    frame["case_n"] = pd.to_numeric(frame["case"], errors="coerce")
    best = (
        frame[frame.verdict == "PASS"]
        .sort_values("speedup", ascending=False)
        .groupby("case", sort=False)
        .head(1)
        .sort_values("case_n")
    )
    parts = [
        "### Every evaluation\n",
        _markdown(frame.drop(columns="case_n")),
        "\n\n### Best passing plan per case\n",
        _markdown(best.drop(columns="case_n")),
        "\n",
    ]
    return "\n".join(parts)


def _backend(plan: dict[str, Any]) -> str:
    att = plan.get("attention", "reference")
    prec = plan.get("attn_precision", "fp32")
    graph = "+graph" if plan.get("cuda_graph") else ""
    return f"{att}/{prec}{graph}"


def study_frame(study: Any) -> pd.DataFrame:
    """One row per finished trial of an Optuna study, with its plan and outcome."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.values is None:
            continue
        plan = trials.trial_plan(t)
        outcome = trials.trial_outcome(t)
        rows.append(
            {
                "trial": t.number,
                "relative_latency": t.values[0],
                "peak_mib": t.values[1],
                "feasible": trials.is_feasible(t),
                "kind": trials.trial_kind(t),
                "backend": _backend(plan.to_dict() if plan else {}),
                "plan_hash": trials.trial_plan_hash(t),
                "seconds": trials.trial_seconds(t),
                "speedup": trials.speedup_of(t),
                "worst_share": outcome.report.budget_share if outcome and outcome.report else None,
            }
        )
    return pd.DataFrame(rows)


@dataclasses.dataclass(frozen=True)
class Winner:
    """What a table ships for a study's shape: the study and trial it names (no trial
    where export shipped an anchor or the reference), the plan's hash and where the plan
    came from."""

    study: str
    trial: int | None
    plan_hash: str
    source: str


def plot_pareto(ax: Any, study: Any, winner: Winner | None = None) -> None:
    """Latency (relative to the reference) against peak memory for one study."""
    from autotune.plan import REFERENCE_PLAN

    frame = study_frame(study)
    case = trials.case_id_of(study)
    ax.set_title(f"case {case}", fontsize=9)
    ax.set_xlabel(
        "peak memory (MiB)"
        if trials.measured_memory(study)
        else "predicted peak memory (MiB; not measured on the CPU)",
        fontsize=8,
    )
    ax.set_ylabel("latency / reference", fontsize=8)
    if frame.empty:
        ax.text(0.5, 0.5, "no trials", ha="center", transform=ax.transAxes)
        return
    bad = frame[~frame.feasible]
    ok = frame[frame.feasible]
    if not bad.empty:
        ax.scatter(
            bad.peak_mib,
            [min(v, 2.0) for v in bad.relative_latency],
            c="lightgrey",
            marker="x",
            s=14,
            label="infeasible (shown at <= 2)",
        )
    for backend, group in ok.groupby("backend"):
        ax.scatter(group.peak_mib, group.relative_latency, s=16, label=backend, alpha=0.8)
    if not ok.empty:
        front = ok.sort_values(["peak_mib", "relative_latency"])
        best = float("inf")
        xs, ys = [], []
        for _, row in front.iterrows():
            if row.relative_latency < best:
                best = row.relative_latency
                xs.append(row.peak_mib)
                ys.append(row.relative_latency)
        ax.step(xs, ys, where="post", color="black", linewidth=1, label="Pareto front")
    ref = frame[frame.plan_hash == REFERENCE_PLAN.hash]
    if not ref.empty:
        ax.scatter(
            ref.peak_mib,
            ref.relative_latency,
            marker="*",
            s=120,
            c="red",
            edgecolors="black",
            label="reference",
            zorder=5,
        )
    if winner is not None:
        # The trial the table names, else this study's trials of the shipped plan (a
        # plan export measured itself, an anchor or the reference, may be one of them).
        named = winner.study == study.study_name and winner.trial is not None
        win = frame[frame.trial == winner.trial] if named else frame[:0]
        if win.empty:  # (a trial of the plan that failed here is not what shipped)
            win = frame[(frame.plan_hash == winner.plan_hash) & frame.feasible]
        if win.empty:  # shipped, but never a trial here: said in the legend
            ax.plot([], [], " ", label=f"exported: {winner.source} (not a trial here)")
        else:
            ax.scatter(
                win.peak_mib,
                win.relative_latency,
                marker="D",
                s=70,
                facecolors="none",
                edgecolors="blue",
                linewidths=2,
                label="exported winner",
                zorder=6,
            )
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="best")


def _plain_log_ticks(axis: Any) -> None:
    """A log y axis labelled 0.5, 1, 2 rather than 5x10^-1: plain numbers, more of them a
    decade the fewer decades the data span (call after plotting)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    lo, hi = axis.axes.get_ylim()
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (
        (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
        if decades <= 1.2
        else (1.0, 2.0, 3.0, 5.0)
        if decades <= 2.5
        else (1.0, 2.0, 5.0)
        if decades <= 4
        else (1.0,)
    )
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def plot_studies(
    studies: list[Any], out: str | Path, winners: dict[str, Winner] | None = None
) -> Path:
    """PNG of Pareto fronts, one panel per study."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(studies))
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax, study in zip(axes.flat, studies, strict=False):
        plot_pareto(ax, study, (winners or {}).get(trials.case_key_of(study)))
    for ax in list(axes.flat)[len(studies) :]:
        ax.axis("off")
    fig.tight_layout()
    out = save_figure(fig, out)
    plt.close(fig)
    return out


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


BENCH_COLUMNS = ("case", "verdict", "ref_ms", "table_ms", "speedup")


def bench_frame(csv_path: str | Path) -> pd.DataFrame:
    """Rows of ``autotune bench --csv`` (anchors decoded); a ValueError naming the file
    where it is not one (no such columns, or not a CSV)."""
    import csv
    import io

    try:
        text, torn = whole_csv_text(csv_path)
        frame = pd.read_csv(io.StringIO(text), dtype={"case": str})
    except (
        pd.errors.ParserError,
        pd.errors.EmptyDataError,
        UnicodeDecodeError,
        csv.Error,
    ) as exc:
        raise ValueError(
            f"{csv_path} is not an 'autotune bench --csv' file ({exc}); give one that "
            "autotune bench wrote"
        ) from None
    missing = [c for c in BENCH_COLUMNS if c not in frame]
    if missing:
        raise ValueError(
            f"{csv_path} is not an 'autotune bench --csv' file: no column "
            f"{', '.join(missing)}; give one that autotune bench wrote"
        )
    if torn:
        warnings.warn(
            f"{csv_path}: {torn} row(s) cut short (a run killed mid-write) left out",
            stacklevel=2,
        )
    if "anchors" in frame:
        frame["anchors"] = frame["anchors"].fillna("{}").map(json.loads)
    # case order, whatever order the run appended them in (a resumed bench, a bench of
    # cases 2,3 first); stable, so a case's rows keep their order (the last one counts)
    order = sorted(range(len(frame)), key=lambda i: case_sort_key(str(frame["case"].iloc[i])))
    return frame.iloc[order].reset_index(drop=True)


def bench_table_markdown(frame: pd.DataFrame, table: Any) -> list[str]:
    """Which table the bench measured, against the one the report describes: the same
    content, or another version of it and then per case whether the benched route is
    this table's entry's plan (a table re-issued with new buckets keeps its entries)."""
    if table is None or "table_hash" not in frame:
        return []
    hashes = [h for h in dict.fromkeys(frame["table_hash"].fillna("").astype(str)) if h]
    if hashes == [table.content_hash]:
        return [f"The bench measured this table (content hash `{table.content_hash[:16]}`).", ""]
    benched = ", ".join(f"`{h[:16]}`" for h in hashes) or "none recorded"
    # each entry's route as the bench names it: its plan's hash, or the reference it keeps
    plans = {
        str(e.get("case")): e.get("plan_hash") if e.get("admitted") else "reference"
        for e in table.entries.values()
        if e.get("case") is not None
    }
    same, other = [], []
    for _, row in frame.drop_duplicates("case", keep="last").iterrows():
        route = row.get("route") if isinstance(row.get("route"), str) else ""
        match = re.match(r"plan (\w+):", route)
        served = match.group(1) if match else route.split(" ")[0]
        case = str(row["case"])
        if served and plans.get(case) == served:
            same.append(case)
        else:
            other.append(f"{case} ({route.split(':')[0] or 'no route'})")

    def cases(names: list[str]) -> str:
        return ("case " if len(names) == 1 else "cases ") + ", ".join(names)

    held = (
        f"{cases(same)} benched this table's entry"
        if same
        else "no case benched this table's entry"
    )
    rest = (
        f"; {cases(other)} benched a route this table's entry does not hold: "
        "bench this table again for them"
        if other
        else "; its times stand for this table's entries (not for its buckets)"
    )
    line = (
        f"The bench measured another version of this table (content hash {benched}; this "
        f"is version {table.version}, `{table.content_hash[:16]}`): {held}{rest}."
    )
    return [line, ""]


def bench_history_markdown(
    frame: pd.DataFrame, history: list[tuple[str, pd.DataFrame]]
) -> list[str]:
    """This run's table medians at the reference times of earlier benches: per case the
    median of the reference's medians over this run and every earlier one that timed the
    case, and the references of the fastest run (the lowest geometric mean over the cases
    every run timed). On the launch-bound cases the reference follows the host and swings
    between processes, so one run's speedup says as much about its reference as about the
    table; these two figures hold the table against the references seen so far."""
    now = frame[frame["table_ms"].notna() & frame["ref_ms"].notna()]
    now = now.drop_duplicates("case", keep="last").set_index("case")[["ref_ms", "table_ms"]]
    refs = {"this run": now["ref_ms"]}
    for name, before in history:
        timed = before[before["ref_ms"].notna()].drop_duplicates("case", keep="last")
        refs[name] = timed.set_index("case")["ref_ms"]
    grid = pd.DataFrame(refs).reindex(now.index)
    full = [c for c in grid if grid[c].notna().all()]  # runs that timed every case
    fastest = min(full, key=lambda c: _geomean(grid[c]))
    median = grid.median(axis=1)
    rows = [
        {
            "case": case,
            "table ms": f"{now.at[case, 'table_ms']:.3f}",
            "ref ms": f"{now.at[case, 'ref_ms']:.3f}",
            "median ref": f"{median[case]:.3f} ({int(grid.loc[case].notna().sum())})",
            "fastest run's ref": f"{grid.at[case, fastest]:.3f}",
            "speedup": f"{now.at[case, 'ref_ms'] / now.at[case, 'table_ms']:.2f}x",
            "at the median": f"{median[case] / now.at[case, 'table_ms']:.2f}x",
            "at the fastest run's": f"{grid.at[case, fastest] / now.at[case, 'table_ms']:.2f}x",
        }
        for case in now.index
    ]
    return [
        "## At the references of earlier benches",
        "",
        f"Cases {', '.join(map(str, now.index))}: this run's table medians at each case's "
        f"median reference over this run and {len(history)} earlier bench(es) (in brackets, "
        "how many timed the case), and at the references of the fastest run (the lowest "
        f"geometric mean over the cases every run timed: {fastest}).",
        "",
        _text_table(rows),
        "",
        f"Geometric means over {len(now)} cases: {_geomean(now['ref_ms'] / now['table_ms']):.2f}x "
        f"in this run, {_geomean(median / now['table_ms']):.2f}x at each case's median "
        f"reference, {_geomean(grid[fastest] / now['table_ms']):.2f}x at the fastest run's "
        f"references ({fastest}).",
        "",
    ]


def time_goes_markdown(frame: pd.DataFrame, profile: str, target: float | None) -> list[str]:
    """Where each benched case's time goes, from a ``bench --hot-path`` CSV: the table's
    time, host time a call and device time a forward (kernels), what paces it, its floor at
    the profile's measured ceilings (``autotune floors``; none for a profile without them),
    and with ``target`` the time that speedup needs over this run's reference. Cases whose
    reference is less than ``target`` times their floor cannot reach it on any schedule.
    Nothing where the CSV has no hot-path columns."""
    if "gpu_us" not in frame or frame["gpu_us"].isna().all():
        return []
    ceilings = CEILINGS.get(profile)
    rows, short, unreachable, host_paced = [], [], [], []
    for _, r in frame.iterrows():
        if pd.isna(r.get("gpu_us")) or pd.isna(r.get("speedup")):
            continue
        try:
            floor = floor_of(get_case(str(r["case"])), ceilings).floor_us if ceilings else None
        except ValueError:  # a case id this version does not know: no floor
            floor = None
        table_us = r["table_ms"] * 1e3
        pace = paced_by(float(r["host_us"]), float(r["gpu_us"]))
        row = {
            "case": r["case"],
            "ref ms": f"{r['ref_ms']:.3f}",
            "table us": f"{table_us:.1f}",
            "speedup": f"{r['speedup']:.2f}x",
            "host us/call": f"{r['host_us']:.1f}",
            "GPU us/fwd": f"{r['gpu_us']:.1f}",
            "kernels": "-" if pd.isna(r.get("kernels")) else f"{r['kernels']:.0f}",
            "paced by": pace,
            "floor us": f"{floor:.1f}" if floor else "-",
            "GPU / floor": f"{r['gpu_us'] / floor:.2f}" if floor else "-",
        }
        if pace.startswith("host"):
            host_paced.append(str(r["case"]))
        if target:
            need = r["ref_ms"] * 1e3 / target
            row[f"us for {target:g}x"] = f"{need:.1f}"
            if r["speedup"] < target:
                short.append(f"{r['case']} ({table_us:.1f} us, needs {need:.1f})")
            if floor and need < floor:
                unreachable.append(f"{r['case']} (reference {r['ref_ms'] * 1e3 / floor:.1f}x)")
        rows.append(row)
    if not rows:
        return []
    lines = [
        "## Where the time goes",
        "",
        "From the bench's hot path: host microseconds a call (`host_us`), "
        "device microseconds and kernels a forward (profiler: the union of the kernels' "
        "spans since c4b511a; a CSV from before it holds their sum, which counts a `pdl` "
        "kernel's wait for the one before it and can exceed the forward), what paces a "
        "steady forward "
        f"(`host at {HOST_HEADROOM:g}x`: it would be the host, were the host "
        f"{HOST_HEADROOM:g} times as slow)"
        + (
            f", and the floor at {profile}'s measured ceilings (`autotune floors`)."
            if ceilings
            else f"; no floors (no measured ceilings for profile {profile!r})."
        ),
        "",
        _text_table(rows),
        "",
    ]
    if target:
        lines += [
            f"Below {target:g}x over this run's reference: "
            + (", ".join(short) if short else "none")
            + ".",
            "",
        ]
        if unreachable:
            lines += [
                f"Cannot reach {target:g}x on any schedule (reference under {target:g}x its "
                "floor): " + ", ".join(unreachable) + ".",
                "",
            ]
    if host_paced:
        lines += [
            f"Paced by the host, now or with the host {HOST_HEADROOM:g}x slower: case "
            + ", ".join(host_paced)
            + " (export ranks plans by their time with a slower host: re-export these).",
            "",
        ]
    if "launch_us" in frame and not frame["launch_us"].isna().all():
        lines += [
            f"Host speed in this run: {frame['launch_us'].median():.1f} us of host time per "
            "eager launch (`launch_us`, the median of its measurements, one a case). The reference "
            "is an eager forward: on the launch-bound cases its time, and every speedup over "
            "it, follows this figure; compare runs with it beside them.",
            "",
        ]
    return lines


def _markdown(frame: pd.DataFrame, index: bool = False, floatfmt: str = ".3g") -> str:
    """A frame as a markdown table; a value not measured (NaN, None: a CPU run's peak
    memory, an anchor that did not run) shows as "-", never as "nan" or "None"."""
    shown = frame.astype(object).where(frame.notna(), None)
    return shown.to_markdown(index=index, floatfmt=floatfmt, missingval="-")


def _text_table(rows: list[dict]) -> str:
    """Rows of already formatted cells as a markdown table, every column right-aligned and
    no cell re-parsed as a number."""
    return pd.DataFrame(rows).to_markdown(
        index=False, disable_numparse=True, colalign=["right"] * len(rows[0])
    )


def _geomean(values: pd.Series) -> float:
    return math.exp(values.map(math.log).mean())


def bench_change_markdown(
    frame: pd.DataFrame, before: pd.DataFrame, before_path: str | Path
) -> list[str]:
    """This bench against an earlier one, case by case: the table's own medians, the
    reference's, each run's host speed, and this run's table at the earlier run's reference
    times. The reference is an eager forward: on a launch-bound case its time follows the
    host, so two runs' speedups differ by the host as much as by the table; the table's
    medians, and its speedup at one run's reference times, do not. Cases in both CSVs
    with a time in both (the last row of a case where a CSV has several)."""
    cols = ["case", "ref_ms", "table_ms"] + (["launch_us"] if "launch_us" in frame else [])
    now = frame[frame["table_ms"].notna()].drop_duplicates("case", keep="last")[cols]
    then = before[before["table_ms"].notna()].drop_duplicates("case", keep="last")
    then = then[[c for c in cols if c in then]]
    both = now.merge(then, on="case", suffixes=("", "_before"))
    if both.empty:
        return [
            "## Against an earlier bench",
            "",
            f"No case of this bench has a time in `{before_path}`.",
            "",
        ]
    rows = []
    for _, r in both.iterrows():
        row = {
            "case": r["case"],
            "table ms": f"{r['table_ms']:.3f}",
            "before": f"{r['table_ms_before']:.3f}",
            "table ratio": f"{r['table_ms'] / r['table_ms_before']:.3f}",
            "ref ms": f"{r['ref_ms']:.3f}",
            "ref before": f"{r['ref_ms_before']:.3f}",
            "speedup": f"{r['ref_ms'] / r['table_ms']:.2f}x",
            "at the earlier ref": f"{r['ref_ms_before'] / r['table_ms']:.2f}x",
        }
        rows.append(row)
    table_ratio = _geomean(both["table_ms"] / both["table_ms_before"])
    ref_ratio = _geomean(both["ref_ms"] / both["ref_ms_before"])
    lines = [
        "## Against an earlier bench",
        "",
        f"Cases {', '.join(map(str, both['case']))} against `{before_path}`: the table's "
        "medians, the reference's, and this run's table at the earlier run's reference "
        "times (on launch-bound cases the reference follows the host; the table's medians "
        "and the last column do not).",
        "",
        _text_table(rows),
        "",
        f"Geometric means over {len(both)} cases: the table's medians x{table_ratio:.3f} of "
        f"the earlier run's, the reference's x{ref_ratio:.3f}; speedup "
        f"{_geomean(both['ref_ms'] / both['table_ms']):.2f}x in this run, "
        f"{_geomean(both['ref_ms_before'] / both['table_ms']):.2f}x at the earlier run's "
        f"reference times (the earlier run's own: "
        f"{_geomean(both['ref_ms_before'] / both['table_ms_before']):.2f}x).",
        "",
    ]
    if "launch_us_before" in both and both[["launch_us", "launch_us_before"]].notna().all().all():
        lines += [
            f"Host speed: {both['launch_us'].median():.1f} us per eager launch in this run, "
            f"{both['launch_us_before'].median():.1f} in the earlier one.",
            "",
        ]
    return lines


def plot_speedups(frame: pd.DataFrame, out: Path) -> Path:
    """Per-case speedup bars (log scale): the table and every passing anchor."""
    plt = _plt()
    cases = list(frame["case"])
    series: dict[str, list[float]] = {"table": [float(v or 0) for v in frame["speedup"]]}
    if "anchors" in frame:
        names = list(dict.fromkeys(n for a in frame["anchors"] for n in a))
        for n in names:
            series[n] = [
                float(a[n][1]) if n in a and a[n][0] == "PASS" and a[n][1] else 0.0
                for a in frame["anchors"]
            ]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(cases) + 2), 4))
    for i, (name, values) in enumerate(series.items()):
        xs = [j + i * width for j in range(len(cases))]
        label = name if any(v > 0 for v in values) else f"{name} (no passing run: no bars)"
        ax.bar(xs, [v if v > 0 else float("nan") for v in values], width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("case")
    ax.set_ylabel("speedup over the reference (log)")
    # Beside the axes, not over the last case's bars.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    save_figure(fig, out)
    plt.close(fig)
    return out


def plot_history(studies: list[Any], out: Path) -> Path:
    """Best speedup so far against trial number, one line per case."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for study in studies:
        frame = study_frame(study).sort_values("trial")
        if frame.empty:
            continue
        best = frame["speedup"].fillna(0).cummax()
        i = studies.index(study)  # 20 colours, then dashed: 14 cases never share a line
        style = {"color": plt.get_cmap("tab20")(i % 20), "linestyle": "-" if i < 20 else "--"}
        ax.plot(frame["trial"], best, label=f"case {trials.case_id_of(study)}", **style)
    ax.set_xlabel("trial")
    ax.set_ylabel("best feasible speedup so far")
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    save_figure(fig, out)
    plt.close(fig)
    return out


def knob_importances(studies: list[Any]) -> pd.DataFrame:
    """Optuna's default importance (PED-ANOVA in Optuna 5) of each parameter for relative
    latency, per case (failed plans clipped to 2x: what decides the outcome)."""
    import warnings

    import optuna

    rows = []
    for study in studies:
        done = [
            t
            for t in study.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.COMPLETE
        ]
        if len(done) < 5:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                imp = optuna.importance.get_param_importances(
                    study, target=lambda t: min(t.values[0], 2.0), normalize=True
                )
        except (RuntimeError, ValueError):
            continue
        for name, value in imp.items():
            rows.append({"case": trials.case_id_of(study), "param": name, "importance": value})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    table = frame.pivot_table(index="param", columns="case", values="importance").fillna(0)
    order = sorted(
        table.columns,
        key=lambda c: (not str(c).isdigit(), int(c) if str(c).isdigit() else 0, str(c)),
    )
    return table[order]


def tuning_cost(studies: list[Any]) -> pd.DataFrame:
    """Per study: case, measured trials (what ``--n-trials`` counts) and of them the
    feasible ones, as the study's own summary line counts them; free ones (repeats,
    forbidden or refused plans, failed or cut short: recorded for the sampler, no plan
    measured); and the summed trial wall time."""
    from optuna.trial import TrialState

    rows = []
    for study in studies:
        done = study.get_trials(deepcopy=False, states=trials.FINISHED)
        measured = sum(1 for t in done if t.state == TrialState.COMPLETE and trials.counts(t))
        seconds = sum(
            (t.datetime_complete - t.datetime_start).total_seconds()
            for t in done
            if t.datetime_complete is not None and t.datetime_start is not None
        )
        rows.append(
            {
                "case": trials.case_id_of(study),
                "measured": measured,
                "free": len(done) - measured,
                "feasible": sum(1 for t in done if trials.is_feasible(t) and trials.counts(t)),
                "trial seconds": seconds,
            }
        )
    return pd.DataFrame(rows, columns=["case", "measured", "free", "feasible", "trial seconds"])


def efficiency_markdown(paths: list[str], out: Path) -> list[str]:
    """Sections from ``autotune efficiency`` records: the table and the curves per case."""
    import shutil

    lines = [
        "## Search efficiency against exhaustive tuning",
        "",
        "Every plan of a reduced space measured once; samplers replayed on the measurements "
        "(`autotune efficiency`); trials and GPU seconds to come within "
        "3% of the exhaustive best, median and quartiles over seeds.",
        "",
    ]
    for path in paths:
        record = json.loads(Path(path).read_text())
        head = record["header"]
        best = record["exhaustive_best"]
        png = Path(path).with_name("efficiency.png")
        # The record's folder names it: several records of one case keep their own curves.
        folder = Path(path).resolve().parent.name
        name = f"efficiency_{head['profile']}_{head['case']}_{folder}.png"
        if png.is_file():
            with atomic_path(out / name) as tmp:  # replaced with the rest of the report
                shutil.copyfile(png, tmp)
        lines += [
            f"### Case {head['case']} ({head['profile']}"
            + (", emulated" if head.get("emulated") else "")
            + f"), space `{head['space']}`, record `{folder}`",
            "",
            f"{record['space_size']} plans, {record['exhaustive_seconds']:.0f} s to measure "
            f"them all; exhaustive best {1 / best['latency']:.2f}x over the reference. "
            f"Command: `{record.get('command', '')}`.",
            "",
            _markdown(pd.DataFrame(record["rows"])),
            "",
        ]
        if png.is_file():
            lines += [f"![efficiency]({name})", ""]
    return lines


@together()  # report.md and its figures replace the old set together
def write_report(
    *,
    profile: str,
    studies: list[Any],
    table: Any,
    bench_csv: str | Path | None,
    out_dir: str | Path,
    command: str,
    notes: str | Path | None = None,
    efficiency: list[str] | None = None,
    unseen_csv: str | Path | None = None,
    target: float | None = None,
    bench_before: str | Path | None = None,
    bench_history: list[str] | None = None,
) -> Path:
    """A markdown page: tables (pandas) and figures (matplotlib), with provenance; a
    hand-written ``notes`` file (targets, misses, what would close them) is appended."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Results for profile `{profile}`", "", f"Made by: `{command}`", ""]
    prov = dict(table.provenance) if table is not None else {}
    if prov:
        dev = prov.get("device", {})
        vers = prov.get("versions", {})
        lines += [
            "## Provenance",
            "",
            f"- table: `{table.source}` version {table.version}, content hash "
            f"`{table.content_hash[:16]}`",
            f"- device: {dev.get('name')}"
            + (f" (capability {dev['capability']})" if dev.get("capability") else "")
            + (" - emulated" if prov.get("emulated") else ""),
            f"- torch {vers.get('torch')}, triton {vers.get('triton')}"
            + (f", CUDA {vers['cuda']}, driver {vers.get('driver')}" if vers.get("cuda") else "")
            + f"; project commit {prov.get('commit')}",
            "",
        ]
    if bench_csv:
        frame = bench_frame(bench_csv)
        cols = [
            c
            for c in (
                "case",
                "verdict",
                "ref_ms",
                "table_ms",
                "speedup",
                "noise",
                "ref_peak_mib",
                "table_peak_mib",
            )
            if c in frame
        ]
        shown = frame[cols].copy()
        names: list[str] = []
        if "anchors" in frame:
            names = list(dict.fromkeys(n for a in frame["anchors"] for n in a))
            for name in names:  # an anchor's speedup over the reference, or its verdict
                shown[name] = [
                    (f"{a[name][1]:.2f}x" if a[name][0] == "PASS" else a[name][0])
                    if name in a
                    else "-"
                    for a in frame["anchors"]
                ]
        lines += [
            "## Bench (official protocol)",
            "",
            f"From `{bench_csv}`."
            + (
                f" Anchors ({', '.join(names)}) built and timed interleaved with the "
                "reference and the table in one run (CSVs made before commit 'bench: anchors "
                "in the same run' timed each in its own process); a failing anchor shows "
                "its verdict, not a time."
                if names
                else ""
            ),
            "",
            *bench_table_markdown(frame, table),
            _markdown(shown),
            "",
        ]
        timed = frame[frame["speedup"].notna()]
        if not timed.empty:
            geo = _geomean(timed["speedup"])
            lines += [
                f"Geometric mean {geo:.2f}x over {len(timed)} cases; worst "
                f"{timed['speedup'].min():.2f}x.",
                "",
            ]
            over = []
            for _, row in timed.iterrows():
                passing = [
                    v[1] for v in (row.get("anchors") or {}).values() if v[0] == "PASS" and v[1]
                ]
                if passing:
                    over.append(row["speedup"] / max(passing))
            if over:
                lines += [
                    "Table over the fastest passing anchor: geometric mean "
                    f"{math.exp(sum(map(math.log, over)) / len(over)):.2f}x, worst "
                    f"{min(over):.2f}x ({len(over)} cases).",
                    "",
                ]
        plot_speedups(frame, out / "speedups.png")
        lines += ["![speedups](speedups.png)", ""]
        lines += time_goes_markdown(frame, profile, target)
        if bench_before:
            lines += bench_change_markdown(frame, bench_frame(bench_before), bench_before)
        if bench_history:
            history = [(str(Path(p).name), bench_frame(p)) for p in bench_history]
            lines += bench_history_markdown(frame, history)
    if table is not None:
        rows = []

        def case_order(kv: Any) -> tuple[int, str]:
            case = str(kv[1].get("case", ""))
            return (int(case), "") if case.isdigit() else (10**6, case)

        for _key, entry in sorted(table.entries.items(), key=case_order):
            ev = entry.get("evidence", {})
            rows.append(
                {
                    "case": entry.get("case"),
                    "plan": entry.get("plan_hash") if entry.get("admitted") else "reference",
                    "speedup": ev.get("speedup"),
                    "noise": ev.get("noise"),
                    "seeds": ev.get("correctness_seeds"),
                    "padded seeds": ev.get("padded_seeds"),
                    "worst budget share": ev.get("worst_budget_share"),
                    "from": _entry_source(entry, profile),
                }
            )
        from autotune.search.efficiency import markdown_for_people

        evidence = pd.DataFrame(rows)
        lines += [
            "## Correctness evidence per entry",
            "",
            "Plans by hash (the table module lists each entry's knobs); an entry that keeps "
            "the reference has no evidence of its own (`-`).",
            "",
            markdown_for_people(evidence, ("left", "left", *["right"] * 5, "left")),
            "",
        ]
    if studies:
        plot_studies(studies, out / "pareto.png", table_winners(table))
        plot_history(studies, out / "history.png")
        lines += [
            "## Pareto fronts",
            "",
            "![pareto](pareto.png)",
            "",
            "## Optimisation history",
            "",
            "![history](history.png)",
            "",
        ]
        imp = knob_importances(studies)
        if not imp.empty:
            lines += [
                "## Knob importances (Optuna's PED-ANOVA, relative latency; failures at 2)",
                "",
                _markdown(imp, index=True, floatfmt=".2f"),
                "",
            ]
        n = sum(len(s.get_trials(deepcopy=False)) for s in studies)
        lines += [f"{len(studies)} studies, {n} trials.", ""]
        cost = tuning_cost(studies)
        lines += [
            "## Tuning cost",
            "",
            "Wall time of the trials of each study (device time spent evaluating plans; "
            "process start-up and selection not included).",
            "",
            _markdown(cost),
            "",
            f"Total: {cost['trial seconds'].sum():.0f} s over {int(cost['measured'].sum())} "
            f"measured trials and {int(cost['free'].sum())} free ones (repeats of a measured "
            "plan, plans the space forbids or the device refuses, failed or cut-short trials).",
            "",
        ]
    if table is not None and getattr(table, "buckets", ()):
        lines += buckets_markdown(table)
    if unseen_csv:
        lines += unseen_markdown(unseen_csv, out, table)
    if efficiency:
        lines += efficiency_markdown(efficiency, out)
    if notes:
        lines += [Path(notes).read_text().rstrip(), ""]
    return write_atomic(out / "report.md", "\n".join(lines))


def buckets_markdown(table: Any) -> list[str]:
    """The table's buckets: ranges, plan, where it came from, and its evidence."""
    rows = []
    for b in table.buckets:
        points = b.get("evidence", {}).get("points", [])
        shares = [p.get("worst_budget_share") or 0.0 for p in points]
        speedups = [p.get("speedup") or 0.0 for p in points]
        d_model, heads, ffn, layers = b["dims"][:4]
        rows.append(
            {
                "d_model/heads/FFN/layers": f"{d_model}/{heads}/{ffn}/{layers}",
                "batch": f"{b['batch'][0]}-{b['batch'][1]}",
                "seq": f"{b['seq'][0]}-{b['seq'][1]}",
                "plan": b.get("plan_hash"),
                "from": b.get("from"),
                "points": len(points),
                "worst share": max(shares) if shares else None,
                "speedup min": min(speedups) if speedups else None,
                "speedup max": max(speedups) if speedups else None,
            }
        )
    return [
        "## Buckets (shapes without an entry)",
        "",
        "Each bucket's plan passed the gate (5 + 5 padded seeds) and beat the reference at "
        "the bucket's corners and centre on the device (`autotune buckets`).",
        "",
        _markdown(pd.DataFrame(rows)),
        "",
    ]


UNSEEN_COLUMNS = ("batch", "seq", "served", "speedup", "table_hash")


def check_unseen_csv(path: str | Path) -> None:
    """Refuse a file that is not an ``autotune unseen`` CSV, naming it."""
    try:
        frame = pd.read_csv(path, nrows=1)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--unseen {str(path)!r} is not readable as a CSV: {exc}") from exc
    missing = [c for c in UNSEEN_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(
            f"--unseen {str(path)!r} is not a CSV that 'autotune unseen --csv' writes (no "
            f"{', '.join(missing)} column); give one it wrote"
        )


def check_efficiency_record(path: str | Path) -> None:
    """Refuse a file that is not an ``autotune efficiency`` record, naming it."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--efficiency {str(path)!r} is not readable JSON: {exc}") from exc
    needed = ("header", "exhaustive_best", "space_size", "exhaustive_seconds", "rows")
    if not isinstance(record, dict) or any(k not in record for k in needed):
        raise ValueError(
            f"--efficiency {str(path)!r} is not a record 'autotune efficiency' writes (it "
            f"holds {', '.join(needed)}); give its efficiency.json"
        )


def unseen_markdown(csv_path: str | Path, out: Path, table: Any) -> list[str]:
    """``autotune unseen`` rows of this table: the summary line, a figure of the shapes
    (served or not, speedup), and the rows."""
    from autotune.tools.unseen import summary

    frame = pd.read_csv(csv_path)
    if table is not None and "table_hash" in frame:
        frame = frame[frame["table_hash"] == table.content_hash]
    if frame.empty:
        return ["## Unseen shapes", "", f"No rows of this table in `{csv_path}`.", ""]
    rows = frame.astype(object).where(frame.notna(), "").to_dict("records")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    served = frame[frame["served"] == "yes"]
    other = frame[frame["served"] != "yes"]
    points = ax.scatter(served["batch"], served["seq"], c=served["speedup"], cmap="viridis")
    if not other.empty:
        ax.scatter(other["batch"], other["seq"], marker="x", color="red", label="reference")
        ax.legend()
    fig.colorbar(points, ax=ax, label="speedup over the reference")
    ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="sequence length")
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    if table is not None:  # the buckets of these dims, drawn as rectangles
        from matplotlib.patches import Rectangle

        dims = None
        for b in table.buckets:
            dims = dims or tuple(b["dims"])
            if tuple(b["dims"]) == dims:
                (b0, b1), (s0, s1) = b["batch"], b["seq"]
                ax.add_patch(Rectangle((b0, s0), b1 - b0 + 1, s1 - s0 + 1, fill=False,
                                       linestyle=":", color="grey"))  # fmt: skip
        ax.set_xlim(0.8, max(frame["batch"]) * 1.3)
        ax.set_ylim(min(frame["seq"]) * 0.8, max(frame["seq"]) * 1.3)
    ax.set_title("Unseen shapes served by the table (dotted: buckets)")
    fig.tight_layout()
    save_figure(fig, out / "unseen.png")
    plt.close(fig)
    cols = ["batch", "seq", "served", "source", "speedup", "failed_elements", "worst_share",
            "vs_tuned", "sync_free"]  # fmt: skip
    return [
        "## Unseen shapes",
        "",
        f"From `{csv_path}` (`autotune unseen`): " + summary(rows) + ".",
        "",
        "![unseen](unseen.png)",
        "",
        _markdown(frame[[c for c in cols if c in frame]]),
        "",
    ]


def profile_studies(storage: Any, profile: str, case: str | None = None) -> list[Any]:
    """A profile's study per case (one case's only, if given), in case order."""
    from autotune.core.cases import case_sort_key, get_case

    studies = trials.studies_by_case(storage, profile)
    if case:
        key = str(get_case(case).key)
        studies = {k: v for k, v in studies.items() if k == key}
    return sorted(studies.values(), key=lambda s: case_sort_key(trials.case_id_of(s)))


def _entry_source(entry: Mapping[str, Any], profile: str) -> str:
    """Where a table entry's plan came from: a study's trial (naming the study's profile
    where it is not ``profile``'s, as for a table validated from another GPU's, and saying
    so where the entry was validated here rather than selected), an anchor export measured
    beside the finalists, or the reference kept."""
    ev = entry.get("evidence", {})
    if not entry.get("admitted"):
        return "reference kept"
    study = str(ev.get("study") or "")
    if ev.get("trial") is None:
        text = study or "-"  # an anchor's export
    else:
        origin = study.split("|", 1)[0] if "|" in study else profile
        text = f"study trial {ev['trial']}"
        if origin != profile:
            text = f"{origin} {text}"
    if str(ev.get("reason", "")).startswith("validated here"):
        text += ", validated here"
    return text


def table_winners(table: Any) -> dict[str, Winner]:
    """Case key (``trials.case_key_of``) -> what the table ships for it (for marking
    winners in the figures)."""
    from autotune.core.cases import CaseKey

    if table is None:
        return {}
    out = {}
    for key, entry in table.entries.items():
        ev = entry.get("evidence", {})
        source = ev.get("study", "") if entry.get("admitted") else "the reference"
        if ev.get("trial") is not None:
            source = f"trial {ev['trial']} of another study"
        study = ev.get("study", "")
        winner = Winner(study, ev.get("trial"), entry.get("plan_hash", ""), source)
        out[str(CaseKey(*key))] = winner
    return out
