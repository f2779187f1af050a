"""Pre-norm layers in two or three Triton launches for any batch size (issue 17).

The fused block (``kernels.block``) runs a sequence's heads one after another in one
program and recomputes LayerNorm1, K and V per head and per query block: at B=1 four
programs carry a whole layer, at B=10000 the recomputation is most of the work. Here the
work is split where it parallelises:

``heads`` (two launches a layer, ``seq_len <= 256``):
  A. grid ``(H * cdiv(S, BLOCK_M), B)``: one (query block, head, sequence) per program.
     LayerNorm1 of its query rows and that head's ``q``; for every key block it needs
     (keys ``<=`` its last row when causal) LayerNorm1 of the key rows and the head's
     ``k``, ``v`` (recomputed per query block: not at all with ``BLOCK_M >= S``); online
     softmax in fp32 (``exp2`` with the scale folded in after the product); the context
     rows of its head written to ``ctx [B, S, D]`` (fp16 when the GEMM operands are fp16).
  B. :func:`post rows <_post_rows_kernel>`, grid ``cdiv(B*S, BLOCK_R)``: ``ctx @ Wo^T + bo``
     with padded rows zeroed, ``+ x``; LayerNorm2; ``GELU_erf(h @ W1^T + b1) @ W2^T + b2``
     over the FFN dim in chunks; ``+`` residual; padded rows zeroed; the final LayerNorm
     (padded rows zeroed again) in the last layer. Each program reads and writes only its
     own rows, so it runs in place on the residual stream.

``seq`` (one launch a layer, ``seq_len <= 128``, ``d_model <= 128``):
  grid ``(cdiv(S, BLOCK_M), B)``: one block of query rows of one sequence per program, every
  head in turn. LayerNorm1 of the keys the block needs (all of them in one tile: no online
  softmax, no K/V recomputation across key blocks) and of its query rows; per head ``q``,
  ``k``, ``v``, the scores, a one-pass softmax in fp32, ``p @ v`` and that head's share of
  the output projection ``ctx_h @ Wo[:, head]^T`` accumulated in fp32; then ``+ bo``,
  residual, LayerNorm2, FFN in chunks, residual, row zeroing and the final LayerNorm in
  the last layer, as the post-rows kernel does. The residual stream goes through memory
  once per layer (read and written once). With one query block per sequence
  (``BLOCK_M >= S``) a program reads only its own sequence and runs in place; otherwise
  layers alternate between two buffers (programs of one sequence read each other's rows).

``rows`` (three launches a layer, any sequence length):
  A1. qkv rows, grid ``cdiv(B*S, BLOCK_R)``: LayerNorm1 and the three projections into a
      packed ``[B, S, 3, H, hd]`` buffer (the attention operand dtype);
  A2. :func:`kernels.attention.attention` (flash, any mask on the device) into ``ctx``
      (fp16 when the GEMM operands are fp16);
  B.  post rows, as above.
  With ``Tiling.attn_post`` A2 and B are one kernel (two launches a layer), grid
  ``(cdiv(S, BLOCK_M), B)``: a program runs every head's flash attention for its query
  rows in turn, adds each head's share of the output projection (``ctx_h @ Wo[:, h]^T``,
  the context rounded once to the GEMM operand type, as the stored context is) into one
  fp32 accumulator, then the post-rows work on those rows (``attn_block_m`` rows,
  ``attn_warps``). No context buffer: the context never leaves the program.
  With ``Tiling.next_qkv`` B also runs A1 of the next layer on the rows it has just
  written (LayerNorm1 and the three projections of the layer after it, from the rows
  still in its registers): A1 launches once a forward, for the first layer, and the
  residual stream is read once a layer fewer (two launches a layer and one).

Arithmetic follows shared/REFERENCE.md ("Model"): LayerNorm (biased variance, eps 1e-5),
softmax state, GELU and the residual stream are fp32; the dot operands follow
``gemm_precision`` (projections, FFN) and ``attn_precision`` (``q k^T``, ``p v``):
``ieee`` / ``tf32`` / ``tf32x3`` fp32 operands, or ``fp16`` / ``bf16`` operands with fp32
accumulation. The weight matrices are read in the GEMM operand dtype
(:func:`prepare_layer_weights` converts them once per weight version).

The token mask (``[B, S]`` bool, any pattern) is read on the device: keys masked, padded
rows of the attention output and of each layer's output zeroed, exactly the reference.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kernels import _triton, gluon_heads, gluon_rows
from kernels import attention as flash
from kernels._common import (
    MAX_FUSED_ROW_TILE,
    MAX_SEQ_ROW_TILE,
    MIN_BLOCK,
    check_int32_offsets,
    fused_row_tile_reasons,
    gdc_mode,
    grid_dependency_enter,
    grid_dependency_exit,
    maxnreg_errors,
    maxnreg_launch,
    padded_dim,
    pdl_launch,
    pdl_reasons,
)
from kernels._precision import (
    HALF_PRECISIONS,
    check_precision,
    dot,
    launch_reasons,
    precision_reasons,
    to_operand,
)
from kernels._triton import (
    SUPPORTED_NUM_WARPS,
    check_launch_device,
    is_interpreted,
    is_power_of_2,
)
from kernels.attention import _attention_rows
from kernels.block import (
    BlockWeights,
    _check_norm,
    _check_x,
    _ffn_of_rows,
    _head_projection,
    _head_projection_of,
    _head_weight,
    _layernorm_rows,
    _mask_bytes,
    _online_softmax_step,
    _output_buffer,
    _w1_tile,
    _w2_tile,
)

LAYERNORM_EPS = 1e-5
LOG2_E = math.log2(math.e)
VARIANTS = ("heads", "rows", "seq")
MAX_HEADS_SEQ_LEN = 256  # heads: K/V recomputed per query block grows like S**2 / BLOCK_M
MAX_D_MODEL = 256  # the row kernels hold whole rows of the residual stream
# seq: every key of a sequence in one tile, beside a block of query rows and a whole-row
# fp32 accumulator of the output projection, in registers.
MAX_SEQ_SEQ_LEN = 128
MAX_SEQ_D_MODEL = 128
# weights_first: the post rows hold Wo, W1 and W2 whole (Triton 3.6 keeps them in shared
# memory: 96 KiB at 128).
MAX_WEIGHTS_FIRST = 128
MIN_HEAD_DIM = 8
MAX_HEADS_HEAD_DIM = 128
ROW_PRECISIONS = ("ieee", "tf32", "tf32x3", "fp16", "bf16")
DEFAULT_SMEM_LIMIT = 200 * 1024
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

__all__ = [
    "LayerWeights",
    "Tiling",
    "estimate_shared_memory_bytes",
    "layer_stack",
    "not_supported_reasons",
    "prepare_layer_weights",
]


# --------------------------------------------------------------------------------------
# Weights and settings
# --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """One layer for these kernels: LayerNorm parameters and biases fp32; the six weight
    matrices contiguous ``[out, in]`` in the GEMM operand dtype (fp16/bf16, or fp32). The
    QKV weights are row blocks of one packed ``[3 d_model, d_model]`` matrix (``qkv_weight``,
    its fp32 bias ``qkv_bias``): the row kernels project all three in one loop."""

    fp32: BlockWeights
    q_weight: torch.Tensor
    k_weight: torch.Tensor
    v_weight: torch.Tensor
    o_weight: torch.Tensor
    ffn_in_weight: torch.Tensor
    ffn_out_weight: torch.Tensor
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor

    @property
    def d_model(self) -> int:
        return self.fp32.d_model

    @property
    def ffn_dim(self) -> int:
        return self.fp32.ffn_dim


def prepare_layer_weights(weights: BlockWeights, gemm_precision: str) -> LayerWeights:
    """The weight matrices in the operand dtype of ``gemm_precision``, made once (not per
    call): half operands halve the bytes every program reads from L2."""
    check_precision(gemm_precision)
    weights.check()
    dtype = _DTYPES.get(gemm_precision, torch.float32)
    w = weights
    qkv = torch.cat([w.q_weight, w.k_weight, w.v_weight]).to(dtype).contiguous()
    d = w.d_model
    return LayerWeights(
        weights,
        q_weight=qkv[:d],  # views: contiguous row blocks of the packed matrix
        k_weight=qkv[d : 2 * d],
        v_weight=qkv[2 * d :],
        o_weight=w.o_weight.to(dtype).contiguous(),
        ffn_in_weight=w.ffn_in_weight.to(dtype).contiguous(),
        ffn_out_weight=w.ffn_out_weight.to(dtype).contiguous(),
        qkv_weight=qkv,
        qkv_bias=torch.cat([w.q_bias, w.k_bias, w.v_bias]).contiguous(),
    )


@dataclasses.dataclass(frozen=True)
class Tiling:
    """Launch settings: the attention's query rows / keys per step / warps / stages, and
    the row kernels' rows per program and warps."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    row_block: int = 32
    row_warps: int = 4
    # rows: the flash attention takes key_mask_bounds (computed once per forward) when
    # there is a key mask: no mask work inside each sequence's all-valid prefix.
    mask_bounds: bool = False
    # post rows (heads, rows): the residual ``x + attention`` is stored to the output rows
    # before the FFN and read back after it, instead of held in registers across the FFN's
    # GEMMs (a [row_block, d_model] fp32 tile fewer live: the same result, bit for bit).
    stage_residual: bool = False
    # post rows (heads, rows; not attn_post): the output projection accumulates onto
    # ``x + bo`` instead of onto zeros with ``x`` added after it: the residual's load is
    # issued before the projection's loop, not after it. The same output, its sums in
    # another order (fp32 rounding apart; padded tokens' rows differ until the layer's end
    # zeroes them). (Folding ``x1 + b2`` into the FFN's accumulator too spilled 72-128 bytes
    # a thread offline, Triton 3.6.)
    fold_residual: bool = False
    # post rows (heads, rows) and seq: the FFN columns one step handles (BLOCK_F; 0: the
    # default of ``ffn_chunk``). Fewer columns, fewer live registers a step (the FFN's
    # hidden tile and both weight tiles), more steps; sums in another order.
    ffn_block: int = 0
    # heads, rows, seq: the FFN's GELU as ``kernels._common.gelu_poly`` (v * sigmoid of an
    # odd polynomial: one exp2 and a fast division, within 2.6e-5 of the erf GELU, 40x
    # under the fp16 rounding of its output) instead of the erf GELU (libdevice erf).
    gelu_poly: bool = False
    # heads, rows: the most registers a thread of the row kernels (qkv rows, post rows) may
    # hold, ptxas's maxnreg (0: the compiler's choice). Fewer registers, more programs
    # resident to hide latency; too few spill. The same arithmetic.
    row_maxnreg: int = 0
    # rows (without attn_post): the most registers a thread of the flash attention kernel
    # may hold (ptxas's maxnreg; 0: the compiler's choice). The same arithmetic.
    attn_maxnreg: int = 0
    # rows (without attn_post): the flash attention kernel's one-tile form, every key in one
    # tile (S <= 256) and the head dim in chunks of this width (``kernels.attention``'s
    # ``head_chunk``; 0: the flash form). An exact softmax instead of the online one.
    attn_head_chunk: int = 0
    # rows: software pipeline stages of the QKV rows kernel (0: Triton's default, 3); fewer
    # stages hold less shared memory a program (more programs an SM). The same arithmetic.
    qkv_stages: int = 0
    # rows: the flash attention and the post-rows kernel as one kernel (two launches a
    # layer): a program per (query block, sequence) runs every head in turn, accumulates
    # the output projection and goes on to the FFN of its rows (attn_block_m rows,
    # attn_warps); no context buffer.
    attn_post: bool = False
    # rows: the post-rows kernel of each layer but the last also computes the next layer's
    # LayerNorm1 and QKV projections from the rows it has just written (still in its
    # registers), so the qkv-rows kernel runs once a forward (the first layer) and the
    # residual stream is not read again for it. The same arithmetic on the same values
    # (bit for bit under the interpreter; compiled, the LayerNorm may sum in another order).
    next_qkv: bool = False
    # heads: the post-rows kernel of each layer but the last also writes the next layer's
    # LayerNorm1 of the rows it has just written (still in its registers), as the GEMM's
    # operand type, into a [B, S, D] buffer; the next layer's heads attention loads those
    # rows instead of the fp32 residual stream, with no LayerNorm of its own (every program
    # normalised up to S key rows and its query rows again, a chain of reductions before its
    # first projection). The same arithmetic on the same values (compiled, the LayerNorm
    # may sum in another order).
    next_norm: bool = False
    # heads, rows (without attn_post): every kernel of the stack is launched with
    # programmatic dependent launch (Hopper+): the next kernel's launch overlaps this one's
    # tail; each waits for its predecessor to finish before its first load. The same
    # arithmetic; CUDA only (the interpreter has no grid dependency control).
    pdl: bool = False
    # heads, rows (without attn_post): the post-rows kernel (and rows' QKV rows kernel) in
    # Gluon for Hopper (``kernels.gluon_rows``): persistent programs with the layer's
    # weights resident in shared memory, each GEMM one wgmma, the next tile's context
    # copied in during this tile's FFN. fp16 operands, D = ffn_dim in 32/64/128, 4 or 8 row
    # warps; 64-row tiles (row_block unused). Sums in another order (the residual rides in
    # the accumulators); CUDA sm_90 only (no interpreter).
    gluon_post: bool = False
    # heads: the heads attention in Gluon for Hopper (``kernels.gluon_heads``) with this
    # many heads a program (0: the Triton kernel): persistent programs, each owning a group
    # of heads (their q, k, v weight rows resident in shared memory) and looping over
    # sequences; every key in one tile (S <= 64 a warpgroup of ``num_warps``), each GEMM one
    # wgmma. fp16 operands, d_model in 32/64/128, head dims 16-128 (8 in pairs: an even
    # number a program); block_m, block_n and num_stages unused. CUDA sm_90 only (no
    # interpreter).
    gluon_heads: int = 0
    # rows (without attn_post): the flash attention in Gluon for Hopper
    # (``kernels.gluon_flash``): each key block's softmax beside the previous block's
    # ``p @ v`` wgmma; 64 query rows a warpgroup of ``num_warps`` (block_m unused),
    # ``block_n`` 64 or 128 keys a step, ``num_stages`` 3 or 4 key and value buffers. fp16
    # attention precision, head dims 16-128; the same arithmetic as the Triton kernel's
    # fp16 form. CUDA sm_90 only (no interpreter).
    gluon_flash: bool = False
    # With pdl: where each kernel lets the next one launch, "start" (right after its own
    # wait: the next kernel's programs become resident and wait) or "end" (after its last
    # store: the next launch's latency overlaps this kernel's tail, nothing more).
    pdl_trigger: str = "start"
    # heads with next_norm: the whole forward in one launch (``kernels.stack``): persistent
    # programs, one a multiprocessor at most, run every layer's heads attention and post
    # rows as phases, a grid-wide barrier (a counter in global memory) between them; no
    # launch between layers. The same arithmetic as the two launches a layer; one
    # ``max(num_warps, row_warps)`` and ``num_stages`` for both phases.
    one_launch: bool = False
    # heads (the Triton kernels): each heads attention and post rows program loads its
    # weight tiles (the head's q, k, v; Wo, W1, W2 whole: the output projection and the FFN
    # in one step each) before anything else; with pdl before its wait for the previous
    # kernel, so the loads overlap that kernel's tail. The same arithmetic as one step each
    # (BLOCK_K = d_model, BLOCK_F = ffn_dim); padded d_model and ffn_dim <= 128.
    weights_first: bool = False

    def __post_init__(self) -> None:
        if self.pdl_trigger != "start" and not self.pdl:
            raise ValueError(
                f"tiling.pdl_trigger={self.pdl_trigger!r} needs tiling.pdl=True (it places "
                "the programmatic launch trigger); set pdl=True or leave the trigger 'start'"
            )
        gdc_mode(self.pdl, self.pdl_trigger)  # a trigger it knows
        if self.ffn_block and (self.ffn_block < 16 or self.ffn_block & (self.ffn_block - 1)):
            raise ValueError(
                f"tiling.ffn_block must be 0 or a power of two >= 16, got {self.ffn_block}"
            )
        chunk = self.attn_head_chunk
        if chunk and (chunk < 16 or chunk & (chunk - 1)):
            raise ValueError(
                f"tiling.attn_head_chunk must be 0 or a power of two >= 16, got {chunk}"
            )
        # 1-2 only: fewer stages than the default's 3 need less shared memory than the
        # estimate (sized for the default) allows; more would need their own model.
        if self.qkv_stages not in (0, 1, 2):
            raise ValueError(
                f"tiling.qkv_stages must be 0 (Triton's default, 3) or 1..2, got {self.qkv_stages}"
            )
        if self.gluon_heads < 0:
            raise ValueError(
                f"tiling.gluon_heads must be 0 (the Triton heads kernel) or the heads a Gluon "
                f"program runs (>= 1), got {self.gluon_heads}"
            )
        errors = maxnreg_errors("tiling.row_maxnreg", self.row_maxnreg)
        errors += maxnreg_errors("tiling.attn_maxnreg", self.attn_maxnreg)
        if errors:
            raise ValueError("; ".join(errors))


