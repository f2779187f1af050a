"""The whole forward in one launch (kernels.stack) against the two launches a layer of the
heads variant (kernels.layer) and the reference, its refusals, and the plan's knob."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from autotune.core.reference import ReferenceTransformer, TransformerConfig
from kernels._tolerance import PROJECT_RULE, compare
from kernels.block import weights_from_model
from kernels.layer import Tiling, layer_stack, prepare_layer_weights
from kernels.registry import perturb_layernorms
from kernels.stack import StackedLayers, stack_forward, stack_grid, stack_layers
from tests.kernels.test_layer import _mask

SMALL = Tiling(block_m=16, block_n=16, row_block=16, next_norm=True)


def _setup(shape, precision, mask_kind, causal, device):  # type: ignore[no-untyped-def]
    b, s, d, h, f, n_layers = shape
    config = TransformerConfig(b, s, d, h, f, n_layers, causal)
    torch.manual_seed(1234)
    model = ReferenceTransformer(config).eval()
    perturb_layernorms(model)  # a LayerNorm of the wrong layer shows
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(b, s, d, generator=gen)
    mask = _mask(mask_kind, b, s, gen)
    if mask is not None:
        x = x.masked_fill(~mask[..., None], 0.0)
    with torch.inference_mode():
        reference = model(x, mask)
    layers, final = weights_from_model(model.to(device))
    prepared = [prepare_layer_weights(w, precision) for w in layers]
    mask_d = None if mask is None else mask.to(device)
    return x.to(device), mask_d, prepared, final, reference


@pytest.mark.parametrize(
    ("precision", "mask_kind", "causal", "extra", "shape"),
    [
        ("fp16", "holes", True, {}, (2, 37, 40, 5, 72, 3)),
        ("ieee", "right-padded", False, {"stage_residual": True}, (3, 20, 32, 4, 48, 2)),
        ("fp16", "none", True, {"gelu_poly": True, "fold_residual": True}, (1, 33, 64, 4, 64, 4)),
        ("fp16", "all-true", True, {"row_warps": 8}, (2, 16, 32, 2, 32, 1)),  # one layer
    ],
)
def test_one_launch_is_the_two_launches_a_layer(
    precision, mask_kind, causal, extra, shape, device
) -> None:
    """Every phase of every layer in one launch: under the interpreter (one program) the
    same bits as layer_stack with next_norm; compiled (many programs, a barrier between
    phases) within the rule of the reference and of the two launches a layer; x never
    written; the counters back at zero; a second launch gives the same output."""
    x, mask, prepared, final, reference = _setup(shape, precision, mask_kind, causal, device)
    tiling = dataclasses.replace(SMALL, **extra)
    kwargs = dict(
        num_heads=shape[3],
        causal=causal,
        key_mask=mask,
        tiling=tiling,
        gemm_precision=precision,
        attn_precision=precision,
    )
    before = x.clone()
    with torch.inference_mode():
        two = layer_stack(x, prepared, final, variant="heads", **kwargs)
        stacked = stack_layers(prepared)
        kwargs["tiling"] = dataclasses.replace(tiling, one_launch=True)
        one = stack_forward(x, stacked, final, **kwargs)
        again = stack_forward(x, stacked, final, **kwargs)
    assert torch.equal(x, before)
    assert torch.count_nonzero(stacked.counters) == 0
    assert torch.equal(one, again)
    assert compare(one.cpu(), reference, PROJECT_RULE).passed
    if device == "cpu":
        assert torch.equal(one, two)
    else:
        assert compare(one.cpu(), two.cpu(), PROJECT_RULE).passed


def test_one_launch_refuses_what_it_does_not_run() -> None:
    """layer_stack points at stack_forward; stack_forward needs one_launch with next_norm
    and refuses the Gluon kernels and pdl, layers of another precision, and anything but a
    StackedLayers."""
    x, _, prepared, final, _ = _setup((1, 8, 16, 2, 16, 2), "fp16", "none", True, "cpu")
    one = dataclasses.replace(SMALL, one_launch=True)
    with pytest.raises(ValueError, match=r"call kernels\.stack\.stack_forward"):
        layer_stack(x, prepared, final, num_heads=2, causal=True, variant="heads", tiling=one)
    stacked = stack_layers(prepared)
    call = dict(num_heads=2, causal=True)
    with pytest.raises(ValueError, match="set both"):
        stack_forward(x, stacked, final, tiling=SMALL, **call)
    with pytest.raises(ValueError, match="set both"):
        stack_forward(x, stacked, final, tiling=dataclasses.replace(one, next_norm=False), **call)
    for knob, value, why in (
        ("gluon_post", True, "not gluon_post"),
        ("gluon_heads", 1, "not gluon_heads"),
        ("row_maxnreg", 128, "row_maxnreg does not apply"),
    ):
        with pytest.raises(ValueError, match=why):
            stack_forward(
                x, stacked, final, tiling=dataclasses.replace(one, **{knob: value}), **call
            )
    with pytest.raises(ValueError, match=r"gemm_precision='ieee' reads torch\.float32"):
        stack_forward(x, stacked, final, tiling=one, gemm_precision="ieee", **call)
    with pytest.raises(ValueError, match="pass stack_layers"):
        stack_forward(x, prepared, final, tiling=one, **call)  # type: ignore[arg-type]
    wider = ReferenceTransformer(TransformerConfig(1, 8, 16, 2, 32, 1, True))
    other = prepare_layer_weights(weights_from_model(wider)[0][0], "fp16")
    with pytest.raises(ValueError, match="stack layers of one shape"):
        stack_layers([prepared[0], other])
    assert isinstance(stacked, StackedLayers) and stacked.qkv_weight.shape == (2, 48, 16)


def test_the_plan_runs_one_launch_where_it_applies(device) -> None:
    """The knob reaches the kernels through the plan (a candidate built with it equals one
    without under the interpreter), and the support rules name what it needs."""
    from autotune.build import build_candidate, not_supported_reasons
    from autotune.core.device import detect_device
    from autotune.plan import Plan

    cfg = TransformerConfig(2, 24, 32, 4, 48, 2, True)
    base = Plan(
        attention="triton",
        fused_layer="heads",
        gemm_precision="fp16",
        attn_precision="fp16",
        attn_block_m=16,
        attn_block_n=16,
        row_block=16,
        row_next_norm=True,
    )
    one = base.replace(one_launch=True)
    info = detect_device(device)
    assert not_supported_reasons(one, cfg, info) == []
    for other, why in (
        ({"row_next_norm": False}, "one_launch runs with next_norm"),
        ({"fused_layer": "rows"}, "one_launch runs the heads variant's kernels"),
        ({"fused_layer": "none"}, "one_launch=True runs the kernels of fused_layer=heads"),
    ):
        reasons = not_supported_reasons(one.replace(**other), cfg, info)
        assert any(why in r for r in reasons), (other, reasons)
    torch.manual_seed(3)
    ref = ReferenceTransformer(cfg).eval()
    perturb_layernorms(ref)
    x = torch.randn(2, 24, 32)
    with torch.inference_mode():
        outs = [
            build_candidate(p, cfg, info, ref.state_dict())(x.to(device)).cpu() for p in (base, one)
        ]
        expected = ref(x)
    assert compare(outs[1], expected, PROJECT_RULE).passed
    if device == "cpu":
        assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("batch", [1, 4])
def test_one_launch_at_case_2s_shape_in_a_cuda_graph(batch, device) -> None:
    """Case 2's shape (and B=4, case 3's) with the table's tiles: 16 (64) programs, one a
    multiprocessor; captured once and replayed on new inputs, each replay equal to an
    eager launch on the same input (the counters reset by every launch's last program)."""
    if device != "cuda":
        pytest.skip("CUDA graphs and many programs need a GPU (the interpreter runs one)")
    shape = (batch, 128, 128, 4, 128, 4)
    x, mask, prepared, final, reference = _setup(shape, "fp16", "all-true", True, device)
    tiling = Tiling(
        block_m=32, block_n=128, num_stages=1, row_block=16, row_warps=8, next_norm=True,
        fold_residual=True, gelu_poly=True, one_launch=True,
    )  # fmt: skip
    assert stack_grid(batch, 128, 4, tiling, x.device) == 16 * batch
    stacked = stack_layers(prepared)
    kwargs = dict(num_heads=4, causal=True, key_mask=mask, tiling=tiling)
    with torch.inference_mode():
        eager = stack_forward(x, stacked, final, **kwargs)
        assert compare(eager.cpu(), reference, PROJECT_RULE).passed
        static_x = x.clone()
        out = torch.empty_like(x)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            stack_forward(static_x, stacked, final, out=out, **kwargs)  # warm-up
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            stack_forward(static_x, stacked, final, out=out, **kwargs)
        for step in range(3):
            static_x.copy_(x * (1.0 + 0.25 * step))
            graph.replay()
            expected = stack_forward(static_x, stacked, final, **kwargs)
            torch.cuda.synchronize()
            assert torch.equal(out, expected), step
        assert torch.count_nonzero(stacked.counters) == 0


@pytest.mark.parametrize(("mask_kind", "causal"), [("holes", False), ("right-padded", True)])
def test_one_launch_with_more_work_than_multiprocessors(mask_kind, causal, device) -> None:
    """256 attention items and 64 row blocks a phase on at most one program a
    multiprocessor (132 on the H200): programs loop over several items of each phase. Within
    the rule of the two launches a layer and of the reference, and the same bits launch
    after launch (a barrier that let a phase start early would show as a difference)."""
    if device != "cuda":
        pytest.skip("many programs need a GPU (the interpreter runs one)")
    shape = (4, 256, 64, 4, 64, 3)
    x, mask, prepared, final, reference = _setup(shape, "fp16", mask_kind, causal, device)
    tiling = dataclasses.replace(SMALL, row_block=16)
    work = 4 * (256 // 16) * 4
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    one = dataclasses.replace(tiling, one_launch=True)
    assert stack_grid(4, 256, 4, one, x.device) == min(work, sms)
    kwargs = dict(num_heads=4, causal=causal, key_mask=mask)
    stacked = stack_layers(prepared)
    with torch.inference_mode():
        two = layer_stack(x, prepared, final, variant="heads", tiling=tiling, **kwargs)
        first = stack_forward(x, stacked, final, tiling=one, **kwargs)
        for _ in range(20):
            assert torch.equal(stack_forward(x, stacked, final, tiling=one, **kwargs), first)
    assert compare(first.cpu(), two.cpu(), PROJECT_RULE).passed
    assert compare(first.cpu(), reference, PROJECT_RULE).passed
