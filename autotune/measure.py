"""Honest timing and memory: paired, interleaved, medians, noise, peak memory, a model.

On CUDA each forward is timed with CUDA events on the current stream; on the CPU with
``perf_counter_ns``. Reference and candidate run in the same process, interleaved, the
order alternating each round; the figure of merit is the ratio of medians.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

from autotune import backends
from autotune.backends import precision
from autotune.core.outcome import TimingStats
from autotune.core.reference import TransformerConfig
from autotune.plan import Plan

Forward = Callable[[], Tensor]


@dataclasses.dataclass(frozen=True)
class TimingSettings:
    warmup: int = 20
    rounds: int = 3
    reps: int = 100
    # Trials may cap the time spent: reps shrink so one model's round stays under this.
    max_round_seconds: float | None = None
    min_reps: int = 5


OFFICIAL_TIMING = TimingSettings(warmup=20, rounds=3, reps=100)
STUDY_TIMING = TimingSettings(warmup=3, rounds=3, reps=30, max_round_seconds=0.25)


def _time_forwards(fn: Forward, reps: int, cuda: bool) -> list[float]:
    """Milliseconds of each of ``reps`` forwards."""
    if cuda:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return times


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def measure_interleaved(
    fns: list[Forward], settings: TimingSettings, *, cuda: bool
) -> tuple[int, list[tuple[float, list[float]]]]:
    """Reps per round, and the median and per-round medians (ms) of each function, timed
    interleaved: warm-up,
    then ``rounds`` rounds in which each function runs ``reps`` forwards, the order
    reversed every other round."""
    for fn in fns:
        for _ in range(settings.warmup):
            fn()
        _sync(cuda)
    reps = settings.reps
    if settings.max_round_seconds is not None:
        slowest_ms = max(max(_time_forwards(fn, 2, cuda)) for fn in fns)
        fit = int(settings.max_round_seconds * 1000 / max(slowest_ms, 1e-3))
        reps = max(settings.min_reps, min(reps, fit))
    samples: list[list[float]] = [[] for _ in fns]
    rounds: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for r in range(settings.rounds):
        for i in order if r % 2 == 0 else order[::-1]:
            times = _time_forwards(fns[i], reps, cuda)
            samples[i].extend(times)
            rounds[i].append(statistics.median(times))
    return reps, [(statistics.median(s), rr) for s, rr in zip(samples, rounds, strict=True)]


def paired_stats(
    ref: tuple[float, list[float]], cand: tuple[float, list[float]], reps: int, cuda: bool
) -> TimingStats:
    """Speedup of ``cand`` over ``ref`` and the noise: the largest relative disagreement
    of a round's ratio with the overall ratio."""
    speedup = ref[0] / cand[0] if cand[0] > 0 else float("inf")
    per_round = [r / c for r, c in zip(ref[1], cand[1], strict=True) if c > 0]
    noise = max(abs(s - speedup) / speedup for s in per_round) if per_round else 0.0
    return TimingStats(
        ref_median_ms=ref[0],
        cand_median_ms=cand[0],
        speedup=speedup,
        noise=noise,
        rounds=len(ref[1]),
        reps=reps,
        ref_round_medians=tuple(ref[1]),
        cand_round_medians=tuple(cand[1]),
        clock="cuda-events" if cuda else "perf_counter_ns",
    )


def measure_paired(
    reference: Forward, candidate: Forward, settings: TimingSettings, *, cuda: bool
) -> TimingStats:
    """Reference and candidate timed interleaved, order alternating each round."""
    reps, (ref, cand) = measure_interleaved([reference, candidate], settings, cuda=cuda)
    return paired_stats(ref, cand, reps, cuda)


def tensor_bytes(*tensors: Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def peak_forward_memory(fn: Forward, held_bytes: int, *, cuda: bool) -> int | None:
    """Peak bytes of one forward on CUDA: the most allocated above what was held before,
    plus ``held_bytes`` (weights and input the caller holds). None on the CPU (not run)."""
    if not cuda:
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before + held_bytes


def predict_peak_bytes(plan: Plan, config: TransformerConfig) -> int:
    """A conservative model of a plan's peak memory (bytes) for a case.

    Inputs and outputs of the whole batch, the weights (and derived copies), and the
    transient working set of one layer for one batch chunk: activations, the
    projections and what the attention backend holds besides (scores, log-sum-exp,
    states: ``AttentionBackend.workspace_bytes``).
    """
    b, s, d, f, n_layers = (
        config.batch_size,
        config.seq_len,
        config.d_model,
        config.ffn_dim,
        config.num_layers,
    )
    fp = 4
    chunk = plan.batch_chunk if 0 < plan.batch_chunk < b else b
    tokens = chunk * s
    weights = n_layers * (4 * d * d + 4 * d + 2 * d * f + d + f) * fp
    low = precision.DTYPES
    gemm_bytes = precision.operand_bytes(plan.gemm_precision)
    attn_bytes = precision.operand_bytes(plan.attn_precision)
    derived = 0
    if plan.qkv == "packed" or plan.gemm_precision in low:
        derived = n_layers * (3 * d * d + 3 * d) * gemm_bytes
        if plan.gemm_precision in low:
            derived += n_layers * (d * d + 2 * d * f) * gemm_bytes
    io = 2 * b * s * d * fp  # input and output of the whole batch
    if plan.host_io:  # they stay in host memory: two input chunks and one output in flight
        io = 3 * chunk * s * d * fp
    if plan.cuda_graph:
        io += 2 * b * s * d * fp  # static input and output copies
    acts = tokens * d * fp * 4  # residual, normed, attention out, ffn out
    qkv = 3 * tokens * d * fp * (2 if plan.heads == "contiguous" else 1)
    if plan.attn_precision in low:
        qkv += 3 * tokens * d * attn_bytes
    ffn = 2 * tokens * f * fp
    if plan.gemm_precision in low:
        ffn += tokens * max(f, 3 * d) * gemm_bytes
    scores = backends.attention(plan.attention).workspace_bytes(plan, config, chunk)
    workspace = 64 * 2**20  # cuBLAS workspace, allocator rounding
    return int(weights + derived + io + acts + qkv + ffn + scores + workspace)


def count_kernels(fn: Forward, *, cuda: bool) -> int | None:
    """Device kernels one call of ``fn`` launches (CUDA-graph replays counted kernel by
    kernel), from the profiler; memcpy/memset excluded. None on the CPU."""
    if not cuda:
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(1 for n in names if not n.lower().startswith(("memcpy", "memset")))
