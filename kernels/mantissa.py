"""Half-precision values rounded to fewer mantissa bits, in place (``attn_drop_bits``).

A tensor core's switching power grows with how many operand bits flip, and case 14's exact
route runs its attention at the card's power cap (docs/case14.md, session 38): operands
with their lowest mantissa bits cleared draw less power a FLOP, so the cap allows a higher
clock. :func:`round_mantissa_` rounds fp16 / bf16 values to nearest (ties away from zero)
with their lowest ``drop`` mantissa bits cleared; whether the coarser operands hold the
project's rule is the studies' and the oracle's question, as for fp16 operands themselves.

Values keep their sign; zeros stay zeros; inf and NaN pass unchanged; a finite value never
rounds to inf (the largest finite value with the low bits cleared is the cap). One read and
one write of the tensor on CUDA (Triton); a few torch ops elsewhere (the same bits).

Graded by position (``attn_drop_bits_late``, ``attn_drop_late_from``): a ``[..., S, C]``
tensor's rows at sequence positions ``late_from`` and after take ``late`` bits cleared, the
rows before them ``drop``. Under a causal mask a query at position ``i`` averages ``i + 1``
keys, so an operand's rounding error reaches a late row's context divided by about
``sqrt(i)``; the early rows, whose few keys weigh most, keep the finer operands.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels import _triton
from kernels._triton import check_launch_device, is_interpreted

__all__ = [
    "MANTISSA_BITS",
    "round_mantissa_",
    "round_mantissa_graded_reference",
    "round_mantissa_reference",
]

# Stored mantissa bits: fp16 10, bf16 7 (eps = 2^-bits).
MANTISSA_BITS = {
    dt: round(-math.log2(torch.finfo(dt).eps)) for dt in (torch.float16, torch.bfloat16)
}
# The first non-finite magnitude (exponent all ones): inf, then NaNs.
_EXP_ALL_ONES = {torch.float16: 0x7C00, torch.bfloat16: 0x7F80}
_BLOCK = 4096


def _check(x: torch.Tensor, drop: int, name: str = "drop") -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in MANTISSA_BITS:
        what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"expected a float16 or bfloat16 tensor, got {what}")
    bits = MANTISSA_BITS[x.dtype]
    if not 0 <= drop < bits:
        raise ValueError(f"{name}={drop} for {x.dtype}: give 0..{bits - 1} mantissa bits to clear")


def _check_graded(x: torch.Tensor, drop: int, late: int, late_from: int) -> None:
    _check(x, drop)
    _check(x, late, "late")
    if x.dim() < 2:
        raise ValueError(f"x has shape {tuple(x.shape)}; graded rounding needs [..., S, C]")
    if late_from < 0:
        raise ValueError(f"late_from={late_from}: give a sequence position >= 0")


def round_mantissa_reference(x: torch.Tensor, drop: int) -> torch.Tensor:
    """The same rounding out of place, in int32 arithmetic: what the kernel must match."""
    _check(x, drop)
    if drop == 0:
        return x.clone()
    inf = _EXP_ALL_ONES[x.dtype]
    bits = x.view(torch.int16).to(torch.int32)
    sign, mag = bits & 0x8000, bits & 0x7FFF
    low = (1 << drop) - 1
    rounded = torch.minimum((mag + (1 << (drop - 1))) & ~low, torch.tensor((inf - 1) & ~low))
    mag = torch.where(mag >= inf, mag, rounded)
    return (sign | mag).to(torch.int16).view(x.dtype)


def round_mantissa_graded_reference(
    x: torch.Tensor, drop: int, late: int, late_from: int
) -> torch.Tensor:
    """Out of place: ``x`` ``[..., S, C]`` with rows at positions >= ``late_from`` along
    dim -2 rounded with ``late`` bits cleared, the others with ``drop`` (``late`` 0: off,
    every row with ``drop``, as :func:`round_mantissa_` reads it)."""
    _check_graded(x, drop, late, late_from)
    out = round_mantissa_reference(x, drop)
    if late and late_from < x.shape[-2]:
        out[..., late_from:, :] = round_mantissa_reference(x[..., late_from:, :], late)
    return out


@triton.jit
def _round_bits(bits, drop, INF: tl.constexpr):
    """``bits`` (int32 of half values) rounded to nearest with ``drop`` (>= 1, a tensor or
    a scalar) low mantissa bits cleared; inf and NaN kept, no finite value sent to inf."""
    sign = bits & 0x8000
    mag = bits & 0x7FFF
    low = (1 << drop) - 1
    rounded = tl.minimum((mag + (1 << (drop - 1))) & ~low, (INF - 1) & ~low)
    return sign | tl.where(mag >= INF, mag, rounded)


@triton.jit
def _round_mantissa_rows_kernel(
    x_ptr,
    rows,
    seq,
    late_from,
    C: tl.constexpr,
    DROP: tl.constexpr,
    LATE: tl.constexpr,
    INF: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Rows of ``C`` halves (row ``r`` at sequence position ``r % seq``), each rounded with
    ``LATE`` bits cleared from ``late_from`` on and ``DROP`` (0 = kept) before."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    late = (r % seq) >= late_from
    drop = tl.where(late, LATE, DROP)[:, None]
    for c0 in range(0, C, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        ok = (r < rows)[:, None] & (c < C)[None, :]
        ptrs = x_ptr + r[:, None] * C + c[None, :]
        bits = tl.load(ptrs, mask=ok, other=0).to(tl.int32)
        new = _round_bits(bits, tl.maximum(drop, 1), INF)
        if DROP == 0:
            new = tl.where(drop == 0, bits, new)
        tl.store(ptrs, new.to(tl.int16), mask=ok)


@triton.jit
def _round_mantissa_kernel(x_ptr, n, DROP: tl.constexpr, INF: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    bits = tl.load(x_ptr + offs, mask=ok, other=0).to(tl.int32)
    tl.store(x_ptr + offs, _round_bits(bits, DROP, INF).to(tl.int16), mask=ok)


def _compiled_or_interpreted(x: torch.Tensor, kernel: object) -> bool:
    """Whether the Triton kernel serves ``x``: on CUDA, under the interpreter, or compiled
    offline (``kernels.sass.offline_launches``); else the torch ops give the same bits."""
    return x.device.type == "cuda" or is_interpreted(kernel) or _triton.OFFLINE_ARCH is not None


def round_mantissa_(x: torch.Tensor, drop: int, late: int = 0, late_from: int = 0) -> torch.Tensor:
    """Round ``x`` (contiguous fp16 / bf16) in place to nearest with its lowest ``drop``
    mantissa bits cleared; returns ``x``. ``drop`` 0 leaves it as it is. With ``late`` > 0,
    ``x`` is ``[..., S, C]`` and its rows at positions ``late_from`` and after (dim -2)
    take ``late`` bits cleared instead."""
    _check(x, drop)
    if not x.is_contiguous():
        raise ValueError(f"x has strides {x.stride()}; round a contiguous tensor (its base)")
    if late:
        _check_graded(x, drop, late, late_from)
        if late_from == 0 or late == drop:
            drop, late = late, 0  # every row takes the late bits: the plain kernel
        elif late_from >= x.shape[-2]:
            late = 0  # no row reaches the late positions
    if (drop == 0 and late == 0) or x.numel() == 0:
        return x
    if late:
        return _round_graded_(x, drop, late, late_from)
    if not _compiled_or_interpreted(x, _round_mantissa_kernel):
        return x.copy_(round_mantissa_reference(x, drop))
    as_int = x.view(torch.int16)
    check_launch_device(_round_mantissa_kernel, {"x": as_int})
    n = as_int.numel()
    grid = (triton.cdiv(n, _BLOCK),)
    _round_mantissa_kernel[grid](
        as_int, n, DROP=drop, INF=_EXP_ALL_ONES[x.dtype], BLOCK=_BLOCK, num_warps=8
    )
    return x


def _round_graded_(x: torch.Tensor, drop: int, late: int, late_from: int) -> torch.Tensor:
    if not _compiled_or_interpreted(x, _round_mantissa_rows_kernel):
        return x.copy_(round_mantissa_graded_reference(x, drop, late, late_from))
    as_int = x.view(torch.int16)
    check_launch_device(_round_mantissa_rows_kernel, {"x": as_int})
    c = x.shape[-1]
    rows = x.numel() // c
    block_c = min(triton.next_power_of_2(c), 1024)
    block_r = max(1, _BLOCK // block_c)
    _round_mantissa_rows_kernel[(triton.cdiv(rows, block_r),)](
        as_int,
        rows,
        x.shape[-2],
        late_from,
        C=c,
        DROP=drop,
        LATE=late,
        INF=_EXP_ALL_ONES[x.dtype],
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=8,
    )
    return x
