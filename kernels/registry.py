"""Named correctness checks over every kernel, for ``autotune kernels check``.

Each check builds small inputs from a seeded CPU generator, runs the kernel on the
requested device, and compares it element by element with the fp32 PyTorch reference
computed on the CPU (so no TF32 creeps into the reference), using the project rule
``err <= atol or err <= rtol * |ref|`` with atol 2e-3, rtol 2e-2 for ieee / tf32 / tf32x3
/ fp16 and the looser documented bf16 tolerance (``kernels._tolerance.BF16_RULE``).

Shapes are small and odd (S=37, head_dim 8/24/32/64, d_model 40) so the whole list runs
in well under a minute under ``TRITON_INTERPRET=1`` on a CPU.

Usage::

    for check in iter_checks():
        result = check.run("cuda")   # or "cpu" with TRITON_INTERPRET=1
        print(check.name, result.passed, result.max_abs_err, result.detail)
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from kernels._tolerance import TOLERANCE_BY_PRECISION, compare
from kernels._triton import triton_available

__all__ = ["CheckResult", "KernelCheck", "iter_checks"]

SEED = 1234


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    max_abs_err: float
    detail: str


@dataclass(frozen=True)
class KernelCheck:
    """One named kernel check; ``run`` never raises, failures come back as results."""

    name: str
    description: str
    check: Callable[[str], CheckResult] = field(repr=False, compare=False)

    def run(self, device: str) -> CheckResult:
        ok, why = triton_available()
        if not ok:
            return CheckResult(False, float("inf"), why)
        try:
            return self.check(device)
        except Exception as exc:  # a failing kernel is a result, not a crash
            where = traceback.extract_tb(exc.__traceback__)[-1]
            return CheckResult(
                False,
                float("inf"),
                f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})",
            )


def _generator() -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(SEED)


def _result(candidate: torch.Tensor, reference: torch.Tensor, precision: str) -> CheckResult:
    comparison = compare(candidate, reference, TOLERANCE_BY_PRECISION[precision])
    return CheckResult(comparison.passed, comparison.max_abs_err, comparison.detail)


def _combine(results: list[CheckResult]) -> CheckResult:
    return CheckResult(
        all(r.passed for r in results),
        max(r.max_abs_err for r in results),
        "; ".join(r.detail for r in results),
    )


# --------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionCase:
    batch: int
    seq_len: int
    num_heads: int
    head_dim: int
    causal: bool
    precision: str
    padded: bool = False
    block_m: int = 16
    block_n: int = 16
    key_mask: bool = False  # a general [B, S] key mask (any pattern), read on the device
    # with key_mask: a valid prefix, holes after it and a masked tail, and key_mask_bounds
    bounds: bool = False
    # > 0: the one-tile form (every key in one tile, the head dim in chunks of this width)
    head_chunk: int = 0
    # the Gluon flash attention (kernels.gluon_flash: compiled on sm_90 only, fp16 q, k, v
    # and context, 64 query rows a warpgroup, 3 key and value buffers; block_m unused)
    gluon: bool = False

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        pad = "-padded" if self.padded else ("-masked" if self.key_mask else "")
        pad += "-bounds" if self.bounds else ""
        tiles = f"bm{self.block_m}-" + (
            f"onetile-hc{self.head_chunk}" if self.head_chunk else f"bn{self.block_n}"
        )
        tiles = f"gluon-bn{self.block_n}" if self.gluon else tiles
        return (
            f"attention/{mask}{pad}/B{self.batch}-S{self.seq_len}-H{self.num_heads}-"
            f"hd{self.head_dim}/{tiles}/{self.precision}"
        )


def _run_attention(case: AttentionCase, device: str) -> CheckResult:
    from kernels.attention import attention, attention_reference

    b, s, h, hd = case.batch, case.seq_len, case.num_heads, case.head_dim
    gen = _generator()
    # q, k, v are strided views into one packed [B, S, 3D] projection output.
    qkv = torch.randn(b, s, 3 * h * hd, generator=gen)
    if case.gluon:  # it takes fp16 q, k, v: the reference gets the same values
        qkv = qkv.half().float()
    key_lengths = None
    if case.padded:
        key_lengths = torch.randint(1, s + 1, (b,), generator=gen, dtype=torch.int32)
        key_lengths[0] = max(1, s // 3)
    key_mask = None
    if case.key_mask:  # holes anywhere; key 0 kept so every causal row sees a key
        key_mask = torch.rand(b, s, generator=gen) < 0.6
        key_mask[:, 0] = True
        if case.bounds:  # prefixes of 0, 1 and 2 blocks, a masked tail on the last row
            for row in range(b):
                key_mask[row, : row * case.block_n + 1] = True
            key_mask[-1, s - 9 :] = False
    q, k, v = qkv.view(b, s, 3, h, hd).unbind(2)
    reference = attention_reference(
        q, k, v, causal=case.causal, key_lengths=key_lengths, key_mask=key_mask
    )

    dtype = torch.float16 if case.gluon else torch.float32
    q_dev, k_dev, v_dev = qkv.to(device, dtype).view(b, s, 3, h, hd).unbind(2)
    out = torch.full((b, s, h * hd), float("nan"), device=device, dtype=dtype)
    mask_dev = None if key_mask is None else key_mask.to(device)
    bounds = None
    if case.bounds:
        from kernels.attention import key_mask_bounds, key_mask_bounds_reference

        assert mask_dev is not None
        bounds = key_mask_bounds(mask_dev)
        want = key_mask_bounds_reference(key_mask)  # type: ignore[arg-type]
        if not torch.equal(bounds.cpu(), want):
            got = bounds.cpu().tolist()
            return CheckResult(False, math.inf, f"key_mask_bounds {got} != {want.tolist()}")
    attention(
        q_dev,
        k_dev,
        v_dev,
        causal=case.causal,
        key_lengths=None if key_lengths is None else key_lengths.to(device),
        key_mask=mask_dev,
        key_bounds=bounds,
        out=out.view(b, s, h, hd),
        block_m=case.block_m,
        block_n=case.block_n,
        precision=case.precision,
        head_chunk=case.head_chunk,
        **({"gluon": True, "num_stages": 3} if case.gluon else {}),
    )
    return _result(out.view(b, s, h, hd).float(), reference, case.precision)


ATTENTION_CASES = (
    AttentionCase(2, 37, 2, 8, causal=True, precision="ieee"),
    AttentionCase(2, 37, 2, 24, causal=False, precision="tf32", padded=True),
    AttentionCase(2, 37, 2, 32, causal=True, precision="fp16", padded=True, block_m=32),
    AttentionCase(1, 37, 2, 64, causal=True, precision="bf16", block_n=32),
    AttentionCase(1, 37, 1, 64, causal=False, precision="tf32x3", block_m=64, block_n=64),
    AttentionCase(2, 37, 2, 24, causal=True, precision="fp16", block_m=16, block_n=32),
    AttentionCase(1, 64, 2, 32, causal=True, precision="tf32", padded=True, block_n=32),
    AttentionCase(2, 37, 1, 8, causal=False, precision="bf16", padded=True),
    AttentionCase(2, 37, 2, 32, causal=True, precision="fp16", key_mask=True, block_n=32),
    AttentionCase(2, 45, 2, 24, causal=False, precision="tf32", key_mask=True),
    AttentionCase(3, 45, 2, 32, causal=True, precision="fp16", key_mask=True, bounds=True),
    AttentionCase(3, 45, 2, 24, causal=False, precision="ieee", key_mask=True, bounds=True),
    # The one-tile form: head dims in 2-4 chunks (a ragged last one at 40), a 256-key tile
    # (S = 130), every mask.
    AttentionCase(2, 37, 2, 40, causal=True, precision="ieee", padded=True, head_chunk=16),
    AttentionCase(1, 37, 2, 256, causal=True, precision="fp16", block_m=32, head_chunk=64),
    AttentionCase(2, 130, 1, 64, causal=False, precision="tf32", key_mask=True, head_chunk=32),
    AttentionCase(
        3, 45, 2, 32, causal=True, precision="fp16", key_mask=True, bounds=True, head_chunk=16
    ),
    AttentionCase(2, 37, 1, 24, causal=False, precision="bf16", padded=True, head_chunk=16),
)
# The Gluon flash attention (session 34), checked where it compiles (sm_90): several key
# blocks, ragged tails, fewer blocks than buffers, head dims 16-128, every mask form.
GLUON_ATTENTION_CASES = (
    AttentionCase(
        3,
        300,
        2,
        32,
        causal=True,
        precision="fp16",
        key_mask=True,
        bounds=True,
        block_m=64,
        block_n=64,
        gluon=True,
    ),
    AttentionCase(
        2,
        200,
        2,
        64,
        causal=False,
        precision="fp16",
        key_mask=True,
        block_m=64,
        block_n=128,
        gluon=True,
    ),
    AttentionCase(1, 77, 2, 16, causal=True, precision="fp16", block_m=64, block_n=64, gluon=True),
    AttentionCase(
        2, 130, 1, 128, causal=True, precision="fp16", block_m=64, block_n=64, gluon=True
    ),
)


# --------------------------------------------------------------------------------------
# LayerNorm
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerNormCase:
    batch: int
    seq_len: int
    d_model: int
    with_delta: bool
    zero_sum_rows: bool = False
    zero_out_rows: bool = False
    block_rows: int = 1
    half: bool = False  # an fp16 delta in, the normed rows out in fp16 (the GEMM hand-off)

    @property
    def name(self) -> str:
        parts = ["add" if self.with_delta else "noadd"]
        if self.half:
            parts.append("fp16-io")
        if self.zero_sum_rows:
            parts.append("zero-sum-rows")
        if self.zero_out_rows:
            parts.append("zero-out-rows")
        return (
            f"layernorm/{'+'.join(parts)}/B{self.batch}-S{self.seq_len}-D{self.d_model}/"
            f"rows{self.block_rows}"
        )


def _run_layernorm(case: LayerNormCase, device: str) -> CheckResult:
    from kernels.layernorm import add_layernorm, add_layernorm_reference

    gen = _generator()
    shape = (case.batch, case.seq_len, case.d_model)
    x = torch.randn(shape, generator=gen)
    delta = torch.randn(shape, generator=gen) if case.with_delta else None
    if delta is not None and case.half:
        delta = delta.half()
    out_dtype = torch.float16 if case.half else torch.float32
    weight = 1 + 0.1 * torch.randn(case.d_model, generator=gen)
    bias = 0.1 * torch.randn(case.d_model, generator=gen)
    row_mask = None
    if case.zero_sum_rows or case.zero_out_rows:
        lengths = torch.randint(1, case.seq_len + 1, (case.batch,), generator=gen)
        row_mask = torch.arange(case.seq_len)[None, :] < lengths[:, None]
    flags = {"zero_sum_rows": case.zero_sum_rows, "zero_out_rows": case.zero_out_rows}
    flags["out_dtype"] = out_dtype
    ref_s, ref_y = add_layernorm_reference(x, delta, weight, bias, row_mask=row_mask, **flags)

    def dev(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device)

    s, y = add_layernorm(
        dev(x),
        dev(delta),
        dev(weight),
        dev(bias),
        row_mask=dev(row_mask),
        block_rows=case.block_rows,
        **flags,
    )
    return _combine([_result(s, ref_s, "ieee"), _result(y, ref_y, "fp16" if case.half else "ieee")])


LAYERNORM_CASES = (
    LayerNormCase(2, 37, 40, with_delta=True),
    LayerNormCase(2, 37, 40, with_delta=True, zero_sum_rows=True, block_rows=2, half=True),
    LayerNormCase(2, 37, 40, with_delta=True, zero_sum_rows=True, block_rows=4),
    LayerNormCase(2, 37, 128, with_delta=False, zero_out_rows=True, block_rows=2),
    LayerNormCase(1, 5, 1024, with_delta=True, block_rows=2),
)


# --------------------------------------------------------------------------------------
# FFN
# --------------------------------------------------------------------------------------
def _linear_params(
    gen: torch.Generator, in_features: int, out_features: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """nn.Linear-like init: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias."""
    bound = in_features**-0.5
    weight = (torch.rand(out_features, in_features, generator=gen) * 2 - 1) * bound
    bias = (torch.rand(out_features, generator=gen) * 2 - 1) * bound
    return weight, bias


def _run_bias_gelu(device: str, half: bool = False) -> CheckResult:
    """``half``: an fp16 GEMM output and its fp16 bias in, GELU'd in place in fp16 (the
    GEMM hand-off)."""
    from kernels.ffn import bias_gelu, bias_gelu_reference

    gen = _generator()
    y = torch.randn(2, 37, 40, generator=gen)
    bias = torch.randn(40, generator=gen)
    if half:
        y, bias = y.half(), bias.half()
        # before y is overwritten in place
        reference = bias_gelu_reference(y.float(), bias.float())
        out = bias_gelu(y.to(device), bias.to(device), block=128, inplace=True)
        return _result(out, reference, "fp16")
    out = bias_gelu(y.to(device), bias.to(device), block=128)
    return _result(out, bias_gelu_reference(y, bias), "ieee")


def _run_mantissa(device: str, dtype: torch.dtype, graded: bool = False) -> CheckResult:
    """``attn_drop_bits``'s in-place rounding, every drop its dtype allows, on an odd
    length with zeros, the largest value, inf and NaN: bit for bit the int32 reference.
    ``graded``: rows by sequence position (``attn_drop_bits_late`` from row 17 of 37,
    two sequences), the early rows at one bit fewer or kept."""
    from kernels.mantissa import (
        MANTISSA_BITS,
        round_mantissa_,
        round_mantissa_graded_reference,
        round_mantissa_reference,
    )

    x = torch.randn(37, 41, generator=_generator()).mul(8.0)
    x[0, :5] = torch.tensor([0.0, float("inf"), float("nan"), torch.finfo(dtype).max, -0.0])
    x = x.to(dtype)
    if graded:
        x = torch.stack([x, x.flip(0)])
    worst, wrong = 0.0, []
    for drop in range(1, MANTISSA_BITS[dtype]):
        if graded:
            early = drop - 1
            want = round_mantissa_graded_reference(x, early, drop, 17)
            got = round_mantissa_(x.to(device), early, drop, 17).cpu()
        else:
            want = round_mantissa_reference(x, drop)
            got = round_mantissa_(x.to(device), drop).cpu()
        if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
            wrong.append(drop)
        finite = torch.isfinite(want)
        worst = max(worst, (got.float() - want.float())[finite].abs().max().item())
    detail = (
        f"drops 1..{MANTISSA_BITS[dtype] - 1} bit for bit" if not wrong else f"drops {wrong} differ"
    )
    return CheckResult(not wrong, worst, detail)


@dataclass(frozen=True)
class LinearCase:
    rows: int
    in_features: int
    out_features: int
    precision: str
    gelu: bool = True

    @property
    def name(self) -> str:
        op = "linear_gelu" if self.gelu else "linear"
        return f"ffn/{op}/M{self.rows}-K{self.in_features}-N{self.out_features}/{self.precision}"


def _run_linear(case: LinearCase, device: str) -> CheckResult:
    from kernels.ffn import linear, linear_gelu, linear_gelu_reference

    gen = _generator()
    x = torch.randn(case.rows, case.in_features, generator=gen)
    weight, bias = _linear_params(gen, case.in_features, case.out_features)
    reference = linear_gelu_reference(x, weight, bias, gelu=case.gelu)
    launch = linear_gelu if case.gelu else linear
    out = launch(
        x.to(device),
        weight.to(device),
        bias.to(device),
        precision=case.precision,
        block_m=16,
        block_n=32,
        block_k=16,
        group_m=2,
    )
    return _result(out, reference, case.precision)


LINEAR_CASES = (
    *(LinearCase(74, 40, 72, precision=p) for p in ("ieee", "tf32", "tf32x3", "fp16", "bf16")),
    LinearCase(37, 72, 40, precision="tf32", gelu=False),
)


# The model the fused block is checked against: called with the shape's fields
# (batch_size, seq_len, d_model, num_heads, ffn_dim, num_layers, causal), it returns the
# project's reference model with the parameter names ``weights_from_model`` reads.
ReferenceFactory = Callable[..., torch.nn.Module]
BLOCK_SHAPE = {
    "batch_size": 2,
    "seq_len": 13,
    "d_model": 32,
    "num_heads": 2,
    "ffn_dim": 48,
    "num_layers": 2,
    "causal": True,
}


def _run_block(
    precision: str, padding: str, device: str, reference: ReferenceFactory
) -> CheckResult:
    """The fused two-launch layer stack against the project's reference model; ``padding``
    "": no mask, "padded": right padding as key lengths, "masked": a mask with holes
    anywhere (key 0 kept), applied by the kernels themselves."""
    from kernels.block import fused_forward, weights_from_model

    torch.manual_seed(11)
    model = reference(**BLOCK_SHAPE).to(device).eval()
    gen = _generator()
    x = torch.randn(2, 13, 32, generator=gen).to(device)
    lengths = mask = None
    if padding == "padded":
        lengths = torch.tensor([13, 9], dtype=torch.int32, device=device)
        mask = torch.arange(13, device=device)[None] < lengths[:, None]
    elif padding == "masked":
        holes = torch.rand(2, 13, generator=gen) < 0.6
        holes[:, 0] = True
        mask = holes.to(device)
    if mask is not None:
        x = x.masked_fill(~mask[..., None], 0.0)
    layers, final = weights_from_model(model)
    with torch.inference_mode():
        ref = model(x, mask)
        out = fused_forward(
            x,
            layers,
            final,
            num_heads=2,
            causal=True,
            key_lengths=lengths,
            key_mask=mask if padding == "masked" else None,
            precision=precision,
            block_m=16,
        )
    return _result(out, ref, precision)


# Fused layers for any batch (kernels.layer): odd sizes, two query blocks, a padded
# d_model (40 -> 64) and FFN chunks, so every masked edge of the row kernels is exercised.
LAYER_SHAPE = {
    "batch_size": 3,
    "seq_len": 21,
    "d_model": 40,
    "num_heads": 5,
    "ffn_dim": 72,
    "num_layers": 2,
    "causal": True,
}


# The Gluon post rows takes d_model = ffn_dim in 32 / 64 / 128 (kernels.gluon_rows).
GLUON_LAYER_SHAPE = dict(LAYER_SHAPE, d_model=64, num_heads=4, ffn_dim=64)


# The register cap of the "nreg" layer checks: below what their row kernels take uncapped,
# so the compiled checks run spilled code (the plans' caps are 128 and 168).
NREG_CHECK_CAP = 64


def perturb_layernorms(model: torch.nn.Module) -> None:
    """Every LayerNorm's weight drawn from [0.5, 1.5] and bias from N(0, 0.5), in place (the
    reference initialises them to 1 and 0, under which a norm taken from the wrong layer
    goes unseen)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.5)


