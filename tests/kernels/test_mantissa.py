"""``attn_drop_bits``'s rounding: the Triton kernel (interpreted on the CPU, compiled with
the ``device`` fixture's CUDA) bit for bit against its int32 reference, and the reference's
own properties: round to nearest, low bits clear, signs, zeros, inf and NaN kept, no
finite value sent to inf."""

from __future__ import annotations

import pytest
import torch

from kernels.mantissa import (
    MANTISSA_BITS,
    round_mantissa_,
    round_mantissa_graded_reference,
    round_mantissa_reference,
)

DTYPES = [torch.float16, torch.bfloat16]


def _values(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    spread = torch.randn(5003, generator=g) * torch.logspace(-9, 4, 5003)  # subnormals too
    big = torch.finfo(dtype).max
    tiny = torch.finfo(dtype).smallest_normal
    specials = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), big, -big, tiny, 1.0]
    return torch.cat([spread, torch.tensor(specials)]).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16).to(torch.int32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_matches_reference_bit_for_bit(device: str, dtype: torch.dtype) -> None:
    x = _values(dtype)
    for drop in range(MANTISSA_BITS[dtype]):
        want = round_mantissa_reference(x, drop)
        got = x.to(device)
        assert round_mantissa_(got, drop) is got  # in place
        assert torch.equal(_bits(got.cpu()), _bits(want)), drop


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_rounds_to_nearest_with_low_bits_clear(dtype: torch.dtype) -> None:
    x = _values(dtype)
    finite = torch.isfinite(x)
    normal = finite & (x.abs() >= torch.finfo(dtype).smallest_normal)
    mantissa = MANTISSA_BITS[dtype]
    for drop in range(1, mantissa):
        y = round_mantissa_reference(x, drop)
        assert torch.equal(_bits(y[finite]) & ((1 << drop) - 1), torch.zeros_like(_bits(y[finite])))
        assert torch.isfinite(y[finite]).all()  # the largest value rounds down, not to inf
        assert torch.equal(_bits(y[~finite]), _bits(x[~finite]))  # inf, NaN unchanged
        assert torch.equal(torch.signbit(y), torch.signbit(x))
        assert torch.equal(y[x == 0], x[x == 0])
        # to nearest: within half a step of the coarser grid, relative to the value
        rel = ((y[normal].float() - x[normal].float()) / x[normal].float()).abs()
        assert rel.max().item() <= 2.0 ** (drop - mantissa - 1) * 1.0001, drop
        assert torch.equal(_bits(round_mantissa_reference(y, drop)), _bits(y))  # idempotent
    assert torch.equal(round_mantissa_reference(x, 0).view(torch.int16), x.view(torch.int16))


def test_bad_input_says_what_to_give() -> None:
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        round_mantissa_(torch.zeros(4), 1)
    with pytest.raises(ValueError, match=r"drop=10 .* 0\.\.9"):
        round_mantissa_(torch.zeros(4, dtype=torch.float16), 10)
    with pytest.raises(ValueError, match=r"drop=7 .* 0\.\.6"):
        round_mantissa_(torch.zeros(4, dtype=torch.bfloat16), 7)
    with pytest.raises(ValueError, match="contiguous"):
        round_mantissa_(torch.zeros(4, 4, dtype=torch.float16).t(), 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_graded_kernel_matches_reference_bit_for_bit(device: str, dtype: torch.dtype) -> None:
    """Rows by sequence position: [B, S, C] with C past one column block (1,100) and odd
    (41), late rows from the middle, from 0 (every row late), past the end (none), and
    early rows kept (drop 0)."""
    g = torch.Generator().manual_seed(11)
    top = MANTISSA_BITS[dtype] - 1
    for shape in [(3, 7, 41), (2, 5, 1100), (9, 33)]:
        x = (torch.randn(shape, generator=g) * torch.logspace(-6, 3, shape[-1])).to(dtype)
        x.view(-1)[:4] = torch.tensor([float("inf"), float("nan"), 0.0, -0.0]).to(dtype)
        seq = shape[-2]
        for drop, late, late_from in [(2, top, 3), (0, 4, 2), (1, 3, 0), (2, 5, seq), (0, top, 1)]:
            want = round_mantissa_graded_reference(x, drop, late, late_from)
            got = x.to(device)
            assert round_mantissa_(got, drop, late, late_from) is got
            assert torch.equal(_bits(got.cpu()), _bits(want)), (shape, drop, late, late_from)


def test_graded_reference_rounds_rows_by_position() -> None:
    x = torch.randn(2, 6, 5, generator=torch.Generator().manual_seed(5)).half()
    y = round_mantissa_graded_reference(x, 1, 6, 4)
    assert torch.equal(_bits(y[:, :4]), _bits(round_mantissa_reference(x[:, :4], 1)))
    assert torch.equal(_bits(y[:, 4:]), _bits(round_mantissa_reference(x[:, 4:], 6)))
    assert torch.equal(_bits(y[:, 4:]) & 0x3F, torch.zeros_like(_bits(y[:, 4:])))
    off = round_mantissa_graded_reference(x, 1, 0, 4)  # late 0: off, as the kernel reads it
    assert torch.equal(_bits(off), _bits(round_mantissa_reference(x, 1)))
    assert torch.equal(_bits(off), _bits(round_mantissa_(x.clone(), 1, 0, 4)))


def test_graded_bad_input_says_what_to_give() -> None:
    with pytest.raises(ValueError, match=r"late=10 .* 0\.\.9"):
        round_mantissa_(torch.zeros(2, 4, dtype=torch.float16), 1, 10, 2)
    with pytest.raises(ValueError, match=r"shape \(4,\).*\[\.\.\., S, C\]"):
        round_mantissa_(torch.zeros(4, dtype=torch.float16), 1, 3, 2)
    with pytest.raises(ValueError, match="late_from=-1"):
        round_mantissa_(torch.zeros(2, 4, dtype=torch.float16), 1, 3, -1)
