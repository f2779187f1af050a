"""The whole forward of a pre-norm stack in one launch (issue 17: the tiniest shapes).

At B = 1-4 the heads variant (``kernels.layer``) runs each layer as two launches of 2-64
programs, each a few microseconds of dependent work. Here one launch runs every phase, no
launch between layers. Measured on an H100 (session 35, ``docs/kernels_h200.md``) it is
slower than the two launches a layer on every heads case: a replayed graph's kernel
boundary costs about 0.4 us, a grid barrier here about 1 us (case 2: 59.1 against 52.6 us a
forward). The plan knob ``one_launch`` keeps it searchable.

The launch:

  grid ``min(max(H * cdiv(S, BLOCK_M) * B, cdiv(B*S, BLOCK_R)), multiprocessors)``
  persistent programs (1 under the interpreter, which runs programs one after another),
  each looping over the work items of a phase with a stride of the grid:

  1. layer 1's heads attention (``_heads_attention_program``: LayerNorm1 inside);
  2. for each layer but the last: its post rows (``_post_rows_program`` with NEXT_NORM:
     the next layer's LayerNorm1 rows into ``normed``), then the next layer's heads
     attention reading them;
  3. the last layer's post rows with the final LayerNorm.

Between phases a grid-wide barrier: each program, after a CTA barrier, adds 1 to a
counter in global memory (release, GPU scope) and spins until it reaches the phase's
count (acquire); the last program to leave resets the counters for the next launch. Every
program is resident at once (at most one a multiprocessor, and a cooperative launch: the
driver refuses a grid that cannot all be resident), so the spin ends. Each layer's context
and LayerNorm1 rows go to their own slice of ``[L, B, S, D]`` buffers: no address is
written twice in a launch. The post rows of a block of rows read and write only those rows
of ``out`` (layer 1 reads ``x``).

The same arithmetic as the two launches a layer (the same jit functions, inlined), with
one ``num_warps`` (``max(num_warps, row_warps)``) and ``num_stages`` for both phases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernels import _triton
from kernels._common import padded_dim
from kernels._triton import check_launch_device, is_interpreted
from kernels.block import _check_norm, _check_x, _mask_bytes, _output_buffer
from kernels.layer import (
    _DTYPES,
    LAYERNORM_EPS,
    LOG2_E,
    LayerWeights,
    Tiling,
    _config_errors,
    _heads_attention_program,
    _post_rows_program,
    ffn_chunk,
    k_chunk,
)

__all__ = ["StackedLayers", "stack_forward", "stack_grid", "stack_layers"]

OFFLINE_SMS = 132  # an offline compile (kernels._triton.OFFLINE_ARCH) launches nothing


@dataclasses.dataclass(frozen=True)
class StackedLayers:
    """Every layer's parameters in ``[L, ...]`` tensors (a layer's at a fixed stride), made
    once from the per-layer weights, and the launch's two barrier counters (int32, zero
    between launches). One forward at a time may use a stack: its counters are shared."""

    layers: tuple[LayerWeights, ...]
    norm1: torch.Tensor  # [L, 2, D] fp32: weight, bias
    qkv_weight: torch.Tensor  # [L, 3D, D] GEMM operand dtype
    qkv_bias: torch.Tensor  # [L, 3D] fp32
    o_weight: torch.Tensor  # [L, D, D]
    o_bias: torch.Tensor  # [L, D]
    norm2: torch.Tensor  # [L, 2, D]
    ffn_in_weight: torch.Tensor  # [L, F, D]
    ffn_in_bias: torch.Tensor  # [L, F]
    ffn_out_weight: torch.Tensor  # [L, D, F]
    ffn_out_bias: torch.Tensor  # [L, D]
    counters: torch.Tensor  # [2] int32: arrivals, departures


def stack_layers(layers: Sequence[LayerWeights]) -> StackedLayers:
    """The ``[L, ...]`` copies of ``layers`` (``prepare_layer_weights`` results of one
    precision and shape) that the one-launch kernel reads; a weight changed in place after
    this is not seen: stack again."""
    if len(layers) == 0:
        raise ValueError("layers is empty; pass at least one LayerWeights")
    for i, w in enumerate(layers):
        if not isinstance(w, LayerWeights):
            raise ValueError(
                f"layers[{i}] is a {type(w).__name__}; pass prepare_layer_weights(...) results"
            )
        first = layers[0]
        if (w.d_model, w.ffn_dim, w.qkv_weight.dtype) != (
            first.d_model,
            first.ffn_dim,
            first.qkv_weight.dtype,
        ):
            raise ValueError(
                f"layers[{i}] has d_model={w.d_model}, ffn_dim={w.ffn_dim}, "
                f"{w.qkv_weight.dtype} weights; layers[0] has {first.d_model}, "
                f"{first.ffn_dim}, {first.qkv_weight.dtype}: stack layers of one shape"
            )

    def stacked(*tensors: torch.Tensor) -> torch.Tensor:
        return torch.stack([t.contiguous() for t in tensors]).contiguous()

    fp = [w.fp32 for w in layers]
    return StackedLayers(
        layers=tuple(layers),
        norm1=stacked(*(torch.stack([f.norm1_weight, f.norm1_bias]) for f in fp)),
        qkv_weight=stacked(*(w.qkv_weight for w in layers)),
        qkv_bias=stacked(*(w.qkv_bias for w in layers)),
        o_weight=stacked(*(w.o_weight for w in layers)),
        o_bias=stacked(*(f.o_bias for f in fp)),
        norm2=stacked(*(torch.stack([f.norm2_weight, f.norm2_bias]) for f in fp)),
        ffn_in_weight=stacked(*(w.ffn_in_weight for w in layers)),
        ffn_in_bias=stacked(*(f.ffn_in_bias for f in fp)),
        ffn_out_weight=stacked(*(w.ffn_out_weight for w in layers)),
        ffn_out_bias=stacked(*(f.ffn_out_bias for f in fp)),
        counters=torch.zeros(2, dtype=torch.int32, device=layers[0].qkv_weight.device),
    )


@triton.jit
def _grid_sync(counters_ptr, target):
    """Every program of the grid waits here until ``target`` arrivals are counted: this
    CTA's stores before it are visible to every program's loads after it."""
    tl.debug_barrier()  # the CTA's stores are done before its one arrival
    tl.atomic_add(counters_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(counters_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(counters_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()  # no thread of the CTA loads before the acquire


@triton.jit
def _stack_kernel(
    x_ptr, out_ptr, ctx_ptr, normed_ptr, key_mask_ptr, counters_ptr,
    n1_ptr, wqkv_ptr, bqkv_ptr, wo_ptr, bo_ptr, n2_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr,
    nfw_ptr, nfb_ptr,
    batch, seq_len, d_model, head_dim, ffn_dim, num_layers, num_heads, num_q_blocks,
    qk_scale, eps,
    CAUSAL: tl.constexpr, HAS_KEY_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_HD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_F: tl.constexpr, BLOCK_QKV: tl.constexpr,
    PREC_G: tl.constexpr, PREC_A: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr,
    STAGE_RESIDUAL: tl.constexpr, GELU_POLY: tl.constexpr, FOLD_RESIDUAL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    per_seq = num_heads * num_q_blocks
    num_attn = per_seq * batch
    num_rows = batch * seq_len
    num_row_blocks = tl.cdiv(num_rows, BLOCK_R)
    # Strides of a layer in the [L, ...] buffers and weights, int64: L * B * S * D may pass
    # 2**31 where one layer's offsets do not.
    tokens = tl.cast(num_rows, tl.int64) * d_model  # elements of one [B, S, D] buffer
    dd = tl.cast(d_model, tl.int64) * d_model
    d_f = tl.cast(d_model, tl.int64) * ffn_dim
    # Layer 1's heads attention, LayerNorm1 of x inside.
    for item in range(pid, num_attn, nprog):
        _heads_attention_program(
            item % per_seq, (item // per_seq).to(tl.int64), x_ptr, ctx_ptr, key_mask_ptr,
            n1_ptr, n1_ptr + d_model, wqkv_ptr, bqkv_ptr, wqkv_ptr + dd, bqkv_ptr + d_model,
            wqkv_ptr + 2 * dd, bqkv_ptr + 2 * d_model, x_ptr, seq_len, d_model, head_dim,
            num_q_blocks, qk_scale, eps, CAUSAL, HAS_KEY_MASK, BLOCK_M, BLOCK_N, BLOCK_D,
            BLOCK_HD, PREC_G, PREC_A, EMULATE_BF16_DOT, False,
        )  # fmt: skip
    phases = 1
    _grid_sync(counters_ptr, phases * nprog)
    for layer in range(num_layers - 1):
        # This layer's post rows, writing the next layer's LayerNorm1 rows; then the next
        # layer's heads attention on them.
        src = tl.where(layer == 0, x_ptr, out_ptr)
        nxt = layer + 1
        for item in range(pid, num_row_blocks, nprog):
            _post_rows_program(
                item, src, ctx_ptr + layer * tokens, out_ptr, key_mask_ptr,
                wo_ptr + layer * dd, bo_ptr + layer * d_model, n2_ptr + layer * 2 * d_model,
                n2_ptr + (layer * 2 + 1) * d_model, w1_ptr + layer * d_f,
                b1_ptr + layer * ffn_dim, w2_ptr + layer * d_f, b2_ptr + layer * d_model,
                nfw_ptr, nfb_ptr, out_ptr, n1_ptr + nxt * 2 * d_model,
                n1_ptr + (nxt * 2 + 1) * d_model, wqkv_ptr, bqkv_ptr,
                normed_ptr + layer * tokens, num_rows, d_model, ffn_dim, eps, HAS_KEY_MASK,
                False, BLOCK_R, BLOCK_D, BLOCK_K, BLOCK_F, PREC_G, EMULATE_BF16_DOT,
                STAGE_RESIDUAL, GELU_POLY, False, BLOCK_QKV, FOLD_RESIDUAL, True,
            )  # fmt: skip
        phases += 1
        _grid_sync(counters_ptr, phases * nprog)
        wqkv = wqkv_ptr + nxt * 3 * dd
        bqkv = bqkv_ptr + nxt * 3 * d_model
        for item in range(pid, num_attn, nprog):
            _heads_attention_program(
                item % per_seq, (item // per_seq).to(tl.int64), x_ptr,
                ctx_ptr + nxt * tokens, key_mask_ptr, n1_ptr, n1_ptr, wqkv, bqkv, wqkv + dd,
                bqkv + d_model, wqkv + 2 * dd, bqkv + 2 * d_model, normed_ptr + layer * tokens,
                seq_len, d_model, head_dim, num_q_blocks, qk_scale, eps, CAUSAL,
                HAS_KEY_MASK, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_HD, PREC_G, PREC_A,
                EMULATE_BF16_DOT, True,
            )  # fmt: skip
        phases += 1
        _grid_sync(counters_ptr, phases * nprog)
    # The last layer's post rows and the final LayerNorm.
    last = num_layers - 1
    src = tl.where(last == 0, x_ptr, out_ptr)
    for item in range(pid, num_row_blocks, nprog):
        _post_rows_program(
            item, src, ctx_ptr + last * tokens, out_ptr, key_mask_ptr, wo_ptr + last * dd,
            bo_ptr + last * d_model, n2_ptr + last * 2 * d_model,
            n2_ptr + (last * 2 + 1) * d_model, w1_ptr + last * d_f, b1_ptr + last * ffn_dim,
            w2_ptr + last * d_f, b2_ptr + last * d_model, nfw_ptr, nfb_ptr, out_ptr, n1_ptr,
            n1_ptr, wqkv_ptr, bqkv_ptr, out_ptr, num_rows, d_model, ffn_dim, eps,
            HAS_KEY_MASK, True, BLOCK_R, BLOCK_D, BLOCK_K, BLOCK_F, PREC_G, EMULATE_BF16_DOT,
            STAGE_RESIDUAL, GELU_POLY, False, BLOCK_QKV, FOLD_RESIDUAL, False,
        )  # fmt: skip
    # The last program out resets the counters for the next launch: every other program
    # has passed its last barrier by then.
    left = tl.atomic_add(counters_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if left == nprog - 1:
        tl.atomic_xchg(counters_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(counters_ptr + 1, 0, sem="relaxed", scope="gpu")


def stack_grid(
    batch: int, seq_len: int, num_heads: int, tiling: Tiling, device: torch.device
) -> int:
    """Programs of the one launch: enough for the larger phase, at most one a
    multiprocessor (every program must be resident for the barriers); one under the
    interpreter (it runs programs one after another: a barrier would wait forever)."""
    if is_interpreted(_stack_kernel):
        return 1
    work = max(
        num_heads * triton.cdiv(seq_len, tiling.block_m) * batch,
        triton.cdiv(batch * seq_len, tiling.row_block),
    )
    if _triton.OFFLINE_ARCH is not None:
        sms = OFFLINE_SMS
    else:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(work, sms))


def _cooperative() -> dict[str, bool]:
    """A cooperative launch where the kernels are compiled: the driver runs every program
    at once or refuses the launch (an error, not a barrier that never opens when other
    work holds multiprocessors). The interpreter runs one program and takes no such
    option."""
    return {} if is_interpreted(_stack_kernel) else {"launch_cooperative_grid": True}


def stack_forward(
    x: torch.Tensor,
    stacked: StackedLayers,
    final_norm: tuple[torch.Tensor, torch.Tensor],
    *,
    num_heads: int,
    causal: bool,
    key_mask: torch.Tensor | None = None,
    tiling: Tiling,
    gemm_precision: str = "fp16",
    attn_precision: str = "fp16",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``layer_stack(x, stacked.layers, final_norm, variant="heads", ...)`` in one launch
    (``tiling.one_launch`` and ``tiling.next_norm`` set); ``x [B, S, D]`` fp32 contiguous
    is never written. Working memory: the output, the contexts and LayerNorm1 rows of
    every layer (``[L, B, S, D]`` in the GEMM operand dtype)."""
    _check_x(x)
    if not isinstance(stacked, StackedLayers):
        raise ValueError(
            f"stacked is a {type(stacked).__name__}; pass stack_layers(prepare_layer_weights...)"
        )
    batch, seq_len, d_model = x.shape
    first = stacked.layers[0]
    want = _DTYPES.get(gemm_precision, torch.float32)
    if first.d_model != d_model or first.qkv_weight.dtype != want:
        raise ValueError(
            f"stacked holds d_model={first.d_model}, {first.qkv_weight.dtype} weights; x has "
            f"{d_model} features and gemm_precision={gemm_precision!r} reads {want}: stack "
            "the matching layers"
        )
    _check_norm(final_norm, d_model)
    if not (tiling.one_launch and tiling.next_norm):
        raise ValueError(
            "stack_forward runs tiling.one_launch with tiling.next_norm; set both (or call "
            "kernels.layer.layer_stack)"
        )
    errors = _config_errors(
        variant="heads",
        seq_len=seq_len,
        d_model=d_model,
        num_heads=num_heads,
        ffn_dim=first.ffn_dim,
        tiling=tiling,
        gemm_precision=gemm_precision,
        attn_precision=attn_precision,
    )
    if errors:
        raise ValueError("; ".join(errors))
    mask_bytes = None if key_mask is None else _mask_bytes(key_mask, batch, seq_len)
    out = _output_buffer(out, x, "x is never written")
    tensors = {"x": x, "out": out, "weights": stacked.qkv_weight}
    if mask_bytes is not None:
        tensors["key_mask"] = mask_bytes
    check_launch_device(_stack_kernel, tensors)
    if x.numel() == 0:
        return out
    layers = len(stacked.layers)
    half = _DTYPES.get(gemm_precision, torch.float32)
    ctx = torch.empty((layers, *x.shape), device=x.device, dtype=half)
    normed = torch.empty((max(layers - 1, 1), *x.shape), device=x.device, dtype=half)
    head_dim = d_model // num_heads
    block_d = padded_dim(d_model)
    s = stacked
    _stack_kernel[(stack_grid(batch, seq_len, num_heads, tiling, x.device),)](
        x, out, ctx, normed, mask_bytes if mask_bytes is not None else x, s.counters,
        s.norm1, s.qkv_weight, s.qkv_bias, s.o_weight, s.o_bias, s.norm2, s.ffn_in_weight,
        s.ffn_in_bias, s.ffn_out_weight, s.ffn_out_bias, final_norm[0], final_norm[1],
        batch, seq_len, d_model, head_dim, first.ffn_dim, layers, num_heads,
        triton.cdiv(seq_len, tiling.block_m), head_dim**-0.5 * LOG2_E, LAYERNORM_EPS,
        CAUSAL=bool(causal), HAS_KEY_MASK=mask_bytes is not None, BLOCK_M=tiling.block_m,
        BLOCK_N=tiling.block_n, BLOCK_D=block_d, BLOCK_HD=padded_dim(head_dim),
        BLOCK_R=tiling.row_block, BLOCK_K=k_chunk(d_model),
        BLOCK_F=ffn_chunk(d_model, first.ffn_dim, tiling.ffn_block),
        BLOCK_QKV=min(block_d, 64), PREC_G=gemm_precision, PREC_A=attn_precision,
        EMULATE_BF16_DOT=is_interpreted(_stack_kernel), STAGE_RESIDUAL=tiling.stage_residual,
        GELU_POLY=tiling.gelu_poly, FOLD_RESIDUAL=tiling.fold_residual,
        num_warps=max(tiling.num_warps, tiling.row_warps), num_stages=tiling.num_stages,
        **_cooperative(),
    )  # fmt: skip
    return out
