"""The fused layers for any batch (kernels.layer) vs ReferenceTransformer, their planning
limits and launcher checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl

from autotune.core.reference import ReferenceTransformer, TransformerConfig
from kernels._common import GELU_POLY_MAX_ERR, gelu_exact, gelu_poly, padded_dim
from kernels._tolerance import PROJECT_RULE, compare
from kernels.block import weights_from_model
from kernels.layer import (
    Tiling,
    estimate_shared_memory_bytes,
    layer_stack,
    not_supported_reasons,
    prepare_layer_weights,
)
from kernels.registry import perturb_layernorms

H200_SMEM = 232448
SMALL = Tiling(block_m=16, block_n=16, row_block=16)


def _mask(kind: str, b: int, s: int, gen: torch.Generator) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "all-true":
        return torch.ones(b, s, dtype=torch.bool)
    if kind == "right-padded":  # one row in three keeps a single token
        lengths = torch.tensor([s, 1, max(s - 5, 1)] * (b // 3 + 1))[:b]
        return torch.arange(s)[None, :] < lengths[:, None]
    holes = torch.rand(b, s, generator=gen) < 0.6
    holes[:, 0] = True
    if kind == "mixed":  # sequences with holes between right-padded and full ones
        lengths = torch.tensor([s, max(s - 5, 1), 1] * (b // 3 + 1))[:b]
        padded = torch.arange(s)[None, :] < lengths[:, None]
        return torch.where((torch.arange(b) % 2 == 1)[:, None], holes, padded)
    return holes


def run_stack(
    *,
    variant: str,
    precision: str,
    mask_kind: str,
    causal: bool,
    shape: tuple[int, int, int, int, int, int] = (3, 37, 40, 5, 72, 2),
    tiling: Tiling = SMALL,
    device: str = "cpu",
    random_norms: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The stack against the reference model; ``random_norms``: every LayerNorm's weight and
    bias drawn at random (the default initialisation is 1 and 0: a norm taken from the wrong
    layer would go unseen)."""
    b, s, d, h, f, n_layers = shape
    config = TransformerConfig(b, s, d, h, f, n_layers, causal)
    torch.manual_seed(1234)
    model = ReferenceTransformer(config).eval()
    if random_norms:
        perturb_layernorms(model)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(b, s, d, generator=gen)
    mask = _mask(mask_kind, b, s, gen)
    if mask is not None:
        x = x.masked_fill(~mask[..., None], 0.0)
    with torch.inference_mode():
        reference = model(x, mask)
        layers, final = weights_from_model(model.to(device))
        xd = x.to(device)
        before = xd.clone()
        out = layer_stack(
            xd,
            [prepare_layer_weights(w, precision) for w in layers],
            final,
            num_heads=h,
            causal=causal,
            key_mask=None if mask is None else mask.to(device),
            variant=variant,
            tiling=tiling,
            gemm_precision=precision,
            attn_precision=precision,
        )
    return out.cpu(), reference, before.cpu() - xd.cpu()


@pytest.mark.parametrize(
    ("variant", "precision", "mask_kind", "causal"),
    [
        ("heads", "ieee", "none", True),
        ("heads", "fp16", "right-padded", True),
        ("heads", "fp16", "holes", False),
        ("heads", "tf32x3", "all-true", True),
        ("rows", "ieee", "holes", True),
        ("rows", "fp16", "right-padded", False),
        ("rows", "fp16", "none", True),
        ("seq", "ieee", "holes", True),
        ("seq", "fp16", "right-padded", True),
        ("seq", "fp16", "holes", False),
    ],
)
def test_layer_stack_matches_the_reference_transformer(
    variant, precision, mask_kind, causal, device
) -> None:
    """Three query blocks (S=37 with 16-row tiles), d_model 40 padded to 64, FFN 72 in
    chunks, head_dim 8: every masked edge; every mask kind, applied on the device, gives
    the reference's output (padded rows zeroed, a one-token row included), and x is left
    as it was."""
    out, reference, x_change = run_stack(
        variant=variant, precision=precision, mask_kind=mask_kind, causal=causal, device=device
    )
    comparison = compare(out, reference, PROJECT_RULE)
    assert comparison.passed, comparison.detail
    assert torch.count_nonzero(x_change) == 0


def test_wide_tiles_and_one_layer_give_the_same_result(device) -> None:
    """One query block covering the whole sequence (no K/V recomputation), 32-row row
    blocks and 8 warps: the same function as the small tiles."""
    kwargs = dict(variant="heads", precision="ieee", mask_kind="holes", causal=True)
    shape = (2, 29, 32, 2, 48, 1)
    wide, reference, _ = run_stack(
        **kwargs,
        shape=shape,
        tiling=Tiling(block_m=32, block_n=32, num_warps=8, row_block=32, row_warps=8),
        device=device,
    )
    small, _, _ = run_stack(**kwargs, shape=shape, device=device)
    assert compare(wide, reference, PROJECT_RULE).passed
    torch.testing.assert_close(wide, small, rtol=1e-5, atol=1e-5)


def _prepared(precision: str = "fp16"):
    config = TransformerConfig(2, 8, 16, 2, 32, 1, True)
    torch.manual_seed(0)
    layers, final = weights_from_model(ReferenceTransformer(config).eval())
    return [prepare_layer_weights(w, precision) for w in layers], final


