"""Fused attention kernel vs the fp32 reference, launcher checks, planning reasons."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from kernels._tolerance import TOLERANCE_BY_PRECISION, compare
from kernels._triton import check_launch_device, device_reasons
from kernels.attention import (
    attention,
    attention_reference,
    estimate_one_tile_shared_memory_bytes,
    estimate_shared_memory_bytes,
    key_mask_bounds,
    key_mask_bounds_reference,
    not_supported_reasons,
)

H200_SMEM = 232448


def packed_qkv(
    batch: int, seq_len: int, heads: int, head_dim: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as strided [B, S, H, hd] views of one packed [B, S, 3D] tensor (CPU)."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, seq_len, 3 * heads * head_dim, generator=gen)
    q, k, v = qkv.view(batch, seq_len, 3, heads, head_dim).unbind(2)
    return q, k, v


def to_device(device: str, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if t is None else t.to(device) for t in tensors]


def assert_matches(result: torch.Tensor, reference: torch.Tensor, precision: str) -> None:
    comparison = compare(result, reference, TOLERANCE_BY_PRECISION[precision])
    assert comparison.passed, comparison.detail


def run_and_compare(
    device: str,
    *,
    batch: int = 2,
    seq_len: int = 37,
    heads: int = 2,
    head_dim: int = 32,
    causal: bool,
    key_lengths: list[int] | None = None,
    precision: str = "ieee",
    **tiles: int,
) -> None:
    q, k, v = packed_qkv(batch, seq_len, heads, head_dim)
    lengths = None if key_lengths is None else torch.tensor(key_lengths, dtype=torch.int32)
    reference = attention_reference(q, k, v, causal=causal, key_lengths=lengths)
    q_d, k_d, v_d, lengths_d = to_device(device, q, k, v, lengths)
    result = attention(
        q_d, k_d, v_d, causal=causal, key_lengths=lengths_d, precision=precision, **tiles
    )
    assert_matches(result, reference, precision)


# --------------------------------------------------------------------------------------
# Numerics
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim", [8, 24, 32, 64])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
def test_matches_reference_at_odd_seq_len_for_each_head_dim(
    device: str, head_dim: int, causal: bool, padded: bool
) -> None:
    run_and_compare(
        device,
        head_dim=head_dim,
        causal=causal,
        key_lengths=[11, 37] if padded else None,
        block_m=16,
        block_n=16,
    )


@pytest.mark.parametrize("precision", ["ieee", "tf32", "tf32x3", "fp16", "bf16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_every_precision_stays_within_its_tolerance(
    device: str, precision: str, causal: bool
) -> None:
    run_and_compare(
        device,
        head_dim=24,
        causal=causal,
        key_lengths=[37, 20],
        precision=precision,
        block_m=16,
        block_n=32,
    )


@pytest.mark.parametrize(("block_m", "block_n"), [(16, 16), (16, 64), (64, 16), (32, 32), (64, 64)])
def test_tile_shapes_cover_diagonal_and_tail_blocks(
    device: str, block_m: int, block_n: int
) -> None:
    # S=70: several query and key blocks, a partial tail, full and masked loop iterations.
    run_and_compare(
        device,
        batch=1,
        seq_len=70,
        heads=1,
        head_dim=16,
        causal=True,
        key_lengths=[53],
        block_m=block_m,
        block_n=block_n,
    )


def test_default_tiles_and_tf32_match_reference(device: str) -> None:
    run_and_compare(device, head_dim=32, causal=True)


def test_seq_len_one(device: str) -> None:
    run_and_compare(device, batch=2, seq_len=1, heads=3, head_dim=8, causal=True)


def test_writes_into_out_view_of_model_dim_buffer_without_touching_padding(device: str) -> None:
    batch, seq_len, heads, head_dim = 2, 37, 3, 8
    q, k, v = packed_qkv(batch, seq_len, heads, head_dim)
    reference = attention_reference(q, k, v, causal=True)
    # out is a [B, S, H, hd] view of the first D columns of a wider [B, S, D + 5] buffer.
    buffer = torch.full((batch, seq_len, heads * head_dim + 5), float("nan"), device=device)
    out = buffer[..., : heads * head_dim].unflatten(-1, (heads, head_dim))
    q_d, k_d, v_d = to_device(device, q, k, v)
    result = attention(q_d, k_d, v_d, causal=True, out=out, block_m=16, block_n=16)
    assert result.data_ptr() == out.data_ptr()
    assert_matches(buffer[..., : heads * head_dim].view_as(reference), reference, "ieee")
    assert torch.isnan(buffer[..., heads * head_dim :]).all(), "wrote outside the out view"


@pytest.mark.parametrize("dtype", [torch.float16])
def test_half_output_is_the_fp32_output_rounded_once(device: str, dtype: torch.dtype) -> None:
    # The layer's output projection rounds the context to its half operand type anyway:
    # a half out must give exactly those bits.
    q, k, v = to_device(device, *packed_qkv(2, 37, 2, 16, seed=5))
    tiles = {"block_m": 16, "block_n": 16, "precision": "fp16", "causal": True}
    full = attention(q, k, v, **tiles)
    half = attention(q, k, v, out=torch.empty(q.shape, dtype=dtype, device=device), **tiles)
    assert half.dtype == dtype
    assert torch.equal(half, full.to(dtype))


def test_new_output_is_contiguous_and_viewable_as_batch_seq_model_dim(device: str) -> None:
    q, k, v = to_device(device, *packed_qkv(1, 37, 2, 8))
    result = attention(q, k, v, causal=False, block_m=16, block_n=16)
    assert result.is_contiguous()
    assert result.view(1, 37, 16).shape == (1, 37, 16)


def test_padded_keys_are_never_read(device: str) -> None:
    q, k, v = packed_qkv(2, 37, 2, 8)
    lengths = torch.tensor([9, 37], dtype=torch.int64)
    reference = attention_reference(q, k, v, causal=False, key_lengths=lengths)
    k_poisoned, v_poisoned = k.clone(), v.clone()
    k_poisoned[0, 9:] = float("nan")
    v_poisoned[0, 9:] = float("nan")
    q_d, k_d, v_d, lengths_d = to_device(device, q, k_poisoned, v_poisoned, lengths)
    result = attention(q_d, k_d, v_d, causal=False, key_lengths=lengths_d, block_m=16, block_n=16)
    assert_matches(result, reference, "ieee")


def test_row_without_any_valid_key_gives_zeros_not_nan(device: str) -> None:
    q, k, v = to_device(device, *packed_qkv(2, 20, 1, 8))
    lengths = torch.tensor([0, 20], dtype=torch.int32, device=device)
    result = attention(q, k, v, causal=False, key_lengths=lengths, block_m=16, block_n=16)
    assert torch.isfinite(result).all()
    assert (result[0] == 0).all()


def test_explicit_scale_is_applied_after_the_product(device: str) -> None:
    q, k, v = packed_qkv(1, 37, 2, 24)
    reference = attention_reference(q, k, v, causal=True, scale=0.3)
    q_d, k_d, v_d = to_device(device, q, k, v)
    result = attention(
        q_d, k_d, v_d, causal=True, scale=0.3, block_m=16, block_n=16, precision="ieee"
    )
    assert_matches(result, reference, "ieee")


def test_reference_query_rows_subset_matches_dense_reference() -> None:
    q, k, v = packed_qkv(2, 37, 2, 8)
    lengths = torch.tensor([5, 37])
    dense = attention_reference(q, k, v, causal=True, key_lengths=lengths)
    rows = torch.tensor([0, 4, 17, 36])
    subset = attention_reference(q, k, v, causal=True, key_lengths=lengths, query_rows=rows)
    torch.testing.assert_close(subset, dense[:, rows], rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------
# Launcher errors
# --------------------------------------------------------------------------------------
def test_rejects_float64_inputs_naming_the_dtype() -> None:
    q, k, v = (t.double() for t in packed_qkv(1, 16, 1, 16))
    with pytest.raises(ValueError, match=r"q has dtype torch\.float64"):
        attention(q, k, v, causal=True)


def test_rejects_three_dim_inputs_with_a_hint_to_view() -> None:
    x = torch.randn(1, 16, 32)
    with pytest.raises(ValueError, match=r"q has shape \(1, 16, 32\); expected 4 dims"):
        attention(x, x, x, causal=True)


def test_rejects_non_unit_last_dim_stride() -> None:
    q = torch.randn(1, 16, 1, 32)[..., ::2]
    with pytest.raises(ValueError, match="last-dim stride 2"):
        attention(q, q, q, causal=True)


def test_rejects_mismatched_key_shape() -> None:
    q = torch.randn(1, 16, 2, 16)
    k = torch.randn(1, 17, 2, 16)
    with pytest.raises(ValueError, match=r"k has shape \(1, 17, 2, 16\) but q has"):
        attention(q, k, q, causal=True)


def test_rejects_head_dim_outside_supported_range() -> None:
    q = torch.randn(1, 16, 2, 4)
    with pytest.raises(ValueError, match=r"head_dim=4 is outside 8\.\.256"):
        attention(q, q, q, causal=True)


@pytest.mark.parametrize(
    ("tiles", "message"),
    [
        ({"block_m": 48}, "block_m=48 must be a power of two"),
        ({"block_n": 8}, "block_n=8 must be a power of two >= 16"),
        ({"num_warps": 3}, "num_warps=3 must be one of"),
        ({"num_stages": 0}, "num_stages=0 must be >= 1"),
        ({"precision": "fp8"}, "precision='fp8' is not supported"),
    ],
)
def test_rejects_bad_tiles_naming_the_value(tiles: dict, message: str) -> None:
    q = torch.randn(1, 16, 1, 16)
    with pytest.raises(ValueError, match=message):
        attention(q, q, q, causal=True, **tiles)


def test_rejects_key_lengths_of_wrong_dtype_and_shape() -> None:
    q = torch.randn(2, 16, 1, 16)
    with pytest.raises(ValueError, match=r"key_lengths has dtype torch\.float32"):
        attention(q, q, q, causal=True, key_lengths=torch.ones(2))
    with pytest.raises(ValueError, match=r"key_lengths has shape \(3,\); expected \(2,\)"):
        attention(q, q, q, causal=True, key_lengths=torch.ones(3, dtype=torch.int32))


def test_rejects_out_of_wrong_shape() -> None:
    q = torch.randn(1, 16, 2, 16)
    with pytest.raises(ValueError, match=r"out has shape \(1, 16, 32\)"):
        attention(q, q, q, causal=True, out=torch.empty(1, 16, 32))
    for dtype in (torch.float64, torch.bfloat16):
        with pytest.raises(ValueError, match=rf"dtype {dtype}; expected \(1, 16, 2, 16\)"):
            attention(q, q, q, causal=True, out=torch.empty(1, 16, 2, 16, dtype=dtype))


def test_cpu_launch_of_a_compiled_kernel_asks_for_cuda_or_interpreter() -> None:
    def compiled_kernel() -> None:  # stands in for a JITFunction (not interpreted)
        pass

    with pytest.raises(ValueError, match="need a CUDA device, or TRITON_INTERPRET=1"):
        check_launch_device(compiled_kernel, {"q": torch.zeros(1)})


def test_cpu_launch_without_interpreter_raises_a_clear_error() -> None:
    code = (
        "import torch\n"
        "from kernels.attention import attention\n"
        "q = torch.randn(1, 16, 1, 16)\n"
        "try:\n"
        "    attention(q, q, q, causal=True)\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo_root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Triton kernels need a CUDA device, or TRITON_INTERPRET=1 on the CPU" in done.stdout, (
        done.stdout + done.stderr
    )


# --------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------
def reasons(**overrides: object) -> list[str]:
    config: dict = {
        "head_dim": 64,
        "seq_len": 128,
        "block_m": 64,
        "block_n": 64,
        "num_warps": 4,
        "num_stages": 2,
        "precision": "fp16",
        "device_type": "cuda",
        "capability": (9, 0),
        "smem_bytes": H200_SMEM,
    }
    config.update(overrides)
    return not_supported_reasons(**config)


def test_supported_config_has_no_reasons() -> None:
    assert reasons() == []


def test_rejects_block_n_larger_than_padded_seq_len() -> None:
    assert "BLOCK_N=128 > padded seq len 64" in reasons(seq_len=37, block_n=128)


def test_rejects_head_dim_and_block_sizes() -> None:
    found = reasons(head_dim=512, block_m=24, block_n=8)
    assert any("head_dim=512" in r for r in found)
    assert any("block_m=24" in r for r in found)
    assert any("block_n=8" in r for r in found)


def test_rejects_tiles_that_exceed_shared_memory() -> None:
    need = estimate_shared_memory_bytes(
        head_dim=256, block_m=128, block_n=64, num_stages=3, precision="tf32"
    )
    assert need == 3 * 2 * 64 * 256 * 4 + 128 * 256 * 4
    assert f"needs ~{need} B shared memory, device has {H200_SMEM}" in reasons(
        head_dim=256, block_m=128, block_n=64, num_stages=3, precision="tf32"
    )


@pytest.mark.parametrize(
    ("head_dim", "block_m", "block_n", "num_stages", "precision", "compiled_shared"),
    [
        (32, 64, 64, 2, "tf32", 40960),
        (64, 128, 64, 3, "tf32", 131072),
        (256, 64, 32, 1, "tf32", 98304),
        (64, 128, 64, 3, "fp16", 90112),
        (256, 64, 32, 2, "fp16", 114688),
        (256, 128, 32, 1, "fp16", 131072),
        (8, 128, 128, 3, "bf16", 40960),
        (64, 128, 64, 2, "tf32x3", 131072),
    ],
)
def test_shared_memory_estimate_matches_triton_sm90_compiles(
    head_dim: int,
    block_m: int,
    block_n: int,
    num_stages: int,
    precision: str,
    compiled_shared: int,
) -> None:
    # compiled_shared: metadata.shared of this kernel compiled by Triton 3.9 for sm_90.
    estimate = estimate_shared_memory_bytes(
        head_dim=head_dim,
        block_m=block_m,
        block_n=block_n,
        num_stages=num_stages,
        precision=precision,
    )
    assert estimate == compiled_shared


def test_rejects_bf16_and_tf32_before_ampere() -> None:
    assert any(
        "needs CUDA capability >= 8.0" in r for r in reasons(precision="bf16", capability=(7, 5))
    )
    assert any(
        "needs CUDA capability >= 8.0" in r for r in reasons(precision="tf32", capability=(7, 5))
    )
    assert reasons(precision="fp16", capability=(7, 5)) == []


def test_cpu_is_supported_only_for_interpreted_kernels(device: str) -> None:
    if device != "cpu":
        pytest.skip("the kernels are compiled for the GPU in this session")
    assert reasons(device_type="cpu", capability=None, smem_bytes=None) == []

    def compiled_kernel() -> None:  # stands in for a JITFunction (not interpreted)
        pass

    found = device_reasons("cpu", compiled_kernel)
    assert any("set TRITON_INTERPRET=1 before importing kernels" in r for r in found)
    assert device_reasons("cuda", compiled_kernel) == []


def test_half_inputs_are_taken_as_is_when_they_are_the_operand_type(device: str) -> None:
    torch.manual_seed(7)
    q, k, v = (torch.randn(2, 37, 2, 24) for _ in range(3))
    ref = attention_reference(q.half().float(), k.half().float(), v.half().float(), causal=True)
    qh, kh, vh = to_device(device, q.half(), k.half(), v.half())
    out = attention(qh, kh, vh, causal=True, precision="fp16", block_m=16, block_n=16)
    assert out.dtype == torch.float32
    assert_matches(out, ref, "fp16")


def test_half_inputs_with_a_float_precision_are_refused_naming_the_dtype() -> None:
    import pytest
    import torch

    from kernels.attention import attention

    q = torch.randn(1, 16, 1, 16).half()
    with pytest.raises(ValueError, match=r"torch.float16.*precision='tf32'"):
        attention(q, q, q, causal=True, precision="tf32", block_m=16, block_n=16)


def _masks(batch: int, seq_len: int, seed: int) -> torch.Tensor:
    """All valid, a valid prefix then holes, a masked tail, nothing valid, holes at 0."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, seq_len, generator=gen) < 0.7
    mask[0] = True
    mask[1, :20] = True
    mask[2, seq_len - 11 :] = False
    mask[3] = False
    mask[4, 0] = False
    return mask


