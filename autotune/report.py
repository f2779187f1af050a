"""Tables and figures for people: pandas and matplotlib live here, never in the runtime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd


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
        frame.drop(columns="case_n").to_markdown(index=False, floatfmt=".3g"),
        "\n\n### Best passing plan per case\n",
        best.drop(columns="case_n").to_markdown(index=False, floatfmt=".3g"),
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
    from autotune.study import is_feasible

    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.values is None:
            continue
        plan = t.user_attrs.get("plan", {})
        outcome = t.user_attrs.get("outcome", {})
        rows.append(
            {
                "trial": t.number,
                "relative_latency": t.values[0],
                "peak_mib": t.values[1],
                "feasible": is_feasible(t),
                "kind": t.user_attrs.get("outcome_kind", "?"),
                "backend": _backend(plan),
                "plan_hash": t.user_attrs.get("plan_hash"),
                "seconds": t.user_attrs.get("seconds"),
                "speedup": (1.0 / t.values[0]) if is_feasible(t) else None,
                "worst_share": (outcome.get("report") or {}).get("budget_share"),
            }
        )
    return pd.DataFrame(rows)


def plot_pareto(ax: Any, study: Any, winner_trial: int | None = None) -> None:
    """Latency (relative to the reference) against peak memory for one study."""
    from autotune.plan import REFERENCE_PLAN

    frame = study_frame(study)
    case = study.user_attrs.get("case", {}).get("id", "?")
    ax.set_title(f"case {case}", fontsize=9)
    ax.set_xlabel("peak memory (MiB)", fontsize=8)
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
    if winner_trial is not None:
        win = frame[frame.trial == winner_trial]
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
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="best")


def plot_studies(
    studies: list[Any], out: str | Path, winners: dict[str, int | None] | None = None
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
        plot_pareto(ax, study, (winners or {}).get(study.study_name))
    for ax in list(axes.flat)[len(studies) :]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