def test_launcher_refuses_bad_arguments_with_the_value_and_the_fix() -> None:
    layers, final = _prepared("fp16")
    x = torch.randn(2, 8, 16)
    kwargs = dict(num_heads=2, causal=True, tiling=SMALL)
    with pytest.raises(ValueError, match="shares storage with x"):
        layer_stack(x, layers, final, out=x, **kwargs)
    with pytest.raises(ValueError, match=r"gemm_precision='ieee' reads torch\.float32"):
        layer_stack(x, layers, final, gemm_precision="ieee", **kwargs)
    with pytest.raises(ValueError, match="variant='blocks' is not one of heads, rows, seq"):
        layer_stack(x, layers, final, variant="blocks", **kwargs)
    with pytest.raises(ValueError, match="row_block=24 must be a power of two"):
        layer_stack(x, layers, final, tiling=Tiling(row_block=24), num_heads=2, causal=True)
    with pytest.raises(ValueError, match="pass prepare_layer_weights"):
        layer_stack(x, [layers[0].fp32], final, **kwargs)
    with pytest.raises(ValueError, match="layers is empty"):
        layer_stack(x, [], final, **kwargs)


def _reasons(**changes):
    args = dict(
        variant="heads",
        seq_len=128,
        d_model=128,
        num_heads=4,
        ffn_dim=128,
        tiling=Tiling(),
        gemm_precision="fp16",
        attn_precision="fp16",
        device_type="cuda",
        capability=(9, 0),
        smem_bytes=H200_SMEM,
    )
    args.update(changes)
    return not_supported_reasons(**args)


def _off_cuda(**changes) -> list[str]:
    """The reasons for a CPU device other than the missing Triton backend (compiled
    kernels, as on the GPU machine, have none off CUDA; the interpreter has one)."""
    reasons = _reasons(device_type="cpu", capability=None, **changes)
    return [r for r in reasons if "has no Triton backend here" not in r]


def test_support_rules_name_the_limit_and_the_way_out() -> None:
    assert _reasons() == []
    assert _reasons(variant="rows", seq_len=1024) == []
    assert any("use fused_layer=rows" in r for r in _reasons(seq_len=1024))
    assert any("d_model=1024 is outside" in r for r in _reasons(d_model=1024, ffn_dim=1024))
    assert any("head_dim=4" in r for r in _reasons(d_model=16, num_heads=4))
    assert any("head_dim=256" in r for r in _reasons(d_model=256, num_heads=1))
    assert _reasons(variant="rows", d_model=256, num_heads=1) == []
    assert any(
        "needs CUDA capability" in r for r in _reasons(gemm_precision="bf16", capability=(7, 5))
    )
    wide = Tiling(block_m=64, block_n=64)
    assert any(
        "attn_block_m=64 > padded seq len 32" in r for r in _reasons(seq_len=32, tiling=wide)
    )
    assert _reasons(seq_len=32, tiling=wide, prune_pointless=False) == []
    tall = Tiling(block_m=128, block_n=64, num_warps=8)
    assert any("attn_block_m=128 in the fused heads layer miscompiles" in r
               for r in _reasons(tiling=tall))  # fmt: skip
    assert _reasons(variant="rows", tiling=tall) == []  # the flash attention is clean at 128
    assert _off_cuda(tiling=tall) == []
    assert any("attn_block_m=128 in the one-launch layer miscompiles" in r
               for r in _reasons(variant="seq", tiling=tall))  # fmt: skip
    assert any("use attn_block_m <= 32" in r
               for r in _reasons(variant="seq", tiling=Tiling(block_m=64)))  # fmt: skip
    assert _reasons(variant="seq", tiling=Tiling(block_m=32)) == []
    assert _off_cuda(variant="seq", tiling=tall) == []
    assert any("seq_len=256 > 128 for fused_layer=seq" in r
               for r in _reasons(variant="seq", seq_len=256))  # fmt: skip
    assert any("d_model=256 > 128 for fused_layer=seq" in r
               for r in _reasons(variant="seq", d_model=256, num_heads=8))  # fmt: skip
    # seq holds every key in one tile: attn_block_n is not pruned for it
    assert _reasons(variant="seq", seq_len=32, tiling=Tiling(block_m=32, block_n=64)) == []


def test_shared_memory_estimate_grows_with_tiles_and_refuses_past_the_limit() -> None:
    def estimate(tiling: Tiling, precision: str = "fp16") -> int:
        return estimate_shared_memory_bytes(
            variant="heads",
            d_model=256,
            num_heads=2,
            ffn_dim=256,
            tiling=tiling,
            gemm_precision=precision,
            attn_precision=precision,
        )

    small, big = (
        estimate(Tiling(block_m=16, block_n=16)),
        estimate(Tiling(block_m=128, block_n=128)),
    )
    assert small < big
    assert estimate(Tiling(), "ieee") > estimate(Tiling(), "fp16")
    huge = Tiling(block_m=64, block_n=128, num_stages=4)
    assert any(
        "shared memory" in r
        for r in _reasons(d_model=256, num_heads=2, ffn_dim=256, seq_len=256, tiling=huge)
    )