def _run_layer(
    variant: str, precision: str, padding: str, causal: bool, device: str,
    reference: ReferenceFactory,
) -> CheckResult:  # fmt: skip
    """The fused layer stack (both launch variants) against the project's reference model;
    ``padding``: "" no mask, "padded" right padding, "masked" holes anywhere (key 0 kept);
    "-staged": the residual staged in memory; "-f16": 16 FFN columns a step; "post" (last): rows
    with the attention and post rows in one kernel; "chain": post rows that write the next
    layer's qkv (rows) or LayerNorm1 rows (heads); "pdl" (last): every kernel launched with
    programmatic dependent launch (compiled on sm_90+ only), "pdlend" with its trigger after
    each kernel's last store; "nreg": the row kernels capped at ``NREG_CHECK_CAP`` registers a
    thread, low enough to spill (compiled only; the interpreter runs the same arithmetic);
    "gelu" (last but "fold"): the FFN's GELU as ``kernels._common.gelu_poly``; "fold" (last of
    all): the post rows' output projection accumulated onto the residual; "gluon" / "gluon8"
    (last of all): the Gluon post rows (``kernels.gluon_rows``, 4 or 8 row warps; compiled
    on sm_90 only), at ``GLUON_LAYER_SHAPE``; "gheads" (after everything): the Gluon heads
    attention (``kernels.gluon_heads``, 2 heads a program, 4 warps; compiled on sm_90 only),
    at that shape too; "gheads8": 8 heads of 8 (in pairs), 4 a program; "one" (after
    everything, heads with "chain"): the whole stack in one launch (``kernels.stack``); "wf"
    (after everything, heads): ``weights_first``, each program's weight tiles loaded first."""
    from kernels.block import weights_from_model
    from kernels.layer import Tiling, layer_stack, prepare_layer_weights
    from kernels.stack import stack_forward, stack_layers

    weights_first = padding.endswith("wf")
    padding = padding.removesuffix("wf").removesuffix("-")
    one_launch = padding.endswith("one")
    padding = padding.removesuffix("one").removesuffix("-")
    pairs = padding.endswith("gheads8")  # 8 heads of 8: the kernel's pairs of heads
    gluon_heads = 4 if pairs else 2 if padding.endswith("gheads") else 0
    padding = padding.removesuffix("8" if pairs else "").removesuffix("gheads").removesuffix("-")
    gluon_warps = 8 if padding.endswith("gluon8") else 4 if padding.endswith("gluon") else 0
    padding = padding.removesuffix("8").removesuffix("gluon") if gluon_warps else padding
    padding = padding.removesuffix("-")
    fold_residual = padding.endswith("fold")
    padding = padding.removesuffix("fold").removesuffix("-")
    gelu_poly = padding.endswith("gelu")
    padding = padding.removesuffix("gelu").removesuffix("-")
    row_maxnreg = NREG_CHECK_CAP if padding.endswith("nreg") else 0
    padding = padding.removesuffix("nreg").removesuffix("-")
    pdl_trigger = "end" if padding.endswith("pdlend") else "start"
    if pdl_trigger == "end":
        padding = padding.removesuffix("end")
    pdl = padding.endswith("pdl")
    padding = padding.removesuffix("pdl").removesuffix("-")
    chain = padding.endswith("chain")
    padding = padding.removesuffix("chain").removesuffix("-")
    attn_post = padding.endswith("post")
    padding = padding.removesuffix("post").removesuffix("-")
    ffn_block = 16 if padding.endswith("-f16") else 0
    padding = padding.removesuffix("-f16")

    gluon_shape = gluon_warps or gluon_heads
    shape = dict(GLUON_LAYER_SHAPE if gluon_shape else LAYER_SHAPE, causal=causal)
    if pairs:
        shape["num_heads"] = 8
    b, s, d = shape["batch_size"], shape["seq_len"], shape["d_model"]
    torch.manual_seed(12)
    model = reference(**shape).to(device).eval()
    if chain:  # LayerNorms not at 1 and 0: a next layer's norm from the wrong layer shows
        perturb_layernorms(model)
    gen = _generator()
    x = torch.randn(b, s, d, generator=gen).to(device)
    mask = None
    if padding in ("padded", "padded-staged"):
        lengths = torch.tensor([s, s - 6, 1])
        mask = (torch.arange(s)[None] < lengths[:, None]).to(device)
    elif padding in ("masked", "masked-bounds", "masked-staged"):
        holes = torch.rand(b, s, generator=gen) < 0.6
        holes[:, 0] = True
        if padding == "masked-bounds":  # a valid prefix of a block, then holes and a tail
            holes[:, :17] = True
            holes[-1, s - 5 :] = False
        mask = holes.to(device)
    if mask is not None:
        x = x.masked_fill(~mask[..., None], 0.0)
    layers, final = weights_from_model(model)
    prepared = [prepare_layer_weights(w, precision) for w in layers]
    with torch.inference_mode():
        ref = model(x, mask)
        run = layer_stack
        if one_launch:  # the same arguments; the weights stacked [L, ...] once

            def run(x, layers, final, *, variant, **kwargs):  # type: ignore[no-untyped-def]
                return stack_forward(x, stack_layers(layers), final, **kwargs)

        out = run(
            x,
            prepared,
            final,
            num_heads=shape["num_heads"],
            causal=causal,
            key_mask=mask,
            variant=variant,
            tiling=Tiling(
                block_m=16,
                block_n=16,
                row_block=64 if gluon_warps else 16,
                row_warps=gluon_warps or 4,
                gluon_post=bool(gluon_warps),
                gluon_heads=gluon_heads,
                mask_bounds=padding == "masked-bounds",
                stage_residual=padding.endswith("-staged"),
                ffn_block=ffn_block,
                attn_post=attn_post,
                next_qkv=chain and variant == "rows",
                next_norm=chain and variant == "heads",
                pdl=pdl,
                pdl_trigger=pdl_trigger,
                row_maxnreg=row_maxnreg,
                gelu_poly=gelu_poly,
                fold_residual=fold_residual,
                one_launch=one_launch,
                weights_first=weights_first,
            ),
            gemm_precision=precision,
            attn_precision=precision,
        )
    return _result(out, ref, precision)


