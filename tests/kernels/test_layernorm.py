"""Fused residual add + LayerNorm kernel vs torch, launcher checks, planning reasons."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernels._tolerance import PROJECT_RULE, compare
from kernels.layernorm import (
    add_layernorm,
    add_layernorm_reference,
    not_supported_reasons,
)


def make_inputs(
    batch: int, seq_len: int, d_model: int, *, with_delta: bool = True, seed: int = 0
) -> dict[str, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, seq_len + 1, (batch,), generator=gen)
    lengths[0] = max(1, seq_len // 2)
    return {
        "x": torch.randn(batch, seq_len, d_model, generator=gen),
        "delta": torch.randn(batch, seq_len, d_model, generator=gen) if with_delta else None,
        "weight": 1 + 0.1 * torch.randn(d_model, generator=gen),
        "bias": 0.1 * torch.randn(d_model, generator=gen),
        "row_mask": torch.arange(seq_len)[None, :] < lengths[:, None],
    }


def on(device: str, t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.to(device)


def assert_matches(result: torch.Tensor, reference: torch.Tensor) -> None:
    comparison = compare(result, reference, PROJECT_RULE)
    assert comparison.passed, comparison.detail


def run_case(
    device: str,
    inputs: dict,
    *,
    zero_sum_rows: bool = False,
    zero_out_rows: bool = False,
    block_rows: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    row_mask = inputs["row_mask"] if (zero_sum_rows or zero_out_rows) else None
    flags = {"zero_sum_rows": zero_sum_rows, "zero_out_rows": zero_out_rows}
    ref_s, ref_y = add_layernorm_reference(
        inputs["x"],
        inputs["delta"],
        inputs["weight"],
        inputs["bias"],
        row_mask=row_mask,
        **flags,
    )
    s, y = add_layernorm(
        on(device, inputs["x"]),
        on(device, inputs["delta"]),
        on(device, inputs["weight"]),
        on(device, inputs["bias"]),
        row_mask=on(device, row_mask),
        block_rows=block_rows,
        **flags,
    )
    assert_matches(s, ref_s)
    assert_matches(y, ref_y)
    return s, y


@pytest.mark.parametrize("d_model", [40, 128, 1024])
@pytest.mark.parametrize("block_rows", [1, 4])
@pytest.mark.parametrize("with_delta", [True, False], ids=["add", "noadd"])
def test_matches_torch_layer_norm_for_any_width(
    device: str, d_model: int, block_rows: int, with_delta: bool
) -> None:
    run_case(device, make_inputs(2, 7, d_model, with_delta=with_delta), block_rows=block_rows)


def test_zero_sum_rows_zeroes_padded_residual_rows_so_their_norm_is_the_bias(
    device: str,
) -> None:
    inputs = make_inputs(2, 37, 40)
    s, y = run_case(device, inputs, zero_sum_rows=True, block_rows=2)
    padded = ~inputs["row_mask"]
    assert padded.any()
    assert (s.cpu()[padded] == 0).all()
    torch.testing.assert_close(y.cpu()[padded], inputs["bias"].expand(int(padded.sum()), 40))


def test_zero_out_rows_zeroes_padded_output_rows_only(device: str) -> None:
    inputs = make_inputs(2, 37, 40, with_delta=False)
    s, y = run_case(device, inputs, zero_out_rows=True)
    padded = ~inputs["row_mask"]
    assert (y.cpu()[padded] == 0).all()
    assert (y.cpu()[~padded] != 0).any()
    assert (s.cpu() == inputs["x"]).all(), "the residual must not be zeroed by zero_out_rows"


def test_both_zeroing_flags_together(device: str) -> None:
    run_case(device, make_inputs(3, 5, 40), zero_sum_rows=True, zero_out_rows=True)


def test_inplace_writes_the_sum_into_x(device: str) -> None:
    inputs = make_inputs(2, 5, 40)
    x = inputs["x"].to(device)
    expected = inputs["x"] + inputs["delta"]
    s, _ = add_layernorm(
        x,
        on(device, inputs["delta"]),
        on(device, inputs["weight"]),
        on(device, inputs["bias"]),
        inplace=True,
    )
    assert s.data_ptr() == x.data_ptr()
    assert_matches(x, expected)


def test_the_last_layernorm_writes_into_out_and_stores_no_sum(device: str) -> None:
    """``keep_sum=False, out=buf`` (a stack's last LayerNorm, the forward's output buffer):
    the normed rows land in ``buf``, bit for bit those of a plain call, padded rows zeroed,
    and no sum is stored (x comes back unchanged); a buffer of another shape, dtype or
    layout is refused with what it should be."""
    inputs = make_inputs(3, 7, 40)
    x = inputs["x"].to(device)
    args = (
        x,
        on(device, inputs["delta"]),
        on(device, inputs["weight"]),
        on(device, inputs["bias"]),
    )
    flags = dict(row_mask=on(device, inputs["row_mask"]), zero_sum_rows=True, zero_out_rows=True)
    _, plain = add_layernorm(*args, **flags)
    before = x.clone()
    buf = torch.full_like(x, float("nan"))
    s, y = add_layernorm(*args, **flags, keep_sum=False, out=buf)
    assert y.data_ptr() == buf.data_ptr() and torch.equal(buf, plain)
    assert s is x and torch.equal(x, before)
    for bad in (buf[:, :6], buf.half(), buf.transpose(0, 1).contiguous().transpose(0, 1)):
        with pytest.raises(ValueError, match="out has shape"):
            add_layernorm(*args, **flags, out=bad)


def test_without_delta_or_zeroing_the_sum_is_x_itself(device: str) -> None:
    inputs = make_inputs(1, 5, 40, with_delta=False)
    x = inputs["x"].to(device)
    s, y = add_layernorm(x, None, on(device, inputs["weight"]), on(device, inputs["bias"]))
    assert s is x
    assert_matches(
        y, add_layernorm_reference(inputs["x"], None, inputs["weight"], inputs["bias"])[1]
    )


def test_accepts_two_dim_rows_with_a_row_stride(device: str) -> None:
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(37, 48, generator=gen)
    x = wide[:, :40]  # rows of 40 with row stride 48
    weight, bias = torch.ones(40), torch.zeros(40)
    s, y = add_layernorm(on(device, x), on(device, x), on(device, weight), on(device, bias))
    assert_matches(s, 2 * x)
    assert_matches(y, torch.nn.functional.layer_norm(2 * x, (40,), weight, bias, 1e-5))


# --------------------------------------------------------------------------------------
# Launcher errors
# --------------------------------------------------------------------------------------
def test_zeroing_without_row_mask_is_rejected() -> None:
    inputs = make_inputs(1, 4, 40)
    with pytest.raises(ValueError, match="need row_mask"):
        add_layernorm(inputs["x"], None, inputs["weight"], inputs["bias"], zero_out_rows=True)


def test_row_mask_without_zeroing_flag_is_rejected_not_ignored() -> None:
    inputs = make_inputs(1, 4, 40)
    with pytest.raises(ValueError, match="it would be ignored"):
        add_layernorm(
            inputs["x"], None, inputs["weight"], inputs["bias"], row_mask=inputs["row_mask"]
        )


def test_rejects_row_mask_of_wrong_dtype_or_size(device: str) -> None:
    # On the device's tensors: the checks after the device check must see a valid device.
    inputs = {k: v.to(device) for k, v in make_inputs(1, 4, 40).items() if v is not None}
    with pytest.raises(ValueError, match=r"row_mask has dtype torch\.int64"):
        add_layernorm(
            inputs["x"],
            None,
            inputs["weight"],
            inputs["bias"],
            row_mask=torch.ones(4, dtype=torch.int64, device=device),
            zero_out_rows=True,
        )
    with pytest.raises(ValueError, match="expected 4 rows"):
        add_layernorm(
            inputs["x"],
            None,
            inputs["weight"],
            inputs["bias"],
            row_mask=torch.ones(5, dtype=torch.bool, device=device),
            zero_out_rows=True,
        )


def test_rejects_weight_of_wrong_size_naming_d_model() -> None:
    inputs = make_inputs(1, 4, 40)
    with pytest.raises(ValueError, match=r"weight has shape \(41,\).*vector of 40"):
        add_layernorm(inputs["x"], None, torch.ones(41), inputs["bias"])


def test_rejects_delta_of_different_shape() -> None:
    inputs = make_inputs(1, 4, 40)
    with pytest.raises(ValueError, match=r"delta has shape \(4, 40\) but x has \(1, 4, 40\)"):
        add_layernorm(inputs["x"], inputs["x"][0], inputs["weight"], inputs["bias"])


def test_rejects_x_that_cannot_be_viewed_as_rows() -> None:
    x = torch.randn(4, 3, 40).transpose(0, 1)
    with pytest.raises(ValueError, match=r"cannot be viewed as \[N, D\] rows"):
        add_layernorm(x, None, torch.ones(40), torch.zeros(40))


def test_rejects_non_power_of_two_block_rows() -> None:
    inputs = make_inputs(1, 4, 40)
    with pytest.raises(ValueError, match="block_rows=3 must be a power of two"):
        add_layernorm(inputs["x"], None, inputs["weight"], inputs["bias"], block_rows=3)


# --------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------
def test_supported_config_has_no_reasons() -> None:
    assert (
        not_supported_reasons(
            d_model=1024, block_rows=2, num_warps=4, device_type="cuda", num_rows=4096
        )
        == []
    )


def test_rejects_tiles_that_would_spill_registers() -> None:
    found = not_supported_reasons(d_model=1024, block_rows=64, num_warps=4, device_type="cuda")
    assert any("512 fp32 values per thread" in r for r in found)


def test_rejects_more_rows_than_the_input_has() -> None:
    found = not_supported_reasons(
        d_model=40, block_rows=16, num_warps=1, device_type="cuda", num_rows=5
    )
    assert "block_rows=16 > padded row count 8" in found


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_delta_and_half_output_round_once_like_casts(device: str, half) -> None:
    """A half delta (a half GEMM's output) is upcast on load and out_dtype stores the
    normed rows as the next GEMM's half operand: the fp32 kernel on delta.float()
    followed by a cast of y, bit for bit in fp16 (Triton's interpreter truncates to bf16
    where CUDA and torch round to nearest: within one bf16 step there); the sum stays
    fp32."""
    inputs = make_inputs(2, 9, 40)
    x, weight, bias, mask = (on(device, inputs[k]) for k in ("x", "weight", "bias", "row_mask"))
    delta = on(device, inputs["delta"].to(half))
    s, y = add_layernorm(x, delta, weight, bias, row_mask=mask, zero_sum_rows=True,
                         out_dtype=half)  # fmt: skip
    s32, y32 = add_layernorm(x, delta.float(), weight, bias, row_mask=mask, zero_sum_rows=True)
    assert s.dtype == torch.float32 and y.dtype == half
    assert torch.equal(s.cpu(), s32.cpu())
    if half == torch.float16:
        assert torch.equal(y.cpu(), y32.to(half).cpu())
    else:
        step = y32.abs().cpu() * 2.0**-7
        assert bool(((y.float().cpu() - y32.cpu()).abs() <= step).all())
    ref_s, ref_y = add_layernorm_reference(
        inputs["x"], inputs["delta"].to(half), inputs["weight"], inputs["bias"],
        row_mask=inputs["row_mask"], zero_sum_rows=True, out_dtype=half,
    )  # fmt: skip
    assert_matches(s, ref_s)
    assert ref_y.dtype == half
    with pytest.raises(ValueError, match=r"out_dtype=torch\.int8; pass torch\.float32"):
        add_layernorm(x, delta, weight, bias, out_dtype=torch.int8)
    with pytest.raises(ValueError, match=r"x has dtype torch\.float16; pass float32"):
        add_layernorm(x.half(), None, weight, bias)