def test_rows_with_mask_bounds_give_the_same_output(device: str) -> None:
    from autotune.core.reference import TransformerConfig, build_reference, generate_random_case
    from kernels.block import weights_from_model
    from kernels.layer import layer_stack, prepare_layer_weights

    cfg = TransformerConfig(3, 37, 40, 5, 72, 2, causal=True)
    ref = build_reference(cfg)
    x, mask = generate_random_case(cfg, seed=2, padding_ratio=0.3)
    mask[0, 4] = False  # a hole inside the first sequence's prefix
    layers, final = weights_from_model(ref, device=device)
    weights = [prepare_layer_weights(w, "fp16") for w in layers]
    x, mask = x.to(device), mask.to(device)

    def run(bounds: bool, variant: str = "rows"):
        tiling = Tiling(block_m=16, block_n=16, row_block=16, mask_bounds=bounds)
        return layer_stack(x, weights, final, num_heads=5, causal=True, key_mask=mask,
                           variant=variant, tiling=tiling)  # fmt: skip

    bounded, plain = run(True), run(False)
    if device == "cpu":
        assert torch.equal(bounded, plain)  # the interpreter: the same operations
    else:  # compiled: two loops, two instruction sequences (kernels.attention, key_bounds)
        with torch.inference_mode():
            expected = ref(x.cpu(), mask.cpu())
        for out in (bounded, plain):
            assert compare(out.cpu(), expected, PROJECT_RULE).passed
        # Measured 2.8e-6 apart on an H100 (session 41, docs/logs/s41/s41_layers_diff.log).
        torch.testing.assert_close(bounded, plain, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="mask_bounds applies to variant='rows' only"):
        run(True, "heads")


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_seq_in_place_and_alternating_buffers_give_the_same_result(layers, device) -> None:
    """fused_layer=seq with one query block per sequence runs every layer after the first
    in place in ``out``; with several blocks (programs of a sequence read each other's
    rows) the layers alternate between two buffers and end in ``out``: odd and even layer
    counts give the one-block result, and x is never written."""
    shape = (3, 29, 32, 2, 48, layers)
    kwargs = dict(variant="seq", precision="ieee", mask_kind="right-padded", causal=True)
    one, reference, x_change = run_stack(
        **kwargs, shape=shape, tiling=Tiling(block_m=32, num_warps=4), device=device
    )
    split, _, split_change = run_stack(
        **kwargs, shape=shape, tiling=Tiling(block_m=16, num_warps=4), device=device
    )
    assert compare(one, reference, PROJECT_RULE).passed
    torch.testing.assert_close(split, one, rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(x_change) == 0 and torch.count_nonzero(split_change) == 0


@pytest.mark.parametrize(("variant", "precision"), [("rows", "fp16"), ("heads", "ieee")])
def test_staged_residual_gives_the_same_output_bit_for_bit(variant, precision, device) -> None:
    """stage_residual keeps x + attention in the output rows during the FFN instead of in
    registers: the same values, so the same output, in place or not (bit for bit on the
    interpreter; compiled, within 2e-6); seq refuses it."""
    from autotune.core.reference import build_reference, generate_random_case

    cfg = TransformerConfig(3, 37, 40, 5, 72, 2, causal=True)
    ref = build_reference(cfg)
    x, mask = generate_random_case(cfg, seed=3, padding_ratio=0.3)
    layers, final = weights_from_model(ref, device=device)
    weights = [prepare_layer_weights(w, precision) for w in layers]
    x, mask = x.to(device), mask.to(device)

    def run(stage: bool, variant: str = variant) -> torch.Tensor:
        tiling = Tiling(block_m=16, block_n=16, row_block=16, stage_residual=stage)
        return layer_stack(x, weights, final, num_heads=5, causal=True, key_mask=mask,
                           variant=variant, tiling=tiling, gemm_precision=precision,
                           attn_precision=precision)  # fmt: skip

    staged = run(True)
    if device == "cpu":
        assert torch.equal(staged, run(False))
    else:  # compiled: the residual add may contract differently with or without the stage
        # Measured on an H100 (session 41, docs/logs/s41/s41_layers_diff.log): rows fp16
        # bit for bit, heads ieee 4.8e-7 apart.
        torch.testing.assert_close(staged, run(False), rtol=1e-6, atol=2e-6)
    with torch.inference_mode():
        assert compare(staged.cpu(), ref(x.cpu(), mask.cpu()), PROJECT_RULE).passed
    with pytest.raises(ValueError, match="stage_residual applies to the post-rows kernel"):
        run(True, "seq")


def test_the_ffn_block_changes_the_steps_not_the_answer(device) -> None:
    """ffn_block: 16 FFN columns a step (8 steps over a padded 128, the last one masked)
    against the default 64 (2 steps): both pass the rule, and agree to rounding."""
    from autotune.core.reference import build_reference, generate_random_case

    cfg = TransformerConfig(3, 37, 40, 5, 72, 2, causal=True)
    ref = build_reference(cfg)
    x, mask = generate_random_case(cfg, seed=5, padding_ratio=0.3)
    layers, final = weights_from_model(ref, device=device)
    weights = [prepare_layer_weights(w, "ieee") for w in layers]
    x, mask = x.to(device), mask.to(device)
    with torch.inference_mode():
        expected = ref(x.cpu(), mask.cpu())
    for variant in ("rows", "seq"):
        outs = []
        for ffn_block in (0, 16):
            tiling = Tiling(block_m=16, block_n=16, row_block=16, ffn_block=ffn_block)
            outs.append(layer_stack(x, weights, final, num_heads=5, causal=True, key_mask=mask,
                                    variant=variant, tiling=tiling, gemm_precision="ieee",
                                    attn_precision="ieee").cpu())  # fmt: skip
            assert compare(outs[-1], expected, PROJECT_RULE).passed, (variant, ffn_block)
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="ffn_block must be 0 or a power of two >= 16"):
        Tiling(ffn_block=24)


