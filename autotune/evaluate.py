"""One plan in, a verdict and measurements out. Never raises for a plan's failure."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable

import torch
from torch import Tensor

from autotune.build import UnsupportedPlan, build_candidate, not_supported_reasons
from autotune.core.device import pinned_copy
from autotune.core.outcome import Outcome, OutcomeKind
from autotune.core.reference import official_settings
from autotune.judge.gate import OFFICIAL_GATE, CaseBench, GateSettings, run_gate
from autotune.measure import (
    STUDY_TIMING,
    TimingSettings,
    measure_interleaved,
    measure_paired,
    paired_stats,
    peak_forward_memory,
    predict_peak_bytes,
    tensor_bytes,
)
from autotune.plan import Plan

FAULT_ENV = "AUTOTUNE_INJECT_FAULT"  # tests only: see fault_for_trial


def classify_exception(exc: BaseException) -> OutcomeKind:
    """Map an exception from building or running a plan to an outcome kind."""
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return OutcomeKind.OUT_OF_MEMORY
    if isinstance(exc, UnsupportedPlan):
        return OutcomeKind.UNSUPPORTED
    name = type(exc).__name__
    module = type(exc).__module__ or ""
    if "OutOfResources" in name:
        return OutcomeKind.UNSUPPORTED
    if name in (
        "CompilationError",
        "BackendCompilerFailed",
        "InductorError",
        "Unsupported",
    ) or module.startswith(("torch._dynamo", "torch._inductor", "triton.compiler")):
        return OutcomeKind.COMPILE_ERROR
    if "No available kernel" in str(exc) or "not supported" in str(exc).lower():
        return OutcomeKind.UNSUPPORTED
    return OutcomeKind.RUNTIME_ERROR


def _cleanup(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def fault_for_trial(number: int | None, spec: str | None = None) -> str:
    """The fault the test hook asks for on this trial ("" for none).

    ``AUTOTUNE_INJECT_FAULT`` is a comma list of ``kind`` (every trial) or ``kind@N``
    (trial number N only); kinds: crash, hang, wrong, raise. Tests only.
    """
    spec = os.environ.get(FAULT_ENV, "") if spec is None else spec
    for part in filter(None, (p.strip() for p in spec.split(","))):
        kind, _, at = part.partition("@")
        if kind not in ("crash", "hang", "wrong", "raise"):
            raise ValueError(f"{FAULT_ENV}: unknown fault {kind!r}; use crash, hang, wrong, raise")
        if not at or (number is not None and at.isdigit() and int(at) == number):
            return kind
    return ""


def _inject_fault(
    model: Callable[[Tensor, Tensor], Tensor], fault: str
) -> Callable[[Tensor, Tensor], Tensor]:
    if fault == "crash":
        os.abort()
    if fault == "hang":
        while True:
            time.sleep(1)
    if fault == "raise":
        raise RuntimeError("injected fault")
    if fault == "wrong":
        return lambda x, m: model(x, m) * 1.01 + 0.01
    return model


def _from_host(model: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """A host_io plan judged on device inputs: hand it host copies, bring the output back."""

    def run(x: Tensor, mask: Tensor) -> Tensor:
        return model(pinned_copy(x), pinned_copy(mask)).to(x.device)

    return run


def _guard_summary(model: object) -> str:
    """Which path polynomial attention took in the last forward (empty for other plans)."""
    log = getattr(model, "guard_log", None)
    if not log:
        return ""
    paths = [d.path for d in log]
    worst = max(d.spread for d in log)
    return (
        f"guard: {paths.count('polynomial')}/{len(paths)} attention calls polynomial, "
        f"largest sampled spread {worst:.3g} (threshold {log[0].threshold:g})"
    )


def evaluate_plan(
    bench: CaseBench,
    plan: Plan,
    *,
    timing: TimingSettings | None = STUDY_TIMING,
    gate: GateSettings = OFFICIAL_GATE,
    capacity_bytes: int | None = None,
    fault: str | None = None,
) -> Outcome:
    """Check support and predicted memory, build, gate on correctness, then time.

    ``timing=None`` skips timing (correctness only). Every failure is an Outcome.
    """
    config = bench.config  # the oracle judges a batch subset where the dense reference cannot run
    device = bench.device
    cuda = device.type == "cuda"
    phases: dict[str, float] = {}
    # Memory is predicted for the whole case: a plan must fit the full batch on the device
    # even where correctness and timing run on the oracle's subset.
    predicted = predict_peak_bytes(plan, bench.case.config)
    reasons = not_supported_reasons(plan, config, device, prune=True)
    if reasons:
        return Outcome(
            OutcomeKind.UNSUPPORTED, "; ".join(reasons), predicted_memory_bytes=predicted
        )
    if capacity_bytes is not None and predicted > capacity_bytes:
        return Outcome(
            OutcomeKind.OUT_OF_MEMORY,
            f"predicted peak {predicted / 2**30:.2f} GiB exceeds the capacity "
            f"{capacity_bytes / 2**30:.2f} GiB (not run)",
            predicted_memory_bytes=predicted,
        )
    model = None
    try:
        with official_settings():
            t0 = time.perf_counter()
            model = build_candidate(plan, config, device, bench.state_dict)
            fn = _inject_fault(model, fault_for_trial(None) if fault is None else fault)
            if plan.host_io and cuda:
                fn = _from_host(fn)
            phases["build"] = time.perf_counter() - t0
            # First forward: compile/capture happen here; its peak is the plan's peak.
            x, mask = bench.timing_inputs()
            held = tensor_bytes(x, mask) + sum(tensor_bytes(p) for p in model.parameters())
            t0 = time.perf_counter()
            with torch.inference_mode():
                peak = peak_forward_memory(lambda: fn(x, mask), held, cuda=cuda)
                if not cuda:
                    fn(x, mask)
            phases["first_call"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            result = run_gate(bench, fn, gate)
            phases["correctness"] = time.perf_counter() - t0
            if not result.passed:
                return Outcome(
                    OutcomeKind.WRONG_RESULT,
                    f"seed {result.failing_seed[0]}{' padded' if result.failing_seed[1] else ''}"
                    if result.failing_seed
                    else "",
                    report=result.worst,
                    seeds_checked=result.seeds_checked,
                    padded_seeds_checked=result.padded_seeds_checked,
                    peak_memory_bytes=peak,
                    predicted_memory_bytes=predicted,
                    phase_seconds=phases,
                )
            stats = None
            ref_peak = None
            if timing is not None:
                t0 = time.perf_counter()
                ref = bench.reference
                with torch.inference_mode():
                    ref_held = tensor_bytes(x, mask) + sum(
                        tensor_bytes(p) for p in ref.parameters()
                    )
                    ref_peak = peak_forward_memory(lambda: ref(x, mask), ref_held, cuda=cuda)
                    if plan.host_io and cuda:  # time the plan as deployed: host in, host out
                        xh, mh = pinned_copy(x), pinned_copy(mask)
                        host_model = model
                        timed = lambda: host_model(xh, mh)  # noqa: E731
                    else:
                        timed = lambda: fn(x, mask)  # noqa: E731
                    if bench.reference_kind == "oracle":
                        # The oracle takes seconds a forward: timed once per bench, not
                        # interleaved with every trial (recorded as such by describe()).
                        reps, [cand] = measure_interleaved([timed], timing, cuda=cuda)
                        oracle_ms = bench.reference_ms()
                        stats = paired_stats(
                            (oracle_ms, [oracle_ms] * len(cand[1])), cand, reps, cuda
                        )
                    else:
                        stats = measure_paired(lambda: ref(x, mask), timed, timing, cuda=cuda)
                phases["timing"] = time.perf_counter() - t0
            return Outcome(
                OutcomeKind.PASSED,
                _guard_summary(model),
                report=result.worst,
                seeds_checked=result.seeds_checked,
                padded_seeds_checked=result.padded_seeds_checked,
                timing=stats,
                peak_memory_bytes=peak,
                ref_peak_memory_bytes=ref_peak,
                predicted_memory_bytes=predicted,
                phase_seconds=phases,
            )
    except Exception as exc:  # a plan's failure is data, never the caller's crash
        kind = classify_exception(exc)
        message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
        if isinstance(exc, UnsupportedPlan):
            message = str(exc)
        return Outcome(kind, message[:500], predicted_memory_bytes=predicted, phase_seconds=phases)
    finally:
        del model
        _cleanup(cuda)
