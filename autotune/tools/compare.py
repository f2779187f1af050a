"""Plans side by side on one case, in one process: the correctness gate for each, then
the reference and every plan timed interleaved, and the device kernels per forward
(``autotune compare``; e.g. the fused block against the graph of library calls)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from autotune.core.outcome import OutcomeKind
from autotune.core.reference import official_settings
from autotune.evaluate import evaluate_many
from autotune.judge.gate import OFFICIAL_GATE, CaseBench
from autotune.measure import TimingSettings, count_kernels
from autotune.plan import Plan


@dataclasses.dataclass
class Row:
    case: str
    plan: str
    plan_hash: str
    passed: bool
    detail: str
    kernels: int | None = None
    median_us: float | None = None
    speedup: float | None = None
    noise: float | None = None
    vs_first: float | None = None
    # CUDA: the plan's host time a call (one call onto an idle device, the median), beside
    # its median: where the two are close the host, not the GPU, sets the plan's pace.
    host_us: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compare_plans(bench: CaseBench, plans: list[Plan], timing: TimingSettings) -> list[Row]:
    """The reference's row, then each plan's: gate, kernels per forward, interleaved time."""
    outcomes = evaluate_many(
        bench, plans, timing=timing, gate=OFFICIAL_GATE, prune=False, kernels=True
    )
    cuda = bench.device.type == "cuda"
    x, mask = bench.timing_inputs()
    with official_settings(), torch.inference_mode():
        ref_kernels = count_kernels(lambda: bench.reference(x, mask), cuda=cuda)
    rows = [Row(bench.case.id, "reference", "", True, "", kernels=ref_kernels, speedup=1.0)]
    first = None
    for plan, outcome in zip(plans, outcomes, strict=True):
        row = Row(bench.case.id, plan.describe(), plan.hash, outcome.passed, "")
        rows.append(row)
        if outcome.report is not None:
            row.detail = outcome.report.summary()
        if not outcome.passed or outcome.timing is None:
            if outcome.kind is not OutcomeKind.WRONG_RESULT:
                row.detail = f"{outcome.kind.value}: {outcome.message}"[:200]
            continue
        t = outcome.timing
        rows[0].median_us = t.ref_median_ms * 1e3
        row.kernels = outcome.kernels_per_forward
        row.median_us = t.cand_median_ms * 1e3
        row.speedup = t.speedup
        row.noise = t.noise
        if outcome.host_ms_per_call is not None:
            row.host_us = outcome.host_ms_per_call * 1e3
        first = first if first is not None else t.cand_median_ms
        row.vs_first = first / t.cand_median_ms
    return rows


def compare_cases(
    cases: list[Any],
    selection: Any,
    plans: list[Plan],
    tables: list[Any],
    timing: TimingSettings,
) -> Iterator[Row]:
    """Per case, the plan each table ships (first), then ``plans``, side by side."""
    for case in cases:
        bench = CaseBench(case, selection.effective_device())
        extra = []
        for table in tables:
            entry = table.entries.get(case.key.as_tuple())
            if entry and entry.get("admitted"):
                extra.append(Plan.from_dict(entry["plan"]))
        yield from compare_plans(bench, extra + plans, timing)
        bench.release()