@pytest.mark.parametrize(
    ("precision", "mask_kind", "causal", "bounds", "stage", "shape"),
    [
        ("fp16", "none", True, False, False, (3, 37, 40, 5, 72, 2)),
        ("fp16", "right-padded", True, True, True, (3, 37, 40, 5, 72, 2)),
        ("ieee", "holes", True, False, False, (3, 37, 40, 5, 72, 2)),
        ("fp16", "holes", False, False, True, (3, 37, 40, 5, 72, 2)),
        # head_dim 16 = its padded tile: the unmasked K/V loads (EVEN_HD)
        ("fp16", "right-padded", True, False, False, (2, 45, 64, 4, 96, 2)),
    ],
)
def test_rows_with_the_attention_and_post_rows_in_one_kernel(
    precision, mask_kind, causal, bounds, stage, shape, device
) -> None:
    """attn_post runs the flash attention and the post rows as one kernel (two launches a
    layer, no context buffer): it passes the rule against the reference model, agrees with
    the three-launch form to rounding (the output projection sums per head instead of per
    64 columns), never writes x, and other variants refuse it."""
    kwargs = dict(variant="rows", precision=precision, mask_kind=mask_kind, causal=causal)
    common = dict(block_m=16, block_n=16, row_block=32, mask_bounds=bounds, stage_residual=stage)
    three, reference, _ = run_stack(**kwargs, shape=shape, tiling=Tiling(**common), device=device)
    two, _, x_change = run_stack(
        **kwargs, shape=shape, tiling=Tiling(**common, attn_post=True), device=device
    )
    assert compare(two, reference, PROJECT_RULE).passed
    torch.testing.assert_close(two, three, rtol=1e-3, atol=2e-4)
    assert torch.count_nonzero(x_change) == 0
    with pytest.raises(ValueError, match="attn_post applies to variant='rows' only"):
        run_stack(**dict(kwargs, variant="heads"), shape=shape,
                  tiling=Tiling(block_m=16, block_n=16, attn_post=True), device=device)  # fmt: skip


def test_the_fused_attention_post_rows_shared_memory_estimate() -> None:
    """With attn_post the estimate covers the attention's ring plus a head's output
    projection operands, or the FFN's tiles at attn_block_m rows, whichever is larger."""
    args = dict(variant="rows", d_model=128, num_heads=4, ffn_dim=128,
                gemm_precision="fp16", attn_precision="fp16")  # fmt: skip
    three = estimate_shared_memory_bytes(**args, tiling=Tiling(block_m=64, row_block=64))
    two = estimate_shared_memory_bytes(
        **args, tiling=Tiling(block_m=64, row_block=64, num_stages=3, attn_post=True)
    )
    deeper = estimate_shared_memory_bytes(
        **args, tiling=Tiling(block_m=64, row_block=64, num_stages=4, attn_post=True)
    )
    assert two >= three > 0 and deeper > two
    # Refused on CUDA at 128-row tiles (the space forbids them too); allowed at 64.
    wide = Tiling(block_m=128, row_block=64, attn_post=True)
    assert any("with attn_post" in r for r in _reasons(variant="rows", tiling=wide))
    narrow = Tiling(block_m=64, row_block=64, attn_post=True)
    assert not _reasons(variant="rows", tiling=narrow)


@pytest.mark.parametrize(
    ("precision", "mask_kind", "causal", "stage", "shape"),
    [
        ("fp16", "right-padded", True, True, (3, 37, 40, 5, 72, 3)),
        ("ieee", "holes", True, False, (3, 37, 40, 5, 72, 2)),
        ("fp16", "holes", False, False, (2, 45, 64, 4, 96, 2)),
        ("fp16", "none", True, True, (2, 20, 40, 5, 72, 1)),  # one layer: nothing to chain
    ],
)
def test_rows_with_the_next_layers_qkv_in_the_post_rows(
    precision, mask_kind, causal, stage, shape, device, monkeypatch
) -> None:
    """next_qkv: each post-rows launch but the last also writes the next layer's qkv from
    the rows it has just written, so the qkv-rows kernel runs once a forward; the same
    arithmetic on the same values (bit for bit under the interpreter; on a GPU the rule),
    x never written;
    heads and attn_post refuse it."""
    from kernels import layer

    launches = {"qkv rows": 0}
    real = layer._qkv_rows_kernel

    class Counted:
        def __getitem__(self, grid):
            launches["qkv rows"] += 1
            return real[grid]

    monkeypatch.setattr(layer, "_qkv_rows_kernel", Counted())
    kwargs = dict(variant="rows", precision=precision, mask_kind=mask_kind, causal=causal)
    common = dict(block_m=16, block_n=16, row_block=16, stage_residual=stage)
    three, reference, _ = run_stack(**kwargs, shape=shape, tiling=Tiling(**common), device=device)
    assert launches["qkv rows"] == shape[-1]
    chained, _, x_change = run_stack(
        **kwargs, shape=shape, tiling=Tiling(**common, next_qkv=True), device=device
    )
    assert launches["qkv rows"] == shape[-1] + 1
    assert compare(chained, reference, PROJECT_RULE).passed
    if device == "cpu":
        assert torch.equal(chained, three)
    # Compiled, the chained LayerNorm1 sums its rows in another register layout than a
    # fresh load: a last-place difference can flip an fp16 rounding, so on a GPU only the
    # rule (checked above) holds.
    assert torch.count_nonzero(x_change) == 0
    for variant, extra in (("heads", {}), ("rows", {"attn_post": True})):
        with pytest.raises(ValueError, match="next_qkv applies to variant='rows' without"):
            run_stack(**dict(kwargs, variant=variant), shape=shape,
                      tiling=Tiling(**common, next_qkv=True, **extra), device=device)  # fmt: skip


