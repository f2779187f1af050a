"""The one evaluation path: plans (or ready modules) in, verdicts and measurements out.

``evaluate_many(bench, candidates)`` checks each plan's support and predicted memory,
builds it, measures its first forward's peak memory, gates it on correctness, then times
every candidate that passed interleaved with the reference in one run. Study trials
(one plan), the finalists' re-measurement at export, ``autotune compare`` and
``autotune bench`` (a table's dispatcher) all go through it. It never raises for a
candidate's failure: every failure is an ``Outcome``.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

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
    count_kernels,
    host_ms_per_call,
    measure_interleaved,
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


def cleanup(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def fault_for_trial(number: int | None, spec: str | None = None) -> str:
    """The fault the test hook asks for on this trial ("" for none).

    ``AUTOTUNE_INJECT_FAULT`` is a comma list of ``kind`` (every trial) or ``kind@N``
    (trial number N only); kinds: crash, hang, wrong, raise, device (a sticky device fault:
    this plan and every later one in the process raise, as after a CUDA illegal memory
    access). Tests only.
    """
    spec = os.environ.get(FAULT_ENV, "") if spec is None else spec
    for part in filter(None, (p.strip() for p in spec.split(","))):
        kind, _, at = part.partition("@")
        if kind not in FAULT_KINDS:
            raise ValueError(f"{FAULT_ENV}: unknown fault {kind!r}; use {', '.join(FAULT_KINDS)}")
        if not at or (number is not None and at.isdigit() and int(at) == number):
            return kind
    return ""


FAULT_KINDS = ("crash", "hang", "wrong", "raise", "device")
_sticky_fault = False  # the "device" fault hit this process: every later plan raises too


class DeviceBroken(RuntimeError):
    """This process's device faulted in an earlier plan (a sticky CUDA error): it can
    evaluate nothing more."""


def device_broken() -> bool:
    """Whether this process's device can no longer run anything: a CUDA device-side fault
    (an illegal memory access) is sticky, and every later call in the process raises (and
    so does the test hook's "device" fault)."""
    if _sticky_fault:
        return True
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize()
    except RuntimeError:  # torch.AcceleratorError is one
        return True
    return False


def _inject_fault(
    model: Callable[[Tensor, Tensor], Tensor], fault: str
) -> Callable[[Tensor, Tensor], Tensor]:
    global _sticky_fault
    if fault == "device" or _sticky_fault:
        _sticky_fault = True
        raise RuntimeError("CUDA error: an illegal memory access was encountered (injected)")
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


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A ready module to judge and time beside plans (a table's dispatcher, say): it has
    the reference's state dict and forward, and is on the bench's device."""

    label: str
    module: Any


def evaluate_plan(
    bench: CaseBench,
    plan: Plan,
    *,
    timing: TimingSettings | None = STUDY_TIMING,
    gate: GateSettings = OFFICIAL_GATE,
    capacity_bytes: int | None = None,
    fault: str | None = None,
) -> Outcome:
    """One plan: support and predicted memory, build, gate, then timing against the
    reference (``timing=None``: correctness only)."""
    [outcome] = evaluate_many(
        bench, [plan], timing=timing, gate=gate, capacity_bytes=capacity_bytes, fault=fault
    )
    return outcome


@dataclasses.dataclass(frozen=True)
class _Ready:
    """A candidate that passed the gate, waiting to be timed."""

    index: int
    timed: Callable[[], Tensor]  # the forward as it is timed
    module: Any
    gate: Any  # its GateResult
    peak: int | None


def evaluate_many(
    bench: CaseBench,
    candidates: Sequence[Plan | Candidate],
    *,
    timing: TimingSettings | None = STUDY_TIMING,
    gate: GateSettings = OFFICIAL_GATE,
    capacity_bytes: int | None = None,
    max_peak_bytes: int | None = None,
    prune: bool = True,
    kernels: bool = False,
    fault: str | None = None,
) -> list[Outcome]:
    """An outcome per candidate, in order (see the module).

    ``capacity_bytes``: plans predicted above it are refused unrun. ``max_peak_bytes``:
    candidates whose measured peak exceeds it are refused after their first forward.
    ``prune``: also refuse plans that would run but waste a search's time. ``kernels``:
    count each passing candidate's device kernels per forward (profiler). ``fault``:
    the test hook (see ``fault_for_trial``)."""
    cuda = bench.device.type == "cuda"
    outcomes: list[Outcome | None] = [None] * len(candidates)
    phases: list[dict[str, float]] = [{} for _ in candidates]
    predicted = [
        predict_peak_bytes(c, bench.case.config) if isinstance(c, Plan) else None
        for c in candidates
    ]
    ready: list[_Ready] = []
    x, mask = bench.timing_inputs()
    try:
        with official_settings():
            for i, candidate in enumerate(candidates):
                outcome, entry = _judge(
                    bench,
                    candidate,
                    predicted[i],
                    gate,
                    capacity_bytes,
                    max_peak_bytes,
                    prune,
                    fault,
                    phases[i],
                )
                if entry is None:
                    outcomes[i] = outcome
                else:
                    deployed = _deployed(candidate, entry.module, entry.timed, x, mask, cuda)
                    ready.append(dataclasses.replace(entry, index=i, timed=deployed))
                entry = None
            stats, ref_peak, counts, host = _time(bench, ready, timing, kernels, cuda, phases)
        passed = [(r.index, _passed(r, stats, ref_peak, counts, host)) for r in ready]
        for index, outcome in passed:
            outcomes[index] = outcome
    except Exception as exc:  # timing itself failed: every candidate still waiting fails
        for index in [r.index for r in ready]:
            outcomes[index] = _failure(exc)
    finally:
        ready.clear()  # the modules go before the allocator is emptied
        cleanup(cuda)
    return [
        dataclasses.replace(o, predicted_memory_bytes=predicted[i], phase_seconds=phases[i])
        for i, o in enumerate(outcomes)
        if o is not None
    ]


def _passed(
    r: _Ready,
    stats: dict[int, Any],
    ref_peak: int | None,
    counts: dict[int, int | None],
    host: dict[int, float],
) -> Outcome:
    return Outcome(
        OutcomeKind.PASSED,
        _guard_summary(r.module),
        report=r.gate.worst,
        seeds_checked=r.gate.seeds_checked,
        padded_seeds_checked=r.gate.padded_seeds_checked,
        timing=stats.get(r.index),
        peak_memory_bytes=r.peak,
        ref_peak_memory_bytes=ref_peak,
        kernels_per_forward=counts.get(r.index),
        host_ms_per_call=host.get(r.index),
    )


def _judge(
    bench: CaseBench,
    candidate: Plan | Candidate,
    predicted: int | None,
    gate: GateSettings,
    capacity_bytes: int | None,
    max_peak_bytes: int | None,
    prune: bool,
    fault: str | None,
    phases: dict[str, float],
) -> tuple[Outcome | None, _Ready | None]:
    """Support, predicted memory, build, first forward (peak), gate: a failure's outcome
    and None, or None and the candidate ready to be timed."""
    cuda = bench.device.type == "cuda"
    if isinstance(candidate, Plan):
        reasons = not_supported_reasons(candidate, bench.config, bench.device, prune=prune)
        if reasons:
            return Outcome(OutcomeKind.UNSUPPORTED, "; ".join(reasons)), None
        if capacity_bytes is not None and predicted is not None and predicted > capacity_bytes:
            return Outcome(
                OutcomeKind.OUT_OF_MEMORY,
                f"predicted peak {predicted / 2**30:.2f} GiB exceeds the capacity "
                f"{capacity_bytes / 2**30:.2f} GiB (not run)",
            ), None
    try:
        t0 = time.perf_counter()
        if isinstance(candidate, Plan):
            model = build_candidate(candidate, bench.config, bench.device, bench.state_dict)
        else:
            model = candidate.module
        fn = _inject_fault(model, fault_for_trial(None) if fault is None else fault)
        if isinstance(candidate, Plan) and candidate.host_io and cuda:
            fn = _from_host(fn)
        phases["build"] = time.perf_counter() - t0
        # First forward: compile/capture happen here; its peak is the candidate's peak.
        x, mask = bench.timing_inputs()
        held = tensor_bytes(x, mask) + sum(tensor_bytes(p) for p in model.parameters())
        t0 = time.perf_counter()
        with torch.inference_mode():
            peak = peak_forward_memory(lambda: fn(x, mask), held, cuda=cuda)
            if not cuda:
                fn(x, mask)
        phases["first_call"] = time.perf_counter() - t0
        if max_peak_bytes is not None and peak is not None and peak > max_peak_bytes:
            return Outcome(
                OutcomeKind.OUT_OF_MEMORY,
                f"measured peak {peak} B over the cap {max_peak_bytes} B",
                peak_memory_bytes=peak,
            ), None
        t0 = time.perf_counter()
        result = run_gate(bench, fn, gate)
        phases["correctness"] = time.perf_counter() - t0
    except Exception as exc:  # a candidate's failure is data, never the caller's crash
        return _failure(exc), None
    if not result.passed:
        where = ""
        if result.failing_seed:
            seed, padded = result.failing_seed
            where = f"seed {seed}{' padded' if padded else ''}"
        return Outcome(
            OutcomeKind.WRONG_RESULT,
            where,
            report=result.worst,
            seeds_checked=result.seeds_checked,
            padded_seeds_checked=result.padded_seeds_checked,
            peak_memory_bytes=peak,
        ), None
    return None, _Ready(-1, fn, model, result, peak)


def _deployed(
    candidate: Plan | Candidate, model: Any, fn: Any, x: Tensor, mask: Tensor, cuda: bool
) -> Callable[[], Tensor]:
    """The forward as it is timed: a host_io plan as deployed, host in and host out."""
    if isinstance(candidate, Plan) and candidate.host_io and cuda:
        xh, mh = pinned_copy(x), pinned_copy(mask)
        return lambda: model(xh, mh)
    return lambda: fn(x, mask)


def _time(
    bench: CaseBench,
    ready: list[_Ready],
    timing: TimingSettings | None,
    kernels: bool,
    cuda: bool,
    phases: list[dict[str, float]],
) -> tuple[dict[int, Any], int | None, dict[int, int | None], dict[int, float]]:
    """Paired timing of every ready candidate against the reference in one interleaved
    run (the oracle, seconds a forward, is timed once per bench instead); the reference's
    peak; kernels per forward when asked; on CUDA each candidate's host time per call
    (``host_ms_per_call``; not where the oracle judges: forwards of seconds)."""
    stats: dict[int, Any] = {}
    counts: dict[int, int | None] = {}
    host: dict[int, float] = {}
    if timing is None or not ready:
        return stats, None, counts, host
    t0 = time.perf_counter()
    x, mask = bench.timing_inputs()
    ref = bench.reference
    with torch.inference_mode():
        ref_held = tensor_bytes(x, mask) + sum(tensor_bytes(p) for p in ref.parameters())
        ref_peak = peak_forward_memory(lambda: ref(x, mask), ref_held, cuda=cuda)
        if kernels:
            counts = {r.index: count_kernels(r.timed, cuda=cuda) for r in ready}
        fns = [r.timed for r in ready]
        if bench.reference_kind == "oracle":
            # The oracle takes seconds a forward: timed once per bench, not interleaved
            # with every trial (recorded as such by describe()).
            reps, results = measure_interleaved(fns, timing, cuda=cuda)
            oracle_ms = bench.reference_ms()
            refs = [(oracle_ms, [oracle_ms] * len(res[1])) for res in results]
        else:
            reps, results = measure_interleaved([lambda: ref(x, mask), *fns], timing, cuda=cuda)
            refs = [results[0]] * len(ready)
            results = results[1:]
    for r, ref_res, res in zip(ready, refs, results, strict=True):
        stats[r.index] = paired_stats(ref_res, res, reps, cuda)
    if cuda and bench.reference_kind != "oracle":
        with torch.inference_mode():
            for r in ready:
                host_ms = _host_ms(r, stats[r.index].cand_median_ms)
                if host_ms is not None:
                    host[r.index] = host_ms
    spent = time.perf_counter() - t0
    for r in ready:
        phases[r.index]["timing"] = spent
    return stats, ref_peak, counts, host


HOST_TIMING_MAX_MS = 20.0  # a forward this long is never paced by its host's launches


def _host_ms(r: _Ready, median_ms: float) -> float | None:
    """A timed candidate's host milliseconds a call (``host_ms_per_call``, about 60 calls
    or fewer for slower forwards), or None: forwards over HOST_TIMING_MAX_MS, plans that
    synchronise every call (their wait is not host work), and a measurement that failed
    (the candidate's timing stands)."""
    plan = getattr(r.module, "plan", None)
    if median_ms > HOST_TIMING_MAX_MS or (
        isinstance(plan, Plan) and (plan.reads_mask_on_host or plan.host_io)
    ):
        return None
    try:
        calls = max(3, min(20, int(50 / max(median_ms, 1e-3))))
        return host_ms_per_call(r.timed, calls=calls)
    except Exception:  # the timing already taken is what counts
        return None


def _failure(exc: BaseException) -> Outcome:
    kind = classify_exception(exc)
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    if isinstance(exc, UnsupportedPlan):
        message = str(exc)
    return Outcome(kind, message[:500])
