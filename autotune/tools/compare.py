"""Plans side by side on one case, in one process: the correctness gate for each, then
the reference and every plan timed interleaved, and the device kernels per forward
(``autotune compare``; e.g. the fused block against the graph of library calls)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from autotune.build import build_candidate
from autotune.core.reference import official_settings
from autotune.evaluate import _cleanup, classify_exception
from autotune.judge.gate import OFFICIAL_GATE, CaseBench, run_gate
from autotune.measure import TimingSettings, count_kernels, measure_interleaved, paired_stats
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

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compare_plans(bench: CaseBench, plans: list[Plan], timing: TimingSettings) -> list[Row]:
    cuda = bench.device.type == "cuda"
    x, mask = bench.timing_inputs()
    rows: list[Row] = []
    models: list[tuple[Row, Any]] = []
    with official_settings():
        for plan in plans:
            row = Row(bench.case.id, plan.describe(), plan.hash, False, "")
            rows.append(row)
            try:
                model = build_candidate(plan, bench.config, bench.device, bench.state_dict)
                result = run_gate(bench, model, OFFICIAL_GATE)
            except Exception as exc:
                row.detail = f"{classify_exception(exc).value}: {exc}"[:200]
                continue
            row.passed = result.passed
            row.detail = result.worst.summary() if result.worst else ""
            if result.passed:
                models.append((row, model))
        ref = bench.reference
        fns = [lambda: ref(x, mask)] + [lambda m=m: m(x, mask) for _, m in models]
        with torch.inference_mode():
            for fn in fns[1:]:
                fn()  # graphs captured, kernels compiled before counting
            counts = [count_kernels(fn, cuda=cuda) for fn in fns]
            reps, results = measure_interleaved(fns, timing, cuda=cuda)
    first = None
    for (row, _), res, kernels in zip(models, results[1:], counts[1:], strict=True):
        stats = paired_stats(results[0], res, reps, cuda)
        row.kernels = kernels
        row.median_us = res[0] * 1e3
        row.speedup = stats.speedup
        row.noise = stats.noise
        first = first if first is not None else res[0]
        row.vs_first = first / res[0]
    rows.insert(
        0,
        Row(
            bench.case.id,
            "reference",
            "",
            True,
            "",
            kernels=counts[0],
            median_us=results[0][0] * 1e3,
            speedup=1.0,
        ),
    )
    del models, fns
    _cleanup(cuda)
    return rows