@pytest.mark.parametrize(
    ("precision", "mask_kind", "causal", "extra", "shape"),
    [
        ("fp16", "right-padded", True, {"stage_residual": True}, (3, 37, 40, 5, 72, 3)),
        ("ieee", "holes", True, {"fold_residual": True}, (3, 37, 40, 5, 72, 2)),
        ("bf16", "holes", False, {"gelu_poly": True}, (2, 45, 64, 4, 96, 2)),
        ("fp16", "none", True, {}, (2, 20, 40, 5, 72, 1)),  # one layer: nothing to chain
    ],
)
def test_heads_with_the_next_layers_layernorm_in_the_post_rows(
    precision, mask_kind, causal, extra, shape, device, monkeypatch
) -> None:
    """next_norm: each post-rows launch but the last also writes the next layer's
    LayerNorm1 rows, and the next heads attention reads them instead of x; the same
    arithmetic on the same values (bit for bit under the interpreter; on a GPU the rule),
    x never written; rows and seq refuse it."""
    from kernels import layer

    normed: list[bool] = []
    real = layer._heads_attention_kernel

    class Recorded:  # the heads kernel's NORMED flag, launch by launch
        def __getitem__(self, grid):
            launch = real[grid]

            def run(*args, **kwargs):
                normed.append(bool(kwargs["NORMED"]))
                return launch(*args, **kwargs)

            return run

    monkeypatch.setattr(layer, "_heads_attention_kernel", Recorded())
    kwargs = dict(variant="heads", precision=precision, mask_kind=mask_kind, causal=causal)
    common = dict(block_m=16, block_n=16, row_block=16, **extra)
    # Random LayerNorm parameters: the next layer's norm1 taken from the wrong layer shows.
    kwargs["random_norms"] = True
    plain, reference, _ = run_stack(**kwargs, shape=shape, tiling=Tiling(**common), device=device)
    assert normed == [False] * shape[-1]
    normed.clear()
    chained, _, x_change = run_stack(
        **kwargs, shape=shape, tiling=Tiling(**common, next_norm=True), device=device
    )
    # Layers 2.. read the rows the post rows wrote (an unwritten buffer would not match).
    assert normed == [False] + [True] * (shape[-1] - 1)
    if precision != "bf16":  # bf16 operands are outside the rule with or without the chain
        assert compare(chained, reference, PROJECT_RULE).passed
    if device == "cpu":
        assert torch.equal(chained, plain)
    else:
        assert compare(chained, plain, PROJECT_RULE).passed
    assert torch.count_nonzero(x_change) == 0
    for variant in ("rows", "seq"):
        with pytest.raises(ValueError, match="next_norm applies to variant='heads'"):
            run_stack(**dict(kwargs, variant=variant), shape=shape,
                      tiling=Tiling(**common, next_norm=True), device=device)  # fmt: skip


@pytest.mark.parametrize(
    ("variant", "mask_kind", "extra"),
    [("heads", "right-padded", {}), ("rows", "general", {"mask_bounds": True, "next_qkv": True})],
)
def test_programmatic_dependent_launch_changes_when_not_what(
    variant, mask_kind, extra, device
) -> None:
    """pdl: every kernel of the stack launched with programmatic dependent launch, each
    waiting for its predecessor before its first load: on a Hopper GPU the same output bit
    for bit as without; the interpreter (no grid dependency control) and GPUs before
    sm_90 refuse it, and so do seq and attn_post (their kernels do not wait)."""
    import dataclasses

    common = dict(block_m=16, block_n=16, row_block=16, **extra)
    kwargs = dict(variant=variant, precision="fp16", mask_kind=mask_kind, causal=True)
    plain, _, _ = run_stack(**kwargs, tiling=Tiling(**common), device=device)
    pdl = Tiling(**common, pdl=True)
    hopper = device == "cuda" and torch.cuda.get_device_capability() >= (9, 0)
    for trigger in ("start", "end"):  # the next kernel let launch: after the wait, or last
        tiling = dataclasses.replace(pdl, pdl_trigger=trigger)
        if hopper:
            launched, _, x_change = run_stack(**kwargs, tiling=tiling, device=device)
            assert torch.equal(launched, plain), trigger
            assert torch.count_nonzero(x_change) == 0
        else:
            refusal = (
                r"tiling\.pdl .* needs compiled kernels on a CUDA|needs compute capability 9\.0"
            )
            with pytest.raises(ValueError, match=refusal):
                run_stack(**kwargs, tiling=tiling, device=device)
    with pytest.raises(ValueError, match=r"tiling\.pdl_trigger='end' needs tiling\.pdl=True"):
        Tiling(**common, pdl_trigger="end")
    with pytest.raises(ValueError, match="pdl trigger must be one of"):
        Tiling(**common, pdl=True, pdl_trigger="middle")
    from kernels._common import gdc_mode

    assert [gdc_mode(False), gdc_mode(True), gdc_mode(True, "end")] == [0, 1, 2]
    with pytest.raises(ValueError, match="places the trigger of pdl=True; got pdl=False"):
        gdc_mode(False, "end")  # attention(pdl=False, pdl_trigger="end") says so too
    for other, tiles in (("seq", {}), ("rows", {"attn_post": True, "next_qkv": False})):
        with pytest.raises(ValueError, match="pdl applies to variants 'heads' and 'rows'"):
            run_stack(**dict(kwargs, variant=other), device=device,
                      tiling=dataclasses.replace(pdl, **tiles))  # fmt: skip