def ffn_chunk(d_model: int, ffn_dim: int, chosen: int = 0) -> int:
    """BLOCK_F: the FFN columns one step of the post-rows (or seq) kernel handles:
    ``chosen`` (a Tiling's ffn_block) if set, else 64, or 32 where d_model > 128."""
    return min(padded_dim(ffn_dim), chosen or (64 if padded_dim(d_model) <= 128 else 32))


def k_chunk(d_model: int) -> int:
    """BLOCK_K: the ctx columns one step of the output projection handles."""
    return min(padded_dim(d_model), 64)


# --------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------
@triton.jit
def _normed_rows(
    base, rows, row_ok, offs_d, d_ok, w_ptr, b_ptr, d_model, eps,
    PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """LayerNorm of rows ``rows`` of a ``[*, d_model]`` fp32 matrix at ``base``, as a dot
    operand of ``PRECISION`` (padded rows and columns read as 0)."""
    x = tl.load(
        base + rows[:, None] * d_model + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    return to_operand(
        _layernorm_rows(x, w_ptr, b_ptr, offs_d, d_ok, d_model, eps), PRECISION, EMULATE_BF16_DOT
    )


@triton.jit
def _operand_rows(
    base, rows, row_ok, offs_d, d_ok, d_model,
    PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """Rows ``rows`` of a ``[*, d_model]`` matrix that ``_store_operand_rows`` wrote, as
    the dot operands ``to_operand`` made of them (padded rows and columns read as 0)."""
    h = tl.load(
        base + rows[:, None] * d_model + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if PRECISION == "bf16" and EMULATE_BF16_DOT:  # the interpreter's: bf16-rounded fp32
        h = h.to(tl.float32)
    return h


@triton.jit
def _store_operand_rows(
    y, base, n1w_ptr, n1b_ptr, rows, row_ok, offs_d, d_ok, d_model, eps,
    PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """LayerNorm1 of fp32 rows ``y`` (padded columns 0) as dot operands of ``PRECISION``,
    stored to rows ``rows`` of the ``[*, d_model]`` matrix at ``base`` (its dtype: the
    operand's, fp32 for ieee / tf32): what ``_normed_rows`` makes of the same rows."""
    h = to_operand(
        _layernorm_rows(y, n1w_ptr, n1b_ptr, offs_d, d_ok, d_model, eps),
        PRECISION,
        EMULATE_BF16_DOT,
    )
    tl.store(
        base + rows[:, None] * d_model + offs_d[None, :],
        h.to(base.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


@triton.jit
def _heads_attention_program(
    pid,
    off_b,
    x_ptr,
    ctx_ptr,
    key_mask_ptr,
    n1w_ptr,
    n1b_ptr,
    wq_ptr,
    bq_ptr,
    wk_ptr,
    bk_ptr,
    wv_ptr,
    bv_ptr,
    normed_ptr,
    seq_len,
    d_model,
    head_dim,
    num_q_blocks,
    qk_scale,
    eps,
    CAUSAL: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_HD: tl.constexpr,
    PREC_G: tl.constexpr,
    PREC_A: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
    NORMED: tl.constexpr,
    PRELOAD: tl.constexpr = False,
    USE_GDC: tl.constexpr = 0,
):
    """One (query block, head, sequence): LayerNorm1 and the head's projections of its
    query rows and, per key block, of the key rows; the online softmax; the head's context.
    With ``NORMED`` the LayerNorm1 rows come ready from ``normed`` (the previous layer's
    post rows wrote them: ``next_norm``) and ``x``, ``n1w``, ``n1b`` are not read.
    ``pid`` is the (query block, head) index, ``off_b`` the sequence (int64): the kernel's
    grid, or a whole-forward program's work item (``kernels.stack``). With ``PRELOAD`` the
    head's q, k and v weight tiles are loaded first, then ``grid_dependency_enter(USE_GDC)``
    (with pdl, the wait for the previous kernel, whose outputs the rest reads; without
    ``PRELOAD`` the caller waits)."""
    head = pid // num_q_blocks
    # The last query blocks first: under causal masking they have the most key blocks.
    start_m = (num_q_blocks - 1 - pid % num_q_blocks) * BLOCK_M
    x_base = x_ptr + off_b * seq_len * d_model
    normed_base = normed_ptr + off_b * seq_len * d_model
    col0 = head * head_dim

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.arange(0, BLOCK_HD)
    d_ok = offs_d < d_model
    c_ok = offs_c < head_dim
    row_ok = offs_m < seq_len
    if PRELOAD:  # nothing writes the weights: loaded while the previous kernel finishes
        wq_t = _head_weight(wq_ptr, col0, offs_d, d_ok, offs_c, c_ok, d_model, PREC_G,
                            EMULATE_BF16_DOT)  # fmt: skip
        wk_t = _head_weight(wk_ptr, col0, offs_d, d_ok, offs_c, c_ok, d_model, PREC_G,
                            EMULATE_BF16_DOT)  # fmt: skip
        wv_t = _head_weight(wv_ptr, col0, offs_d, d_ok, offs_c, c_ok, d_model, PREC_G,
                            EMULATE_BF16_DOT)  # fmt: skip
        grid_dependency_enter(USE_GDC)

    if NORMED:
        h_q = _operand_rows(normed_base, offs_m, row_ok, offs_d, d_ok, d_model, PREC_G,
                            EMULATE_BF16_DOT)  # fmt: skip
    else:
        h_q = _normed_rows(
            x_base, offs_m, row_ok, offs_d, d_ok, n1w_ptr, n1b_ptr, d_model, eps, PREC_G,
            EMULATE_BF16_DOT,
        )  # fmt: skip
    if PRELOAD:
        q = _head_projection_of(h_q, wq_t, bq_ptr, col0, offs_c, c_ok, BLOCK_M, BLOCK_HD,
                                PREC_G, EMULATE_BF16_DOT)  # fmt: skip
    else:
        q = _head_projection(
            h_q, wq_ptr, bq_ptr, col0, offs_d, d_ok, offs_c, c_ok, d_model,
            BLOCK_M, BLOCK_HD, PREC_G, EMULATE_BF16_DOT,
        )  # fmt: skip
    q = to_operand(q, PREC_A, EMULATE_BF16_DOT)

    hi = seq_len
    if CAUSAL:
        hi = tl.minimum(seq_len, start_m + BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_HD], dtype=tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        key_in = offs_n < seq_len
        if NORMED:
            h_k = _operand_rows(normed_base, offs_n, key_in, offs_d, d_ok, d_model, PREC_G,
                                EMULATE_BF16_DOT)  # fmt: skip
        else:
            h_k = _normed_rows(
                x_base, offs_n, key_in, offs_d, d_ok, n1w_ptr, n1b_ptr, d_model, eps, PREC_G,
                EMULATE_BF16_DOT,
            )  # fmt: skip
        if PRELOAD:
            k = _head_projection_of(h_k, wk_t, bk_ptr, col0, offs_c, c_ok, BLOCK_N, BLOCK_HD,
                                    PREC_G, EMULATE_BF16_DOT)  # fmt: skip
            v = _head_projection_of(h_k, wv_t, bv_ptr, col0, offs_c, c_ok, BLOCK_N, BLOCK_HD,
                                    PREC_G, EMULATE_BF16_DOT)  # fmt: skip
        else:
            k = _head_projection(
                h_k, wk_ptr, bk_ptr, col0, offs_d, d_ok, offs_c, c_ok, d_model,
                BLOCK_N, BLOCK_HD, PREC_G, EMULATE_BF16_DOT,
            )  # fmt: skip
            v = _head_projection(
                h_k, wv_ptr, bv_ptr, col0, offs_d, d_ok, offs_c, c_ok, d_model,
                BLOCK_N, BLOCK_HD, PREC_G, EMULATE_BF16_DOT,
            )  # fmt: skip
        kt = to_operand(tl.trans(k), PREC_A, EMULATE_BF16_DOT)
        qk = dot(q, kt, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), PREC_A, EMULATE_BF16_DOT)
        qk = qk * qk_scale  # log2 domain: head_dim**-0.5 * log2(e), after the product
        valid = key_in[None, :]
        if HAS_KEY_MASK:  # any key may be masked: the mask's byte, read here
            key_ok = tl.load(key_mask_ptr + off_b * seq_len + offs_n, mask=key_in, other=0)
            valid = valid & (key_ok != 0)[None, :]
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None])
        m_i, l_i, acc = _online_softmax_step(qk, valid, m_i, l_i, acc, v, PREC_A, EMULATE_BF16_DOT)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # no valid key at all: context 0, not NaN
    ctx = acc / l_safe[:, None]
    tl.store(
        ctx_ptr + off_b * seq_len * d_model + offs_m[:, None] * d_model + (col0 + offs_c)[None, :],
        ctx.to(ctx_ptr.dtype.element_ty),
        mask=row_ok[:, None] & c_ok[None, :],
    )


@triton.jit
def _heads_attention_kernel(
    x_ptr,
    ctx_ptr,
    key_mask_ptr,
    n1w_ptr,
    n1b_ptr,
    wq_ptr,
    bq_ptr,
    wk_ptr,
    bk_ptr,
    wv_ptr,
    bv_ptr,
    normed_ptr,
    seq_len,
    d_model,
    head_dim,
    num_q_blocks,
    qk_scale,
    eps,
    CAUSAL: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_HD: tl.constexpr,
    PREC_G: tl.constexpr,
    PREC_A: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
    USE_GDC: tl.constexpr,
    NORMED: tl.constexpr,
    PRELOAD: tl.constexpr,
):
    """One (query block, head, sequence) a program: ``_heads_attention_program`` (which
    waits itself, after its weights' loads, with ``PRELOAD``)."""
    if not PRELOAD:
        grid_dependency_enter(USE_GDC)
    _heads_attention_program(
        tl.program_id(0), tl.program_id(1).to(tl.int64), x_ptr, ctx_ptr, key_mask_ptr,
        n1w_ptr, n1b_ptr, wq_ptr, bq_ptr, wk_ptr, bk_ptr, wv_ptr, bv_ptr, normed_ptr, seq_len,
        d_model, head_dim, num_q_blocks, qk_scale, eps, CAUSAL, HAS_KEY_MASK, BLOCK_M,
        BLOCK_N, BLOCK_D, BLOCK_HD, PREC_G, PREC_A, EMULATE_BF16_DOT, NORMED, PRELOAD, USE_GDC,
    )  # fmt: skip
    grid_dependency_exit(USE_GDC)


@triton.jit
def _project_rows(
    h_op,
    w_ptr,
    b_ptr,
    out_ptr,
    rows,
    row_ok,
    offs_d,
    d_ok,
    out_col0,
    out_stride,
    d_model,
    n_cols,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
):
    """``out[rows, out_col0 + j] = (h @ W^T + b)[:, j]`` for all ``n_cols`` columns of an
    ``[n_cols, d_model]`` weight, ``BLOCK_N`` columns at a time."""
    for n0 in range(0, n_cols, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        c_ok = cols < n_cols
        wt = tl.load(
            w_ptr + cols[None, :] * d_model + offs_d[:, None],
            mask=d_ok[:, None] & c_ok[None, :],
            other=0.0,
        )
        y = dot(
            h_op,
            to_operand(wt, PRECISION, EMULATE_BF16_DOT),
            tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32),
            PRECISION,
            EMULATE_BF16_DOT,
        )
        y += tl.load(b_ptr + cols, mask=c_ok, other=0.0)[None, :]
        tl.store(
            out_ptr + rows[:, None] * out_stride + (out_col0 + cols)[None, :],
            y.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & c_ok[None, :],
        )


@triton.jit
def _qkv_rows_kernel(
    x_ptr,
    qkv_ptr,
    n1w_ptr,
    n1b_ptr,
    wqkv_ptr,
    bqkv_ptr,
    num_rows,
    d_model,
    eps,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    grid_dependency_enter(USE_GDC)
    offs_m = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rows = offs_m.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < d_model
    row_ok = offs_m < num_rows
    y = tl.load(
        x_ptr + rows[:, None] * d_model + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    _qkv_of_rows(
        y, qkv_ptr, n1w_ptr, n1b_ptr, wqkv_ptr, bqkv_ptr, rows, row_ok, offs_d, d_ok, d_model,
        eps, BLOCK_R, BLOCK_D, BLOCK_N, PRECISION, EMULATE_BF16_DOT,
    )  # fmt: skip
    grid_dependency_exit(USE_GDC)


@triton.jit
def _ffn_residual_rows(
    x1, valid, n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, nfw_ptr, nfb_ptr,
    offs_d, d_ok, d_model, ffn_dim, eps,
    HAS_KEY_MASK: tl.constexpr, FINAL_NORM: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_F: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr, GELU_POLY: tl.constexpr,
    w1_pre=0, w2_pre=0, PRELOAD: tl.constexpr = False,
):  # fmt: skip
    """A layer's second half on fp32 rows ``x1 = x + attention`` (padded columns 0):
    ``x1 + FFN(LayerNorm2(x1)) + b2``, rows with ``valid`` False zeroed (with a key mask),
    and the final LayerNorm (padded rows zeroed again) when ``FINAL_NORM``. ``PRELOAD``:
    the FFN's weights given (``_ffn_of_rows``)."""
    f = _ffn_of_rows(
        x1, n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, w2_ptr, offs_d, d_ok, d_model, ffn_dim, eps,
        BLOCK_R, BLOCK_D, BLOCK_F, PRECISION, EMULATE_BF16_DOT, GELU_POLY, w1_pre, w2_pre,
        PRELOAD,
    )  # fmt: skip
    return _residual_tail(
        x1, f, valid, b2_ptr, nfw_ptr, nfb_ptr, offs_d, d_ok, d_model, eps,
        HAS_KEY_MASK, FINAL_NORM,
    )  # fmt: skip


@triton.jit
def _residual_tail(
    x1, f, valid, b2_ptr, nfw_ptr, nfb_ptr, offs_d, d_ok, d_model, eps,
    HAS_KEY_MASK: tl.constexpr, FINAL_NORM: tl.constexpr,
):  # fmt: skip
    """``x1 + f + b2``, rows with ``valid`` False zeroed (with a key mask), and the final
    LayerNorm (padded rows zeroed again) when ``FINAL_NORM``."""
    y = x1 + f + tl.load(b2_ptr + offs_d, mask=d_ok, other=0.0)[None, :]
    if HAS_KEY_MASK:
        y = tl.where(valid[:, None], y, 0.0)
    if FINAL_NORM:
        y = tl.where(d_ok[None, :], y, 0.0)
        y = _layernorm_rows(y, nfw_ptr, nfb_ptr, offs_d, d_ok, d_model, eps)
        if HAS_KEY_MASK:
            y = tl.where(valid[:, None], y, 0.0)
    return y


@triton.jit
def _residual_start(x_ptr, bo_ptr, rows, row_ok, offs_d, d_ok, d_model):
    """With ``fold_residual``: the output projection's starting accumulator ``x + bo``.
    Padded tokens' rows are not told apart here (that would put the key mask's load ahead
    of the projection's): their x1 is not the reference's ``x`` but they are zeroed at the
    layer's end like every padded row, and rows do not mix before that (LayerNorm and FFN
    are row-wise), so the output is the same."""
    a = tl.load(
        x_ptr + rows[:, None] * d_model + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    return a + tl.load(bo_ptr + offs_d, mask=d_ok, other=0.0)[None, :]


@triton.jit
def _post_rows_tail(
    a, x_ptr, out_ptr, key_mask_ptr, bo_ptr, n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, w2_ptr,
    b2_ptr, nfw_ptr, nfb_ptr, rows, row_ok, offs_d, d_ok, d_model, ffn_dim, eps,
    HAS_KEY_MASK: tl.constexpr, FINAL_NORM: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_F: tl.constexpr, PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr, STAGE_RESIDUAL: tl.constexpr, GELU_POLY: tl.constexpr,
    FOLD_RESIDUAL: tl.constexpr, w1_pre=0, w2_pre=0, PRELOAD: tl.constexpr = False,
):  # fmt: skip
    """What follows the output projection ``a`` (fp32 ``[BLOCK_R, BLOCK_D]``, no bias) of
    rows ``rows`` (token indices, int64): ``+ bo``, padded rows zeroed, ``+ x``; LayerNorm2,
    FFN, residual, padded rows zeroed, the final LayerNorm when ``FINAL_NORM``; stored to
    ``out`` (which may be ``x``: only these rows are read and written). With
    ``FOLD_RESIDUAL``, ``a`` is already ``x1`` (``_residual_start`` began the projection at
    ``x + bo``). ``PRELOAD``: the FFN's weights given (``_ffn_of_rows``)."""
    io_mask = row_ok[:, None] & d_ok[None, :]
    offsets = rows[:, None] * d_model + offs_d[None, :]
    valid = row_ok
    if HAS_KEY_MASK:  # rows are tokens: the mask's byte of each row
        valid = tl.load(key_mask_ptr + rows, mask=row_ok, other=0) != 0
    if FOLD_RESIDUAL:
        x1 = a
    else:
        a += tl.load(bo_ptr + offs_d, mask=d_ok, other=0.0)[None, :]
        if HAS_KEY_MASK:
            # Padded rows of the attention output, as the reference zeroes them (a padded
            # row feeds nothing but itself here and is zeroed again below: kept for
            # exactness of the intermediate, not of the output).
            a = tl.where(valid[:, None], a, 0.0)
        x1 = tl.load(x_ptr + offsets, mask=io_mask, other=0.0) + a
    if STAGE_RESIDUAL:
        # x1 waits in this program's own output rows (in place or not, no other program
        # reads them) while the FFN runs; the barrier orders the CTA's stores before the
        # loads, whatever layout each gets.
        tl.store(out_ptr + offsets, x1, mask=io_mask)
        f = _ffn_of_rows(
            x1, n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, w2_ptr, offs_d, d_ok, d_model, ffn_dim,
            eps, BLOCK_R, BLOCK_D, BLOCK_F, PRECISION, EMULATE_BF16_DOT, GELU_POLY, w1_pre,
            w2_pre, PRELOAD,
        )  # fmt: skip
        tl.debug_barrier()
        x1 = tl.load(out_ptr + offsets, mask=io_mask, other=0.0)
        y = _residual_tail(
            x1, f, valid, b2_ptr, nfw_ptr, nfb_ptr, offs_d, d_ok, d_model, eps,
            HAS_KEY_MASK, FINAL_NORM,
        )  # fmt: skip
    else:
        y = _ffn_residual_rows(
            x1, valid, n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, nfw_ptr, nfb_ptr,
            offs_d, d_ok, d_model, ffn_dim, eps, HAS_KEY_MASK, FINAL_NORM,
            BLOCK_R, BLOCK_D, BLOCK_F, PRECISION, EMULATE_BF16_DOT, GELU_POLY, w1_pre, w2_pre,
            PRELOAD,
        )  # fmt: skip
    tl.store(out_ptr + offsets, y, mask=io_mask)
    return y


@triton.jit
def _qkv_of_rows(
    y, qkv_ptr, n1w_ptr, n1b_ptr, wqkv_ptr, bqkv_ptr, rows, row_ok, offs_d, d_ok, d_model, eps,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """LayerNorm1 of fp32 rows ``y`` (padded columns 0) and the three projections into the
    packed ``qkv`` rows ``rows`` (``[*, 3 * d_model]``), one loop over the packed
    ``[3 d_model, d_model]`` weight (one copy of the loop's code where three were: session
    22's PC sampling found the chained post rows kernel waiting on instruction fetch there):
    the qkv-rows kernel's work on rows it would have loaded."""
    h = to_operand(
        _layernorm_rows(y, n1w_ptr, n1b_ptr, offs_d, d_ok, d_model, eps),
        PRECISION,
        EMULATE_BF16_DOT,
    )
    _project_rows(
        h, wqkv_ptr, bqkv_ptr, qkv_ptr, rows, row_ok, offs_d, d_ok, 0, 3 * d_model, d_model,
        3 * d_model, BLOCK_R, BLOCK_D, BLOCK_N, PRECISION, EMULATE_BF16_DOT,
    )  # fmt: skip


@triton.jit
def _wo_rows(wo_ptr, offs_k, k_ok, offs_d, d_ok, d_model):
    """Rows ``offs_k`` of ``Wo^T`` [len(offs_k), BLOCK_D]: element (k, n) = Wo[n, offs_k[k]]
    (the context columns ``offs_k`` of the output projection)."""
    return tl.load(
        wo_ptr + offs_d[None, :] * d_model + offs_k[:, None],
        mask=k_ok[:, None] & d_ok[None, :],
        other=0.0,
    )


@triton.jit
def _post_rows_program(
    pid,
    x_ptr,
    ctx_ptr,
    out_ptr,
    key_mask_ptr,
    wo_ptr,
    bo_ptr,
    n2w_ptr,
    n2b_ptr,
    w1_ptr,
    b1_ptr,
    w2_ptr,
    b2_ptr,
    nfw_ptr,
    nfb_ptr,
    qkv_ptr,
    n1w_ptr,
    n1b_ptr,
    wqkv_ptr,
    bqkv_ptr,
    normed_ptr,
    num_rows,
    d_model,
    ffn_dim,
    eps,
    HAS_KEY_MASK: tl.constexpr,
    FINAL_NORM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_F: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
    STAGE_RESIDUAL: tl.constexpr,
    GELU_POLY: tl.constexpr,
    NEXT_QKV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FOLD_RESIDUAL: tl.constexpr,
    NEXT_NORM: tl.constexpr,
    PRELOAD: tl.constexpr = False,
    USE_GDC: tl.constexpr = 0,
):
    """The post-attention rows of one layer; with ``NEXT_QKV`` also the next layer's
    LayerNorm1 and QKV projections of the same rows into ``qkv`` (its weights in
    ``n1w_ptr`` .. ``bqkv_ptr``; unused placeholders otherwise); with ``NEXT_NORM`` the
    next layer's LayerNorm1 of the same rows into ``normed`` (``n1w_ptr``, ``n1b_ptr``).
    ``pid`` is the block of rows: the kernel's grid, or a whole-forward program's work item
    (``kernels.stack``). With ``PRELOAD`` (``BLOCK_K >= d_model``, ``BLOCK_F >=
    ffn_dim``: one step each) the output projection's and the FFN's weight tiles are loaded
    first, then ``grid_dependency_enter(USE_GDC)`` (with pdl, the wait for the previous
    kernel, whose outputs the rest reads; without ``PRELOAD`` the caller waits)."""
    offs_m = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rows = offs_m.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_k0 = tl.arange(0, BLOCK_K)
    d_ok = offs_d < d_model
    row_ok = offs_m < num_rows
    w1_t = 0
    w2_t = 0
    if PRELOAD:  # nothing writes the weights: loaded while the previous kernel finishes
        k_ok = offs_k0 < d_model
        wo_t = to_operand(
            _wo_rows(wo_ptr, offs_k0, k_ok, offs_d, d_ok, d_model), PRECISION, EMULATE_BF16_DOT
        )
        offs_f = tl.arange(0, BLOCK_F)
        f_ok = offs_f < ffn_dim
        w1_t = _w1_tile(w1_ptr, offs_d, d_ok, offs_f, f_ok, d_model, PRECISION,
                        EMULATE_BF16_DOT)  # fmt: skip
        w2_t = _w2_tile(w2_ptr, offs_d, d_ok, offs_f, f_ok, ffn_dim, PRECISION,
                        EMULATE_BF16_DOT)  # fmt: skip
        grid_dependency_enter(USE_GDC)

    # Output projection of the attention context, BLOCK_K ctx columns at a time: onto
    # zeros, or with FOLD_RESIDUAL onto x + bo.
    if FOLD_RESIDUAL:
        a = _residual_start(x_ptr, bo_ptr, rows, row_ok, offs_d, d_ok, d_model)
    else:
        a = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    if PRELOAD:
        c = tl.load(
            ctx_ptr + rows[:, None] * d_model + offs_k0[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        a = dot(to_operand(c, PRECISION, EMULATE_BF16_DOT), wo_t, a, PRECISION, EMULATE_BF16_DOT)
    else:
        for k0 in range(0, d_model, BLOCK_K):
            offs_k = k0 + offs_k0
            k_ok = offs_k < d_model
            c = tl.load(
                ctx_ptr + rows[:, None] * d_model + offs_k[None, :],
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            ).to(tl.float32)
            wo_t = _wo_rows(wo_ptr, offs_k, k_ok, offs_d, d_ok, d_model)
            a = dot(
                to_operand(c, PRECISION, EMULATE_BF16_DOT),
                to_operand(wo_t, PRECISION, EMULATE_BF16_DOT),
                a,
                PRECISION,
                EMULATE_BF16_DOT,
            )
    y = _post_rows_tail(
        a, x_ptr, out_ptr, key_mask_ptr, bo_ptr, n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, w2_ptr,
        b2_ptr, nfw_ptr, nfb_ptr, rows, row_ok, offs_d, d_ok, d_model, ffn_dim, eps,
        HAS_KEY_MASK, FINAL_NORM, BLOCK_R, BLOCK_D, BLOCK_F, PRECISION, EMULATE_BF16_DOT,
        STAGE_RESIDUAL, GELU_POLY, FOLD_RESIDUAL, w1_t, w2_t, PRELOAD,
    )  # fmt: skip
    if NEXT_QKV:
        _qkv_of_rows(
            y, qkv_ptr, n1w_ptr, n1b_ptr, wqkv_ptr, bqkv_ptr, rows, row_ok, offs_d, d_ok,
            d_model, eps, BLOCK_R, BLOCK_D, BLOCK_N, PRECISION, EMULATE_BF16_DOT,
        )  # fmt: skip
    if NEXT_NORM:
        _store_operand_rows(
            y, normed_ptr, n1w_ptr, n1b_ptr, rows, row_ok, offs_d, d_ok, d_model, eps,
            PRECISION, EMULATE_BF16_DOT,
        )  # fmt: skip


@triton.jit
def _post_rows_kernel(
    x_ptr,
    ctx_ptr,
    out_ptr,
    key_mask_ptr,
    wo_ptr,
    bo_ptr,
    n2w_ptr,
    n2b_ptr,
    w1_ptr,
    b1_ptr,
    w2_ptr,
    b2_ptr,
    nfw_ptr,
    nfb_ptr,
    qkv_ptr,
    n1w_ptr,
    n1b_ptr,
    wqkv_ptr,
    bqkv_ptr,
    normed_ptr,
    num_rows,
    d_model,
    ffn_dim,
    eps,
    HAS_KEY_MASK: tl.constexpr,
    FINAL_NORM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_F: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
    STAGE_RESIDUAL: tl.constexpr,
    GELU_POLY: tl.constexpr,
    NEXT_QKV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_GDC: tl.constexpr,
    FOLD_RESIDUAL: tl.constexpr,
    NEXT_NORM: tl.constexpr,
    PRELOAD: tl.constexpr,
):
    """The post-attention rows of one layer, a block of ``BLOCK_R`` rows a program:
    ``_post_rows_program`` (which waits itself, after its weights' loads, with
    ``PRELOAD``)."""
    if not PRELOAD:
        grid_dependency_enter(USE_GDC)
    _post_rows_program(
        tl.program_id(0), x_ptr, ctx_ptr, out_ptr, key_mask_ptr, wo_ptr, bo_ptr,
        n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, nfw_ptr, nfb_ptr, qkv_ptr,
        n1w_ptr, n1b_ptr, wqkv_ptr, bqkv_ptr, normed_ptr, num_rows, d_model, ffn_dim,
        eps, HAS_KEY_MASK, FINAL_NORM, BLOCK_R, BLOCK_D, BLOCK_K, BLOCK_F, PRECISION,
        EMULATE_BF16_DOT, STAGE_RESIDUAL, GELU_POLY, NEXT_QKV, BLOCK_N, FOLD_RESIDUAL,
        NEXT_NORM, PRELOAD, USE_GDC,
    )  # fmt: skip
    grid_dependency_exit(USE_GDC)


@triton.jit
def _attn_post_rows_kernel(
    qkv_ptr,
    x_ptr,
    out_ptr,
    key_mask_ptr,
    key_bounds_ptr,
    wo_ptr,
    bo_ptr,
    n2w_ptr,
    n2b_ptr,
    w1_ptr,
    b1_ptr,
    w2_ptr,
    b2_ptr,
    nfw_ptr,
    nfb_ptr,
    seq_len,
    d_model,
    num_heads,
    head_dim,
    ffn_dim,
    num_m_blocks,
    qk_scale,
    eps,
    CAUSAL: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    HAS_KEY_BOUNDS: tl.constexpr,
    FINAL_NORM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_HD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_F: tl.constexpr,
    EVEN_HD: tl.constexpr,
    PREC_G: tl.constexpr,
    PREC_A: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
    STAGE_RESIDUAL: tl.constexpr,
    GELU_POLY: tl.constexpr,
):
    # grid (query blocks, batch): the query blocks of one sequence run together and share
    # its K/V in L2, the most expensive (last, causal) blocks first.
    pid_m = num_m_blocks - 1 - tl.program_id(0)
    off_b = tl.program_id(1).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    row_ok = offs_m < seq_len
    rows = off_b * seq_len + offs_m.to(tl.int64)  # token rows (masked past seq_len)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < d_model
    offs_hd = tl.arange(0, BLOCK_HD)
    hd_ok = offs_hd < head_dim
    stride_s = 3 * d_model  # packed [B, S, 3, H, hd]
    seq_base = qkv_ptr + off_b * seq_len * stride_s
    km_base = key_mask_ptr + off_b * seq_len

    # Every head in turn: its attention rows, then its share of the output projection
    # ctx_h @ Wo[:, h*hd:(h+1)*hd]^T, accumulated in fp32. The context is rounded once to
    # the projection's operand type, as the three-launch form's stored context is.
    a = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for h in range(0, num_heads):
        q_base = seq_base + h * head_dim
        ctx = _attention_rows(
            q_base, q_base + d_model, q_base + 2 * d_model, km_base, key_bounds_ptr,
            key_bounds_ptr, off_b, start_m, stride_s, stride_s, stride_s, seq_len, head_dim,
            qk_scale, CAUSAL, False, HAS_KEY_MASK, HAS_KEY_BOUNDS, BLOCK_M, BLOCK_N,
            BLOCK_HD, EVEN_HD, PREC_A, EMULATE_BF16_DOT,
        )  # fmt: skip
        wo_t = _wo_rows(wo_ptr, h * head_dim + offs_hd, hd_ok, offs_d, d_ok, d_model)
        a = dot(
            to_operand(ctx, PREC_G, EMULATE_BF16_DOT),
            to_operand(wo_t, PREC_G, EMULATE_BF16_DOT),
            a,
            PREC_G,
            EMULATE_BF16_DOT,
        )
    _post_rows_tail(
        a, x_ptr, out_ptr, key_mask_ptr, bo_ptr, n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, w2_ptr,
        b2_ptr, nfw_ptr, nfb_ptr, rows, row_ok, offs_d, d_ok, d_model, ffn_dim, eps,
        HAS_KEY_MASK, FINAL_NORM, BLOCK_M, BLOCK_D, BLOCK_F, PREC_G, EMULATE_BF16_DOT,
        STAGE_RESIDUAL, GELU_POLY, False,
    )  # fmt: skip


@triton.jit
def _seq_layer_kernel(
    x_ptr,
    out_ptr,
    key_mask_ptr,
    n1w_ptr,
    n1b_ptr,
    wq_ptr,
    bq_ptr,
    wk_ptr,
    bk_ptr,
    wv_ptr,
    bv_ptr,
    wo_ptr,
    bo_ptr,
    n2w_ptr,
    n2b_ptr,
    w1_ptr,
    b1_ptr,
    w2_ptr,
    b2_ptr,
    nfw_ptr,
    nfb_ptr,
    seq_len,
    d_model,
    num_heads,
    head_dim,
    ffn_dim,
    num_q_blocks,
    qk_scale,
    eps,
    CAUSAL: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    FINAL_NORM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_HD: tl.constexpr,
    BLOCK_F: tl.constexpr,
    PREC_G: tl.constexpr,
    PREC_A: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
    GELU_POLY: tl.constexpr,
):
    off_b = tl.program_id(1).to(tl.int64)
    # The last query blocks first: under causal masking they have the most keys.
    start_m = (num_q_blocks - 1 - tl.program_id(0)) * BLOCK_M
    x_base = x_ptr + off_b * seq_len * d_model

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.arange(0, BLOCK_HD)
    d_ok = offs_d < d_model
    c_ok = offs_c < head_dim
    row_ok = offs_m < seq_len
    hi = seq_len
    if CAUSAL:
        hi = tl.minimum(seq_len, start_m + BLOCK_M)
    key_in = offs_s < hi

    # LayerNorm1 of every key this block attends to, once for all heads.
    h_k = _normed_rows(
        x_base, offs_s, key_in, offs_d, d_ok, n1w_ptr, n1b_ptr, d_model, eps, PREC_G,
        EMULATE_BF16_DOT,
    )  # fmt: skip
    h_q = _normed_rows(
        x_base, offs_m, row_ok, offs_d, d_ok, n1w_ptr, n1b_ptr, d_model, eps, PREC_G,
        EMULATE_BF16_DOT,
    )  # fmt: skip
    valid = key_in[None, :]
    if HAS_KEY_MASK:  # any key may be masked: the mask's byte, read here
        key_ok = tl.load(key_mask_ptr + off_b * seq_len + offs_s, mask=key_in, other=0)
        valid = valid & (key_ok != 0)[None, :]
    if CAUSAL:
        valid = valid & (offs_s[None, :] <= offs_m[:, None])

    attn = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for hh in range(0, num_heads):
        col0 = hh * head_dim
        q = _head_projection(
            h_q, wq_ptr, bq_ptr, col0, offs_d, d_ok, offs_c, c_ok, d_model,
            BLOCK_M, BLOCK_HD, PREC_G, EMULATE_BF16_DOT,
        )  # fmt: skip
        k = _head_projection(
            h_k, wk_ptr, bk_ptr, col0, offs_d, d_ok, offs_c, c_ok, d_model,
            BLOCK_S, BLOCK_HD, PREC_G, EMULATE_BF16_DOT,
        )  # fmt: skip
        v = _head_projection(
            h_k, wv_ptr, bv_ptr, col0, offs_d, d_ok, offs_c, c_ok, d_model,
            BLOCK_S, BLOCK_HD, PREC_G, EMULATE_BF16_DOT,
        )  # fmt: skip
        qk = dot(
            to_operand(q, PREC_A, EMULATE_BF16_DOT),
            to_operand(tl.trans(k), PREC_A, EMULATE_BF16_DOT),
            tl.zeros([BLOCK_M, BLOCK_S], dtype=tl.float32),
            PREC_A,
            EMULATE_BF16_DOT,
        )
        qk = tl.where(valid, qk * qk_scale, float("-inf"))  # log2 domain, after the product
        m = tl.max(qk, 1)
        m = tl.where(m == float("-inf"), 0.0, m)  # a row with no valid key: 0, not NaN
        p = tl.exp2(qk - m[:, None])
        l_i = tl.sum(p, 1)
        ctx = dot(
            to_operand(p, PREC_A, EMULATE_BF16_DOT),
            to_operand(v, PREC_A, EMULATE_BF16_DOT),
            tl.zeros([BLOCK_M, BLOCK_HD], dtype=tl.float32),
            PREC_A,
            EMULATE_BF16_DOT,
        )
        ctx = ctx / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # no valid key: context 0
        # Wo[:, head]^T tile [BLOCK_HD, BLOCK_D]: element (c, n) = Wo[n, col0 + c].
        wo_t = tl.load(
            wo_ptr + offs_d[None, :] * d_model + (col0 + offs_c)[:, None],
            mask=c_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        attn = dot(
            to_operand(ctx, PREC_G, EMULATE_BF16_DOT),
            to_operand(wo_t, PREC_G, EMULATE_BF16_DOT),
            attn,
            PREC_G,
            EMULATE_BF16_DOT,
        )
    attn += tl.load(bo_ptr + offs_d, mask=d_ok, other=0.0)[None, :]
    valid_row = row_ok
    if HAS_KEY_MASK:  # padded rows of the attention output, as the reference zeroes them
        valid_row = tl.load(key_mask_ptr + off_b * seq_len + offs_m, mask=row_ok, other=0) != 0
        attn = tl.where(valid_row[:, None], attn, 0.0)
    offsets = offs_m[:, None] * d_model + offs_d[None, :]
    io_mask = row_ok[:, None] & d_ok[None, :]
    x1 = tl.load(x_base + offsets, mask=io_mask, other=0.0) + attn
    y = _ffn_residual_rows(
        x1, valid_row, n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, nfw_ptr, nfb_ptr,
        offs_d, d_ok, d_model, ffn_dim, eps, HAS_KEY_MASK, FINAL_NORM,
        BLOCK_M, BLOCK_D, BLOCK_F, PREC_G, EMULATE_BF16_DOT, GELU_POLY,
    )  # fmt: skip
    tl.store(out_ptr + off_b * seq_len * d_model + offsets, y, mask=io_mask)


# --------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------
def estimate_shared_memory_bytes(
    *,
    variant: str,
    d_model: int,
    seq_len: int = MAX_SEQ_SEQ_LEN,
    num_heads: int,
    ffn_dim: int,
    tiling: Tiling,
    gemm_precision: str,
    attn_precision: str,
) -> int:
    """Shared memory of the largest program, in bytes: the dot operand tiles that can be
    live at once (Triton stages them through shared memory), times the pipeline stages of
    the attention's key loop. An upper-side estimate, not a compiler's number: a
    configuration under the limit can still fail with OutOfResources at compile time."""
    g = 2 if gemm_precision in HALF_PRECISIONS else 4
    a = 2 if attn_precision in HALF_PRECISIONS else 4
    # The FFN's rows: a row-kernel program's row_block, or seq's query block.
    bd, br = padded_dim(d_model), tiling.block_m if variant == "seq" else tiling.row_block
    bk, bf = k_chunk(d_model), ffn_chunk(d_model, ffn_dim, tiling.ffn_block)
    post = g * max(br * bk + bk * bd, br * bd + bd * bf + br * bf + bf * bd)
    if tiling.weights_first:  # one step each, the three weight tiles held from the start
        bf = padded_dim(ffn_dim)
        post = g * (bd * bd + 2 * bd * bf + br * bd + br * bf)
    if variant == "rows":
        qkv = g * (br * bd + bd * min(bd, 64))
        if not tiling.attn_post:
            return max(post, qkv)
        # One kernel: a head's flash attention (its own model), then that head's share of
        # the output projection, then the FFN of the query block's rows.
        bm, hd = tiling.block_m, d_model // max(num_heads, 1)
        bhd, bf = padded_dim(hd), ffn_chunk(d_model, ffn_dim, tiling.ffn_block)
        attention = flash.estimate_shared_memory_bytes(
            head_dim=hd,
            block_m=bm,
            block_n=tiling.block_n,
            num_stages=tiling.num_stages,
            precision=attn_precision,
        )
        fused = max(
            attention + g * (bm * bhd + bhd * bd),
            g * (bm * bd + bd * bf + bm * bf + bf * bd),
        )
        return max(qkv, fused)
    if variant == "seq":
        # The keys' and queries' LayerNorm outputs stay staged for the whole head loop;
        # beside them, the operands of one product at a time (projection, q k^T, p v,
        # out-projection), with a quarter more for the compiler's own buffers.
        bhd, bm = padded_dim(d_model // max(num_heads, 1)), tiling.block_m
        bs = padded_dim(seq_len)
        step = max(
            g * bd * bhd,
            a * (bm * bhd + bhd * bs),
            a * (bm * bs + bs * bhd),
            g * (bm * bhd + bhd * bd),
        )
        attention = g * (bs * bd + bm * bd) + step
        return int(1.25 * max(attention, post))
    if tiling.gluon_heads:  # the Gluon heads attention counts its own (gluon_heads_problems)
        return post
    bhd, bm, bn = padded_dim(d_model // max(num_heads, 1)), tiling.block_m, tiling.block_n
    per_key_block = g * (bn * bd + 2 * bd * bhd) + a * (bhd * bn + bm * bn + bn * bhd)
    heads = g * (bm * bd + bd * bhd) + a * bm * bhd + per_key_block * max(tiling.num_stages, 1)
    return max(post, heads)


def _config_errors(
    *,
    variant: str,
    seq_len: int,
    d_model: int,
    num_heads: int,
    ffn_dim: int,
    tiling: Tiling,
    gemm_precision: str,
    attn_precision: str,
) -> list[str]:
    """Reasons a configuration cannot run at all (the launcher raises on these)."""
    reasons: list[str] = []
    if variant not in VARIANTS:
        return [f"variant={variant!r} is not one of {', '.join(VARIANTS)}"]
    if not 1 <= d_model <= MAX_D_MODEL:
        reasons.append(
            f"d_model={d_model} is outside 1..{MAX_D_MODEL} for the fused layer (its row "
            "kernels hold whole rows); use the per-op kernels"
        )
    if ffn_dim < 1 or seq_len < 1:
        reasons.append(f"ffn_dim={ffn_dim} and seq_len={seq_len} must be >= 1")
    if variant == "heads" and seq_len > MAX_HEADS_SEQ_LEN:
        reasons.append(
            f"seq_len={seq_len} > {MAX_HEADS_SEQ_LEN} for fused_layer=heads (K/V recomputed per "
            "query block); use fused_layer=rows"
        )
    if variant == "seq" and seq_len > MAX_SEQ_SEQ_LEN:
        reasons.append(
            f"seq_len={seq_len} > {MAX_SEQ_SEQ_LEN} for fused_layer=seq (every key in one "
            "tile); use fused_layer=heads or rows"
        )
    if variant == "seq" and d_model > MAX_SEQ_D_MODEL:
        reasons.append(
            f"d_model={d_model} > {MAX_SEQ_D_MODEL} for fused_layer=seq (whole rows of the "
            "output projection in registers); use fused_layer=heads or rows"
        )
    if num_heads < 1 or d_model % num_heads:
        reasons.append(f"num_heads={num_heads} must be >= 1 and divide d_model={d_model}")
    else:
        head_dim = d_model // num_heads
        top = MAX_HEADS_HEAD_DIM if variant == "heads" else flash.MAX_HEAD_DIM
        if not MIN_HEAD_DIM <= head_dim <= top:
            reasons.append(
                f"head_dim={head_dim} is outside {MIN_HEAD_DIM}..{top} for fused_layer="
                f"{variant}; use a different number of heads"
            )
    for name, value in (
        ("attn_block_m", tiling.block_m),
        ("attn_block_n", tiling.block_n),
        ("row_block", tiling.row_block),
    ):
        if not is_power_of_2(value) or value < MIN_BLOCK:
            reasons.append(f"{name}={value} must be a power of two >= {MIN_BLOCK}")
    for name, value in (("attn_warps", tiling.num_warps), ("row_warps", tiling.row_warps)):
        if value not in SUPPORTED_NUM_WARPS:
            reasons.append(f"{name}={value} must be one of {SUPPORTED_NUM_WARPS}")
    if tiling.num_stages < 1:
        reasons.append(f"attn_stages={tiling.num_stages} must be >= 1")
    if tiling.pdl and (variant not in ("heads", "rows") or tiling.attn_post):
        reasons.append(
            "pdl applies to variants 'heads' and 'rows' without attn_post (their kernels "
            f"wait on their predecessor); got variant={variant!r}, attn_post={tiling.attn_post}"
        )
    if tiling.row_maxnreg and (variant not in ("heads", "rows") or tiling.attn_post):
        reasons.append(
            "row_maxnreg caps the separate qkv-rows and post-rows kernels of variants 'heads' "
            f"and 'rows' without attn_post; got variant={variant!r}, attn_post={tiling.attn_post}"
        )
    if tiling.fold_residual and (variant not in ("heads", "rows") or tiling.attn_post):
        reasons.append(
            "fold_residual applies to the post-rows kernel of variants 'heads' and 'rows' "
            f"without attn_post; got variant={variant!r}, attn_post={tiling.attn_post}"
        )
    if tiling.attn_maxnreg and (variant != "rows" or tiling.attn_post):
        reasons.append(
            "attn_maxnreg caps the flash attention kernel of variant 'rows' without attn_post "
            f"(the other variants fuse the attention into their own kernels); got "
            f"variant={variant!r}, attn_post={tiling.attn_post}"
        )
    if tiling.attn_head_chunk and (variant != "rows" or tiling.attn_post):
        reasons.append(
            "attn_head_chunk picks the one-tile form of the flash attention kernel of variant "
            "'rows' without attn_post (the other variants fuse the attention into their own "
            f"kernels); got variant={variant!r}, attn_post={tiling.attn_post}"
        )
    elif tiling.attn_head_chunk:
        reasons += flash.one_tile_reasons(tiling.attn_head_chunk, seq_len)
    if tiling.gluon_flash and (variant != "rows" or tiling.attn_post):
        reasons.append(
            "gluon_flash replaces the flash attention kernel of variant 'rows' without "
            f"attn_post; got variant={variant!r}, attn_post={tiling.attn_post}"
        )
    elif tiling.gluon_flash:
        head_dim = d_model // num_heads if num_heads and d_model % num_heads == 0 else 0
        why = flash.gluon_reasons(
            head_dim=head_dim, block_n=tiling.block_n, num_warps=tiling.num_warps,
            num_stages=tiling.num_stages, precision=attn_precision,
            head_chunk=tiling.attn_head_chunk,
        )  # fmt: skip
        if gemm_precision != "fp16":
            why.append(f"the context is fp16 here: set gemm_precision=fp16 (got {gemm_precision})")
        reasons += [f"gluon_flash: {r}" for r in why]
    if tiling.next_norm and variant != "heads":
        reasons.append(
            "next_norm applies to variant='heads': its post-rows kernel writes the next "
            f"layer's LayerNorm1 for the heads attention (got variant={variant!r})"
        )
    if tiling.next_qkv and (variant != "rows" or tiling.attn_post):
        reasons.append(
            "next_qkv applies to variant='rows' without attn_post: its post-rows kernel "
            f"writes the next layer's qkv (got variant={variant!r}, "
            f"attn_post={tiling.attn_post})"
        )
    one_stage_64 = tiling.num_stages == 1 and tiling.block_m >= 64
    if variant == "heads" and not tiling.gluon_heads and one_stage_64:
        # Measured on the H200 (session 36, Triton 3.6, docs/logs/s36/s36_bm64_probe.log): the
        # compiled heads attention at case 2's shape faults (an illegal memory access) with
        # one stage and 64 query rows (64 or 128 keys, 4 or 8 warps); 2 stages, or 32 rows
        # at one stage, pass. Not yet explained: refused until it is.
        reasons.append(
            "the heads attention faults compiled with attn_stages=1 and attn_block_m >= 64 "
            f"(got attn_block_m={tiling.block_m}): use attn_stages >= 2 or attn_block_m <= 32"
        )
    if tiling.weights_first:
        reasons += [
            f"weights_first {what}"
            for what, wrong in (
                (f"loads the heads variant's weights (variant={variant!r})", variant != "heads"),
                ("is for the Triton post rows, not gluon_post", tiling.gluon_post),
                ("is for the Triton heads attention, not gluon_heads", tiling.gluon_heads),
                ("is for the two launches a layer, not one_launch", tiling.one_launch),
                (
                    f"holds Wo, W1 and W2 whole: padded d_model and ffn_dim <= "
                    f"{MAX_WEIGHTS_FIRST} (got {d_model} and {ffn_dim})",
                    max(padded_dim(d_model), padded_dim(ffn_dim)) > MAX_WEIGHTS_FIRST,
                ),
                (
                    f"runs the FFN in one step: leave ffn_block 0 (got {tiling.ffn_block})",
                    tiling.ffn_block,
                ),
            )
            if wrong
        ]
    if tiling.one_launch:
        reasons += [
            f"one_launch runs {what}"
            for what, wrong in (
                (f"the heads variant's kernels (got variant={variant!r})", variant != "heads"),
                ("with next_norm (its heads phases read LayerNorm1 rows)", not tiling.next_norm),
                ("the Triton kernels, not gluon_post", tiling.gluon_post),
                ("the Triton kernels, not gluon_heads", tiling.gluon_heads),
                ("no launch to overlap: pdl does not apply", tiling.pdl),
                ("both phases in one kernel: row_maxnreg does not apply", tiling.row_maxnreg),
            )
            if wrong
        ]
    if tiling.gluon_post:
        reasons += _gluon_errors(variant, d_model, ffn_dim, tiling, gemm_precision)
    if tiling.gluon_heads:
        reasons += _gluon_heads_errors(
            variant, seq_len, d_model, num_heads, tiling, gemm_precision, attn_precision
        )
    for name, value in (("gemm_precision", gemm_precision), ("attn_precision", attn_precision)):
        if value not in ROW_PRECISIONS:
            known = precision_reasons(value, None)
            reasons.append(
                known[0]
                if known
                else f"{name}={value!r} is not supported by the fused layer; use one of "
                f"{', '.join(ROW_PRECISIONS)}"
            )
    return reasons


def _gluon_errors(variant: str, d_model: int, ffn_dim: int, tiling: Tiling, gemm: str) -> list[str]:
    """Why the Gluon row kernels cannot take this configuration (empty: it can)."""
    if variant not in ("heads", "rows") or tiling.attn_post:
        return [
            "gluon_post replaces the post-rows kernel of variants 'heads' and 'rows' "
            f"without attn_post; got variant={variant!r}, attn_post={tiling.attn_post}"
        ]
    problems = gluon_rows.gluon_problems(d_model, ffn_dim, gemm, tiling.row_warps, tiling.next_qkv)
    reasons = [f"gluon_post: {why}" for why in problems]
    for name, on in (
        ("stage_residual", tiling.stage_residual),
        ("fold_residual", tiling.fold_residual),
        ("ffn_block", tiling.ffn_block),
        ("qkv_stages", tiling.qkv_stages),
        ("row_maxnreg", tiling.row_maxnreg),
    ):
        if on:
            reasons.append(
                f"{name} configures the Triton row kernels that gluon_post replaces (the "
                "Gluon kernels always fold the residual into their accumulators and hold "
                "their weights resident); leave it unset"
            )
    return reasons


def _gluon_heads_errors(
    variant: str, seq_len: int, d_model: int, num_heads: int, tiling: Tiling, gemm: str,
    attn: str,
) -> list[str]:  # fmt: skip
    """Why the Gluon heads attention cannot take this configuration (empty: it can)."""
    if variant != "heads":
        return [
            "gluon_heads replaces the heads attention kernel of variant 'heads'; got "
            f"variant={variant!r}"
        ]
    problems = gluon_heads.gluon_heads_problems(
        seq_len=seq_len, d_model=d_model, num_heads=num_heads, heads=tiling.gluon_heads,
        gemm_precision=gemm, attn_precision=attn, num_warps=tiling.num_warps,
    )  # fmt: skip
    return [f"gluon_heads: {why}" for why in problems]


def gluon_knob(tiling: Tiling) -> tuple[str, str] | None:
    """The first Gluon knob set and the kernel it picks (None: no Gluon kernel)."""
    for name, what in (
        ("gluon_post", "the Gluon post-rows kernel"),
        ("gluon_heads", "the Gluon heads attention"),
        ("gluon_flash", "the Gluon flash attention"),
    ):
        if getattr(tiling, name):
            return name, what
    return None


def not_supported_reasons(
    *,
    variant: str,
    seq_len: int,
    d_model: int,
    num_heads: int,
    ffn_dim: int,
    tiling: Tiling,
    gemm_precision: str,
    attn_precision: str,
    device_type: str,
    capability: tuple[int, int] | None,
    smem_bytes: int | None,
    prune_pointless: bool = True,
) -> list[str]:
    """Why this fused-layer configuration should not run here; empty list = supported.

    With ``prune_pointless``, tiles wider than the padded sequence (they only add masked
    work) are refused too, so a search does not spend trials on them.
    """
    shape = dict(seq_len=seq_len, d_model=d_model, num_heads=num_heads, ffn_dim=ffn_dim)
    precisions = dict(gemm_precision=gemm_precision, attn_precision=attn_precision)
    reasons = _config_errors(variant=variant, tiling=tiling, **shape, **precisions)
    if tiling.pdl:
        reasons += pdl_reasons(device_type, capability)
    if variant == "heads" and not tiling.gluon_heads:  # (the Gluon kernel has no such tile)
        reasons += fused_row_tile_reasons(
            "attn_block_m", tiling.block_m, "fused heads layer", device_type
        )
    if variant == "seq":
        reasons += fused_row_tile_reasons(
            "attn_block_m", tiling.block_m, "one-launch layer", device_type, MAX_SEQ_ROW_TILE
        )
    post = variant == "rows" and tiling.attn_post
    if post and device_type == "cuda" and tiling.block_m > MAX_FUSED_ROW_TILE:
        reasons.append(
            f"attn_block_m={tiling.block_m} with attn_post: the fused kernels' tiles over "
            f"{MAX_FUSED_ROW_TILE} rows faulted or read out of bounds on CUDA (Triton 3.6, "
            "H200: docs/kernels_h200.md), and this one is untried there; use "
            f"attn_block_m <= {MAX_FUSED_ROW_TILE}"
        )
    if not reasons and prune_pointless:
        padded_s = padded_dim(seq_len)
        tiles = [("attn_block_m", tiling.block_m), ("attn_block_n", tiling.block_n)]
        # seq and the one-tile attention hold every key in one tile: no key blocks; the
        # Gluon heads attention uses neither tile
        kept = 0 if tiling.gluon_heads else 1 if variant == "seq" or tiling.attn_head_chunk else 2
        if tiling.gluon_flash:  # 64 query rows a warpgroup: only the key block is a tile
            tiles, kept = tiles[1:], 1
        for name, value in tiles[:kept]:
            if value > padded_s:
                reasons.append(f"{name}={value} > padded seq len {padded_s}; use a smaller {name}")
        padded_hd = padded_dim(d_model // max(num_heads, 1))
        if tiling.attn_head_chunk > padded_hd:
            reasons.append(
                f"attn_head_chunk={tiling.attn_head_chunk} > padded head dim {padded_hd}: one "
                f"chunk, as at {padded_hd}; use attn_head_chunk <= {padded_hd}"
            )
        chunk = ffn_chunk(d_model, ffn_dim)
        if tiling.ffn_block and ffn_chunk(d_model, ffn_dim, tiling.ffn_block) == chunk:
            reasons.append(
                f"ffn_block={tiling.ffn_block} gives the default {chunk} FFN columns a step at "
                f"d_model {d_model}, ffn_dim {ffn_dim}: the same kernel as ffn_block=0"
            )
    if smem_bytes is None and device_type == "cuda":
        smem_bytes = DEFAULT_SMEM_LIMIT
    reasons = launch_reasons(
        kernel=_post_rows_kernel,
        device_type=device_type,
        precision=gemm_precision,
        capability=capability,
        smem_bytes=smem_bytes,
        smem_needed=lambda: estimate_shared_memory_bytes(
            variant=variant,
            d_model=d_model,
            seq_len=seq_len,
            num_heads=num_heads,
            ffn_dim=ffn_dim,
            tiling=tiling,
            **precisions,
        ),
        reasons=reasons,
    )
    if device_type == "cuda" and not reasons:
        reasons.extend(precision_reasons(attn_precision, capability))
    if knob := gluon_knob(tiling):  # whatever else is wrong: the device check names the knob
        name = knob[0]
        if device_type != "cuda":  # (under the interpreter the launcher refuses it)
            reasons.append(
                f"{name} runs on a CUDA device of compute capability 9.x (Gluon has no "
                f"interpreter); leave {name} unset here"
            )
        elif capability is not None and capability[0] != 9:
            reasons.append(
                f"{name} is built for Hopper (wgmma, sm_90); this device is sm_"
                f"{capability[0]}{capability[1]}"
            )
    return reasons


# --------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------
def _post_weights(
    w: LayerWeights, final_norm: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, ...]:
    """The kernel arguments of the work after the attention, in their order: the output
    projection, LayerNorm2, the FFN, and the norm the layer ends with (the final LayerNorm
    in the last layer; LayerNorm2's parameters as unused placeholders otherwise)."""
    f = w.fp32
    norm_w, norm_b = final_norm if final_norm is not None else (f.norm2_weight, f.norm2_bias)
    return (
        w.o_weight, f.o_bias, f.norm2_weight, f.norm2_bias, w.ffn_in_weight, f.ffn_in_bias,
        w.ffn_out_weight, f.ffn_out_bias, norm_w, norm_b,
    )  # fmt: skip


def _qkv_weights(w: LayerWeights) -> tuple[torch.Tensor, ...]:
    """The kernel arguments of LayerNorm1 and the QKV projections, in their order."""
    return w.fp32.norm1_weight, w.fp32.norm1_bias, w.qkv_weight, w.qkv_bias


def _launch_layer(
    x: torch.Tensor,
    out: torch.Tensor,
    ctx: torch.Tensor | None,
    qkv: torch.Tensor | None,
    w: LayerWeights,
    mask_bytes: torch.Tensor | None,
    final_norm: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    variant: str,
    num_heads: int,
    causal: bool,
    tiling: Tiling,
    gemm_precision: str,
    attn_precision: str,
    key_mask: torch.Tensor | None,
    key_bounds: torch.Tensor | None = None,
    qkv_ready: bool = False,
    next_w: LayerWeights | None = None,
    normed: torch.Tensor | None = None,
    normed_ready: bool = False,
) -> None:
    """One layer: ``out = layer(x)`` (``out`` may be ``x``: the last kernel reads and
    writes only its own rows, after the attention has read all of ``x``; for ``seq`` only
    with one query block per sequence). ``rows``: ``qkv_ready``, the previous layer's
    post rows already wrote this layer's ``qkv``; ``next_w``, this layer's post rows also
    writes the next layer's ``qkv`` with those weights. ``heads``: ``normed_ready``, the
    previous layer's post rows already wrote this layer's LayerNorm1 rows into ``normed``;
    ``next_w``, this layer's post rows writes the next layer's there."""
    chain_qkv = variant == "rows" and not tiling.attn_post and qkv is not None
    chain_norm = variant == "heads" and normed is not None
    if qkv_ready and not chain_qkv:
        raise ValueError("qkv_ready chains the post rows of variant='rows' only")
    if normed_ready and not chain_norm:
        raise ValueError("normed_ready chains the post rows of variant='heads' with normed")
    if next_w is not None and not (chain_qkv or chain_norm):
        raise ValueError(
            "next_w chains the post rows of variant='rows' (qkv) or 'heads' (with normed) only"
        )
    if next_w is not None and final_norm is not None:
        raise ValueError("next_w: the last layer (the final LayerNorm) has no next layer")
    batch, seq_len, d_model = x.shape
    head_dim = d_model // num_heads
    block_d = padded_dim(d_model)
    emulate = is_interpreted(_post_rows_kernel)
    f = w.fp32
    num_rows = batch * seq_len
    mask_arg = mask_bytes if mask_bytes is not None else x  # dummy pointer when unused
    if variant == "seq":
        num_q_blocks = triton.cdiv(seq_len, tiling.block_m)
        _seq_layer_kernel[(num_q_blocks, batch)](
            x,
            out,
            mask_arg,
            f.norm1_weight,
            f.norm1_bias,
            w.q_weight,
            f.q_bias,
            w.k_weight,
            f.k_bias,
            w.v_weight,
            f.v_bias,
            *_post_weights(w, final_norm),
            seq_len,
            d_model,
            num_heads,
            head_dim,
            w.ffn_dim,
            num_q_blocks,
            head_dim**-0.5 * LOG2_E,
            LAYERNORM_EPS,
            CAUSAL=bool(causal),
            HAS_KEY_MASK=mask_bytes is not None,
            FINAL_NORM=final_norm is not None,
            BLOCK_M=tiling.block_m,
            BLOCK_S=padded_dim(seq_len),
            BLOCK_D=block_d,
            BLOCK_HD=padded_dim(head_dim),
            BLOCK_F=ffn_chunk(d_model, w.ffn_dim, tiling.ffn_block),
            PREC_G=gemm_precision,
            PREC_A=attn_precision,
            EMULATE_BF16_DOT=emulate,
            GELU_POLY=tiling.gelu_poly,
            num_warps=tiling.num_warps,
            num_stages=tiling.num_stages,
        )
        return
    if variant == "heads" and tiling.gluon_heads:  # kernels.gluon_heads
        gluon_heads.launch_heads_attention_gluon(
            x, normed if normed_ready else None, ctx, mask_bytes, (f.norm1_weight, f.norm1_bias),
            w.qkv_weight, w.qkv_bias, num_heads=num_heads, heads=tiling.gluon_heads,
            causal=bool(causal), eps=LAYERNORM_EPS, num_warps=tiling.num_warps,
            use_gdc=gdc_mode(tiling.pdl, tiling.pdl_trigger),
        )  # fmt: skip
    elif variant == "heads":
        num_q_blocks = triton.cdiv(seq_len, tiling.block_m)
        _heads_attention_kernel[(num_heads * num_q_blocks, batch)](
            x,
            ctx,
            mask_arg,
            f.norm1_weight,
            f.norm1_bias,
            w.q_weight,
            f.q_bias,
            w.k_weight,
            f.k_bias,
            w.v_weight,
            f.v_bias,
            normed if normed_ready else x,  # a placeholder when unused
            seq_len,
            d_model,
            head_dim,
            num_q_blocks,
            head_dim**-0.5 * LOG2_E,
            LAYERNORM_EPS,
            CAUSAL=bool(causal),
            HAS_KEY_MASK=mask_bytes is not None,
            BLOCK_M=tiling.block_m,
            BLOCK_N=tiling.block_n,
            BLOCK_D=block_d,
            BLOCK_HD=padded_dim(head_dim),
            PREC_G=gemm_precision,
            PREC_A=attn_precision,
            EMULATE_BF16_DOT=emulate,
            USE_GDC=gdc_mode(tiling.pdl, tiling.pdl_trigger),
            NORMED=normed_ready,
            PRELOAD=tiling.weights_first,
            num_warps=tiling.num_warps,
            num_stages=tiling.num_stages,
            **pdl_launch(tiling.pdl),
        )
    else:
        assert qkv is not None
        if not qkv_ready and tiling.gluon_post:  # the Gluon QKV rows (kernels.gluon_rows)
            gluon_rows.launch_qkv_rows_gluon(
                x, qkv, _qkv_weights(w), num_rows, d_model, LAYERNORM_EPS,
                num_warps=tiling.row_warps, use_gdc=gdc_mode(tiling.pdl, tiling.pdl_trigger),
            )  # fmt: skip
        elif not qkv_ready:
            _qkv_rows_kernel[(triton.cdiv(num_rows, tiling.row_block),)](
                x,
                qkv,
                *_qkv_weights(w),
                num_rows,
                d_model,
                LAYERNORM_EPS,
                BLOCK_R=tiling.row_block,
                BLOCK_D=block_d,
                BLOCK_N=min(block_d, 64),
                PRECISION=gemm_precision,
                EMULATE_BF16_DOT=emulate,
                USE_GDC=gdc_mode(tiling.pdl, tiling.pdl_trigger),
                num_warps=tiling.row_warps,
                **({"num_stages": tiling.qkv_stages} if tiling.qkv_stages else {}),
                **maxnreg_launch(tiling.row_maxnreg),
                **pdl_launch(tiling.pdl),
            )
        if tiling.attn_post:
            _launch_attn_post(
                x, out, qkv, w, mask_bytes, key_bounds, final_norm, num_heads=num_heads,
                causal=causal, tiling=tiling, gemm_precision=gemm_precision,
                attn_precision=attn_precision, emulate=emulate,
            )  # fmt: skip
            return
        q, k, v = qkv.view(batch, seq_len, 3, num_heads, head_dim).unbind(2)
        flash.attention(
            q,
            k,
            v,
            causal=causal,
            key_mask=key_mask,
            key_bounds=key_bounds,
            out=ctx.view(batch, seq_len, num_heads, head_dim),
            block_m=tiling.block_m,
            block_n=tiling.block_n,
            num_warps=tiling.num_warps,
            num_stages=tiling.num_stages,
            precision=attn_precision,
            pdl=tiling.pdl,
            pdl_trigger=tiling.pdl_trigger,
            maxnreg=tiling.attn_maxnreg,
            head_chunk=tiling.attn_head_chunk,
            gluon=tiling.gluon_flash,
        )
    if tiling.gluon_post:
        chained = next_w is not None and chain_qkv
        norms = next_w is not None and chain_norm
        gluon_rows.launch_post_rows_gluon(
            x, ctx, out, mask_arg, _post_weights(w, final_norm), qkv if chained else x,
            _qkv_weights(next_w if next_w is not None else w), normed if norms else x,
            num_rows, d_model, LAYERNORM_EPS, has_key_mask=mask_bytes is not None,
            final_norm=final_norm is not None, gelu_poly=tiling.gelu_poly, next_qkv=chained,
            next_norm=norms, num_warps=tiling.row_warps,
            use_gdc=gdc_mode(tiling.pdl, tiling.pdl_trigger),
        )  # fmt: skip
        return
    _post_rows_kernel[(triton.cdiv(num_rows, tiling.row_block),)](
        x,
        ctx,
        out,
        mask_arg,
        *_post_weights(w, final_norm),
        qkv if next_w is not None and chain_qkv else x,  # placeholders when unused
        *_qkv_weights(next_w if next_w is not None else w),
        normed if next_w is not None and chain_norm else x,
        num_rows,
        d_model,
        w.ffn_dim,
        LAYERNORM_EPS,
        HAS_KEY_MASK=mask_bytes is not None,
        FINAL_NORM=final_norm is not None,
        BLOCK_R=tiling.row_block,
        BLOCK_D=block_d,
        # weights_first: the output projection and the FFN in one step each.
        BLOCK_K=block_d if tiling.weights_first else k_chunk(d_model),
        BLOCK_F=(
            padded_dim(w.ffn_dim)
            if tiling.weights_first
            else ffn_chunk(d_model, w.ffn_dim, tiling.ffn_block)
        ),
        PRECISION=gemm_precision,
        EMULATE_BF16_DOT=emulate,
        STAGE_RESIDUAL=tiling.stage_residual,
        GELU_POLY=tiling.gelu_poly,
        NEXT_QKV=next_w is not None and chain_qkv,
        BLOCK_N=min(block_d, 64),
        USE_GDC=gdc_mode(tiling.pdl, tiling.pdl_trigger),
        FOLD_RESIDUAL=tiling.fold_residual,
        NEXT_NORM=next_w is not None and chain_norm,
        PRELOAD=tiling.weights_first,
        num_warps=tiling.row_warps,
        **maxnreg_launch(tiling.row_maxnreg),
        **pdl_launch(tiling.pdl),
    )


def _launch_attn_post(
    x: torch.Tensor,
    out: torch.Tensor,
    qkv: torch.Tensor,
    w: LayerWeights,
    mask_bytes: torch.Tensor | None,
    key_bounds: torch.Tensor | None,
    final_norm: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    num_heads: int,
    causal: bool,
    tiling: Tiling,
    gemm_precision: str,
    attn_precision: str,
    emulate: bool,
) -> None:
    """rows with ``attn_post``: the attention, output projection, LayerNorm2, FFN and
    residuals of a layer in one launch, after the QKV rows kernel filled ``qkv``."""
    batch, seq_len, d_model = x.shape
    head_dim = d_model // num_heads
    num_m_blocks = triton.cdiv(seq_len, tiling.block_m)
    block_hd = padded_dim(head_dim)
    _attn_post_rows_kernel[(num_m_blocks, batch)](
        qkv,
        x,
        out,
        mask_bytes if mask_bytes is not None else x,
        key_bounds if key_bounds is not None else x,
        *_post_weights(w, final_norm),
        seq_len,
        d_model,
        num_heads,
        head_dim,
        w.ffn_dim,
        num_m_blocks,
        head_dim**-0.5 * LOG2_E,
        LAYERNORM_EPS,
        CAUSAL=bool(causal),
        HAS_KEY_MASK=mask_bytes is not None,
        HAS_KEY_BOUNDS=key_bounds is not None,
        FINAL_NORM=final_norm is not None,
        BLOCK_M=tiling.block_m,
        BLOCK_N=tiling.block_n,
        BLOCK_HD=block_hd,
        BLOCK_D=padded_dim(d_model),
        BLOCK_F=ffn_chunk(d_model, w.ffn_dim, tiling.ffn_block),
        EVEN_HD=block_hd == head_dim,
        PREC_G=gemm_precision,
        PREC_A=attn_precision,
        EMULATE_BF16_DOT=emulate,
        STAGE_RESIDUAL=tiling.stage_residual,
        GELU_POLY=tiling.gelu_poly,
        num_warps=tiling.num_warps,
        num_stages=tiling.num_stages,
    )


def layer_stack(
    x: torch.Tensor,
    layers: Sequence[LayerWeights],
    final_norm: tuple[torch.Tensor, torch.Tensor],
    *,
    num_heads: int,
    causal: bool,
    key_mask: torch.Tensor | None = None,
    variant: str = "heads",
    tiling: Tiling = Tiling(),
    gemm_precision: str = "fp16",
    attn_precision: str = "fp16",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every layer of a pre-norm stack and the final LayerNorm (fused into the last
    layer's post-rows kernel); ``x [B, S, D]`` fp32 contiguous is never written.

    ``key_mask`` [B, S] bool (True = a real token), any pattern, is read on the device:
    the launcher never synchronises (safe inside CUDA graph capture). Working memory: the
    output, a context buffer ``[B, S, D]`` (fp16 with fp16 GEMM operands; none for ``rows``
    with ``tiling.attn_post``) and, for ``rows``, the packed ``[B, S, 3D]`` projections in
    the attention operand dtype; for ``heads`` with ``tiling.next_norm``, the LayerNorm1
    rows ``[B, S, D]`` in the GEMM operand dtype.
    """
    _check_x(x)
    if len(layers) == 0:
        raise ValueError("layers is empty; pass at least one LayerWeights")
    batch, seq_len, d_model = x.shape
    want = _DTYPES.get(gemm_precision, torch.float32)
    for i, w in enumerate(layers):
        if not isinstance(w, LayerWeights):
            raise ValueError(
                f"layers[{i}] is a {type(w).__name__}; pass prepare_layer_weights(...) results"
            )
        if w.d_model != d_model:
            raise ValueError(
                f"layers[{i}] has d_model={w.d_model} but x has {d_model} features; "
                "pass the matching layers"
            )
        if w.q_weight.dtype != want:
            raise ValueError(
                f"layers[{i}] holds {w.q_weight.dtype} weights but gemm_precision="
                f"{gemm_precision!r} reads {want}; prepare them with that precision"
            )
    _check_norm(final_norm, d_model)
    errors = _config_errors(
        variant=variant,
        seq_len=seq_len,
        d_model=d_model,
        num_heads=num_heads,
        ffn_dim=layers[0].ffn_dim,
        tiling=tiling,
        gemm_precision=gemm_precision,
        attn_precision=attn_precision,
    )
    if errors:
        raise ValueError("; ".join(errors))
    mask_bytes = None if key_mask is None else _mask_bytes(key_mask, batch, seq_len)
    if tiling.mask_bounds and variant != "rows":
        raise ValueError("tiling.mask_bounds applies to variant='rows' only")
    if tiling.one_launch:
        raise ValueError(
            "tiling.one_launch runs the whole stack in one kernel: call "
            "kernels.stack.stack_forward, not layer_stack"
        )
    if tiling.attn_post and variant != "rows":
        raise ValueError("tiling.attn_post applies to variant='rows' only")
    if tiling.stage_residual and variant == "seq":
        raise ValueError("tiling.stage_residual applies to the post-rows kernel (heads, rows)")
    out = _output_buffer(out, x, "x is never written")
    tensors = {"x": x, "out": out, "weights": layers[0].q_weight}
    if mask_bytes is not None:
        tensors["key_mask"] = mask_bytes
    check_launch_device(_post_rows_kernel, tensors)
    offline = _triton.OFFLINE_ARCH is not None  # compiled and recorded, not run
    if tiling.pdl and (
        (x.device.type != "cuda" and not offline) or is_interpreted(_post_rows_kernel)
    ):
        where = "the interpreter" if is_interpreted(_post_rows_kernel) else str(x.device)
        raise ValueError(
            "tiling.pdl (programmatic dependent launch) needs compiled kernels on a CUDA GPU; "
            f"got {where}"
        )
    if tiling.pdl and (why := pdl_reasons("cuda", _triton.launch_capability(x.device))):
        raise ValueError("; ".join(why))
    if knob := gluon_knob(tiling):
        name, what = knob
        if (x.device.type != "cuda" and not offline) or is_interpreted(_post_rows_kernel):
            where = "the interpreter" if is_interpreted(_post_rows_kernel) else str(x.device)
            raise ValueError(
                f"tiling.{name} ({what}) runs compiled on a CUDA GPU of compute capability "
                f"9.x; got {where}: leave {name} unset"
            )
        major = (
            _triton.OFFLINE_ARCH // 10 if offline else torch.cuda.get_device_capability(x.device)[0]
        )
        if major != 9:
            raise ValueError(
                f"tiling.{name} is built for Hopper (sm_90: wgmma); this device is sm_{major}x"
            )
    if x.numel() == 0:
        return out
    if variant == "seq":
        return _seq_stack(x, out, layers, final_norm, mask_bytes, num_heads, causal, tiling,
                          gemm_precision, attn_precision)  # fmt: skip
    # The context in the post-rows kernel's operand type: heads writes it itself; rows' flash
    # attention rounds once on its store (fp16 only: kernels._common.OUT_DTYPES), which is
    # what post rows' to_operand did to an fp32 context (the same bits, half the bytes).
    ctx_dtype = torch.float32
    if variant == "heads":
        ctx_dtype = _DTYPES.get(gemm_precision, torch.float32)
    elif gemm_precision == "fp16":
        ctx_dtype = torch.float16
    ctx = None if tiling.attn_post else torch.empty(x.shape, device=x.device, dtype=ctx_dtype)
    qkv = None
    if variant == "rows":
        qkv_dtype = _DTYPES.get(attn_precision, torch.float32)
        qkv = torch.empty((batch, seq_len, 3 * d_model), device=x.device, dtype=qkv_dtype)
        if tiling.attn_post:  # the fused kernel reads q, k, v with int32 offsets
            head_dim = d_model // num_heads
            views = qkv.view(batch, seq_len, 3, num_heads, head_dim).unbind(2)
            check_int32_offsets(dict(zip("qkv", views, strict=True)), seq_len, head_dim)
    normed = None
    if tiling.next_norm and len(layers) > 1:  # heads (_config_errors): LayerNorm1 rows
        normed = torch.empty(
            x.shape, device=x.device, dtype=_DTYPES.get(gemm_precision, torch.float32)
        )
    bounds = None
    if tiling.mask_bounds and key_mask is not None:
        bounds = flash.key_mask_bounds(key_mask)  # one launch, for every layer
    current = x
    for i, w in enumerate(layers):
        last = i == len(layers) - 1
        chained = (tiling.next_qkv and variant == "rows") or normed is not None
        _launch_layer(
            current,
            out,
            ctx,
            qkv,
            w,
            mask_bytes,
            final_norm if last else None,
            variant=variant,
            num_heads=num_heads,
            causal=causal,
            tiling=tiling,
            gemm_precision=gemm_precision,
            attn_precision=attn_precision,
            key_mask=key_mask,
            key_bounds=bounds,
            qkv_ready=chained and i > 0 and normed is None,
            next_w=layers[i + 1] if chained and not last else None,
            normed=normed,
            normed_ready=normed is not None and i > 0,
        )
        current = out
    return out


def _seq_stack(
    x: torch.Tensor,
    out: torch.Tensor,
    layers: Sequence[LayerWeights],
    final_norm: tuple[torch.Tensor, torch.Tensor],
    mask_bytes: torch.Tensor | None,
    num_heads: int,
    causal: bool,
    tiling: Tiling,
    gemm_precision: str,
    attn_precision: str,
) -> torch.Tensor:
    """The ``seq`` variant's layers, one launch each. With one query block per sequence a
    program reads only its own rows and every layer after the first runs in place in
    ``out``; with several, programs of a sequence read each other's rows, so layers
    alternate between ``out`` and one more buffer, ending in ``out``."""
    single = tiling.block_m >= x.shape[1]
    spare = out if single else torch.empty_like(out)
    current = x
    for i, w in enumerate(layers):
        left = len(layers) - 1 - i  # layers after this one
        target = out if single or left % 2 == 0 else spare
        _launch_layer(
            current,
            target,
            None,
            None,
            w,
            mask_bytes,
            final_norm if left == 0 else None,
            variant="seq",
            num_heads=num_heads,
            causal=causal,
            tiling=tiling,
            gemm_precision=gemm_precision,
            attn_precision=attn_precision,
            key_mask=None,
        )
        current = target
    return out
