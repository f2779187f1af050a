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
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._triton import check_launch_device, is_interpreted

__all__ = ["MANTISSA_BITS", "round_mantissa_", "round_mantissa_reference"]

# Stored mantissa bits: fp16 10, bf16 7 (eps = 2^-bits).
MANTISSA_BITS = {
    dt: round(-math.log2(torch.finfo(dt).eps)) for dt in (torch.float16, torch.bfloat16)
}
# The first non-finite magnitude (exponent all ones): inf, then NaNs.
_EXP_ALL_ONES = {torch.float16: 0x7C00, torch.bfloat16: 0x7F80}
_BLOCK = 4096


def _check(x: torch.Tensor, drop: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in MANTISSA_BITS:
        what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"expected a float16 or bfloat16 tensor, got {what}")
    bits = MANTISSA_BITS[x.dtype]
    if not 0 <= drop < bits:
        raise ValueError(f"drop={drop} for {x.dtype}: give 0..{bits - 1} mantissa bits to clear")


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


@triton.jit
def _round_mantissa_kernel(x_ptr, n, DROP: tl.constexpr, INF: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    bits = tl.load(x_ptr + offs, mask=ok, other=0).to(tl.int32)
    sign = bits & 0x8000
    mag = bits & 0x7FFF
    low: tl.constexpr = (1 << DROP) - 1
    rounded = tl.minimum((mag + (1 << (DROP - 1))) & ~low, (INF - 1) & ~low)
    mag = tl.where(mag >= INF, mag, rounded)
    tl.store(x_ptr + offs, (sign | mag).to(tl.int16), mask=ok)


def round_mantissa_(x: torch.Tensor, drop: int) -> torch.Tensor:
    """Round ``x`` (contiguous fp16 / bf16) in place to nearest with its lowest ``drop``
    mantissa bits cleared; returns ``x``. ``drop`` 0 leaves it as it is."""
    _check(x, drop)
    if not x.is_contiguous():
        raise ValueError(f"x has strides {x.stride()}; round a contiguous tensor (its base)")
    if drop == 0 or x.numel() == 0:
        return x
    if x.device.type != "cuda" and not is_interpreted(_round_mantissa_kernel):
        return x.copy_(round_mantissa_reference(x, drop))
    as_int = x.view(torch.int16)
    check_launch_device(_round_mantissa_kernel, {"x": as_int})
    n = as_int.numel()
    grid = (triton.cdiv(n, _BLOCK),)
    _round_mantissa_kernel[grid](
        as_int, n, DROP=drop, INF=_EXP_ALL_ONES[x.dtype], BLOCK=_BLOCK, num_warps=8
    )
    return x
