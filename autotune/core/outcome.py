"""Typed, serialisable outcomes of evaluating one plan on one case."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

from autotune.core.reference import CorrectnessReport


class OutcomeKind(enum.StrEnum):
    PASSED = "passed"
    WRONG_RESULT = "wrong_result"
    UNSUPPORTED = "unsupported"
    OUT_OF_MEMORY = "out_of_memory"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASHED = "crashed"

    @property
    def label(self) -> str:
        return self.value.replace("_", " ")


# A plan must stay GPU-bound with its host running this many times slower than in the
# process that measured it: a deployment's host does other work. Session 19's bench of
# tables/h200.py v40 ran case 8's compile=default plan, 1.21 ms at its export, at 2.16 ms
# in a process where its host took 2.27 ms a call (1.12 ms of GPU time a forward).
HOST_HEADROOM = 2.0


def robust_ms(median_ms: float, host_ms: float | None, headroom: float = HOST_HEADROOM) -> float:
    """The time a forward would take with its host ``headroom`` times slower: its measured
    median, or ``headroom`` x its host time per call where that is longer (unknown host
    time: the median)."""
    return median_ms if host_ms is None else max(median_ms, headroom * host_ms)


def paced_by(host_us: float, gpu_us: float | None) -> str:
    """What sets a steady forward's pace: "host" when a call's host time reaches its GPU
    time, "host at 2x" (HOST_HEADROOM) when it would with the host that much slower,
    "GPU" otherwise, and "-" when no GPU time was measured."""
    if not gpu_us:
        return "-"
    if host_us >= gpu_us:
        return "host"
    return f"host at {HOST_HEADROOM:g}x" if HOST_HEADROOM * host_us >= gpu_us else "GPU"


@dataclasses.dataclass(frozen=True)
class TimingStats:
    """Paired, interleaved timing of reference and candidate (milliseconds)."""

    ref_median_ms: float
    cand_median_ms: float
    speedup: float
    noise: float  # relative disagreement of the per-round speedups with the overall one
    rounds: int
    reps: int
    ref_round_medians: tuple[float, ...] = ()
    cand_round_medians: tuple[float, ...] = ()
    clock: str = "cuda-events"

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["ref_round_medians"] = list(self.ref_round_medians)
        data["cand_round_medians"] = list(self.cand_round_medians)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TimingStats:
        data = dict(data)
        data["ref_round_medians"] = tuple(data.get("ref_round_medians", ()))
        data["cand_round_medians"] = tuple(data.get("cand_round_medians", ()))
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to a plan: its kind, the evidence, and the measurements."""

    kind: OutcomeKind
    message: str = ""
    report: CorrectnessReport | None = None  # the worst seed's report
    seeds_checked: int = 0
    padded_seeds_checked: int = 0
    timing: TimingStats | None = None
    peak_memory_bytes: int | None = None
    ref_peak_memory_bytes: int | None = None
    predicted_memory_bytes: int | None = None
    phase_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    kernels_per_forward: int | None = None  # device kernels of one forward, when counted
    # Host milliseconds a warm call costs (CUDA, each call issued on an idle device).
    host_ms_per_call: float | None = None

    @property
    def passed(self) -> bool:
        return self.kind is OutcomeKind.PASSED

    @property
    def violation(self) -> float:
        """Correctness constraint: worst budget share minus 1 (<= 0 feasible)."""
        if self.report is not None:
            v = self.report.violation
            return v if math.isfinite(v) else 1e6
        return 0.0 if self.passed else 1e6

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "message": self.message,
            "report": self.report.to_json() if self.report else None,
            "seeds_checked": self.seeds_checked,
            "padded_seeds_checked": self.padded_seeds_checked,
            "timing": self.timing.to_json() if self.timing else None,
            "peak_memory_bytes": self.peak_memory_bytes,
            "ref_peak_memory_bytes": self.ref_peak_memory_bytes,
            "predicted_memory_bytes": self.predicted_memory_bytes,
            "phase_seconds": dict(self.phase_seconds),
            "kernels_per_forward": self.kernels_per_forward,
            "host_ms_per_call": self.host_ms_per_call,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(
            kind=OutcomeKind(data["kind"]),
            message=data.get("message", ""),
            report=CorrectnessReport.from_json(data["report"]) if data.get("report") else None,
            seeds_checked=data.get("seeds_checked", 0),
            padded_seeds_checked=data.get("padded_seeds_checked", 0),
            timing=TimingStats.from_json(data["timing"]) if data.get("timing") else None,
            peak_memory_bytes=data.get("peak_memory_bytes"),
            ref_peak_memory_bytes=data.get("ref_peak_memory_bytes"),
            predicted_memory_bytes=data.get("predicted_memory_bytes"),
            phase_seconds=dict(data.get("phase_seconds", {})),
            kernels_per_forward=data.get("kernels_per_forward"),
            host_ms_per_call=data.get("host_ms_per_call"),
        )

    def summary_line(self) -> str:
        if self.passed and self.timing is not None:
            t = self.timing
            peak = (
                f", peak {self.peak_memory_bytes / 2**20:.0f} MiB"
                if self.peak_memory_bytes is not None
                else ""
            )
            # PASS is the rule's verdict; a plan slower beyond the noise is said so.
            slower = ", slower than the reference" if t.speedup * (1 + t.noise) < 1 else ""
            return (
                f"PASS {t.speedup:.2f}x (ref {t.ref_median_ms:.2f} ms, plan "
                f"{t.cand_median_ms:.2f} ms, noise {100 * t.noise:.1f}%{peak}{slower})"
            )
        if self.passed:
            return "PASS (not timed)"
        if self.kind is OutcomeKind.WRONG_RESULT and self.report is not None:
            return f"FAIL wrong result: {self.report.summary()}"
        return f"FAIL {self.kind.label}: {self.message}"