def test_key_mask_bounds_match_their_reference(device: str) -> None:
    for seq_len in (1, 17, 45, 130):
        mask = _masks(5, seq_len, seed=seq_len)
        got = key_mask_bounds(mask.to(device)).cpu()
        want = key_mask_bounds_reference(mask)
        assert torch.equal(got, want), (seq_len, got.tolist(), want.tolist())
    assert key_mask_bounds_reference(torch.ones(2, 9, dtype=torch.bool)).tolist() == [[9, 9]] * 2


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("block_m", "block_n"), [(16, 16), (32, 16), (16, 32)])
def test_key_bounds_leave_the_result_unchanged(
    device: str, causal: bool, block_m: int, block_n: int
) -> None:
    q, k, v = to_device(device, *packed_qkv(5, 45, 2, 16, seed=3))
    mask = _masks(5, 45, seed=4).to(device)
    kwargs = dict(causal=causal, key_mask=mask, block_m=block_m, block_n=block_n, precision="ieee")
    plain = attention(q, k, v, **kwargs)
    bounded = attention(q, k, v, key_bounds=key_mask_bounds(mask), **kwargs)
    if device == "cpu":
        assert torch.equal(plain, bounded)  # the interpreter: the same operations, bit for bit
    else:
        # compiled, the unmasked prefix loop and the masked loop are different instruction
        # sequences: within rounding (an H100, session 40: at most 1.8e-7 apart in ieee,
        # scripts/key_bounds_diff.py), never bit-equal by contract
        assert float((plain - bounded).abs().max()) <= 1e-6
    ref = attention_reference(q.cpu(), k.cpu(), v.cpu(), causal=causal, key_mask=mask.cpu())
    ok = ref.isfinite()  # query rows with no valid key: 0 here, NaN in the reference
    assert torch.allclose(bounded.cpu()[ok], ref[ok], atol=1e-4, rtol=1e-4)


