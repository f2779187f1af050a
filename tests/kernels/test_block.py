"""The fused two-launch layer vs ReferenceTransformer, planning limits, launcher checks."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from autotune.core.reference import ReferenceTransformer, TransformerConfig
from kernels._tolerance import PROJECT_RULE, compare
from kernels.block import (
    block_reference,
    estimate_shared_memory_bytes,
    fused_forward,
    fused_layer,
    lengths_from_mask,
    not_supported_reasons,
    prepare_block_weights,
    weights_from_model,
)

H200_SMEM = 232448
D_MODEL = 32
FFN_DIM = 48


def build_case(
    *, seq_len: int, num_heads: int, num_layers: int, causal: bool, padded: bool
) -> tuple[ReferenceTransformer, torch.Tensor, torch.Tensor | None]:
    config = TransformerConfig(2, seq_len, D_MODEL, num_heads, FFN_DIM, num_layers, causal)
    torch.manual_seed(1234)
    model = ReferenceTransformer(config).eval()
    x = torch.randn(2, seq_len, D_MODEL, generator=torch.Generator().manual_seed(7))
    mask = None
    if padded:
        lengths = torch.tensor([seq_len - 5, seq_len])
        mask = torch.arange(seq_len)[None, :] < lengths[:, None]
        x = x.masked_fill(~mask[..., None], 0.0)
    return model, x, mask


def assert_passes(result: torch.Tensor, reference: torch.Tensor) -> None:
    comparison = compare(result, reference, PROJECT_RULE)
    assert comparison.passed, comparison.detail


@pytest.mark.parametrize(
    ("seq_len", "num_heads", "num_layers", "causal", "padded", "precision"),
    [
        (16, 2, 2, True, False, "tf32"),
        (16, 4, 1, False, False, "ieee"),
        (13, 4, 2, True, True, "fp16"),
        (13, 2, 1, False, True, "tf32"),
        (13, 2, 2, False, True, "ieee"),
        (16, 2, 1, True, True, "fp16"),
    ],
)
def test_fused_forward_matches_reference_transformer(
    device: str,
    seq_len: int,
    num_heads: int,
    num_layers: int,
    causal: bool,
    padded: bool,
    precision: str,
) -> None:
    model, x, mask = build_case(
        seq_len=seq_len, num_heads=num_heads, num_layers=num_layers, causal=causal, padded=padded
    )
    with torch.no_grad():
        expected = model(x, mask)
    layers, final_norm = weights_from_model(model, device=device)
    key_lengths = None if mask is None else lengths_from_mask(mask).to(device)
    result = fused_forward(
        x.to(device),
        layers,
        final_norm,
        num_heads=num_heads,
        causal=causal,
        key_lengths=key_lengths,
        precision=precision,
        block_m=16,
        num_warps=1 if device == "cpu" else 4,
    )
    assert_passes(result, expected)
    if mask is not None:
        assert bool((result.cpu()[~mask] == 0).all())


def test_fused_layer_matches_block_reference_with_and_without_final_norm(device: str) -> None:
    model, x, mask = build_case(seq_len=13, num_heads=2, num_layers=1, causal=True, padded=True)
    weights = prepare_block_weights(model.layers[0], device=device)
    lengths = lengths_from_mask(mask)
    norm = (model.final_norm.weight.detach(), model.final_norm.bias.detach())
    with torch.no_grad():
        layer_ref = block_reference(
            x, prepare_block_weights(model.layers[0]), num_heads=2, causal=True, key_lengths=lengths
        )
        assert_passes(layer_ref, model.layers[0](x, mask))
        final_ref = block_reference(
            x,
            prepare_block_weights(model.layers[0]),
            num_heads=2,
            causal=True,
            key_lengths=lengths,
            final_norm=norm,
        )
    xd, ld = x.to(device), lengths.to(device)
    out = torch.empty_like(xd)
    result = fused_layer(
        xd, weights, num_heads=2, causal=True, key_lengths=ld, out=out, precision="ieee", block_m=16
    )
    assert result is out
    assert_passes(result, layer_ref)
    normed = fused_layer(
        xd,
        weights,
        num_heads=2,
        causal=True,
        key_lengths=ld,
        final_norm=tuple(t.to(device) for t in norm),
        precision="ieee",
        block_m=16,
    )
    assert_passes(normed, final_ref)


def test_state_dict_with_prefix_gives_the_same_weights() -> None:
    model, _, _ = build_case(seq_len=16, num_heads=2, num_layers=2, causal=False, padded=False)
    from_module = prepare_block_weights(model.layers[1])
    from_state = prepare_block_weights(model.state_dict(), prefix="layers.1.")
    assert torch.equal(from_module.ffn_out_weight, from_state.ffn_out_weight)
    with pytest.raises(ValueError, match=r"layers\.7\.norm1\.weight"):
        prepare_block_weights(model.state_dict(), prefix="layers.7.")


# --------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------
CASE1 = dict(seq_len=128, d_model=128, num_heads=4, ffn_dim=128)


def plan(**overrides: object) -> list[str]:
    args = dict(
        CASE1,
        block_m=32,
        num_warps=4,
        num_stages=1,
        precision="tf32",
        device_type="cuda",
        capability=(9, 0),
        smem_bytes=H200_SMEM,
    )
    args.update(overrides)
    return not_supported_reasons(**args)


def test_case_one_shapes_are_supported_and_fit() -> None:
    assert plan() == []
    assert plan(precision="fp16", block_m=64) == []
    assert plan(num_heads=16) == []  # head_dim 8
    need = estimate_shared_memory_bytes(**CASE1, block_m=32, num_stages=1, precision="tf32")
    assert need < 200 * 1024


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"seq_len": 512}, "seq_len=512 is outside 1..256"),
        ({"d_model": 1024, "ffn_dim": 1024}, "d_model=1024 is outside 1..256"),
        ({"d_model": 128, "num_heads": 32}, "head_dim=4 is outside 8..128"),
        ({"block_m": 24}, "block_m=24 must be a power of two"),
        ({"precision": "bf16"}, "precision='bf16' is not supported by the fused layer"),
        ({"precision": "fp8"}, "precision='fp8' is not one of"),
        ({"capability": (7, 5)}, "needs CUDA capability >= 8.0"),
        ({"smem_bytes": 32 * 1024}, "shared memory"),
        ({"device_type": "cuda", "seq_len": 16, "block_m": 64}, "block_m=64 > padded seq len"),
        ({"block_m": 128, "precision": "fp16"}, "block_m=128 in the fused block miscompiles"),
    ],
)
def test_not_supported_reasons_refuses(overrides: dict, expected: str) -> None:
    reasons = plan(**overrides)
    assert any(expected in r for r in reasons), reasons


def test_128_row_tiles_are_refused_on_cuda_only() -> None:
    on_cpu = plan(block_m=128, precision="fp16", device_type="cpu", capability=None)
    # off the interpreter (a compiled GPU run) the CPU is refused as a device, not the tile
    assert [r for r in on_cpu if not r.startswith("device type 'cpu'")] == []
    assert plan(block_m=64, precision="fp16") == []


def test_big_tiles_exceed_the_default_shared_memory_limit() -> None:
    reasons = plan(seq_len=256, d_model=256, num_heads=2, ffn_dim=256, smem_bytes=None)
    assert any("shared memory" in r for r in reasons), reasons


# --------------------------------------------------------------------------------------
# Launcher checks
# --------------------------------------------------------------------------------------
def _layer() -> tuple[torch.Tensor, object]:
    model, x, _ = build_case(seq_len=16, num_heads=2, num_layers=1, causal=False, padded=False)
    return x, prepare_block_weights(model.layers[0])


def test_launcher_names_bad_dtype_and_values() -> None:
    x, weights = _layer()
    with pytest.raises(ValueError, match=r"x has dtype torch.float16; pass float32"):
        fused_layer(x.half(), weights, num_heads=2, causal=False)
    with pytest.raises(ValueError, match=r"call \.contiguous"):
        fused_layer(x.transpose(0, 1), weights, num_heads=2, causal=False)
    with pytest.raises(ValueError, match="num_heads=3 must be >= 1 and divide d_model=32"):
        fused_layer(x, weights, num_heads=3, causal=False)
    with pytest.raises(ValueError, match=r"key_lengths has dtype torch\.float32"):
        fused_layer(x, weights, num_heads=2, causal=False, key_lengths=torch.ones(2))
    with pytest.raises(ValueError, match=r"key_lengths has shape \(3,\)"):
        fused_layer(
            x, weights, num_heads=2, causal=False, key_lengths=torch.ones(3, dtype=torch.int32)
        )
    with pytest.raises(ValueError, match="out shares storage with x"):
        fused_layer(x, weights, num_heads=2, causal=False, out=x)
    with pytest.raises(ValueError, match="precision='bf16'"):
        fused_layer(x, weights, num_heads=2, causal=False, precision="bf16")
    with pytest.raises(ValueError, match="not right padding"):
        lengths_from_mask(torch.tensor([[True, False, True]]))