@pytest.mark.parametrize(
    ("precision", "mask_kind", "causal", "extra", "shape"),
    [
        ("fp16", "right-padded", True, {"next_norm": True, "fold_residual": True},
         (3, 37, 40, 5, 72, 3)),
        ("ieee", "holes", True, {"stage_residual": True}, (2, 37, 40, 5, 72, 2)),
        ("fp16", "none", False, {"next_norm": True, "gelu_poly": True}, (2, 20, 64, 4, 128, 2)),
    ],
)  # fmt: skip
def test_weights_first_loads_earlier_and_computes_the_same(
    precision, mask_kind, causal, extra, shape, device
) -> None:
    """weights_first: the heads attention and post rows programs load their weight tiles
    before anything else (with pdl before their wait), the output projection and the FFN
    in one step each: bit for bit the plain kernels with the same steps (d_model <= 64: one
    output-projection step either way; ffn_block the padded FFN) under the interpreter, the
    rule on a GPU, where pdl with it is bit for bit the same."""
    kwargs = dict(variant="heads", precision=precision, mask_kind=mask_kind, causal=causal)
    ffn = padded_dim(shape[4])
    common = dict(block_m=16, block_n=16, row_block=16, **extra)
    plain, reference, _ = run_stack(
        **kwargs, shape=shape, tiling=Tiling(**common, ffn_block=ffn), device=device
    )
    first = Tiling(**common, weights_first=True)
    loaded, _, x_change = run_stack(**kwargs, shape=shape, tiling=first, device=device)
    assert compare(loaded, reference, PROJECT_RULE).passed
    assert torch.count_nonzero(x_change) == 0
    if device == "cpu":
        assert torch.equal(loaded, plain)
    else:
        assert compare(loaded, plain, PROJECT_RULE).passed
        if torch.cuda.get_device_capability() >= (9, 0):
            for trigger in ("start", "end"):
                tiling = dataclasses.replace(first, pdl=True, pdl_trigger=trigger)
                launched, _, _ = run_stack(**kwargs, shape=shape, tiling=tiling, device=device)
                assert torch.equal(launched, loaded), trigger


def test_weights_first_refusals(device: str) -> None:
    """weights_first holds whole weight tiles: heads only, the Triton kernels, two launches
    a layer, padded d_model and ffn_dim <= 128, no ffn_block."""
    kwargs = dict(variant="heads", precision="fp16", mask_kind="none", causal=True)
    common = dict(block_m=16, block_n=16, row_block=16, weights_first=True)
    refusals = [
        ({"variant": "rows"}, {}, (3, 37, 40, 5, 72, 1), "weights_first loads the heads"),
        ({}, {"ffn_block": 32}, (3, 37, 40, 5, 72, 1), "leave ffn_block 0"),
        ({}, {}, (1, 8, 40, 5, 200, 1), r"padded d_model and ffn_dim <= 128 \(got 40 and 200\)"),
    ]
    for over, tiles, shape, match in refusals:
        with pytest.raises(ValueError, match=match):
            run_stack(**dict(kwargs, **over), shape=shape, tiling=Tiling(**common, **tiles),
                      device=device)  # fmt: skip


def test_heads_one_stage_at_64_query_rows_is_refused(device: str) -> None:
    """Compiled, the heads attention faulted with one stage and 64 query rows (H200, Triton
    3.6, session 36); the rule refuses it everywhere, and 32 rows or 2 stages still run."""
    kwargs = dict(variant="heads", precision="fp16", mask_kind="none", causal=True)
    shape = (1, 20, 40, 5, 72, 1)
    for block_m in (64, 128):
        with pytest.raises(ValueError, match="attn_stages=1 and attn_block_m >= 64"):
            run_stack(**kwargs, shape=shape, tiling=Tiling(block_m=block_m, num_stages=1),
                      device=device)  # fmt: skip
    for block_m, stages in ((32, 1), (64, 2)):
        out, reference, _ = run_stack(
            **kwargs, shape=shape, tiling=Tiling(block_m=block_m, num_stages=stages), device=device
        )
        assert compare(out, reference, PROJECT_RULE).passed


def test_row_maxnreg_caps_only_and_keeps_the_arithmetic(device: str) -> None:
    """A register cap on the row kernels changes no value: under the interpreter it is
    ignored, compiled it only moves values to local memory (bit for bit either way)."""
    common = dict(block_m=16, block_n=16, row_block=16)
    kwargs = dict(variant="rows", precision="fp16", mask_kind="padded", causal=True)
    plain, _, _ = run_stack(**kwargs, tiling=Tiling(**common), device=device)
    capped, _, x_change = run_stack(
        **kwargs, tiling=Tiling(**common, row_maxnreg=64), device=device
    )
    assert torch.equal(capped, plain)
    assert torch.count_nonzero(x_change) == 0
    for bad in (8, 256):
        with pytest.raises(ValueError, match=r"tiling\.row_maxnreg must be 0 .* or in 24\.\.255"):
            Tiling(**common, row_maxnreg=bad)
    for other, tiles in (("seq", {}), ("rows", {"attn_post": True})):
        with pytest.raises(ValueError, match="row_maxnreg caps the separate qkv-rows"):
            run_stack(**dict(kwargs, variant=other), device=device,
                      tiling=Tiling(**common, row_maxnreg=128, **tiles))  # fmt: skip


