"""bias + exact GELU epilogue and the Triton GEMM vs torch, launcher checks, planning."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernels._tolerance import PROJECT_RULE, TOLERANCE_BY_PRECISION, compare
from kernels.ffn import (
    bias_gelu,
    bias_gelu_not_supported_reasons,
    bias_gelu_reference,
    estimate_linear_shared_memory_bytes,
    linear,
    linear_gelu,
    linear_gelu_not_supported_reasons,
    linear_gelu_reference,
)

H200_SMEM = 232448


def linear_params(in_features: int, out_features: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    bound = in_features**-0.5
    weight = (torch.rand(out_features, in_features, generator=gen) * 2 - 1) * bound
    bias = (torch.rand(out_features, generator=gen) * 2 - 1) * bound
    return weight, bias


def randn(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_matches(result: torch.Tensor, reference: torch.Tensor, precision: str) -> None:
    comparison = compare(result, reference, TOLERANCE_BY_PRECISION[precision])
    assert comparison.passed, comparison.detail


# --------------------------------------------------------------------------------------
# bias_gelu
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2, 37, 40), (37, 1024), (5, 3)])
@pytest.mark.parametrize("block", [32, 1024])
def test_bias_gelu_matches_torch_for_odd_widths(
    device: str, shape: tuple[int, ...], block: int
) -> None:
    y, bias = randn(*shape), randn(shape[-1], seed=2)
    result = bias_gelu(y.to(device), bias.to(device), block=block, num_warps=1)
    assert_matches(result, bias_gelu_reference(y, bias), "ieee")


def test_bias_gelu_is_the_erf_form_not_the_tanh_approximation(device: str) -> None:
    y = torch.tensor([[-3.0, -2.5, -1.0, 0.5, 2.0]])
    bias = torch.zeros(5)
    result = bias_gelu(y.to(device), bias.to(device), block=32, num_warps=1).cpu()
    exact = torch.nn.functional.gelu(y, approximate="none")
    tanh = torch.nn.functional.gelu(y, approximate="tanh")
    torch.testing.assert_close(result, exact, rtol=1e-5, atol=1e-6)
    assert (result - tanh).abs().max() > 1e-4


def test_bias_gelu_writes_into_out_or_in_place(device: str) -> None:
    y, bias = randn(3, 40).to(device), randn(40, seed=2).to(device)
    expected = bias_gelu_reference(y.cpu(), bias.cpu())
    out = torch.empty_like(y)
    assert bias_gelu(y, bias, out=out, block=64) is out
    assert_matches(out, expected, "ieee")
    assert bias_gelu(y, bias, inplace=True, block=64) is y
    assert_matches(y, expected, "ieee")


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_bias_gelu_on_a_half_gemm_output_rounds_once_like_a_cast(device: str, half) -> None:
    """A half y (a half GEMM's output) read as it is, GELU in fp32, rounded once on store:
    the fp32 kernel on y.float() followed by a cast, in place or into fp32; bit for bit in
    fp16 (Triton's interpreter truncates to bf16 where CUDA rounds to nearest: within one
    bf16 step there)."""
    y, bias = randn(5, 72).to(half), randn(72, seed=2)
    cast = bias_gelu(y.float().to(device), bias.to(device), block=64).to(half)
    into_fp32 = bias_gelu(y.to(device), bias.to(device), out=torch.empty(5, 72).to(device))
    in_place = y.clone().to(device)
    assert bias_gelu(in_place, bias.to(device), inplace=True, block=64) is in_place
    assert in_place.dtype == half
    if half == torch.float16:
        assert torch.equal(in_place.cpu(), cast.cpu())
    else:
        exact = cast.float().cpu()
        assert bool(((in_place.float().cpu() - exact).abs() <= exact.abs() * 2.0**-7).all())
    want = bias_gelu(y.float().to(device), bias.to(device), block=64)
    assert torch.equal(into_fp32.cpu(), want.cpu())


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_a_half_bias_is_upcast_exactly_like_a_cast_kernel(device: str, half) -> None:
    """A half GEMM's bias read as it is: the same output, bit for bit, as its fp32 copy
    (the cast kernel it replaces); an integer bias is refused."""
    y, bias = randn(5, 72).to(torch.float16), randn(72, seed=2).to(half)
    direct = bias_gelu(y.clone().to(device), bias.to(device), inplace=True, block=64)
    copied = bias_gelu(y.clone().to(device), bias.float().to(device), inplace=True, block=64)
    assert torch.equal(direct.cpu(), copied.cpu())
    with pytest.raises(ValueError, match="float32, float16 or bfloat16 vector of 72"):
        bias_gelu(y, torch.zeros(72, dtype=torch.int32))


def test_bias_gelu_rejects_non_contiguous_y_and_wrong_bias() -> None:
    with pytest.raises(ValueError, match="expected a contiguous float32, float16 or bfloat16"):
        bias_gelu(torch.randn(40, 3).t(), torch.zeros(40))
    with pytest.raises(ValueError, match=r"bias has shape \(39,\).*vector of 40"):
        bias_gelu(torch.randn(3, 40), torch.zeros(39))
    with pytest.raises(ValueError, match="block=1000 must be a power of two"):
        bias_gelu(torch.randn(3, 40), torch.zeros(40), block=1000)


def test_bias_gelu_planning_reasons() -> None:
    assert (
        bias_gelu_not_supported_reasons(num_cols=40, block=1024, num_warps=4, device_type="cuda")
        == []
    )
    found = bias_gelu_not_supported_reasons(num_cols=40, block=64, num_warps=4, device_type="cuda")
    assert any("block=64 < 128 threads" in r for r in found)


# --------------------------------------------------------------------------------------
# linear_gelu / linear
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["ieee", "tf32", "tf32x3", "fp16", "bf16"])
def test_linear_gelu_every_precision_within_its_tolerance(device: str, precision: str) -> None:
    x = randn(37, 40)
    weight, bias = linear_params(40, 72)
    result = linear_gelu(
        x.to(device),
        weight.to(device),
        bias.to(device),
        precision=precision,
        block_m=16,
        block_n=32,
        block_k=16,
        group_m=2,
    )
    assert_matches(result, linear_gelu_reference(x, weight, bias), precision)


@pytest.mark.parametrize(
    ("block_m", "block_n", "block_k", "group_m"),
    [(16, 16, 16, 1), (32, 64, 32, 4), (64, 16, 64, 8)],
)
def test_linear_gelu_tiles_cover_tails_in_every_dim(
    device: str, block_m: int, block_n: int, block_k: int, group_m: int
) -> None:
    x = randn(2, 37, 40)  # M = 74 rows, K = 40 (not a multiple of block_k)
    weight, bias = linear_params(40, 72)
    result = linear_gelu(
        x.to(device),
        weight.to(device),
        bias.to(device),
        precision="ieee",
        block_m=block_m,
        block_n=block_n,
        block_k=block_k,
        group_m=group_m,
    )
    assert result.shape == (2, 37, 72)
    assert_matches(result, linear_gelu_reference(x, weight, bias), "ieee")


def test_linear_without_bias_reads_transposed_weight_storage(device: str) -> None:
    x = randn(37, 48)
    weight = randn(48, 40, seed=5).t()  # [40, 48] with strides (1, 40)
    result = linear(
        x.to(device), weight.to(device), None, precision="ieee", block_m=16, block_n=16, block_k=16
    )
    assert_matches(result, linear_gelu_reference(x, weight, None, gelu=False), "ieee")


def test_linear_gelu_writes_into_out(device: str) -> None:
    x = randn(37, 40)
    weight, bias = linear_params(40, 24)
    out = torch.empty(37, 24, device=device)
    result = linear_gelu(
        x.to(device),
        weight.to(device),
        bias.to(device),
        out=out,
        precision="ieee",
        block_m=16,
        block_n=16,
        block_k=16,
    )
    assert result is out
    assert_matches(out, linear_gelu_reference(x, weight, bias), "ieee")


def test_linear_gelu_rejects_weight_with_wrong_in_features() -> None:
    with pytest.raises(ValueError, match=r"weight has shape \(24, 39\).*\[out_features, 40\]"):
        linear_gelu(torch.randn(5, 40), torch.randn(24, 39), torch.zeros(24))


def test_linear_gelu_rejects_small_or_odd_blocks_and_unknown_precision() -> None:
    x, weight, bias = torch.randn(5, 40), torch.randn(24, 40), torch.zeros(24)
    with pytest.raises(ValueError, match="block_k=8 must be a power of two >= 16"):
        linear_gelu(x, weight, bias, block_k=8)
    with pytest.raises(ValueError, match="precision='fp64' is not supported"):
        linear_gelu(x, weight, bias, precision="fp64")


def test_linear_gelu_rejects_out_of_wrong_shape() -> None:
    with pytest.raises(ValueError, match=r"out has shape \(5, 23\)"):
        linear_gelu(
            torch.randn(5, 40), torch.randn(24, 40), torch.zeros(24), out=torch.empty(5, 23)
        )


def test_linear_gelu_planning_reasons() -> None:
    config: dict = {
        "num_rows": 8192,
        "in_features": 128,
        "out_features": 128,
        "block_m": 128,
        "block_n": 128,
        "block_k": 32,
        "group_m": 8,
        "num_warps": 4,
        "num_stages": 3,
        "precision": "tf32",
        "device_type": "cuda",
        "capability": (9, 0),
        "smem_bytes": H200_SMEM,
    }
    assert linear_gelu_not_supported_reasons(**config) == []
    found = linear_gelu_not_supported_reasons(**{**config, "out_features": 40, "block_k": 12})
    assert "BLOCK_N=128 > padded size 64" in found
    assert any("block_k=12" in r for r in found)
    need = estimate_linear_shared_memory_bytes(
        block_m=256, block_n=256, block_k=64, num_stages=4, precision="tf32"
    )
    assert need == 4 * (256 * 64 * 2) * 4
    big = {
        **config,
        "num_rows": 8192,
        "in_features": 1024,
        "out_features": 1024,
        "block_m": 256,
        "block_n": 256,
        "block_k": 64,
        "num_stages": 4,
    }
    assert f"needs ~{need} B shared memory, device has {H200_SMEM}" in (
        linear_gelu_not_supported_reasons(**big)
    )


@pytest.mark.parametrize(
    ("tile", "num_stages", "precision", "compiled_shared"),
    [
        ((64, 64, 32), 3, "tf32", 49152),
        ((128, 128, 64), 4, "tf32", 262144),
        ((64, 64, 32), 3, "fp16", 36864),
        ((128, 64, 64), 2, "bf16", 57344),
        ((64, 64, 32), 1, "fp16", 16384),
    ],
)
def test_gemm_shared_memory_estimate_matches_triton_sm90_compiles(
    tile: tuple[int, int, int], num_stages: int, precision: str, compiled_shared: int
) -> None:
    # compiled_shared: metadata.shared of this kernel compiled by Triton 3.9 for sm_90.
    block_m, block_n, block_k = tile
    estimate = estimate_linear_shared_memory_bytes(
        block_m=block_m,
        block_n=block_n,
        block_k=block_k,
        num_stages=num_stages,
        precision=precision,
    )
    assert estimate == compiled_shared


# --------------------------------------------------------------------------------------
# ffn_act=blas_tanh: the GEMM's own bias + GELU epilogue (not a Triton kernel; here so that
# KERNELS_TEST_DEVICE=cuda runs it where cuBLASLt's epilogue computes it)
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32", "ieee"])
@pytest.mark.parametrize("half", [False, True])
def test_blas_tanh_is_the_tanh_gelu_of_the_product_rounded_once(
    device: str, precision: str, half: bool
) -> None:
    """What the epilogue computes: the product of the operands at the plan's precision
    summed in fp32, the bias added and the tanh GELU applied before one rounding (a half
    plan's operand out, or its fp32 upcast); fp32/ieee in fp32 throughout."""
    from autotune.backends import get
    from autotune.backends.precision import DTYPES

    dtype = DTYPES.get(precision)
    if half and dtype is None:
        pytest.skip("half hand-off needs a half precision")
    weight, bias = linear_params(96, 160, seed=5)
    h = randn(3, 37, 96, seed=6)
    if dtype is not None:
        weight, bias, h = weight.to(dtype), bias.to(dtype), h.to(dtype)
    out = get("ffn_act", "blas_tanh").inner(
        h.to(device), weight.to(device), bias.to(device), precision, half=half
    )
    assert out.shape == (3, 37, 160)
    assert out.dtype == (dtype if half else torch.float32)
    wide = torch.nn.functional.linear(h.double(), weight.double(), bias.double())
    expected = torch.nn.functional.gelu(wide, approximate="tanh")
    exact = torch.nn.functional.gelu(wide)
    got = out.cpu().double()
    # one rounding to the half type (a relative 2^-8 step for fp16, 2^-7 for bf16) on top
    # of fp32 sums of 96 products; TF32 operands (fp32) carry 2^-11 each; cuBLASLt's
    # epilogue may take its tanh from the hardware's approximate tanh (2^-11 relative)
    tol = {"fp16": 1e-3, "bf16": 8e-3, "fp32": 2e-3, "ieee": 1e-5 if device == "cpu" else 1e-3}
    torch.testing.assert_close(got, expected, rtol=tol[precision], atol=tol[precision])
    if precision != "bf16":  # the tanh form, not the exact GELU: closer to it on average
        assert (got - expected).abs().mean() < (got - exact).abs().mean()


def test_blas_tanh_hands_half_operands_along_and_passes_the_rule(device: str) -> None:
    """A half plan with the Triton LayerNorm: the GEMM's half operand goes in and its half
    output goes to the next GEMM as it is (no cast kernels), and the forward stays within
    the project's rule of the reference."""
    from autotune.backends import get
    from autotune.build import build_candidate
    from autotune.core.device import detect_device
    from autotune.core.reference import ReferenceTransformer, TransformerConfig, check_outputs
    from autotune.plan import Plan

    assert get("ffn_act", "blas_tanh").half_io and get("layernorm", "triton").half_io
    config = TransformerConfig(2, 12, 32, 2, 48, 2, True)
    torch.manual_seed(7)
    reference = ReferenceTransformer(config).eval()
    plan = Plan(
        attention="sdpa_math",
        attn_precision="fp16",
        gemm_precision="fp16",
        qkv="packed",
        layernorm="triton",
        ffn_act="blas_tanh",
    )
    x = torch.randn(2, 12, 32)
    mask = torch.arange(12)[None, :] < torch.tensor([[12], [7]])
    with torch.inference_mode():
        expected = reference(x, mask)
        model = build_candidate(plan, config, detect_device(device), reference.state_dict())
        got = model.to(device)(x.to(device), mask.to(device)).cpu()
        assert check_outputs(got, expected).passed


def test_project_rule_is_an_or_of_absolute_and_relative_error() -> None:
    ref = torch.tensor([100.0, 0.001])
    assert compare(torch.tensor([101.9, 0.0029]), ref, PROJECT_RULE).passed
    assert not compare(torch.tensor([102.1, 0.001]), ref, PROJECT_RULE).passed
    assert not compare(torch.tensor([float("nan"), 0.001]), ref, PROJECT_RULE).passed