# --------------------------------------------------------------------------------------
# Polynomial attention
# --------------------------------------------------------------------------------------
def _run_polynomial(
    precision: str,
    exact_prefix: int,
    device: str,
    row_norm: bool = False,
    stats_first: bool = False,
    head_dim: int = 16,
) -> CheckResult:
    """Chunked polynomial attention on packed views vs its float64 dense reference."""
    from kernels.polynomial import polynomial_attention, polynomial_reference

    b, s, h, hd = 2, 45, 2, head_dim
    qkv = torch.randn(b, s, 3 * h * hd, generator=_generator())
    q, k, v = qkv.view(b, s, 3, h, hd).unbind(2)
    reference = polynomial_reference(
        q, k, v, causal=True, exact_prefix=exact_prefix, row_norm=row_norm
    )
    q_dev, k_dev, v_dev = qkv.to(device).view(b, s, 3, h, hd).unbind(2)
    out = polynomial_attention(
        q_dev,
        k_dev,
        v_dev,
        causal=True,
        chunk=16,
        exact_prefix=exact_prefix,
        precision=precision,
        block_m=16,
        block_n=16,
        exact_kwargs={"block_m": 16, "block_n": 16},
        row_norm=row_norm,
        stats_first=stats_first,
    )
    return _result(out, reference, precision)


