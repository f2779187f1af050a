"""Fused attention forward (FlashAttention-2 style online softmax), its reference, checks.

Layout: q, k, v and the output are ``[B, S, H, head_dim]`` views with arbitrary strides
(last-dim stride 1), e.g. slices of a packed ``[B, S, 3D]`` QKV projection viewed as
``[B, S, 3, H, hd]``; the output can be written straight into a ``[B, S, D]`` buffer viewed
as ``[B, S, H, hd]``.

Arithmetic (REFERENCE.md steps 2-6): ``scores = (q @ k^T) * scale``; keys ``j > i`` masked
when causal; keys ``j >= key_lengths[b]`` masked; softmax in fp32; ``probs @ v``. The kernel
never stores scores: each program owns ``BLOCK_M`` query rows of one (batch, head) and
streams key blocks, keeping the running max ``m``, sum ``l`` and accumulator in fp32.
``exp2`` is used with ``log2(e)`` folded into the scale.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels import _triton, gluon_flash
from kernels._common import (
    MIN_BLOCK,
    check_int32_offsets,
    check_out,
    check_qkv,
    gdc_mode,
    grid_dependency_enter,
    grid_dependency_exit,
    maxnreg_errors,
    maxnreg_launch,
    padded_head_dim,
    pdl_launch,
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
    next_power_of_2,
)

MIN_HEAD_DIM = 8
MAX_HEAD_DIM = 256
LOG2_E = math.log2(math.e)
# The one-tile form (head_chunk > 0) holds a [block_m, padded seq] score tile in registers.
MAX_ONE_TILE_KEYS = 256

__all__ = [
    "attention",
    "attention_reference",
    "estimate_shared_memory_bytes",
    "key_mask_bounds",
    "key_mask_bounds_reference",
    "not_supported_reasons",
]


# --------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------
def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    key_lengths: torch.Tensor | None = None,
    key_mask: torch.Tensor | None = None,
    scale: float | None = None,
    query_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain PyTorch attention following REFERENCE.md steps 2-6; returns ``[B, S, H, hd]``.
    ``key_mask`` [B, S] bool: keys marked False are masked (the reference's key mask).

    Materialises the scores. ``query_rows`` (1-D int tensor of query positions) restricts
    the computation to those rows (returns ``[B, len(query_rows), H, hd]``), which keeps
    the memory linear in S for spot checks at long sequence lengths.
    """
    seq_len, head_dim = q.shape[1], q.shape[3]
    scale = head_dim**-0.5 if scale is None else scale
    qh = q.transpose(1, 2)  # [B, H, S, hd]
    kh = k.transpose(1, 2).contiguous()
    vh = v.transpose(1, 2).contiguous()
    rows = torch.arange(seq_len, device=q.device) if query_rows is None else query_rows
    rows = rows.to(device=q.device, dtype=torch.long)
    qh = qh.index_select(2, rows).contiguous()
    scores = (qh @ kh.transpose(-2, -1)) * scale  # [B, H, R, S]
    keys = torch.arange(seq_len, device=q.device)
    if causal:
        scores = scores.masked_fill(keys[None, :] > rows[:, None], float("-inf"))
    if key_lengths is not None:
        valid = keys[None, :] < key_lengths.to(q.device)[:, None]  # [B, S]
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask.to(q.device)[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return (probs @ vh).transpose(1, 2).contiguous()


# --------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------
@triton.jit
def _attend_key_block(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_ks,
    stride_vs,
    start_n,
    offs_m,
    offs_n0,
    offs_d,
    kv_len,
    head_dim,
    qk_scale,
    km_base,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One online-softmax step over keys ``[start_n, start_n + BLOCK_N)``.

    MASKED=False is only used for blocks where every key is valid for every query row.
    HAS_KEY_MASK (only with MASKED): keys whose byte at ``km_base`` is 0 are masked.
    """
    offs_n = start_n + offs_n0
    d_ok = offs_d < head_dim
    n_ok = offs_n < kv_len
    kt_ptrs = k_base + offs_n[None, :] * stride_ks + offs_d[:, None]
    v_ptrs = v_base + offs_n[:, None] * stride_vs + offs_d[None, :]
    if MASKED:
        kt = tl.load(kt_ptrs, mask=n_ok[None, :] & d_ok[:, None], other=0.0)
    elif EVEN_D:
        kt = tl.load(kt_ptrs)
    else:
        kt = tl.load(kt_ptrs, mask=d_ok[:, None], other=0.0)
    kt = to_operand(kt, PRECISION, EMULATE_BF16_DOT)
    qk = dot(q, kt, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), PRECISION, EMULATE_BF16_DOT)
    qk = qk * qk_scale  # log2 domain: scale * log2(e)
    if MASKED:
        valid = n_ok[None, :]
        if HAS_KEY_MASK:
            valid = valid & (tl.load(km_base + offs_n, mask=n_ok, other=0) != 0)[None, :]
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None])
        qk = tl.where(valid, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # A row with no valid key so far keeps m = -inf; subtract 0 instead (no NaN).
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = m_new
    p = tl.exp2(qk - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if MASKED:
        v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    elif EVEN_D:
        v = tl.load(v_ptrs)
    else:
        v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
    v = to_operand(v, PRECISION, EMULATE_BF16_DOT)
    p = to_operand(p, PRECISION, EMULATE_BF16_DOT)
    acc = dot(p, v, acc, PRECISION, EMULATE_BF16_DOT)
    return acc, l_i, m_new


@triton.jit
def _attention_rows(
    q_base,
    k_base,
    v_base,
    km_base,
    key_lengths_ptr,
    key_bounds_ptr,
    off_b,
    start_m,
    stride_qs,
    stride_ks,
    stride_vs,
    seq_len,
    head_dim,
    qk_scale,
    CAUSAL: tl.constexpr,
    HAS_KEY_LENGTHS: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    HAS_KEY_BOUNDS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
):
    """The attention of query rows ``[start_m, start_m + BLOCK_M)`` of one (sequence, head):
    fp32 ``[BLOCK_M, BLOCK_D]``, normalised; a row with no valid key gives 0, rows past
    ``seq_len`` are computed from zero queries (the caller masks their store)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < seq_len
    d_ok = offs_d < head_dim
    q = tl.load(
        q_base + offs_m[:, None] * stride_qs + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    q = to_operand(q, PRECISION, EMULATE_BF16_DOT)

    kv_len = seq_len
    if HAS_KEY_LENGTHS:
        kv_len = tl.minimum(tl.load(key_lengths_ptr + off_b).to(tl.int32), seq_len)
        kv_len = tl.maximum(kv_len, 0)
    # Key blocks in [0, full_hi) are valid for every row of this query block; blocks in
    # [full_hi, hi) need the tail / padding / causal mask; keys >= hi are skipped.
    if CAUSAL:
        hi = tl.minimum(kv_len, start_m + BLOCK_M)
        full_hi = tl.minimum(kv_len, start_m + 1)
    else:
        hi = kv_len
        full_hi = kv_len
    full_hi = (full_hi // BLOCK_N) * BLOCK_N
    if HAS_KEY_MASK:
        if HAS_KEY_BOUNDS:
            # key_mask_bounds: keys [0, prefix) are all valid, keys >= end all masked.
            # Blocks inside the prefix take the unmasked step, blocks past the end are
            # skipped (a fully masked block adds exactly nothing): the same result.
            prefix = tl.load(key_bounds_ptr + off_b * 2).to(tl.int32)
            end = tl.load(key_bounds_ptr + off_b * 2 + 1).to(tl.int32)
            hi = tl.minimum(hi, end)
            full_hi = tl.minimum(full_hi, (prefix // BLOCK_N) * BLOCK_N)
        else:  # any key may be masked: every block takes the masked step
            full_hi = 0

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, full_hi, BLOCK_N):
        acc, l_i, m_i = _attend_key_block(
            acc,
            l_i,
            m_i,
            q,
            k_base,
            v_base,
            stride_ks,
            stride_vs,
            start_n,
            offs_m,
            offs_n0,
            offs_d,
            kv_len,
            head_dim,
            qk_scale,
            km_base,
            False,
            CAUSAL,
            False,
            EVEN_D,
            PRECISION,
            EMULATE_BF16_DOT,
            BLOCK_M,
            BLOCK_N,
            BLOCK_D,
        )
    for start_n in range(full_hi, hi, BLOCK_N):
        acc, l_i, m_i = _attend_key_block(
            acc,
            l_i,
            m_i,
            q,
            k_base,
            v_base,
            stride_ks,
            stride_vs,
            start_n,
            offs_m,
            offs_n0,
            offs_d,
            kv_len,
            head_dim,
            qk_scale,
            km_base,
            True,
            CAUSAL,
            HAS_KEY_MASK,
            EVEN_D,
            PRECISION,
            EMULATE_BF16_DOT,
            BLOCK_M,
            BLOCK_N,
            BLOCK_D,
        )
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # no valid key at all: output 0, not NaN
    out = acc / l_safe[:, None]
    return out


@triton.jit
def _attention_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    key_lengths_ptr,
    key_mask_ptr,
    key_bounds_ptr,
    stride_mb,
    stride_qb,
    stride_qs,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_os,
    stride_oh,
    num_heads,
    seq_len,
    head_dim,
    qk_scale,
    CAUSAL: tl.constexpr,
    HAS_KEY_LENGTHS: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    HAS_KEY_BOUNDS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    grid_dependency_enter(USE_GDC)
    # 1-D grid: (batch * head)-major so the query blocks of one head run together and
    # share its K/V in L2; within a head the most expensive (last, causal) blocks go first.
    num_m_blocks = tl.cdiv(seq_len, BLOCK_M)
    pid = tl.program_id(0)
    pid_bh = pid // num_m_blocks
    pid_m = num_m_blocks - 1 - pid % num_m_blocks
    off_b = (pid_bh // num_heads).to(tl.int64)
    off_h = (pid_bh % num_heads).to(tl.int64)
    q_base = q_ptr + off_b * stride_qb + off_h * stride_qh
    k_base = k_ptr + off_b * stride_kb + off_h * stride_kh
    v_base = v_ptr + off_b * stride_vb + off_h * stride_vh
    o_base = o_ptr + off_b * stride_ob + off_h * stride_oh

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    out = _attention_rows(
        q_base,
        k_base,
        v_base,
        key_mask_ptr + off_b * stride_mb,
        key_lengths_ptr,
        key_bounds_ptr,
        off_b,
        start_m,
        stride_qs,
        stride_ks,
        stride_vs,
        seq_len,
        head_dim,
        qk_scale,
        CAUSAL,
        HAS_KEY_LENGTHS,
        HAS_KEY_MASK,
        HAS_KEY_BOUNDS,
        BLOCK_M,
        BLOCK_N,
        BLOCK_D,
        EVEN_D,
        PRECISION,
        EMULATE_BF16_DOT,
    )
    row_ok = offs_m < seq_len
    d_ok = offs_d < head_dim
    tl.store(
        o_base + offs_m[:, None] * stride_os + offs_d[None, :],
        out.to(o_base.dtype.element_ty),  # fp32, or rounded once to a half output
        mask=row_ok[:, None] & d_ok[None, :],
    )
    grid_dependency_exit(USE_GDC)


@triton.jit
def _attention_keys_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    key_lengths_ptr,
    key_mask_ptr,
    key_bounds_ptr,
    stride_mb,
    stride_qb,
    stride_qs,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_os,
    stride_oh,
    num_heads,
    seq_len,
    head_dim,
    qk_scale,
    CAUSAL: tl.constexpr,
    HAS_KEY_LENGTHS: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    HAS_KEY_BOUNDS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DC: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    """Every key of the sequence in one tile (``BLOCK_N >= seq_len``), the head dim in
    chunks of ``BLOCK_DC``: ``scores = sum_c q[:, c] @ k[:, c]^T``, an exact softmax (no
    running max, no rescaling), then ``out[:, c] = probs @ v[:, c]`` chunk by chunk, each
    stored as it is done. At large head dims (case 8: 256) this holds a score tile and one
    output chunk in registers where the flash form holds the whole ``[BLOCK_M, head_dim]``
    accumulator beside the query (225-255 registers a thread, spilling at 4 warps).

    The probabilities are normalised before the second product (the reference's order:
    softmax, round to the operand type, ``probs @ v``); a row with no valid key gives 0."""
    grid_dependency_enter(USE_GDC)
    num_m_blocks = tl.cdiv(seq_len, BLOCK_M)
    pid = tl.program_id(0)
    pid_bh = pid // num_m_blocks
    pid_m = num_m_blocks - 1 - pid % num_m_blocks
    off_b = (pid_bh // num_heads).to(tl.int64)
    off_h = (pid_bh % num_heads).to(tl.int64)
    q_base = q_ptr + off_b * stride_qb + off_h * stride_qh
    k_base = k_ptr + off_b * stride_kb + off_h * stride_kh
    v_base = v_ptr + off_b * stride_vb + off_h * stride_vh
    o_base = o_ptr + off_b * stride_ob + off_h * stride_oh

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_DC)
    row_ok = offs_m < seq_len
    kv_len = seq_len
    if HAS_KEY_LENGTHS:
        kv_len = tl.minimum(tl.load(key_lengths_ptr + off_b).to(tl.int32), seq_len)
    if HAS_KEY_BOUNDS:  # keys past the last valid one are never loaded (all masked)
        kv_len = tl.minimum(kv_len, tl.load(key_bounds_ptr + off_b * 2 + 1).to(tl.int32))
    if CAUSAL:  # no row of this block sees a key past its last row
        kv_len = tl.minimum(kv_len, start_m + BLOCK_M)
    n_ok = offs_n < kv_len

    qk = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for d0 in range(0, head_dim, BLOCK_DC):
        d_ok = d0 + offs_c < head_dim
        q = tl.load(
            q_base + offs_m[:, None] * stride_qs + (d0 + offs_c)[None, :],
            mask=row_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        kt = tl.load(
            k_base + offs_n[None, :] * stride_ks + (d0 + offs_c)[:, None],
            mask=n_ok[None, :] & d_ok[:, None],
            other=0.0,
        )
        q = to_operand(q, PRECISION, EMULATE_BF16_DOT)
        kt = to_operand(kt, PRECISION, EMULATE_BF16_DOT)
        qk = dot(q, kt, qk, PRECISION, EMULATE_BF16_DOT)

    valid = n_ok[None, :]
    if HAS_KEY_MASK:
        km = tl.load(key_mask_ptr + off_b * stride_mb + offs_n, mask=n_ok, other=0)
        valid = valid & (km != 0)[None, :]
    if CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None])
    qk = tl.where(valid, qk * qk_scale, float("-inf"))  # log2 domain: scale * log2(e)
    m = tl.max(qk, 1)
    m = tl.where(m == float("-inf"), 0.0, m)  # a row with no valid key: p = 0, not NaN
    p = tl.exp2(qk - m[:, None])
    l_sum = tl.sum(p, 1)
    p = p * (1.0 / tl.where(l_sum == 0.0, 1.0, l_sum))[:, None]
    p = to_operand(p, PRECISION, EMULATE_BF16_DOT)

    for d0 in range(0, head_dim, BLOCK_DC):
        d_ok = d0 + offs_c < head_dim
        v = tl.load(
            v_base + offs_n[:, None] * stride_vs + (d0 + offs_c)[None, :],
            mask=n_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        v = to_operand(v, PRECISION, EMULATE_BF16_DOT)
        out = tl.zeros([BLOCK_M, BLOCK_DC], dtype=tl.float32)
        out = dot(p, v, out, PRECISION, EMULATE_BF16_DOT)
        tl.store(
            o_base + offs_m[:, None] * stride_os + (d0 + offs_c)[None, :],
            out.to(o_base.dtype.element_ty),  # fp32, or rounded once to a half output
            mask=row_ok[:, None] & d_ok[None, :],
        )
    grid_dependency_exit(USE_GDC)


# --------------------------------------------------------------------------------------
# Planning: what a configuration needs and whether it can run
# --------------------------------------------------------------------------------------
def estimate_shared_memory_bytes(
    *, head_dim: int, block_m: int, block_n: int, num_stages: int, precision: str
) -> int:
    """Shared memory of one program in bytes: a model of what Triton allocates.

    Calibrated against ``metadata.shared`` of this kernel compiled by Triton 3.9 for sm_90
    over 40 tiles (head_dim 8..256, block 32..128, num_stages 1..4, every precision).
    K and V tiles are staged in shared memory as loaded, i.e. in fp32, whatever the
    operand precision:

    - fp32 operands (tf32 / ieee / tf32x3), num_stages >= 2:
      ``(block_m + 2 * num_stages * block_n) * BLOCK_D * 4`` (Q + K/V ring), exact;
      tf32x3 adds ``block_m * BLOCK_D * 4``; ieee needed up to 20% less.
    - fp16 / bf16, num_stages >= 2: ``(num_stages - 1) * 2 * block_n * BLOCK_D * 4``
      (fp32 K/V ring) ``+ block_m * BLOCK_D * 2`` (Q) ``+ block_n * BLOCK_D * 2``
      (converted operand), exact.
    - num_stages == 1 (no pipelining): ``(block_m + block_n) * BLOCK_D * 4`` for fp32
      operands and ``max(block_m, block_n) * BLOCK_D * 4`` for fp16 / bf16, exact.

    Triton 3.6 (the GPU machine) may allocate differently; a tile under the limit can
    still fail with OutOfResources at its first launch: record that as "unsupported".
    """
    block_d = padded_head_dim(head_dim)
    half = precision in HALF_PRECISIONS
    if num_stages <= 1:
        return (max(block_m, block_n) if half else block_m + block_n) * block_d * 4
    if half:
        staged_kv = (num_stages - 1) * 2 * block_n * block_d * 4
        return staged_kv + block_m * block_d * 2 + block_n * block_d * 2
    need = (block_m + 2 * num_stages * block_n) * block_d * 4
    if precision == "tf32x3":
        need += block_m * block_d * 4
    return need


def one_tile_keys(seq_len: int) -> int:
    """BLOCK_N of the one-tile form: the sequence rounded up to a power of two, >= 16."""
    return max(MIN_BLOCK, next_power_of_2(seq_len))


def one_tile_reasons(head_chunk: int, seq_len: int) -> list[str]:
    """Reasons the one-tile form (``head_chunk`` > 0) cannot run at this length."""
    if head_chunk == 0:
        return []
    if not is_power_of_2(head_chunk) or head_chunk < MIN_BLOCK:
        return [f"head_chunk={head_chunk} must be 0 or a power of two >= {MIN_BLOCK}"]
    if one_tile_keys(seq_len) > MAX_ONE_TILE_KEYS:
        return [
            f"head_chunk={head_chunk} holds every key in one tile: seq_len={seq_len} is over "
            f"{MAX_ONE_TILE_KEYS}; use head_chunk=0 (the flash form)"
        ]
    return []


def estimate_one_tile_shared_memory_bytes(
    *,
    seq_len: int,
    block_m: int,
    head_chunk: int,
    head_dim: int,
    num_stages: int,
    precision: str,
    input_bytes: int = 4,
) -> int:
    """Shared memory of one program of the one-tile form (``head_chunk`` > 0) in bytes, an
    upper bound: the query and key chunks staged as loaded, ``max(num_stages, 1) *
    (block_m + BLOCK_N) * chunk * input_bytes`` (2 for half inputs, 4 for fp32), plus the
    ``[block_m, BLOCK_N]`` probability tile of the second product in the operand type;
    twice that for tf32x3 (split operands).

    Against Triton 3.6's ``metadata.shared`` (286 compiles: sm_80 and sm_90, 4 and 8 warps,
    32-128 rows, chunks of 32-128, 1-3 stages, fp32 and half inputs, S 128 and 256; a
    review's sweep, session 24): the compiled size 0.14-0.94 of it, never over. Without the
    probability tile it was up to 2.4x under (mma.sync at 32 rows or on sm_80; 8 warps on
    sm_90)."""
    chunk = min(head_chunk, padded_head_dim(head_dim))
    keys = one_tile_keys(seq_len)
    staged = max(num_stages, 1) * (block_m + keys) * chunk * input_bytes
    probs = block_m * keys * (2 if precision in HALF_PRECISIONS else 4)
    return (staged + probs) * (2 if precision == "tf32x3" else 1)


def _config_errors(
    *,
    head_dim: int,
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    precision: str,
) -> list[str]:
    """Reasons a configuration cannot run at all (the launcher raises on these)."""
    reasons: list[str] = []
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        reasons.append(
            f"head_dim={head_dim} is outside {MIN_HEAD_DIM}..{MAX_HEAD_DIM}; "
            "use a different number of heads"
        )
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if not is_power_of_2(value) or value < MIN_BLOCK:
            reasons.append(f"{name}={value} must be a power of two >= {MIN_BLOCK}")
    if num_warps not in SUPPORTED_NUM_WARPS:
        reasons.append(f"num_warps={num_warps} must be one of {SUPPORTED_NUM_WARPS}")
    if num_stages < 1:
        reasons.append(f"num_stages={num_stages} must be >= 1")
    reasons.extend(precision_reasons(precision, None))
    return reasons


def not_supported_reasons(
    *,
    head_dim: int,
    seq_len: int,
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    precision: str,
    device_type: str,
    capability: tuple[int, int] | None,
    smem_bytes: int | None,
    prune_pointless: bool = True,
    head_chunk: int = 0,
    half_inputs: bool = False,
) -> list[str]:
    """Why this attention configuration should not run here; empty list = supported.

    ``prune_pointless`` also refuses tiles larger than the padded sequence (they run, but
    waste the search's time) and, for the one-tile form (``head_chunk`` > 0), chunks wider
    than the padded head dim; a builder that must serve any shape turns it off.
    ``half_inputs``: q, k, v arrive as fp16 / bf16 (the one-tile form's shared memory)."""
    reasons = _config_errors(
        head_dim=head_dim,
        block_m=block_m,
        block_n=block_n,
        num_warps=num_warps,
        num_stages=num_stages,
        precision=precision,
    )
    if seq_len < 1:
        reasons.append(f"seq_len={seq_len} must be >= 1")
    reasons += one_tile_reasons(head_chunk, seq_len)
    padded_seq = max(MIN_BLOCK, next_power_of_2(seq_len))
    blocks = (("block_m", block_m),) if head_chunk else (("block_m", block_m), ("block_n", block_n))
    for name, value in blocks:
        if prune_pointless and is_power_of_2(value) and value > padded_seq:
            reasons.append(f"{name.upper()}={value} > padded seq len {padded_seq}")
    padded_d = padded_head_dim(head_dim)
    if prune_pointless and head_chunk and is_power_of_2(head_chunk) and head_chunk > padded_d:
        reasons.append(f"head_chunk={head_chunk} > padded head dim {padded_d}")

    def smem_needed() -> int:
        if head_chunk:
            return estimate_one_tile_shared_memory_bytes(
                seq_len=seq_len,
                block_m=block_m,
                head_chunk=head_chunk,
                head_dim=head_dim,
                num_stages=num_stages,
                precision=precision,
                input_bytes=2 if half_inputs else 4,
            )
        return estimate_shared_memory_bytes(
            head_dim=head_dim,
            block_m=block_m,
            block_n=block_n,
            num_stages=num_stages,
            precision=precision,
        )

    return launch_reasons(
        kernel=_attention_keys_kernel if head_chunk else _attention_fwd_kernel,
        device_type=device_type,
        precision=precision,
        capability=capability,
        smem_bytes=smem_bytes,
        smem_needed=smem_needed,
        reasons=reasons,
    )


# --------------------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------------------
@triton.jit
def _key_bounds_kernel(mask_ptr, out_ptr, seq_len, stride_mb, BLOCK: tl.constexpr):
    """Per sequence: the first masked key (``seq_len`` if none) and one past the last
    valid key (0 if none)."""
    b = tl.program_id(0).to(tl.int64)
    first_masked = tl.full([], 0, tl.int32) + seq_len
    end = tl.full([], 0, tl.int32)
    for start in range(0, seq_len, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < seq_len
        valid = tl.load(mask_ptr + b * stride_mb + offs, mask=inside, other=0) != 0
        first_masked = tl.minimum(first_masked, tl.min(tl.where(inside & ~valid, offs, seq_len), 0))
        end = tl.maximum(end, tl.max(tl.where(inside & valid, offs + 1, 0), 0))
    tl.store(out_ptr + b * 2, first_masked)
    tl.store(out_ptr + b * 2 + 1, end)


def key_mask_bounds_reference(key_mask: torch.Tensor) -> torch.Tensor:
    """``[B, 2]`` int32: per sequence the length of its all-valid key prefix and one past
    its last valid key (PyTorch, the kernel's reference)."""
    batch, seq_len = key_mask.shape
    pos = torch.arange(seq_len, device=key_mask.device)
    first = torch.where(~key_mask, pos, seq_len).amin(1) if seq_len else pos.new_zeros(batch)
    end = torch.where(key_mask, pos + 1, 0).amax(1) if seq_len else pos.new_zeros(batch)
    return torch.stack([first, end], 1).to(torch.int32)


def key_mask_bounds(key_mask: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 2]`` int32 on the mask's device, for ``attention(..., key_bounds=)``: one
    launch, no host synchronisation (safe inside CUDA graph capture)."""
    if key_mask.dim() != 2:
        raise ValueError(f"key_mask has shape {tuple(key_mask.shape)}; pass a bool [B, S]")
    batch, seq_len = key_mask.shape
    mask_bytes = _key_mask_bytes(key_mask, batch, seq_len)
    if out is None:
        out = torch.empty((batch, 2), device=key_mask.device, dtype=torch.int32)
    elif out.shape != (batch, 2) or out.dtype != torch.int32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous int32 ({batch}, 2) tensor")
    if batch == 0:
        return out
    check_launch_device(_key_bounds_kernel, {"key_mask": mask_bytes, "out": out})
    block = min(1024, next_power_of_2(max(seq_len, 16)))
    _key_bounds_kernel[(batch,)](mask_bytes, out, seq_len, mask_bytes.stride(0), BLOCK=block)
    return out


def _check_key_bounds(key_bounds: torch.Tensor, batch: int) -> None:
    if key_bounds.dtype != torch.int32 or tuple(key_bounds.shape) != (batch, 2):
        raise ValueError(
            f"key_bounds has dtype {key_bounds.dtype} and shape {tuple(key_bounds.shape)}; "
            f"pass key_mask_bounds(key_mask): int32 ({batch}, 2)"
        )
    if not key_bounds.is_contiguous():
        raise ValueError("key_bounds must be contiguous")


def _check_key_lengths(key_lengths: torch.Tensor, batch: int) -> None:
    if key_lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"key_lengths has dtype {key_lengths.dtype}; pass int32 or int64")
    if key_lengths.shape != (batch,):
        raise ValueError(
            f"key_lengths has shape {tuple(key_lengths.shape)}; expected "
            f"({batch},), one valid-key count per batch row"
        )
    if key_lengths.stride(0) != 1 and batch > 1:
        raise ValueError("key_lengths must be contiguous; call .contiguous()")


def _key_mask_bytes(key_mask: torch.Tensor, batch: int, seq_len: int) -> torch.Tensor:
    """A bool [B, S] mask as bytes the kernel reads (a view: no copy for a contiguous one)."""
    if key_mask.dtype != torch.bool:
        raise ValueError(f"key_mask has dtype {key_mask.dtype}; pass a bool [B, S] tensor")
    if tuple(key_mask.shape) != (batch, seq_len):
        raise ValueError(
            f"key_mask has shape {tuple(key_mask.shape)}; expected ({batch}, {seq_len})"
        )
    if key_mask.stride(-1) != 1:
        key_mask = key_mask.contiguous()
    return key_mask.view(torch.uint8)


def gluon_reasons(
    *, head_dim: int, block_n: int, num_warps: int, num_stages: int, precision: str,
    head_chunk: int = 0, key_lengths: bool = False,
) -> list[str]:  # fmt: skip
    """Why ``attention(..., gluon=True)`` cannot take this configuration (empty: it can).
    The query tile is 64 rows a warpgroup (``block_m`` unused); ``maxnreg`` caps its
    registers as it caps the Triton kernel's (``attention`` checks its value)."""
    reasons = gluon_flash.gluon_flash_problems(
        head_dim=head_dim, block_n=block_n, stages=num_stages, num_warps=num_warps,
        precision=precision, key_lengths=key_lengths,
    )  # fmt: skip
    if head_chunk:
        reasons.append(f"head_chunk={head_chunk} picks the Triton one-tile form; leave it 0")
    return reasons


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    key_lengths: torch.Tensor | None = None,
    key_mask: torch.Tensor | None = None,
    key_bounds: torch.Tensor | None = None,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
    precision: str = "tf32",
    pdl: bool = False,
    pdl_trigger: str = "start",
    maxnreg: int = 0,
    head_chunk: int = 0,
    gluon: bool = False,
) -> torch.Tensor:
    """Fused attention forward; returns ``out`` (or a new contiguous ``[B, S, H, hd]``
    float32). ``out`` may be float16: computed in fp32, rounded once on the store.

    ``key_lengths`` [B]: keys at or past a row's length are masked (right padding).
    ``key_mask`` [B, S] bool (True = a real token): any key may be masked, exactly the
    reference's key mask, whatever its pattern; it is read on the device (no host sync).
    ``key_bounds`` (``key_mask_bounds(key_mask)``, with a key mask only): key blocks inside
    each sequence's all-valid prefix skip the mask, blocks past its last valid key are
    skipped; the same result within rounding (bit for bit on the CPU interpreter; compiled,
    the two loops are different instruction sequences: at most 1.8e-7 apart in ieee and
    4.6e-4 in tf32 on an H100, each as close to the reference; scripts/key_bounds_diff.py).
    Query rows with no valid key at all give 0 here where the reference gives NaN. The
    launcher does not synchronise the device (safe to use inside CUDA graph capture); it
    does not check that ``out`` does not alias k or v. ``pdl``: launched with programmatic
    dependent launch (Hopper+, compiled only): it may start while the previous kernel of
    the stream runs and waits for it before its first load; ``pdl_trigger`` says where it
    lets the next kernel launch ("start": after that wait; "end": after its last store).
    ``maxnreg``: the most registers a thread may hold (ptxas's maxnreg; 0: the compiler's
    choice); the same arithmetic.
    ``head_chunk`` > 0: every key in one tile and the head dim in chunks of that width
    (``_attention_keys_kernel``; sequences up to ``MAX_ONE_TILE_KEYS``; ``block_n`` unused):
    an exact softmax instead of the online one, for short sequences at large head dims.
    ``gluon``: the Gluon flash attention (``kernels.gluon_flash``: each key block's softmax
    beside the previous block's ``p @ v``; Hopper, fp16 q, k, v and ``out``; ``block_n``
    64 or 128, ``num_stages`` 3 or 4 key and value buffers; ``head_chunk`` unset); the
    same arithmetic as ``precision="fp16"``.
    """
    check_precision(precision)
    use_gdc = gdc_mode(pdl, pdl_trigger)
    check_qkv(q, k, v, precision)
    batch, seq_len, num_heads, head_dim = q.shape
    errors = _config_errors(
        head_dim=head_dim,
        block_m=block_m,
        block_n=block_n,
        num_warps=num_warps,
        num_stages=num_stages,
        precision=precision,
    )
    errors += maxnreg_errors("maxnreg", maxnreg)
    errors += one_tile_reasons(head_chunk, seq_len)
    if gluon:
        errors = maxnreg_errors("maxnreg", maxnreg) + gluon_reasons(
            head_dim=head_dim, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
            precision=precision, head_chunk=head_chunk, key_lengths=key_lengths is not None,
        )  # fmt: skip
    if errors:
        raise ValueError("; ".join(errors))
    if gluon:  # before the Triton launch checks: their message names the Triton kernels
        offline = _triton.OFFLINE_ARCH
        if is_interpreted(_attention_fwd_kernel) or (q.device.type != "cuda" and not offline):
            where = "the interpreter" if is_interpreted(_attention_fwd_kernel) else str(q.device)
            raise ValueError(
                "gluon=True (the Gluon flash attention) runs compiled on a CUDA GPU of compute "
                f"capability 9.x; got {where}: pass gluon=False"
            )
        major = offline // 10 if offline else torch.cuda.get_device_capability(q.device)[0]
        if major != 9:
            raise ValueError(f"gluon=True is built for Hopper (sm_90: wgmma); this is sm_{major}x")
    if out is None:
        out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    check_out(out, q.shape)
    tensors = {"q": q, "k": k, "v": v, "out": out}
    if key_lengths is not None:
        _check_key_lengths(key_lengths, batch)
        tensors["key_lengths"] = key_lengths
    mask_bytes = None
    if key_mask is not None:
        mask_bytes = _key_mask_bytes(key_mask, batch, seq_len)
        tensors["key_mask"] = mask_bytes
    if key_bounds is not None:
        if key_mask is None:
            raise ValueError("key_bounds without key_mask: pass the mask they were made from")
        _check_key_bounds(key_bounds, batch)
        tensors["key_bounds"] = key_bounds
    check_launch_device(_attention_fwd_kernel, tensors)
    check_int32_offsets({"q": q, "k": k, "v": v, "out": out}, seq_len, head_dim)
    scale = head_dim**-0.5 if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale={scale} must be finite")
    if q.numel() == 0:
        return out
    if gluon:
        if scale <= 0:  # it masks before it scales: a positive scale keeps -inf masked
            raise ValueError(f"gluon=True takes a positive scale (got {scale}): pass gluon=False")
        if out.dtype != torch.float16 or q.dtype != torch.float16:
            raise ValueError(
                f"gluon=True takes fp16 q, k, v and out (got {q.dtype}, {out.dtype}): pass "
                "fp16 tensors or gluon=False"
            )
        gluon_flash.launch_flash_gluon(
            q, k, v, out, causal=causal, mask_bytes=mask_bytes, key_bounds=key_bounds,
            scale=scale, block_n=block_n, stages=num_stages, num_warps=num_warps,
            maxnreg=maxnreg, use_gdc=use_gdc,
        )  # fmt: skip
        return out
    block_d = padded_head_dim(head_dim)
    grid = (batch * num_heads * triton.cdiv(seq_len, block_m),)
    if head_chunk:
        kernel = _attention_keys_kernel
        blocks = {"BLOCK_N": one_tile_keys(seq_len), "BLOCK_DC": min(head_chunk, block_d)}
    else:
        kernel = _attention_fwd_kernel
        blocks = {"BLOCK_N": block_n, "BLOCK_D": block_d, "EVEN_D": block_d == head_dim}
    kernel[grid](
        q,
        k,
        v,
        out,
        key_lengths if key_lengths is not None else q,
        mask_bytes if mask_bytes is not None else q,
        key_bounds if key_bounds is not None else q,
        mask_bytes.stride(0) if mask_bytes is not None else 0,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        num_heads,
        seq_len,
        head_dim,
        scale * LOG2_E,
        CAUSAL=bool(causal),
        HAS_KEY_LENGTHS=key_lengths is not None,
        HAS_KEY_MASK=mask_bytes is not None,
        HAS_KEY_BOUNDS=key_bounds is not None,
        BLOCK_M=block_m,
        **blocks,
        PRECISION=precision,
        EMULATE_BF16_DOT=is_interpreted(kernel),
        USE_GDC=use_gdc,
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl_launch(pdl),
        **maxnreg_launch(maxnreg),
    )
    return out
