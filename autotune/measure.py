"""Honest timing and memory: paired, interleaved, medians, noise, peak memory, a model.

On CUDA each forward is timed with CUDA events on the current stream, each function's
loop of forwards in a row, the order alternating each round (the official protocol). On
the CPU with ``perf_counter_ns``, the functions interleaved in turns of a few forwards:
there the machine's speed drifts over tens of milliseconds, and whole loops of one function
then the other read that drift as a difference between them (the reference timed against
itself on smoke-1, 200 runs of study timing: whole loops 0.57x-1.63x, sd 11%; turns of 4
forwards 0.83x-1.36x, sd 3-6%). Everything runs in the same process; the figure of merit
is the ratio of medians.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

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
    # CUDA: forwards of one function per turn, the functions interleaved turn by turn (0:
    # the official protocol's whole loops of ``reps``). The CPU always takes turns.
    cuda_turn: int = 0


OFFICIAL_TIMING = TimingSettings(warmup=20, rounds=3, reps=100)
# Search decisions interleave on CUDA too: a launch-bound reference timed against itself
# in whole loops read 0.80x-1.30x on the H200 (case 1; in turns of 4 0.99x-1.02x:
# docs/logs/h200_s4_timing_selfcheck.log), the same drift as the CPU's.
STUDY_TIMING = TimingSettings(warmup=3, rounds=3, reps=30, max_round_seconds=0.25, cuda_turn=4)
# A plan replaces another only when faster by more than the noise and by this share
# (export's winners and incumbents, and a knob chosen from a whole-batch record).
MIN_GAIN = 0.02


def _time_forwards(fn: Forward, reps: int, cuda: bool) -> list[float]:
    """Milliseconds of each of ``reps`` forwards of one function in a row: on CUDA a start
    and an end event around every forward, one synchronisation after the loop."""
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


def _williams_base(n: int) -> list[int]:
    """0, 1, n-1, 2, n-2, ...: its steps between neighbours are 1, -2, 3, -4, ... (mod n)."""
    base, low, high = [0], 1, n - 1
    while len(base) < n:
        if len(base) % 2:
            base.append(low)
            low += 1
        else:
            base.append(high)
            high -= 1
    return base


def step_order(n: int, step: int) -> list[int]:
    """The order of ``n`` functions at interleaved step ``step``: a Williams design, the
    row ``0, 1, n-1, 2, n-2, ...`` shifted by ``step // 2`` (mod n), reversed on odd steps
    (n = 2: AB BA BA AB, repeated). Over any ``2 n`` consecutive steps every function is
    first twice and last twice, and within the steps every function directly follows
    every other one exactly twice (a plain rotation put the functions listed next to the
    reference after it every time and the others never: session 20's five-function
    compares). Across step boundaries, where the turns also run back to back, function k
    is followed by k + 1 once more per ``2 n`` steps: with four functions the second
    follows the first in 9 of 24 turns, the others in 6."""
    k = (step // 2) % n
    order = [(b + k) % n for b in _williams_base(n)]
    return order[::-1] if step % 2 else order


# CPU: forwards of one function in a row before the next function's turn. A forward right
# after the other model's is slower (smoke-1: 5-6% for the reference and the candidate
# alike), so per-forward alternation (1) makes most of every sample such forwards and
# puts each median among them; turns of 4 keep ~80% of the samples in the
# steady state that the official protocol's whole loops time, and the drift still
# cancels (a turn is 2-4 ms on the smoke cases).
CPU_BURST = 4


def _time_steps(
    fns: list[Forward], reps: int, first_step: int, burst: int, cuda: bool = False
) -> list[list[float]]:
    """Milliseconds of ``reps`` forwards of each function, interleaved in turns of
    ``burst`` forwards (the order of the turns from ``step_order``): on CUDA a start and an
    end event around every forward and one synchronisation at the end, on the CPU
    ``perf_counter_ns``.

    The machine's speed drifts over tens of milliseconds (on a shared CPU per-forward
    times correlate at lags of 10-30 forwards; on the GPU a launch-bound forward follows
    the host's); a loop of one function's forwards and then a loop of the other's
    samples two different machines. Turns of a few forwards sample the same one, so the
    drift cancels in the ratio."""
    events: list[list[tuple[Any, Any]]] = [[] for _ in fns]
    times: list[list[float]] = [[] for _ in fns]
    clock = time.perf_counter_ns
    step = first_step
    done = 0
    while fns and done < reps:
        count = min(burst, reps - done)
        for i in step_order(len(fns), step):
            fn = fns[i]
            for _ in range(count):
                if cuda:
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn()
                    end.record()
                    events[i].append((start, end))
                else:
                    t0 = clock()
                    fn()
                    times[i].append((clock() - t0) / 1e6)
        done += count
        step += 1
    if cuda:
        torch.cuda.synchronize()
        times = [[s.elapsed_time(e) for s, e in ev] for ev in events]
    return times


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def measure_interleaved(
    fns: list[Forward], settings: TimingSettings, *, cuda: bool
) -> tuple[int, list[tuple[float, list[float]]]]:
    """Reps per round, and the median and per-round medians (ms) of each function.

    Warm-up: ``warmup`` forwards of each function, interleaved (one of each in turn), so
    every function is warm and none is timed right after a long run of another's.
    Then ``rounds`` rounds of ``reps`` forwards of each function:

    - CUDA with ``cuda_turn`` 0 (the official protocol): per round, each function's
      ``reps`` forwards in a row, a start and an end event around every forward, one
      synchronisation after each loop; the order of the functions reversed every other
      round.
    - CUDA with ``cuda_turn`` k, and the CPU (turns of ``CPU_BURST``): per round, the
      functions interleaved in turns of k forwards (``step_order``: a Williams design,
      reversed from turn to turn), each forward timed (events; ``perf_counter_ns``).
    """
    n = len(fns)
    for step in range(settings.warmup):
        for i in step_order(n, step):
            fns[i]()
    _sync(cuda)
    reps = settings.reps
    if settings.max_round_seconds is not None:
        slowest_ms = max(max(_time_forwards(fn, 2, cuda)) for fn in fns)
        fit = int(settings.max_round_seconds * 1000 / max(slowest_ms, 1e-3))
        reps = max(settings.min_reps, min(reps, fit))
    samples: list[list[float]] = [[] for _ in fns]
    rounds: list[list[float]] = [[] for _ in fns]
    order = list(range(n))
    for r in range(settings.rounds):
        burst = settings.cuda_turn if cuda else CPU_BURST
        if burst <= 0:  # whole loops of one function, the order reversed every other round
            times: list[list[float]] = [[] for _ in fns]
            for i in order if r % 2 == 0 else order[::-1]:
                times[i] = _time_forwards(fns[i], reps, cuda)
        else:
            turns = -(-reps // burst)  # a round's turns: the next round goes on
            times = _time_steps(fns, reps, r * turns, burst, cuda)
        for i, t in enumerate(times):
            samples[i].extend(t)
            rounds[i].append(statistics.median(t))
    return reps, [(statistics.median(s), rr) for s, rr in zip(samples, rounds, strict=True)]


def host_ms_per_call(fn: Callable[[], Any], calls: int = 20, bursts: int = 3) -> float:
    """A warm forward's host cost on CUDA: each call issued on an idle device (synchronised
    before it, not after), the wall time until it returns; the median of ``calls`` such
    calls (``bursts`` is kept for callers: ``calls`` x ``bursts`` calls in all). With an
    empty launch queue no launch waits for the GPU, so this is the host's own work, however
    many kernels the forward launches; below the device time per forward a forward is
    GPU-bound, above it the host sets the pace. (A call that synchronises counts its wait.)"""
    fn()
    samples = []
    for _ in range(max(1, calls * bursts)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(samples)


def eager_launch_us(
    launches: int = 200, rounds: int = 5, device: torch.device | str = "cuda"
) -> float:
    """This machine's host speed on CUDA: microseconds of host time per eager launch of a
    one-element in-place add (``launches`` in a row onto an idle device, no synchronisation
    inside; the median of ``rounds``). A launch-bound eager forward, such as the reference
    on the small cases, costs about its kernel count times this: two runs whose figures
    differ time that reference at different speeds, whatever the GPU does."""
    t = torch.zeros(1, device=device)
    t.add_(1.0)
    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(launches):
            t.add_(1.0)
        samples.append((time.perf_counter() - t0) * 1e6 / launches)
    torch.cuda.synchronize(device)
    return statistics.median(samples)


def steady_calls_sync_free(fn: Callable[[], Any], calls: int = 3) -> str:
    """Whether ``calls`` warm calls of ``fn`` run without a host synchronisation on CUDA
    (``torch.cuda.set_sync_debug_mode("error")``): "yes", or "no: " and the first line of
    what synchronised."""
    verdict = "yes"
    torch.cuda.synchronize()
    with warnings.catch_warnings():  # torch warns that the mode is a prototype, every time
        warnings.filterwarnings("ignore", "Synchronization debug mode is a prototype")
        torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(calls):
            fn()
    except RuntimeError as exc:
        verdict = "no: " + str(exc).strip().splitlines()[0][:120]
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
    return verdict


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


def pair_noise(a: TimingStats, b: TimingStats) -> float:
    """The noise of comparing two candidates timed in the same interleaved rounds: the
    largest relative disagreement of a round's ratio of their medians with the overall
    ratio. The reference's own swings between rounds (a launch-bound eager forward follows
    its host) move both candidates' speedups alike and cancel here; in each one's speedup
    noise they do not (session 23's export of case 1: the challenger, the incumbent and the
    anchor all at 14.6-14.7%). Without aligned rounds (older records), the larger of the
    two speedup noises."""
    ra, rb = a.cand_round_medians, b.cand_round_medians
    if (
        not ra
        or len(ra) != len(rb)
        or min(*ra, *rb) <= 0
        or min(a.cand_median_ms, b.cand_median_ms) <= 0
    ):
        return max(a.noise, b.noise)
    overall = a.cand_median_ms / b.cand_median_ms
    return max(abs(x / y / overall - 1.0) for x, y in zip(ra, rb, strict=True))


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
    # batch_streams: that many chunks in flight at once, each in its stream's own pool
    live = max(1, min(plan.batch_streams, -(-b // chunk)))
    return int(weights + derived + io + live * (acts + qkv + ffn + scores + workspace))


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
