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
        rows.append({
            "case": r["case"],
            "plan": " ".join(f"{k}={v}" for k, v in sorted(plan.items())) or "reference",
            "verdict": "PASS" if out["kind"] == "passed" else f"FAIL {out['kind']}",
            "speedup": timing.get("speedup"),
            "ref_ms": timing.get("ref_median_ms"),
            "plan_ms": timing.get("cand_median_ms"),
            "noise_%": 100 * timing["noise"] if timing else None,
            "peak_MiB": (out["peak_memory_bytes"] / 2**20) if out.get("peak_memory_bytes") else None,
            "worst_share": report.get("budget_share"),
        })
    return pd.DataFrame(rows)


def evaluation_markdown(path: str | Path) -> str:
    frame = evaluation_frame(json.loads(Path(path).read_text()))
    frame["case_n"] = pd.to_numeric(frame["case"], errors="coerce")
    best = (
        frame[frame.verdict == "PASS"].sort_values("speedup", ascending=False)
        .groupby("case", sort=False).head(1).sort_values("case_n")
    )
    parts = [
        "### Every evaluation\n",
        frame.drop(columns="case_n").to_markdown(index=False, floatfmt=".3g"),
        "\n\n### Best passing plan per case\n",
        best.drop(columns="case_n").to_markdown(index=False, floatfmt=".3g"),
        "\n",
    ]
    return "\n".join(parts)