def _run_polynomial_guard(device: str) -> CheckResult:
    """The guard keeps narrow scores polynomial and sends 10x wider ones to exact attention.

    Rows below 16 are exact (few keys: the s^3/6 weight error does not average out); the
    exact path runs in ieee (fp16 exact attention loses ~1e-2 at scores of ~30).
    """
    from kernels.attention import attention_reference
    from kernels.polynomial import guarded_attention

    b, s, h, hd = 2, 40, 2, 16
    gen = _generator()
    q, k, v = (torch.randn(b, s, h, hd, generator=gen) for _ in range(3))
    q, k = 0.3 * q, 0.3 * k
    results = []
    for widen, path in ((1.0, "polynomial"), (10.0, "exact")):
        qw, kw = widen * q, widen * k
        out, decision = guarded_attention(
            qw.to(device),
            kw.to(device),
            v.to(device),
            causal=True,
            threshold=1.0,
            chunk=16,
            exact_prefix=16,
            precision="fp16",
            exact_kwargs={"block_m": 16, "block_n": 16, "precision": "ieee"},
            polynomial_kwargs={"block_m": 16, "block_n": 16},
        )
        result = _result(out, attention_reference(qw, kw, v, causal=True), "fp16")
        if decision.path != path:
            result = CheckResult(False, result.max_abs_err, f"{decision} (expected {path})")
        results.append(result)
    return _combine(results)