@pytest.mark.parametrize(
    ("variant", "precision", "mask_kind", "extra"),
    [
        ("rows", "fp16", "holes", {"next_qkv": True}),
        ("rows", "ieee", "right-padded", {"stage_residual": True}),
        ("heads", "fp16", "holes", {}),
        ("rows", "fp16", "none", {"stage_residual": True, "ffn_block": 16}),
    ],
)
def test_fold_residual_starts_the_projection_at_x_and_keeps_the_answer(
    variant, precision, mask_kind, extra, device
) -> None:
    """fold_residual: the output projection accumulates onto x + bo instead of having x
    added after it (padded tokens' rows differ until the layer's end zeroes them). The
    same sums in another order: close to the unfolded stack, within the rule, x
    untouched; refused where there is no separate post rows kernel."""
    kwargs = dict(variant=variant, precision=precision, mask_kind=mask_kind, causal=True)
    common = dict(block_m=16, block_n=16, row_block=16, **extra)
    plain, reference, _ = run_stack(**kwargs, tiling=Tiling(**common), device=device)
    folded, _, x_change = run_stack(
        **kwargs, tiling=Tiling(**common, fold_residual=True), device=device
    )
    # fp32 rounding apart; with fp16 operands a last-bit change of x1 can flip the fp16
    # rounding of a LayerNorm output, whose error the rest of the layer carries.
    tol = 2e-6 if precision == "ieee" else 1e-3
    torch.testing.assert_close(folded, plain, rtol=tol, atol=tol)
    assert not torch.equal(folded, plain)  # the knob reached the kernel: another order of sums
    assert compare(folded.cpu(), reference, PROJECT_RULE).passed
    assert torch.count_nonzero(x_change) == 0
    for other, tiles in (("seq", {}), ("rows", {"attn_post": True, "next_qkv": False})):
        with pytest.raises(ValueError, match="fold_residual applies to the post-rows kernel"):
            run_stack(**dict(kwargs, variant=other), device=device,
                      tiling=Tiling(**dict(common, **tiles), fold_residual=True))  # fmt: skip


def test_attn_maxnreg_caps_the_flash_attention_and_keeps_the_arithmetic(device: str) -> None:
    """A register cap on the flash attention of variant rows changes no value (ignored by
    the interpreter; compiled, at most local memory); bad caps and the variants whose
    attention lives in their own kernels are refused with the value and the way out."""
    common = dict(block_m=16, block_n=16, row_block=16)
    kwargs = dict(variant="rows", precision="fp16", mask_kind="holes", causal=True)
    plain, _, _ = run_stack(**kwargs, tiling=Tiling(**common), device=device)
    capped, _, _ = run_stack(**kwargs, tiling=Tiling(**common, attn_maxnreg=64), device=device)
    assert torch.equal(capped, plain)
    with pytest.raises(ValueError, match=r"tiling\.attn_maxnreg must be 0 .* or in 24\.\.255"):
        Tiling(**common, attn_maxnreg=300)
    for other, tiles in (("heads", {}), ("seq", {}), ("rows", {"attn_post": True})):
        with pytest.raises(ValueError, match="attn_maxnreg caps the flash attention kernel"):
            run_stack(**dict(kwargs, variant=other), device=device,
                      tiling=Tiling(**common, attn_maxnreg=96, **tiles))  # fmt: skip


def test_rows_one_tile_attention_matches_the_flash_form(device: str) -> None:
    """Variant rows with the one-tile attention (every key in one tile, the head dim in
    chunks of 16: 8 = one ragged chunk at head dim 8): within 1e-5 of the flash form, masks
    included; refused where the attention is not a separate kernel, and past 256 keys."""
    common = dict(block_m=16, block_n=16, row_block=16)
    kwargs = dict(variant="rows", precision="ieee", mask_kind="holes", causal=True)
    plain, _, _ = run_stack(**kwargs, tiling=Tiling(**common), device=device)
    one_tile, _, _ = run_stack(**kwargs, tiling=Tiling(**common, attn_head_chunk=16),
                               device=device)  # fmt: skip
    assert torch.allclose(one_tile, plain, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"tiling\.attn_head_chunk must be 0 or a power of two"):
        Tiling(**common, attn_head_chunk=24)
    for other, tiles in (("heads", {}), ("seq", {}), ("rows", {"attn_post": True})):
        with pytest.raises(ValueError, match="attn_head_chunk picks the one-tile form"):
            run_stack(**dict(kwargs, variant=other), device=device,
                      tiling=Tiling(**common, attn_head_chunk=16, **tiles))  # fmt: skip
    reasons = not_supported_reasons(
        variant="rows", seq_len=300, d_model=64, num_heads=4, ffn_dim=64,
        tiling=Tiling(**common, attn_head_chunk=16), gemm_precision="fp16",
        attn_precision="fp16", device_type="cuda", capability=(9, 0), smem_bytes=None,
    )  # fmt: skip
    assert any("seq_len=300 is over 256" in r for r in reasons), reasons


