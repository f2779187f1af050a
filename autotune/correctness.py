"""The correctness gate: the official protocol (5 seeds, same weights), padded inputs
too, stop at the first failing seed; the worst report and a continuous violation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor, nn

from autotune.cases import Case
from autotune.device import DeviceInfo
from autotune.reference import (
    ACCURACY_SEEDS,
    ATOL,
    RTOL,
    TIMING_SEED,
    CorrectnessReport,
    build_reference,
    check_outputs,
    generate_random_case,
)

DEFAULT_PADDING = 0.25


@dataclasses.dataclass(frozen=True)
class GateSettings:
    seeds: tuple[int, ...] = ACCURACY_SEEDS
    padded_seeds: tuple[int, ...] = ACCURACY_SEEDS[:2]
    padding_ratio: float = DEFAULT_PADDING
    atol: float = ATOL
    rtol: float = RTOL


OFFICIAL_GATE = GateSettings()
SELECTION_GATE = GateSettings(padded_seeds=ACCURACY_SEEDS)


@dataclasses.dataclass
class GateResult:
    passed: bool
    worst: CorrectnessReport | None
    seeds_checked: int
    padded_seeds_checked: int
    failing_seed: tuple[int, bool] | None = None  # (seed, padded)


class CaseBench:
    """One case on one device: the reference with the official weights, inputs and
    reference outputs generated once and reused by every plan evaluated on it."""

    def __init__(self, case: Case, device: DeviceInfo) -> None:
        self.case = case
        self.device = device
        self.reference = build_reference(case.config, device.torch_device)
        self.state_dict = {k: v.detach().clone() for k, v in self.reference.state_dict().items()}
        self._inputs: dict[tuple[int, float], tuple[Tensor, Tensor]] = {}
        self._outputs: dict[tuple[int, float], Tensor] = {}

    def inputs(self, seed: int, padding_ratio: float) -> tuple[Tensor, Tensor]:
        key = (seed, padding_ratio)
        if key not in self._inputs:
            self._inputs[key] = generate_random_case(
                self.case.config, self.device.torch_device, torch.float32, seed, padding_ratio
            )
        return self._inputs[key]

    def timing_inputs(self) -> tuple[Tensor, Tensor]:
        return self.inputs(TIMING_SEED, self.case.padding_ratio)

    def reference_output(self, seed: int, padding_ratio: float) -> Tensor:
        key = (seed, padding_ratio)
        if key not in self._outputs:
            x, mask = self.inputs(seed, padding_ratio)
            with torch.inference_mode():
                self._outputs[key] = self.reference(x, mask)
        return self._outputs[key]

    def release(self) -> None:
        self._inputs.clear()
        self._outputs.clear()


def run_gate(
    bench: CaseBench,
    candidate: nn.Module | Callable[[Tensor, Tensor], Tensor],
    settings: GateSettings = OFFICIAL_GATE,
) -> GateResult:
    """Check the candidate on every seed (then padded seeds); stop at the first failure."""
    worst: CorrectnessReport | None = None
    checked = padded = 0
    plan_seeds = [(s, bench.case.padding_ratio) for s in settings.seeds]
    padding = settings.padding_ratio if bench.case.padding_ratio <= 0 else 0.0
    pad_seeds = [(s, padding) for s in settings.padded_seeds] if padding > 0 else []
    for seed, ratio in plan_seeds + pad_seeds:
        x, mask = bench.inputs(seed, ratio)
        ref = bench.reference_output(seed, ratio)
        with torch.inference_mode():
            out = candidate(x, mask)
        report = check_outputs(out, ref, settings.atol, settings.rtol)
        del out
        if ratio > 0 and bench.case.padding_ratio <= 0:
            padded += 1
        else:
            checked += 1
        if worst is None or report.budget_share > worst.budget_share:
            worst = report
        if not report.passed:
            return GateResult(False, report, checked, padded, (seed, ratio > 0))
    return GateResult(True, worst, checked, padded)