def test_key_bounds_launcher_errors(device: str) -> None:
    q, k, v = to_device(device, *packed_qkv(2, 16, 2, 16))
    mask = torch.ones(2, 16, dtype=torch.bool, device=device)
    with pytest.raises(ValueError, match="key_bounds without key_mask"):
        attention(q, k, v, causal=True, key_bounds=key_mask_bounds(mask))
    with pytest.raises(ValueError, match=r"pass key_mask_bounds\(key_mask\): int32 \(2, 2\)"):
        attention(q, k, v, causal=True, key_mask=mask, key_bounds=torch.zeros(2, 2, device=device))
    with pytest.raises(ValueError, match="pass a bool"):
        key_mask_bounds(torch.ones(16, device=device, dtype=torch.bool))


# --------------------------------------------------------------------------------------
# The one-tile form (head_chunk > 0: every key in one tile, the head dim in chunks)
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seq_len", "head_dim", "head_chunk", "block_m"),
    [(37, 40, 16, 16), (64, 64, 32, 32), (130, 24, 32, 16), (1, 8, 16, 16), (20, 256, 64, 16)],
)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("mask", ["none", "lengths", "holes"])
def test_one_tile_form_matches_the_reference_and_the_flash_form(
    device: str, seq_len: int, head_dim: int, head_chunk: int, block_m: int, causal: bool, mask: str
) -> None:
    """Ragged last chunks (40 = 16 + 16 + 8), a 256-key tile (S = 130), one key, head dim
    256; no mask, right padding (a sequence with no key at all), holes anywhere (``_masks``:
    a fully masked sequence too)."""
    q, k, v = packed_qkv(5, seq_len, 2, head_dim, seed=seq_len)
    kwargs: dict = {}
    if mask == "lengths":
        lengths = [0, seq_len, max(1, seq_len // 3), 1, seq_len]
        kwargs["key_lengths"] = torch.tensor(lengths, dtype=torch.int32)
    if mask == "holes":
        kwargs["key_mask"] = _masks(5, seq_len, seed=seq_len + 1)
    reference = attention_reference(q, k, v, causal=causal, **kwargs)
    q_d, k_d, v_d = to_device(device, q, k, v)
    dev_kwargs = {name: t.to(device) for name, t in kwargs.items()}
    one_tile = attention(
        q_d, k_d, v_d, causal=causal, block_m=block_m, head_chunk=head_chunk,
        precision="ieee", **dev_kwargs,
    )  # fmt: skip
    flash = attention(q_d, k_d, v_d, causal=causal, block_m=16, block_n=16, precision="ieee",
                      **dev_kwargs)  # fmt: skip
    ok = reference.isfinite()  # query rows with no valid key: 0 here, NaN in the reference
    assert torch.isfinite(one_tile).all()
    assert (one_tile.cpu()[~ok] == 0).all()
    assert_matches(one_tile.cpu()[ok], reference[ok], "ieee")
    assert torch.allclose(one_tile.cpu(), flash.cpu(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
def test_one_tile_form_takes_each_precision_and_half_inputs(device: str, precision: str) -> None:
    q, k, v = packed_qkv(2, 45, 2, 64, seed=7)
    reference = attention_reference(q, k, v, causal=True)
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    q_d, k_d, v_d = (t.to(device=device, dtype=half or torch.float32) for t in (q, k, v))
    out = torch.empty(q.shape, device=device, dtype=torch.float16 if half else torch.float32)
    attention(q_d, k_d, v_d, causal=True, out=out, block_m=32, head_chunk=32, precision=precision)
    assert_matches(out.float().cpu(), reference, precision)


def test_one_tile_form_never_reads_keys_past_the_bounds(device: str) -> None:
    """Keys at or past a sequence's length, or past its last valid key with key bounds,
    are never loaded: NaN there changes nothing."""
    q, k, v = packed_qkv(2, 37, 2, 32, seed=5)
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[0, 20:] = False
    mask[1, 3] = False
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[0, 20:], v_bad[0, 20:] = float("nan"), float("nan")
    reference = attention_reference(q, k, v, causal=False, key_mask=mask)
    q_d, k_d, v_d = to_device(device, q, k_bad, v_bad)
    mask_d = mask.to(device)
    bounds = key_mask_bounds(mask_d)
    out = attention(q_d, k_d, v_d, causal=False, key_mask=mask_d, key_bounds=bounds, block_m=16,
                    head_chunk=16, precision="ieee")  # fmt: skip
    assert_matches(out.cpu(), reference, "ieee")
    lengths = torch.tensor([20, 37], dtype=torch.int32)
    reference = attention_reference(q, k, v, causal=True, key_lengths=lengths)
    out = attention(q_d, k_d, v_d, causal=True, key_lengths=lengths.to(device), block_m=16,
                    head_chunk=32, precision="ieee")  # fmt: skip
    assert_matches(out.cpu(), reference, "ieee")


def test_one_tile_form_refuses_long_sequences_and_bad_chunks(device: str) -> None:
    q, k, v = to_device(device, *packed_qkv(1, 257, 1, 16))
    with pytest.raises(ValueError, match=r"seq_len=257 is over 256; use head_chunk=0"):
        attention(q, k, v, causal=True, head_chunk=16)
    q, k, v = to_device(device, *packed_qkv(1, 16, 1, 16))
    with pytest.raises(ValueError, match=r"head_chunk=24 must be 0 or a power of two >= 16"):
        attention(q, k, v, causal=True, head_chunk=24)
    assert "head_chunk=8 must be 0 or a power of two >= 16" in " ".join(reasons(head_chunk=8))
    assert "seq_len=300 is over 256" in " ".join(reasons(seq_len=300, head_chunk=64))
    assert "head_chunk=128 > padded head dim 64" in reasons(head_chunk=128)
    assert reasons(head_chunk=128, prune_pointless=False) == []
    # block_n is not the one-tile form's: a block_n over the sequence is no reason there
    assert reasons(seq_len=37, block_n=128, head_chunk=32) == []


@pytest.mark.parametrize(
    ("seq_len", "block_m", "head_chunk", "num_stages", "precision", "input_bytes", "compiled"),
    [
        # metadata.shared of _attention_keys_kernel compiled by Triton 3.6 at head dim 256
        # (fp16 = half inputs; tf32 = fp32 inputs): sm_90, 4 warps (case 8's shape, B 64, H 4)
        (128, 64, 64, 1, "fp16", 2, 24576),
        (128, 64, 64, 2, "fp16", 2, 49152),
        (128, 64, 64, 3, "fp16", 2, 73728),
        (128, 128, 64, 2, "fp16", 2, 65536),
        (128, 32, 64, 2, "fp16", 2, 26624),
        (128, 64, 64, 2, "tf32", 4, 65536),
        # sm_90, 8 warps: case 8's prior, and the points a review found over the first model
        (128, 64, 64, 2, "fp16", 2, 57344),
        (128, 64, 128, 2, "fp16", 2, 98304),
        (256, 64, 32, 1, "tf32", 4, 98304),
        (256, 64, 64, 2, "tf32", 4, 212992),
        (256, 32, 32, 1, "fp16", 2, 32768),
        # sm_80, 4 warps (mma.sync)
        (256, 64, 32, 1, "tf32", 4, 98304),
        (256, 32, 64, 1, "fp16", 2, 49152),
        (256, 32, 128, 1, "tf32", 4, 163840),
    ],
)
def test_one_tile_shared_memory_estimate_bounds_triton_compiles(
    seq_len: int,
    block_m: int,
    head_chunk: int,
    num_stages: int,
    precision: str,
    input_bytes: int,
    compiled: int,
) -> None:
    estimate = estimate_one_tile_shared_memory_bytes(
        seq_len=seq_len, block_m=block_m, head_chunk=head_chunk, head_dim=256,
        num_stages=num_stages, precision=precision, input_bytes=input_bytes,
    )  # fmt: skip
    assert compiled <= estimate <= 2.5 * compiled


def test_one_tile_shared_memory_refusal_names_the_need() -> None:
    need = estimate_one_tile_shared_memory_bytes(
        seq_len=256, block_m=128, head_chunk=128, head_dim=256, num_stages=3, precision="fp16"
    )
    assert f"needs ~{need} B shared memory" in " ".join(
        reasons(seq_len=256, block_m=128, head_dim=256, head_chunk=128, num_stages=3)
    )
    assert reasons(seq_len=128, head_dim=256, head_chunk=64, num_stages=3, half_inputs=True) == []