def test_qkv_stages_keep_the_arithmetic(device: str) -> None:
    """The QKV rows kernel at 2 or 1 pipeline stages: the same output (bit for bit; the
    interpreter ignores stages, compiled only the loads' schedule changes); bad values are
    refused naming the value."""
    common = dict(block_m=16, block_n=16, row_block=16)
    kwargs = dict(variant="rows", precision="fp16", mask_kind="holes", causal=True)
    plain, _, _ = run_stack(**kwargs, tiling=Tiling(**common), device=device)
    for stages in (2, 1):
        staged, _, _ = run_stack(**kwargs, tiling=Tiling(**common, qkv_stages=stages),
                                 device=device)  # fmt: skip
        assert torch.equal(staged, plain), stages
    with pytest.raises(ValueError, match=r"tiling\.qkv_stages must be 0 .* or 1\.\.2, got 7"):
        Tiling(**common, qkv_stages=7)


@triton.jit
def _gelu_kernel(x_ptr, out_ptr, n, POLY: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    v = tl.load(x_ptr + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, gelu_poly(v) if POLY else gelu_exact(v), mask=ok)


def _gelu(x: torch.Tensor, poly: bool, device: str) -> torch.Tensor:
    xs = x.float().to(device)
    out = torch.empty_like(xs)
    _gelu_kernel[(triton.cdiv(xs.numel(), 1024),)](xs, out, xs.numel(), POLY=poly, BLOCK=1024)
    return out.cpu().double()


def test_gelu_poly_stays_within_its_bound_of_the_erf_gelu(device: str) -> None:
    """kernels._common.gelu_poly against the erf GELU (fp64) on a dense grid and the tails
    (fp32's largest magnitudes too): within GELU_POLY_MAX_ERR everywhere, and the bound is
    tight (the fit's worst is over a tenth of it); GELU(0) = 0 (padded columns), NaN stays
    NaN, -inf gives ~0; the erf form within 1e-6."""
    x = torch.cat([
        torch.linspace(-12.0, 12.0, 96_001, dtype=torch.float64),
        torch.tensor([-3e38, -1e30, -1e8, -1e4, -100.0, -8.5, -8.0, -7.9, 0.0, 7.9, 8.0, 8.5,
                      100.0, 1e4]).double(),
    ])  # fmt: skip
    want = 0.5 * x * (1.0 + torch.erf(x / 2**0.5))
    poly_err = (_gelu(x, True, device) - want).abs()
    assert poly_err.max().item() <= GELU_POLY_MAX_ERR
    assert poly_err.max().item() > GELU_POLY_MAX_ERR / 10
    small = x.abs() <= 100
    assert (_gelu(x, False, device) - want)[small].abs().max().item() <= 1e-6
    special = _gelu(torch.tensor([0.0, float("nan"), float("-inf")]), True, device)
    assert special[0] == 0.0 and special[1].isnan() and abs(special[2].item()) < 1e-10


def test_gelu_poly_changes_the_layers_output_within_the_rule(device: str) -> None:
    """Tiling(gelu_poly=True) runs the other GELU (the outputs differ), within the rule of
    the reference, on every fused variant."""
    common = dict(block_m=16, block_n=16, row_block=16)
    forms = (
        ("rows", {}),
        ("rows", {"stage_residual": True}),  # the post rows' staged branch
        ("rows", {"attn_post": True}),  # the attention + post rows kernel
        ("heads", {}),
        ("seq", {}),
    )
    for variant, knobs in forms:
        kwargs = dict(variant=variant, precision="fp16", mask_kind="padded", causal=True)
        tiling = Tiling(**common, **knobs)
        plain, reference, _ = run_stack(**kwargs, tiling=tiling, device=device)
        poly, _, x_change = run_stack(
            **kwargs, tiling=dataclasses.replace(tiling, gelu_poly=True), device=device
        )
        assert not torch.equal(poly, plain), (variant, knobs)
        assert (poly - plain).abs().max().item() < 1e-3, (variant, knobs)
        assert compare(poly, reference, PROJECT_RULE).passed, (variant, knobs)
        assert torch.count_nonzero(x_change) == 0


def test_the_qkv_weights_are_row_blocks_of_one_packed_matrix() -> None:
    """prepare_layer_weights packs Wq, Wk, Wv into one [3 d_model, d_model] matrix (the row
    kernels' one projection loop reads it) and hands the three out as views of it."""
    torch.manual_seed(5)
    model = ReferenceTransformer(TransformerConfig(1, 8, 40, 5, 72, 1, True)).eval()
    (w,), _ = weights_from_model(model)
    for precision, dtype in (("fp16", torch.float16), ("ieee", torch.float32)):
        lw = prepare_layer_weights(w, precision)
        assert lw.qkv_weight.shape == (120, 40) and lw.qkv_weight.dtype == dtype
        assert lw.qkv_weight.is_contiguous() and lw.qkv_bias.dtype == torch.float32
        for i, (mine, theirs) in enumerate(
            ((lw.q_weight, w.q_weight), (lw.k_weight, w.k_weight), (lw.v_weight, w.v_weight))
        ):
            assert mine.is_contiguous()
            assert mine.untyped_storage().data_ptr() == lw.qkv_weight.untyped_storage().data_ptr()
            assert torch.equal(mine, theirs.to(dtype))
            assert torch.equal(
                lw.qkv_bias[40 * i : 40 * (i + 1)], (w.q_bias, w.k_bias, w.v_bias)[i]
            )
