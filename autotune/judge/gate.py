"""The correctness gate: the official protocol (5 seeds, same weights), padded inputs
too, stop at the first failing seed; the worst report and a continuous violation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor, nn

from autotune.core.cases import Case
from autotune.core.device import DeviceInfo
from autotune.core.reference import (
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


def dense_reference_fits(case: Case, device: DeviceInfo) -> bool:
    """Whether the dense reference (it materialises [B, H, S, S] scores) can run here."""
    from autotune.measure import predict_peak_bytes
    from autotune.plan import REFERENCE_PLAN

    if case.regime == "infeasible-dense":
        return False
    need = predict_peak_bytes(REFERENCE_PLAN, case.config)
    return not device.total_memory or need <= 0.9 * device.total_memory


class CaseBench:
    """One case on one device: the reference with the official weights, inputs and
    reference outputs generated once and reused by every plan evaluated on it.

    Where the dense reference cannot run (``reference="auto"`` decides from the shape and
    the device's memory), the streamed exact oracle judges instead, on the first
    ``oracle_batch`` sequences of the batch (rows are independent, so a subset is exact):
    correctness and timing then both run on that subset, and ``describe()`` says so.
    """

    def __init__(
        self, case: Case, device: DeviceInfo, *, reference: str = "auto", oracle_batch: int = 1
    ) -> None:
        if reference not in ("auto", "dense", "oracle"):
            raise ValueError(f"reference must be auto, dense or oracle, got {reference!r}")
        if oracle_batch < 1:
            raise ValueError(f"oracle_batch must be at least 1, got {oracle_batch}")
        self.case = case
        self.device = device
        use_oracle = reference == "oracle" or (
            reference == "auto" and not dense_reference_fits(case, device)
        )
        self.reference_kind = "oracle" if use_oracle else "dense"
        self.config = case.config
        dense = build_reference(case.config, device.torch_device)
        if use_oracle:
            from autotune.judge.oracle import StreamedOracle

            b = min(oracle_batch, case.config.batch_size)
            self.config = dataclasses.replace(case.config, batch_size=b)
            oracle = StreamedOracle(case.config)
            oracle.load_state_dict(dense.state_dict())
            self.reference = oracle.to(device.torch_device).eval()
        else:
            self.reference = dense
        self.state_dict = {k: v.detach().clone() for k, v in self.reference.state_dict().items()}
        self._inputs: dict[tuple[int, float], tuple[Tensor, Tensor]] = {}
        self._outputs: dict[tuple[int, float], Tensor] = {}
        self._reference_ms: float | None = None

    def inputs(self, seed: int, padding_ratio: float) -> tuple[Tensor, Tensor]:
        key = (seed, padding_ratio)
        if key not in self._inputs:
            self._inputs[key] = generate_random_case(
                self.config, self.device.torch_device, torch.float32, seed, padding_ratio
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

    def reference_ms(self) -> float:
        """Median ms of the reference forward on the timing input (three runs, cached):
        the oracle's cost, against which plans of an oracle-judged case are quoted."""
        if self._reference_ms is None:
            from autotune.measure import TimingSettings, measure_interleaved

            x, mask = self.timing_inputs()
            with torch.inference_mode():
                _, [(median, _)] = measure_interleaved(
                    [lambda: self.reference(x, mask)],
                    TimingSettings(warmup=0, rounds=1, reps=3),
                    cuda=x.is_cuda,
                )
            self._reference_ms = median
        return self._reference_ms

    def describe(self) -> str:
        if self.reference_kind == "dense":
            return "dense reference, full batch"
        return (
            f"streamed exact oracle on the first {self.config.batch_size} of "
            f"{self.case.config.batch_size} sequences (the dense reference cannot run)"
        )

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