def _compiled_on_hopper() -> bool:
    """Whether kernels run compiled on a CUDA GPU of compute capability 9.0 or newer."""
    from kernels._triton import interpreter_enabled

    return (
        not interpreter_enabled()
        and torch.cuda.is_available()
        and torch.cuda.get_device_capability() >= (9, 0)
    )


def iter_checks(reference: ReferenceFactory | None = None) -> Iterator[KernelCheck]:
    """Every kernel check, cheapest first within each family. The fused block is checked
    against ``reference`` (the project's model), and only when it is given."""
    hopper = _compiled_on_hopper() and torch.cuda.get_device_capability()[0] == 9
    for case in ATTENTION_CASES + (GLUON_ATTENTION_CASES if hopper else ()):
        yield KernelCheck(
            case.name,
            "fused attention vs fp32 reference",
            lambda device, c=case: _run_attention(c, device),
        )
    for case in LAYERNORM_CASES:
        yield KernelCheck(
            case.name,
            "residual add + LayerNorm vs torch",
            lambda device, c=case: _run_layernorm(c, device),
        )
    for dtype in (torch.float16, torch.bfloat16):
        yield KernelCheck(
            f"mantissa/round/37x41/{str(dtype).removeprefix('torch.')}",
            "q, k, v rounded to fewer mantissa bits in place vs the int32 reference",
            lambda device, dt=dtype: _run_mantissa(device, dt),
        )
        yield KernelCheck(
            f"mantissa/graded/2x37x41/{str(dtype).removeprefix('torch.')}",
            "q, k, v rounded by sequence position (attn_drop_bits_late) vs the int32 reference",
            lambda device, dt=dtype: _run_mantissa(device, dt, graded=True),
        )
    yield KernelCheck(
        "ffn/bias_gelu/B2-S37-N40", "bias + exact GELU epilogue vs torch", _run_bias_gelu
    )
    yield KernelCheck(
        "ffn/bias_gelu/B2-S37-N40/fp16-io",
        "bias + exact GELU epilogue on an fp16 GEMM output, in place, vs torch",
        lambda device: _run_bias_gelu(device, half=True),
    )
    # ieee: the block's TF32 products err ~2.5e-3 on an H200 (1 element of 832 over the
    # rule, docs/logs/h200_s3_kernels_check.log); no plan of the spaces runs it in TF32.
    blocks = (("ieee", ""), ("fp16", "padded"), ("fp16", "masked")) if reference else ()
    for precision, padding in blocks:
        yield KernelCheck(
            f"block/2-layers/B2-S13-D32-H2/{precision}" + (f"/{padding}" if padding else ""),
            "fused two-launch layers vs the reference model",
            lambda device, p=precision, pad=padding: _run_block(p, pad, device, reference),
        )
    layer_cases = (
        ("heads", "ieee", "", True),
        ("heads", "fp16", "padded", True),
        ("heads", "fp16", "masked", False),
        ("rows", "ieee", "masked", True),
        ("rows", "fp16", "padded", True),
        ("rows", "fp16", "masked-bounds", True),
        ("rows", "fp16", "masked-staged", True),
        ("heads", "ieee", "padded-staged", True),
        ("rows", "fp16", "masked-staged-f16", True),
        ("seq", "ieee", "masked", True),
        ("seq", "fp16", "padded-f16", True),
        ("seq", "fp16", "padded", True),
        ("rows", "fp16", "masked-bounds-post", True),
        ("rows", "ieee", "padded-staged-post", True),
        ("rows", "fp16", "post", False),
        ("rows", "fp16", "masked-staged-f16-post", True),
        ("rows", "fp16", "masked-bounds-chain", True),
        ("rows", "ieee", "padded-staged-chain", True),
        ("rows", "fp16", "chain", False),
        ("rows", "fp16", "masked-bounds-chain-nreg", True),
        ("heads", "fp16", "padded-staged-nreg", True),
        ("rows", "fp16", "masked-bounds-chain-gelu", True),
        ("heads", "fp16", "padded-staged-gelu", True),
        ("seq", "fp16", "padded-gelu", True),
        ("rows", "fp16", "masked-staged-f16-post-gelu", True),
        ("rows", "fp16", "masked-bounds-chain-gelu-fold", True),
        ("heads", "ieee", "padded-fold", True),
        ("rows", "fp16", "masked-staged-f16-fold", True),
        ("rows", "fp16", "fold", False),
        ("heads", "fp16", "masked-chain", True),
        ("heads", "ieee", "padded-staged-chain-gelu-fold", True),
        ("heads", "fp16", "chain", False),
        # the whole stack in one launch (session 35)
        ("heads", "fp16", "masked-chain-one", True),
        ("heads", "ieee", "padded-staged-chain-gelu-fold-one", True),
        ("heads", "fp16", "chain-one", False),
        # each program's weight tiles loaded first (session 36)
        ("heads", "fp16", "masked-chain-fold-wf", True),
        ("heads", "ieee", "padded-staged-gelu-wf", True),
        ("heads", "fp16", "wf", False),
    )
    if _compiled_on_hopper():  # programmatic dependent launch: compiled, sm_90+ only
        layer_cases += (
            ("heads", "fp16", "padded-pdl", True),
            ("rows", "fp16", "masked-bounds-chain-pdl", True),
            ("rows", "ieee", "padded-staged-pdl", True),
            ("heads", "fp16", "padded-pdlend", True),
            ("rows", "fp16", "masked-bounds-chain-pdlend", True),
            ("heads", "fp16", "padded-chain-pdl", True),
            # the Gluon post rows (session 28): Hopper's wgmma, compiled only
            ("rows", "fp16", "masked-gluon", True),
            ("rows", "fp16", "padded-chain-gluon8", True),
            ("rows", "fp16", "chain-gluon", False),
            ("heads", "fp16", "padded-chain-gluon", True),
            # the Gluon heads attention (session 29), with the Triton and the Gluon post rows
            ("heads", "fp16", "masked-gheads", True),
            ("heads", "fp16", "padded-chain-gheads", True),
            ("heads", "fp16", "padded-chain-gluon-gheads", True),
            ("heads", "fp16", "gheads", False),
            ("heads", "fp16", "masked-chain-gluon-gheads8", True),
            ("heads", "fp16", "padded-chain-pdl-wf", True),
            ("heads", "fp16", "masked-chain-pdlend-gelu-fold-wf", True),
        )
    for variant, precision, padding, causal in layer_cases if reference else ():
        dims = "D40-H5"
        if "gluon" in padding or "gheads" in padding:
            dims = "D64-H8" if padding.endswith("gheads8") else "D64-H4"
        name = f"layer/{variant}/2-layers/B3-S21-{dims}/{precision}" + (
            f"/{padding}" if padding else ""
        )
        yield KernelCheck(
            name + ("" if causal else "/noncausal"),
            f"fused layers ({variant}) vs the reference model",
            lambda device, v=variant, p=precision, pad=padding, c=causal: _run_layer(
                v, p, pad, c, device, reference
            ),
        )
    for case in LINEAR_CASES:
        yield KernelCheck(
            case.name,
            "Triton GEMM + bias (+ exact GELU) vs torch",
            lambda device, c=case: _run_linear(c, device),
        )
    for precision, exact_prefix, row_norm in (
        ("fp16", 0, False),
        ("ieee", 7, False),
        ("fp16", 0, True),
        ("ieee", 7, True),
    ):
        suffix = f"-exact{exact_prefix}" if exact_prefix else ""
        suffix += "-rownorm" if row_norm else ""
        yield KernelCheck(
            f"polynomial/B2-S45-H2-hd16-c16{suffix}/{precision}",
            "chunked polynomial attention vs float64 reference"
            + (" (row-normalised weights)" if row_norm else ""),
            lambda device, p=precision, n=exact_prefix, r=row_norm: _run_polynomial(
                p, n, device, r
            ),
        )
    # Row statistics first (one accumulator): head dims 16 (two feature tiles) and 20 (32
    # padded: four tiles, the padded columns' features zero).
    for precision, exact_prefix, hd in (("fp16", 0, 16), ("ieee", 7, 16), ("ieee", 0, 20)):
        suffix = f"-exact{exact_prefix}" if exact_prefix else ""
        yield KernelCheck(
            f"polynomial/B2-S45-H2-hd{hd}-c16{suffix}-rownorm-statsfirst/{precision}",
            "chunked polynomial attention, row statistics before the prefix dots, vs float64",
            lambda device, p=precision, n=exact_prefix, d=hd: _run_polynomial(
                p, n, device, True, True, d
            ),
        )
    yield KernelCheck(
        "polynomial/guard/B2-S40-H2-hd16/fp16",
        "score-spread guard picks polynomial / exact; output vs exact attention",
        _run_polynomial_guard,
    )
