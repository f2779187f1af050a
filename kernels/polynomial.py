"""Causal degree-2 polynomial attention as a chunked linear scan, and a guard around it.

Math. Exact causal attention is ``out_i = sum_{j<=i} exp(s_ij) v_j / sum_{j<=i} exp(s_ij)``
with ``s_ij = scale * q_i . k_j``. Polynomial attention replaces ``exp(s)`` by
``p(s) = 1 + s + s^2 / 2`` (= ((s + 1)^2 + 1) / 2 >= 1/2, so the denominator never
vanishes). With ``q' = q * sqrt(scale)``, ``k' = k * sqrt(scale)`` and the feature map
``phi(x) = [1, x, x (x) x / sqrt(2)]``, ``p(s_ij) = phi(q'_i) . phi(k'_j)``, so the causal
sums become a scan over a state of ``F x (hd + 1)`` numbers (numerator columns and the
denominator). The error against softmax is ``exp(s) - p(s) ~ s^3 / 6`` per weight: the
polynomial is only usable when every ``|s_ij|`` is small, which :func:`guarded_attention`
estimates before choosing (see :func:`score_spread`).

Features. The quadratic part is symmetric, so only blocks of it are kept: head dims
(padded to ``BLOCK_D``, a power of two) are cut into ``NB = BLOCK_D / feature_tile``
tiles, and the quadratic features are the ``NB (NB + 1) / 2`` tile pairs ``(A, B)`` with
``A <= B``, each of ``feature_tile^2`` products ``q'_a q'_b`` (a in A, b in B). The key
side carries the weight: 1 for ``A < B`` (the pair stands for ``(a, b)`` and ``(b, a)``),
1/2 on diagonal tiles (which hold both orders), so the sum is exactly ``(q'.k')^2 / 2``.
Feature rows (``F = 1 + BLOCK_D + NB (NB + 1) / 2 * feature_tile^2``): the constant, the
``BLOCK_D`` linear ones, then the quadratic tiles. head_dim 64 with feature_tile 8:
``F = 1 + 64 + 36 * 64 = 2369`` (the dense map has 4161, the unique-pair map 2145).

Kernels (two launches, no torch ops in between):

1. ``_prefix_state_kernel``, 1-D grid of ``B * H * (1 + NB (NB + 1) / 2)`` programs: one
   (batch, head, feature block). Each scans the keys in order, keeping its block of the
   running state (``[feature_tile^2, BLOCK_D]`` numerator + denominator, fp32, in
   registers) and, at every chunk boundary ``c = 1 .. n_chunks - 1``, writes the
   exclusive prefix state of chunk ``c`` divided by its key count ``c * chunk`` (a mean,
   so that it fits fp16 operands at S = 100,000 where the raw sums would overflow). The
   scan is the cumsum: the workspace is written once and read once.
2. ``_output_kernel``, 1-D grid of ``B * H * ceil((S - first) / block_m)`` programs, one
   ``block_m`` query block of one (batch, head): ``count * phi(Q') @ state`` (the prefix,
   from the workspace, every feature block a ``tl.dot``), plus the intra-chunk part
   computed directly as ``p(q . k)`` over the chunk's own keys ``j <= i``; divides and
   stores in fp32. Rows below ``exact_prefix`` are not written.

Exact prefix. Rows ``i < exact_prefix`` are computed by exact softmax attention
(:func:`kernels.attention.attention` on the first ``exact_prefix`` rows of q, k, v: with
the causal mask they only see keys ``< exact_prefix``); the polynomial rows ``>=
exact_prefix`` still sum over all keys ``j <= i``. Early rows average few keys, so the
``s^3 / 6`` weight error does not average out there.

Workspace (:func:`workspace_bytes`): ``B * H * (n_chunks - 1) * F * (hd * e + 4)`` bytes
with ``n_chunks = ceil(S / chunk)`` and ``e`` the operand size (2 for fp16, 4 for tf32 /
ieee): the numerator snapshots are stored in the operand type the second kernel feeds to
``tl.dot`` anyway, the denominators in fp32. In fp32 that is the
``n_chunks x F x (hd + 1) x 4`` of a plain chunked scan (one snapshot fewer: chunk 0 has
an empty prefix). Case 14 (B 32, H 16, hd 64, S 100,000), fp16, feature_tile 8:
chunk 256 -> 391 chunks, 121.8 MB per (b, h), 62 GB for all 512 (b, h): stream the batch
(``B`` rows at a time); chunk 1024 -> 30.3 MB per (b, h), 15.5 GB.

Cost for one (b, h) at S = 100,000, hd 64, fp16, feature_tile 8, chunk 256, block_m 64
(:func:`cost_model`): state dots ``2 * S * F * hd`` = 3.03e10 FLOP, prefix dots the same
3.03e10, intra-chunk dots ``4 * S * hd * (chunk + block_m) / 2`` = 4.1e9, total 6.5e10
FLOP on tensor cores (exact causal attention: ``2 * S^2 * hd`` = 1.28e12, 20x more). Bytes:
q, k, v read once each from HBM (38 MB as fp32 views; kernel 1 re-reads k, v once per
feature block, from L2) + workspace written and read once (2 x 121.8 MB) + out (25.6 MB).
Case 14 has 32 x 16 x 2 = 1024 (b, h, layer) slices: 6.7e13 FLOP, ~0.26 TB of traffic.

Measured (H200, Triton 3.6, B 1, S 100,000, 16 heads of 64, fp32 packed views, fp16,
chunk 256, block_m 64, block_n 64, feature_tile 8, 4 warps; this code): 16.6 ms per
batch row (kernel 1 11.5 ms = 42 TFLOP/s, kernel 2 5.0 ms), ~1.06 s for case 14's 64
(batch row, layer) slices against 44.9 ms (2.9 s) for cuDNN SDPA in fp16; 8 warps,
chunk 512 / block_m 128 and feature_tile 16 were slower (20-24 ms). Kernel 1's grid at
B 1 is only 592 programs with 4-step inner loops; flattening them into one pipelined
loop was tried (reverted, never timed on a GPU). The whole case-14 layer stack with this
kernel: 1.43 s per forward (docs/case14.md). Session 12 (row-normalised weights, 4 sequences
a launch, `scripts/kernel_profile.py --case 14 --batch 4`): 9.35 ms per (batch row, layer)
in ``_output_kernel`` and 7.5 ms in ``_prefix_state_kernel``, 78% of a 1.40 s forward.
On the H200 the kernels matched the reference (fp16 1.3e-3, ieee 1.3e-6 max abs error at
S 700) and exact softmax on small scores (0.3 randn q, k: 9.2e-4 over 1M elements).

Accuracy (float64, LayerNorm + default-Linear inputs as in case 14, score std 0.33):
degree 2 is NOT a drop-in at the attention output: rows averaging few keys err by up
to 0.025 (rows < 16), 0.013 (< 256), 0.0045 (< 4096), and since k and v are both linear
in the same x the ``s^3 / 6`` weight error is correlated with v and leaves a ~1e-3 bias
even at S = 32,768 (max 0.0019 over the last 64 rows, atol is 0.002). ``exact_prefix``
removes the early rows; whether the layer passes is judged end to end against the
streamed oracle: at case 14 it failed with prefixes 1024 (133 of 1.6e10 elements over 5
seeds) and 8192 (2 of 6.6e9 over 2 seeds, rows ~11,000).

Row-normalised weights (``row_norm=True``, session 8). The Taylor weights' error has a
floor: their bias ``~ -var/2 * cov(s, v)`` does not shrink with the key count (CPU float64
study at case 14's weights and inputs, ``docs/case14_guard_study.md``: worst share of the
allowance 0.70-0.79 from row 8k out to 32k). Weights ``1 + t + (t^2 - var_i) / 2`` with
``t = s - mu_i`` (the row's own score mean and variance over ``j <= i``) sum to the key
count, and their error decays about as ``n^-0.5``: worst share 0.16 at rows 12-16k, 0.11 at
24-32k, and with a 1024-row exact prefix 3 elements above half the allowance in 5
sequences of 16,384 rows instead of 16,162. They need only the state the scan keeps: the
prefix's denominator groups give the row's sums of ``s`` and ``s^2 / 2``, and the output
kernel takes one more pass of score dots over the intra-chunk keys. Not yet measured on
the GPU.

Interface. As :func:`kernels.attention.attention`: q, k, v ``[B, S, H, hd]`` views with
any strides (last-dim stride 1), e.g. slices of a packed QKV projection; fp32 inputs are
converted to the operand type in the kernels, fp16 inputs (fp16 precision only) are used
as is; ``out`` ``[B, S, H, hd]`` (may be a view) fp32, or fp16 (rounded once on the
store). ``causal`` must be True. There is
no key mask: with right padding and causal attention, valid rows never see a padded key,
so a caller with right padding needs none (padded rows get garbage, which the layer
zeroes anyway). Launchers never synchronise the device; :func:`guarded_attention` reads
the spread once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import triton
import triton.language as tl

from kernels._common import (
    MIN_BLOCK,
    check_int32_offsets,
    check_out,
    check_qkv,
    padded_head_dim,
)
from kernels._precision import check_precision, dot, launch_reasons, operand_bytes, to_operand
from kernels._triton import (
    INT32_MAX,
    SUPPORTED_NUM_WARPS,
    check_launch_device,
    is_interpreted,
    is_power_of_2,
)
from kernels.attention import attention

MIN_HEAD_DIM = 8
MAX_HEAD_DIM = 128
MIN_CHUNK = 16
MAX_CHUNK = 4096
FEATURE_TILES = (4, 8, 16)
POLYNOMIAL_PRECISIONS = ("fp16", "tf32", "ieee")
EXACT_KWARGS = ("block_m", "block_n", "num_warps", "num_stages", "precision")
# fp32 tile elements per thread above which a tile is refused (it spills kilobytes).
MAX_TILE_ELEMENTS_PER_THREAD = 96

__all__ = [
    "GuardDecision",
    "cost_model",
    "estimate_registers_per_thread",
    "estimate_shared_memory_bytes",
    "guarded_attention",
    "not_supported_reasons",
    "num_features",
    "polynomial_attention",
    "polynomial_reference",
    "score_spread",
    "workspace_bytes",
]


# --------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------
def polynomial_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None = None,
    exact_prefix: int = 0,
    row_norm: bool = False,
) -> torch.Tensor:
    """Dense float64 polynomial attention, ``[B, S, H, hd]`` float64.

    The kernel's math with no chunking: weights ``p(s) = 1 + s + s^2 / 2`` for the rows
    ``>= exact_prefix`` and ``exp(s)`` (softmax) for the rows below, keys ``j > i`` masked
    when causal. ``row_norm``: ``p_i(s) = 1 + t + (t^2 - var_i) / 2`` with ``t = s - mu_i``,
    ``mu_i`` and ``var_i`` the mean and variance of row i's allowed scores. Materialises
    ``[B, H, S, S]`` scores: for small test shapes only.
    """
    seq_len, head_dim = q.shape[1], q.shape[3]
    scale = head_dim**-0.5 if scale is None else float(scale)
    qh, kh, vh = (t.transpose(1, 2).double() for t in (q, k, v))  # [B, H, S, hd]
    scores = (qh @ kh.transpose(-2, -1)) * scale
    rows = torch.arange(seq_len, device=q.device)
    allowed = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device)
    if causal:
        allowed = rows[None, :] <= rows[:, None]
    if row_norm:
        n = allowed.sum(-1, keepdim=True).clamp_min(1)
        mu = torch.where(allowed, scores, 0.0).sum(-1, keepdim=True) / n
        var = torch.where(allowed, (scores - mu) ** 2, 0.0).sum(-1, keepdim=True) / n
        t = scores - mu
        poly = torch.where(allowed, 1 + t + (t * t - var) / 2, 0.0)
    else:
        poly = torch.where(allowed, 1 + scores + scores * scores / 2, 0.0)
    soft = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    weights = poly / poly.sum(-1, keepdim=True)
    exact_rows = (rows < exact_prefix)[:, None]
    weights = torch.where(exact_rows, soft, weights)
    return (weights @ vh).transpose(1, 2).contiguous()


# --------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------
@triton.jit
def _linear_step(
    k_base, v_base, stride_ks, stride_vs, offs_n, offs_d, d_ok, sqrt_scale, lin_acc, lin_z,
    v_sum, EVEN_D: tl.constexpr, PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """One key block into the constant + linear block's running sums."""
    kt_ptrs = k_base + offs_n[None, :] * stride_ks + offs_d[:, None]
    v_ptrs = v_base + offs_n[:, None] * stride_vs + offs_d[None, :]
    if EVEN_D:
        kt = tl.load(kt_ptrs).to(tl.float32)
        v = tl.load(v_ptrs)
    else:
        kt = tl.load(kt_ptrs, mask=d_ok[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
    kt = kt * sqrt_scale
    lin_acc = dot(
        to_operand(kt, PRECISION, EMULATE_BF16_DOT),
        to_operand(v, PRECISION, EMULATE_BF16_DOT),
        lin_acc,
        PRECISION,
        EMULATE_BF16_DOT,
    )
    return lin_acc, lin_z + tl.sum(kt, 1), v_sum + tl.sum(v.to(tl.float32), 0)


@triton.jit
def _store_linear(
    ws_num_ptr, ws_den_ptr, snap_row, snap, offs_d, d_ok, head_dim, lin_acc, lin_z, v_sum,
    CHUNK: tl.constexpr, NUM_FEATURES: tl.constexpr,
):  # fmt: skip
    """Snapshot ``snap`` (workspace row ``snap_row``) of the constant + linear block."""
    inv = 1.0 / ((snap + 1) * CHUNK)
    num_base = ws_num_ptr + snap_row * (NUM_FEATURES * head_dim)
    den_base = ws_den_ptr + snap_row * NUM_FEATURES
    tl.store(num_base + offs_d, (v_sum * inv).to(ws_num_ptr.dtype.element_ty), mask=d_ok)
    tl.store(den_base, 1.0)
    tl.store(
        num_base + (1 + offs_d)[:, None] * head_dim + offs_d[None, :],
        (lin_acc * inv).to(ws_num_ptr.dtype.element_ty),
        mask=d_ok[None, :],
    )
    tl.store(den_base + 1 + offs_d, lin_z * inv)


@triton.jit
def _quad_step(
    k_base, v_base, stride_ks, stride_vs, offs_n, offs_a, offs_b, a_ok, b_ok, offs_d, d_ok,
    weight, quad_acc, quad_z,
    TILE: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """One key block into a quadratic tile pair's running sums."""
    ka_ptrs = k_base + offs_n[None, :] * stride_ks + offs_a[:, None]
    kb_ptrs = k_base + offs_n[None, :] * stride_ks + offs_b[:, None]
    v_ptrs = v_base + offs_n[:, None] * stride_vs + offs_d[None, :]
    if EVEN_D:
        ka = tl.load(ka_ptrs).to(tl.float32)
        kb = tl.load(kb_ptrs).to(tl.float32)
        v = tl.load(v_ptrs)
    else:
        ka = tl.load(ka_ptrs, mask=a_ok[:, None], other=0.0).to(tl.float32)
        kb = tl.load(kb_ptrs, mask=b_ok[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
    feat = tl.reshape(ka[:, None, :] * kb[None, :, :], (TILE * TILE, BLOCK_N))
    feat = feat * weight
    quad_acc = dot(
        to_operand(feat, PRECISION, EMULATE_BF16_DOT),
        to_operand(v, PRECISION, EMULATE_BF16_DOT),
        quad_acc,
        PRECISION,
        EMULATE_BF16_DOT,
    )
    return quad_acc, quad_z + tl.sum(feat, 1)


@triton.jit
def _store_quad(
    ws_num_ptr, ws_den_ptr, snap_row, snap, fb, offs_d, d_ok, head_dim, quad_acc, quad_z,
    CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr,
    NUM_FEATURES: tl.constexpr,
):  # fmt: skip
    """Snapshot ``snap`` (workspace row ``snap_row``) of quadratic feature block ``fb``."""
    inv = 1.0 / ((snap + 1) * CHUNK)
    row0 = 1 + BLOCK_D + (fb - 1) * (TILE * TILE)
    offs_f = row0 + tl.arange(0, TILE * TILE)
    num_base = ws_num_ptr + snap_row * (NUM_FEATURES * head_dim)
    den_base = ws_den_ptr + snap_row * NUM_FEATURES
    tl.store(
        num_base + offs_f[:, None] * head_dim + offs_d[None, :],
        (quad_acc * inv).to(ws_num_ptr.dtype.element_ty),
        mask=d_ok[None, :],
    )
    tl.store(den_base + offs_f, quad_z * inv)


@triton.jit
def _prefix_state_kernel(
    k_ptr,
    v_ptr,
    ws_num_ptr,
    ws_den_ptr,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    num_heads,
    head_dim,
    num_snapshots,
    sqrt_scale,
    CHUNK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TILE: tl.constexpr,
    NUM_TILES: tl.constexpr,
    NUM_FEATURES: tl.constexpr,
    EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
    FLAT: tl.constexpr,
):
    """Exclusive prefix states (divided by their key count) at every chunk boundary.

    Program = (batch * head, feature block); feature block 0 is the constant + linear
    features, block ``1 + t`` the t-th quadratic tile pair (A <= B, row-major). Only
    full chunks (all but the last) enter a snapshot, so no key is ever masked here.
    ``FLAT``: one loop over every key block, a snapshot stored after a chunk's last block
    (the same sums in the same order), so that the compiler's software pipelining spans
    chunk boundaries; otherwise a loop over chunks around a loop over their key blocks.
    """
    num_blocks = 1 + NUM_TILES * (NUM_TILES + 1) // 2
    steps: tl.constexpr = CHUNK // BLOCK_N
    pid = tl.program_id(0)
    fb = pid % num_blocks
    bh = pid // num_blocks
    off_b = (bh // num_heads).to(tl.int64)
    off_h = (bh % num_heads).to(tl.int64)
    k_base = k_ptr + off_b * stride_kb + off_h * stride_kh
    v_base = v_ptr + off_b * stride_vb + off_h * stride_vh
    snap_base = bh.to(tl.int64) * num_snapshots
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    if fb == 0:
        lin_acc = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)
        lin_z = tl.zeros([BLOCK_D], dtype=tl.float32)
        v_sum = tl.zeros([BLOCK_D], dtype=tl.float32)
        if FLAT:
            for it in range(0, num_snapshots * steps):
                lin_acc, lin_z, v_sum = _linear_step(
                    k_base, v_base, stride_ks, stride_vs, it * BLOCK_N + offs_n0, offs_d, d_ok,
                    sqrt_scale, lin_acc, lin_z, v_sum, EVEN_D, PRECISION, EMULATE_BF16_DOT,
                )  # fmt: skip
                if it % steps == steps - 1:
                    snap = it // steps
                    _store_linear(
                        ws_num_ptr, ws_den_ptr, snap_base + snap, snap, offs_d, d_ok, head_dim,
                        lin_acc, lin_z, v_sum, CHUNK, NUM_FEATURES,
                    )  # fmt: skip
        else:
            for snap in range(0, num_snapshots):
                for sub in range(0, CHUNK, BLOCK_N):
                    lin_acc, lin_z, v_sum = _linear_step(
                        k_base, v_base, stride_ks, stride_vs, snap * CHUNK + sub + offs_n0,
                        offs_d, d_ok, sqrt_scale, lin_acc, lin_z, v_sum, EVEN_D, PRECISION,
                        EMULATE_BF16_DOT,
                    )  # fmt: skip
                _store_linear(
                    ws_num_ptr, ws_den_ptr, snap_base + snap, snap, offs_d, d_ok, head_dim,
                    lin_acc, lin_z, v_sum, CHUNK, NUM_FEATURES,
                )  # fmt: skip
    else:
        # Quadratic tile pair number fb - 1 -> (tile_a, tile_b), tile_a <= tile_b.
        rest = fb - 1
        tile_a = rest * 0
        tile_b = rest * 0
        for i in tl.static_range(NUM_TILES):
            hit = (rest >= 0) & (rest < NUM_TILES - i)
            tile_a = tl.where(hit, i, tile_a)
            tile_b = tl.where(hit, i + rest, tile_b)
            rest -= NUM_TILES - i
        # Key-side weight: 1/2 on diagonal tile pairs; k' k' carries one factor of scale.
        weight = tl.where(tile_a == tile_b, 0.5, 1.0) * (sqrt_scale * sqrt_scale)
        offs_t = tl.arange(0, TILE)
        offs_a = tile_a * TILE + offs_t
        offs_b = tile_b * TILE + offs_t
        a_ok = offs_a < head_dim
        b_ok = offs_b < head_dim
        quad_acc = tl.zeros([TILE * TILE, BLOCK_D], dtype=tl.float32)
        quad_z = tl.zeros([TILE * TILE], dtype=tl.float32)
        if FLAT:
            for it in range(0, num_snapshots * steps):
                quad_acc, quad_z = _quad_step(
                    k_base, v_base, stride_ks, stride_vs, it * BLOCK_N + offs_n0, offs_a, offs_b,
                    a_ok, b_ok, offs_d, d_ok, weight, quad_acc, quad_z,
                    TILE, BLOCK_N, EVEN_D, PRECISION, EMULATE_BF16_DOT,
                )  # fmt: skip
                if it % steps == steps - 1:
                    snap = it // steps
                    _store_quad(
                        ws_num_ptr, ws_den_ptr, snap_base + snap, snap, fb, offs_d, d_ok,
                        head_dim, quad_acc, quad_z, CHUNK, BLOCK_D, TILE, NUM_FEATURES,
                    )  # fmt: skip
        else:
            for snap in range(0, num_snapshots):
                for sub in range(0, CHUNK, BLOCK_N):
                    quad_acc, quad_z = _quad_step(
                        k_base, v_base, stride_ks, stride_vs, snap * CHUNK + sub + offs_n0,
                        offs_a, offs_b, a_ok, b_ok, offs_d, d_ok, weight, quad_acc, quad_z,
                        TILE, BLOCK_N, EVEN_D, PRECISION, EMULATE_BF16_DOT,
                    )  # fmt: skip
                _store_quad(
                    ws_num_ptr, ws_den_ptr, snap_base + snap, snap, fb, offs_d, d_ok,
                    head_dim, quad_acc, quad_z, CHUNK, BLOCK_D, TILE, NUM_FEATURES,
                )  # fmt: skip


@triton.jit
def _chunk_scores(
    q_op, k_base, stride_ks, offs_n, offs_d, n_ok, d_ok, sqrt_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """Scaled scores ``s = q' . k'`` of a query block against one key block (unmasked)."""
    kt = tl.load(
        k_base + offs_n[None, :] * stride_ks + offs_d[:, None],
        mask=n_ok[None, :] & d_ok[:, None],
        other=0.0,
    )
    s = dot(
        q_op,
        to_operand(kt, PRECISION, EMULATE_BF16_DOT),
        tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32),
        PRECISION,
        EMULATE_BF16_DOT,
    )
    return s * sqrt_scale


@triton.jit
def _q_tile(q_base, stride_qs, offs_m, row_ok, offs_c, head_dim):
    """Columns ``offs_c`` of a query block's rows, fp32 (padded rows and columns 0)."""
    return tl.load(
        q_base + offs_m[:, None] * stride_qs + offs_c[None, :],
        mask=row_ok[:, None] & (offs_c < head_dim)[None, :],
        other=0.0,
    ).to(tl.float32)


@triton.jit
def _row_weights(
    q_op, k_base, stride_ks, s1, s2, count, key0, hi, offs_m, offs_n0, offs_d, d_ok,
    seq_len, sqrt_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """Row-normalised weights ``a_i + b_i s + s^2 / 2`` of a query block: ``(a_i, b_i)``
    from the prefix's sums ``s1`` (of s) and ``s2`` (of s^2 / 2) over ``count`` keys and
    one pass of score dots over the intra-chunk keys ``key0 <= j < hi``, ``j <= i``."""
    n_keys = tl.zeros([BLOCK_M], dtype=tl.float32) + count
    for start_n in range(key0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < seq_len
        s = _chunk_scores(
            q_op, k_base, stride_ks, offs_n, offs_d, n_ok, d_ok, sqrt_scale,
            BLOCK_M, BLOCK_N, PRECISION, EMULATE_BF16_DOT,
        )  # fmt: skip
        keep = (offs_n[None, :] <= offs_m[:, None]) & n_ok[None, :]
        s = tl.where(keep, s, 0.0)
        s1 += tl.sum(s, 1)
        s2 += tl.sum(0.5 * s * s, 1)
        n_keys += tl.sum(keep.to(tl.float32), 1)
    n_keys = tl.maximum(n_keys, 1.0)
    mu = s1 / n_keys
    var = tl.maximum(2.0 * s2 / n_keys - mu * mu, 0.0)
    return 1.0 - mu + 0.5 * (mu * mu - var), 1.0 - mu


@triton.jit
def _quad_prefix(
    q_base, stride_qs, offs_m, row_ok, num_base, den_base, offs_d, d_ok, head_dim,
    sqrt_scale, acc, acc_den,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr,
    NUM_TILES: tl.constexpr, WITH_DEN: tl.constexpr, PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """The prefix snapshot's quadratic tile pairs (A <= B, in kernel 1's order) against a
    query block: ``acc += phi_2(q') @ state`` and, with ``WITH_DEN``, ``acc_den +=
    phi_2(q') . z``; the q' tiles are re-read (from the cache)."""
    offs_t = tl.arange(0, TILE)
    offs_f = tl.arange(0, TILE * TILE)
    row0 = 1 + BLOCK_D
    for tile_a in range(0, NUM_TILES):
        qa = _q_tile(q_base, stride_qs, offs_m, row_ok, tile_a * TILE + offs_t, head_dim)
        qa = qa * sqrt_scale
        for tile_b in range(tile_a, NUM_TILES):
            qb = _q_tile(q_base, stride_qs, offs_m, row_ok, tile_b * TILE + offs_t, head_dim)
            qb = qb * sqrt_scale
            feat = tl.reshape(qa[:, :, None] * qb[:, None, :], (BLOCK_M, TILE * TILE))
            state = tl.load(
                num_base + (row0 + offs_f)[:, None] * head_dim + offs_d[None, :],
                mask=d_ok[None, :],
                other=0.0,
            )
            acc = dot(
                to_operand(feat, PRECISION, EMULATE_BF16_DOT),
                to_operand(state, PRECISION, EMULATE_BF16_DOT),
                acc,
                PRECISION,
                EMULATE_BF16_DOT,
            )
            if WITH_DEN:
                acc_den += tl.sum(feat * tl.load(den_base + row0 + offs_f)[None, :], 1)
            row0 += TILE * TILE
    return acc, acc_den


@triton.jit
def _prefix_row_weighted(
    q, q_op, q_base, stride_qs, row_ok, ws_num_ptr, ws_den_ptr, k_base, stride_ks, bh,
    chunk, num_snapshots, hi, offs_m, offs_n0, offs_d, d_ok, seq_len, head_dim, sqrt_scale,
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, TILE: tl.constexpr, NUM_TILES: tl.constexpr,
    NUM_FEATURES: tl.constexpr, PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """``_output_kernel``'s prefix part with ``STATS_FIRST``: the row weights first, then
    ``count * (a_i const + (b_i q') @ lin + phi_2(q') @ quad)`` in one accumulator.
    Returns ``(num, den, a_row, b_row)``, ``den`` without the intra-chunk weights."""
    count = (chunk * CHUNK) * 1.0
    s1 = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum of s over the prefix keys
    s2 = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum of s^2 / 2
    snap = bh.to(tl.int64) * num_snapshots + tl.maximum(chunk - 1, 0)
    num_base = ws_num_ptr + snap * (NUM_FEATURES * head_dim)
    den_base = ws_den_ptr + snap * NUM_FEATURES
    if chunk > 0:
        z_lin = tl.load(den_base + 1 + offs_d)
        s1 = tl.sum(q * z_lin[None, :], 1) * count
        # The quadratic denominators as Z [BLOCK_D, BLOCK_D]: Z[a, b] is the feature of
        # (a, b) in tile pair (a // TILE, b // TILE) when that pair is stored (A <= B),
        # else 0, so that q'^T Z q' sums every stored feature times its q' product.
        offs_r = tl.arange(0, BLOCK_D)
        ta = (offs_r // TILE)[:, None]
        tb = (offs_d // TILE)[None, :]
        pair = ta * NUM_TILES - ta * (ta - 1) // 2 + (tb - ta)
        z_rows = 1 + BLOCK_D + pair * (TILE * TILE)
        z_rows += (offs_r % TILE)[:, None] * TILE + (offs_d % TILE)[None, :]
        z_quad = tl.load(den_base + z_rows, mask=tb >= ta, other=0.0)
        qz = dot(
            q_op,
            to_operand(z_quad, PRECISION, EMULATE_BF16_DOT),
            tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32),
            PRECISION,
            EMULATE_BF16_DOT,
        )
        s2 = tl.sum(qz * q, 1) * count
    a_row, b_row = _row_weights(
        q_op, k_base, stride_ks, s1, s2, count, chunk * CHUNK, hi, offs_m, offs_n0, offs_d,
        d_ok, seq_len, sqrt_scale, BLOCK_M, BLOCK_N, PRECISION, EMULATE_BF16_DOT,
    )  # fmt: skip
    num = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if chunk > 0:
        const = tl.load(num_base + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        lin = tl.load(
            num_base + (1 + offs_d)[:, None] * head_dim + offs_d[None, :],
            mask=d_ok[None, :],
            other=0.0,
        )
        num = dot(
            to_operand(q * b_row[:, None], PRECISION, EMULATE_BF16_DOT),
            to_operand(lin, PRECISION, EMULATE_BF16_DOT),
            a_row[:, None] * const[None, :],
            PRECISION,
            EMULATE_BF16_DOT,
        )
        num, _ = _quad_prefix(
            q_base, stride_qs, offs_m, row_ok, num_base, den_base, offs_d, d_ok, head_dim,
            sqrt_scale, num, s1, BLOCK_M, BLOCK_D, TILE, NUM_TILES, False, PRECISION,
            EMULATE_BF16_DOT,
        )  # fmt: skip
        num = num * count
    den = count * a_row + b_row * s1 + s2
    return num, den, a_row, b_row


@triton.jit
def _output_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    ws_num_ptr,
    ws_den_ptr,
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
    num_snapshots,
    first_block,
    num_query_blocks,
    exact_prefix,
    sqrt_scale,
    CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TILE: tl.constexpr,
    NUM_TILES: tl.constexpr,
    NUM_FEATURES: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
    ROW_NORM: tl.constexpr,
    STATS_FIRST: tl.constexpr,
):
    """One query block: prefix state from the workspace + the intra-chunk part.

    ``ROW_NORM``: the weights are ``a_i + b_i s + s^2 / 2`` with ``a_i = 1 - mu_i +
    (mu_i^2 - var_i) / 2`` and ``b_i = 1 - mu_i``, where ``mu_i`` and ``var_i`` are the
    mean and variance of row i's scores over its keys ``j <= i`` (that is
    ``1 + t + (t^2 - var_i) / 2`` with ``t = s - mu_i``, the degree-2 fit of exp for the
    row's own score distribution; the weights sum to the key count). The row statistics
    come from the same prefix state (its denominator groups) and a first pass over the
    intra-chunk keys; the second pass applies the weights.

    ``STATS_FIRST`` (with ``ROW_NORM``): the same weights, with the row statistics taken
    before the prefix dots: the prefix's sum of ``s^2 / 2`` is ``q'^T Z q'`` with ``Z`` the
    quadratic denominator group laid out as a ``[BLOCK_D, BLOCK_D]`` upper block triangle
    (one dot, no feature tiles), so the linear group enters the prefix dots as ``(b_i q')
    @ state`` and the constant as ``a_i`` times it: one accumulator instead of two (a
    ``[BLOCK_M, BLOCK_D]`` fp32 tile fewer live through the feature loop) and no
    denominator work in it. Sums in another order, ``b_i q'`` rounded to the operand type,
    and the ``q'^T Z q'`` dot takes q' and Z as operands of ``PRECISION`` (fp16: both
    rounded; the two-accumulator form sums ``feat * z`` in fp32): not bit-identical to it.
    Case 14 (one sequence, rows 2048-4096, H200): 3.32e-5 max error against float64,
    3.22e-5 for the two-accumulator form."""
    pid = tl.program_id(0)
    bh = pid // num_query_blocks
    block = first_block + pid % num_query_blocks
    off_b = (bh // num_heads).to(tl.int64)
    off_h = (bh % num_heads).to(tl.int64)
    q_base = q_ptr + off_b * stride_qb + off_h * stride_qh
    k_base = k_ptr + off_b * stride_kb + off_h * stride_kh
    v_base = v_ptr + off_b * stride_vb + off_h * stride_vh
    o_base = o_ptr + off_b * stride_ob + off_h * stride_oh

    start_m = block * BLOCK_M
    chunk = start_m // CHUNK
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
    q = q.to(tl.float32) * sqrt_scale  # q' = q * sqrt(scale)
    q_op = to_operand(q, PRECISION, EMULATE_BF16_DOT)

    hi = tl.minimum(start_m + BLOCK_M, seq_len)  # keys of the intra-chunk part: < hi
    if STATS_FIRST:
        num, den, a_row, b_row = _prefix_row_weighted(
            q, q_op, q_base, stride_qs, row_ok, ws_num_ptr, ws_den_ptr, k_base, stride_ks, bh,
            chunk, num_snapshots, hi, offs_m, offs_n0, offs_d, d_ok, seq_len, head_dim,
            sqrt_scale,
            CHUNK, BLOCK_M, BLOCK_N, BLOCK_D, TILE, NUM_TILES, NUM_FEATURES, PRECISION,
            EMULATE_BF16_DOT,
        )  # fmt: skip
    else:
        num = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        den = tl.zeros([BLOCK_M], dtype=tl.float32)
        # ROW_NORM: the prefix's group sums, kept apart until the row's weights are known.
        pre_const = tl.zeros([BLOCK_D], dtype=tl.float32)
        pre_lin = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        pre_s1 = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum of s over the prefix keys
        pre_s2 = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum of s^2 / 2
        count = 0.0
        if chunk > 0:
            snap = bh.to(tl.int64) * num_snapshots + (chunk - 1)
            num_base = ws_num_ptr + snap * (NUM_FEATURES * head_dim)
            den_base = ws_den_ptr + snap * NUM_FEATURES
            # Constant + linear features.
            const = tl.load(num_base + offs_d, mask=d_ok, other=0.0).to(tl.float32)
            lin = tl.load(
                num_base + (1 + offs_d)[:, None] * head_dim + offs_d[None, :],
                mask=d_ok[None, :],
                other=0.0,
            )
            z_lin = tl.load(den_base + 1 + offs_d)
            inter = dot(
                q_op, to_operand(lin, PRECISION, EMULATE_BF16_DOT), num, PRECISION, EMULATE_BF16_DOT
            )
            if ROW_NORM:  # the quadratic group accumulates alone
                pre_const = const
                pre_lin = inter
                pre_s1 = tl.sum(q * z_lin[None, :], 1)
                inter = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
                inter_den = tl.zeros([BLOCK_M], dtype=tl.float32)
            else:
                inter += const[None, :]
                inter_den = 1.0 + tl.sum(q * z_lin[None, :], 1)
            inter, inter_den = _quad_prefix(
                q_base, stride_qs, offs_m, row_ok, num_base, den_base, offs_d, d_ok, head_dim,
                sqrt_scale, inter, inter_den, BLOCK_M, BLOCK_D, TILE, NUM_TILES, True, PRECISION,
                EMULATE_BF16_DOT,
            )  # fmt: skip
            count = (chunk * CHUNK) * 1.0
            num = inter * count
            den = inter_den * count
            pre_s1 = pre_s1 * count
            pre_s2 = inter_den * count

        a_row = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        b_row = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        if ROW_NORM:
            # First pass: the row's score statistics over its intra-chunk keys.
            a_row, b_row = _row_weights(
                q_op, k_base, stride_ks, pre_s1, pre_s2, count, chunk * CHUNK, hi, offs_m,
                offs_n0, offs_d, d_ok, seq_len, sqrt_scale,
                BLOCK_M, BLOCK_N, PRECISION, EMULATE_BF16_DOT,
            )  # fmt: skip
            # The prefix's groups with the row's weights; the denominator is the key count
            # in exact arithmetic, computed from the same sums for self-consistent rounding.
            num = num + count * (a_row[:, None] * pre_const[None, :] + b_row[:, None] * pre_lin)
            den = count * a_row + b_row * pre_s1 + pre_s2
    # Intra-chunk part: keys [chunk start, end of this query block), j <= i.
    for start_n in range(chunk * CHUNK, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < seq_len
        s = _chunk_scores(
            q_op, k_base, stride_ks, offs_n, offs_d, n_ok, d_ok, sqrt_scale,
            BLOCK_M, BLOCK_N, PRECISION, EMULATE_BF16_DOT,
        )  # fmt: skip
        p = a_row[:, None] + b_row[:, None] * s + 0.5 * s * s
        p = tl.where((offs_n[None, :] <= offs_m[:, None]) & n_ok[None, :], p, 0.0)
        v = tl.load(
            v_base + offs_n[:, None] * stride_vs + offs_d[None, :],
            mask=n_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        num = dot(
            to_operand(p, PRECISION, EMULATE_BF16_DOT),
            to_operand(v, PRECISION, EMULATE_BF16_DOT),
            num,
            PRECISION,
            EMULATE_BF16_DOT,
        )
        den += tl.sum(p, 1)
    den = tl.where(row_ok, den, 1.0)
    out = num / den[:, None]
    tl.store(
        o_base + offs_m[:, None] * stride_os + offs_d[None, :],
        out.to(o_base.dtype.element_ty),  # fp32, or rounded once to a half output
        mask=(row_ok & (offs_m >= exact_prefix))[:, None] & d_ok[None, :],
    )


# --------------------------------------------------------------------------------------
# Planning: features, workspace, cost, resources
# --------------------------------------------------------------------------------------
def num_features(head_dim: int, feature_tile: int = 8) -> int:
    """F, the feature rows of one state: ``1 + BLOCK_D + NB (NB + 1) / 2 * tile^2``."""
    block_d = padded_head_dim(head_dim)
    tiles = block_d // feature_tile
    return 1 + block_d + tiles * (tiles + 1) // 2 * feature_tile**2


def num_chunks(seq_len: int, chunk: int) -> int:
    return -(-seq_len // chunk)


def workspace_bytes(
    *,
    batch: int,
    seq_len: int,
    num_heads: int,
    head_dim: int,
    chunk: int,
    precision: str = "fp16",
    feature_tile: int = 8,
) -> int:
    """Device bytes :func:`polynomial_attention` allocates besides its output.

    ``B * H * (n_chunks - 1) * F * (head_dim * e + 4)``: one prefix snapshot per chunk
    boundary, numerators in the operand type (``e`` = 2 for fp16, 4 for tf32 / ieee),
    denominators in fp32. Exact: it is what the launcher allocates (plus nothing else).
    """
    snapshots = max(0, num_chunks(seq_len, chunk) - 1)
    per_row = head_dim * operand_bytes(precision) + 4
    return batch * num_heads * snapshots * num_features(head_dim, feature_tile) * per_row


def cost_model(
    *,
    seq_len: int,
    head_dim: int,
    chunk: int,
    precision: str = "fp16",
    feature_tile: int = 8,
    block_m: int = 64,
    input_bytes: int = 4,
) -> dict[str, float]:
    """FLOPs and HBM bytes for one (batch, head): the numbers in the module docstring.

    ``state_flops`` (kernel 1) = ``prefix_flops`` (kernel 2) = ``2 * S * F * BLOCK_D``;
    ``intra_flops`` = ``4 * S * BLOCK_D * (chunk + block_m) / 2`` (a query block sees on
    average half its chunk plus itself). Bytes: q, k, v read once, the workspace written
    once and read once, the fp32 output written once (re-reads served by L2 not counted).
    """
    block_d = padded_head_dim(head_dim)
    features = num_features(head_dim, feature_tile)
    state = 2.0 * seq_len * features * block_d
    intra = 4.0 * seq_len * block_d * (chunk + block_m) / 2
    ws = workspace_bytes(
        batch=1,
        seq_len=seq_len,
        num_heads=1,
        head_dim=head_dim,
        chunk=chunk,
        precision=precision,
        feature_tile=feature_tile,
    )
    io = 3.0 * seq_len * head_dim * input_bytes + seq_len * head_dim * 4
    return {
        "state_flops": state,
        "prefix_flops": state,
        "intra_flops": intra,
        "total_flops": 2 * state + intra,
        "exact_causal_flops": 2.0 * seq_len * seq_len * head_dim,
        "workspace_bytes": float(ws),
        "total_bytes": io + 2.0 * ws,
    }


def estimate_shared_memory_bytes(
    *,
    head_dim: int,
    block_m: int,
    block_n: int,
    feature_tile: int,
    num_stages: int,
    precision: str,
) -> int:
    """Shared memory of the larger of the two kernels' programs, in bytes (a model).

    Calibrated against ``metadata.shared`` of both kernels compiled by Triton 3.9 for
    sm_90 (12 tiles: head_dim 16..128, feature_tile 4..16, block_m 16..128, block_n
    16..128, num_stages 1..3, fp16 / tf32 / ieee): exact for 10, ieee needed 20% less,
    and the smallest tile (16 x 16, one stage) 512 bytes more. Loads are staged in fp32
    (``num_stages - 1`` buffers), the dot operands in the operand type ``e``:

    - kernel 1, constant + linear block: ``(s - 1) * 2 * block_n * BLOCK_D * 4 + 2 *
      block_n * BLOCK_D * e``; quadratic block: ``(s - 1) * (BLOCK_D + 2 * tile) *
      block_n * 4 + (tile^2 + BLOCK_D) * block_n * e``;
    - kernel 2 (the intra-chunk loop dominates): ``(s - 1) * 2 * block_n * BLOCK_D * 4 +
      (block_m + block_n) * BLOCK_D * e`` (+ ``block_m * block_n * 4`` for fp32 operands).

    Triton 3.6 (the GPU machine) may allocate differently; a tile under the limit can
    still fail with OutOfResources at its first launch: record that as "unsupported".
    """
    block_d = padded_head_dim(head_dim)
    e = operand_bytes(precision)
    f = feature_tile * feature_tile
    ring = max(0, num_stages - 1)
    linear = ring * 2 * block_n * block_d * 4 + 2 * block_n * block_d * e
    quad = ring * (block_d + 2 * feature_tile) * block_n * 4 + (f + block_d) * block_n * e
    output = ring * 2 * block_n * block_d * 4 + (block_m + block_n) * block_d * e
    if e == 4:
        output += block_m * block_n * 4
    return max(linear, quad, output)


def estimate_registers_per_thread(
    *, head_dim: int, block_m: int, block_n: int, feature_tile: int, num_warps: int
) -> int:
    """fp32 tile elements live per thread in the larger kernel: a spill predictor.

    Kernel 1 holds a ``[rows, BLOCK_D]`` state and a ``[rows, block_n]`` operand (rows =
    BLOCK_D for the linear block, ``tile^2`` for a quadratic one); kernel 2 a ``[block_m,
    BLOCK_D]`` accumulator and a ``[block_m, max(tile^2, block_n)]`` feature / score
    tile; over ``32 * num_warps`` threads. Compiled for sm_90 (Triton 3.9, fp16): <= 64
    spilled at most 72 bytes, 96 spilled 0.5-2 KB, 128 spilled ~1 KB, 160+ 1.4-2.5 KB.
    """
    block_d = padded_head_dim(head_dim)
    threads = 32 * num_warps
    f = feature_tile * feature_tile
    state = max(block_d * (block_d + block_n), f * (block_d + block_n))
    output = block_m * (block_d + max(f, block_n))
    return math.ceil(max(state, output) / threads)


def _config_errors(
    *,
    head_dim: int,
    chunk: int,
    block_m: int,
    block_n: int,
    feature_tile: int,
    num_warps: int,
    num_stages: int,
    precision: str,
    output_block_n: int | None = None,
    output_warps: int | None = None,
    output_stages: int | None = None,
) -> list[str]:
    """Reasons a configuration cannot run at all (the launcher raises on these).
    ``output_*``: kernel 2's own keys a step, warps and stages (None: the shared ones)."""
    reasons: list[str] = []
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        reasons.append(
            f"head_dim={head_dim} is outside {MIN_HEAD_DIM}..{MAX_HEAD_DIM}; polynomial "
            "features grow as head_dim^2: use exact attention (kernels.attention)"
        )
    if not is_power_of_2(chunk) or not MIN_CHUNK <= chunk <= MAX_CHUNK:
        reasons.append(f"chunk={chunk} must be a power of two in {MIN_CHUNK}..{MAX_CHUNK}")
    blocks = [("block_m", block_m), ("block_n", block_n)]
    if output_block_n is not None:
        blocks.append(("output_block_n", output_block_n))
    for name, value in blocks:
        if not is_power_of_2(value) or value < MIN_BLOCK:
            reasons.append(f"{name}={value} must be a power of two >= {MIN_BLOCK}")
        elif is_power_of_2(chunk) and value > chunk:
            reasons.append(f"{name}={value} must be <= chunk={chunk} (it tiles the chunk)")
    block_d = padded_head_dim(head_dim)
    if feature_tile not in FEATURE_TILES:
        reasons.append(f"feature_tile={feature_tile} must be one of {FEATURE_TILES}")
    elif feature_tile > block_d:
        reasons.append(f"feature_tile={feature_tile} must be <= the padded head_dim {block_d}")
    for name, value in (("num_warps", num_warps), ("output_warps", output_warps)):
        if value is not None and value not in SUPPORTED_NUM_WARPS:
            reasons.append(f"{name}={value} must be one of {SUPPORTED_NUM_WARPS}")
    for name, value in (("num_stages", num_stages), ("output_stages", output_stages)):
        if value is not None and value < 1:
            reasons.append(f"{name}={value} must be >= 1")
    if precision not in POLYNOMIAL_PRECISIONS:
        reasons.append(
            f"precision={precision!r} is not supported by polynomial attention; use one "
            f"of {POLYNOMIAL_PRECISIONS}"
        )
    return reasons


def not_supported_reasons(
    *,
    head_dim: int,
    chunk: int,
    precision: str,
    capability: tuple[int, int] | None,
    device_type: str = "cuda",
    smem_bytes: int | None = None,
    block_m: int = 64,
    block_n: int = 64,
    feature_tile: int = 8,
    num_warps: int = 4,
    num_stages: int = 2,
    output_block_n: int | None = None,
    output_warps: int | None = None,
    output_stages: int | None = None,
) -> list[str]:
    """Why this polynomial-attention configuration should not run here; [] = supported.

    Checks the configuration (head_dim 8..128, power-of-two chunk and tiles, precision),
    the device (a Triton backend, the precision's minimum capability), the shared-memory
    model (:func:`estimate_shared_memory_bytes`) when ``smem_bytes`` is given, and
    register pressure (:func:`estimate_registers_per_thread` <= 96).
    """
    reasons = _config_errors(
        head_dim=head_dim,
        chunk=chunk,
        block_m=block_m,
        block_n=block_n,
        feature_tile=feature_tile,
        num_warps=num_warps,
        num_stages=num_stages,
        precision=precision,
        output_block_n=output_block_n,
        output_warps=output_warps,
        output_stages=output_stages,
    )
    if not reasons:
        per_thread = estimate_registers_per_thread(
            head_dim=head_dim,
            block_m=block_m,
            block_n=block_n,
            feature_tile=feature_tile,
            num_warps=num_warps,
        )
        if per_thread > MAX_TILE_ELEMENTS_PER_THREAD:
            reasons.append(
                f"keeps ~{per_thread} fp32 tile elements per thread in registers (> "
                f"{MAX_TILE_ELEMENTS_PER_THREAD}: spills): raise num_warps or shrink "
                "block_m / block_n / feature_tile"
            )
    return launch_reasons(
        kernel=_output_kernel,
        device_type=device_type,
        precision=precision,
        capability=capability,
        smem_bytes=smem_bytes,
        smem_needed=lambda: estimate_shared_memory_bytes(
            head_dim=head_dim,
            block_m=block_m,
            block_n=block_n,
            feature_tile=feature_tile,
            num_stages=num_stages,
            precision=precision,
        ),
        reasons=reasons,
    )


# --------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------
def _check_scale(scale: float | None, head_dim: int) -> float:
    scale = head_dim**-0.5 if scale is None else float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(
            f"scale={scale} must be finite and > 0 (the features use sqrt(scale)); "
            "fold a sign into q instead"
        )
    return scale


def _check_causal(causal: bool) -> None:
    if causal is not True:
        raise ValueError(
            f"causal={causal!r}: polynomial attention is implemented for causal=True "
            "only; use kernels.attention.attention for non-causal attention"
        )


def _exact_kwargs(exact_kwargs: Mapping[str, Any] | None, precision: str) -> dict[str, Any]:
    merged: dict[str, Any] = {"precision": precision}
    for key, value in (exact_kwargs or {}).items():
        if key not in EXACT_KWARGS:
            raise ValueError(
                f"exact_kwargs has unknown key {key!r}; allowed: {', '.join(EXACT_KWARGS)}"
            )
        merged[key] = value
    return merged


def polynomial_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    chunk: int = 256,
    exact_prefix: int = 0,
    precision: str = "fp16",
    block_m: int = 64,
    block_n: int = 64,
    feature_tile: int = 8,
    num_warps: int = 4,
    num_stages: int = 2,
    exact_kwargs: Mapping[str, Any] | None = None,
    row_norm: bool = False,
    stats_first: bool = False,
    output_block_n: int | None = None,
    output_warps: int | None = None,
    output_stages: int | None = None,
    prefix_flat: bool = False,
) -> torch.Tensor:
    """Causal polynomial attention (see the module docstring); returns ``out``.

    ``chunk``: keys per prefix snapshot (power of two, 16..4096; more = less workspace,
    more intra-chunk work). ``exact_prefix``: rows below it use exact softmax attention
    (:func:`kernels.attention.attention` with ``exact_kwargs``: block_m, block_n,
    num_warps, num_stages, precision; precision defaults to ``precision``).
    ``block_m`` query rows per program of kernel 2, ``block_n`` keys per step of both
    kernels, ``feature_tile`` the quadratic tile (``feature_tile^2`` features per block),
    ``num_warps`` / ``num_stages`` for both kernels. ``row_norm``: weights fitted to each
    row's own score mean and variance (:func:`polynomial_reference`), which removes the
    plain weights' bias that does not shrink with the key count; it costs a second pass
    of score dots over the intra-chunk keys. ``stats_first`` (with ``row_norm``): the
    row statistics before the prefix dots, one accumulator fewer in kernel 2 (see
    ``_output_kernel``). ``output_block_n``, ``output_warps``, ``output_stages``: kernel
    2's own keys a step, warps and stages (default: ``block_n``, ``num_warps``,
    ``num_stages``). ``prefix_flat``: kernel 1 as one loop over all key blocks (see
    ``_prefix_state_kernel``; the same sums). Allocates :func:`workspace_bytes`. Never
    synchronises the device.
    """
    _check_causal(causal)
    for name, flag in (("row_norm", row_norm), ("stats_first", stats_first)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}={flag!r} must be True or False")
    if not isinstance(prefix_flat, bool):
        raise ValueError(f"prefix_flat={prefix_flat!r} must be True or False")
    if stats_first and not row_norm:
        raise ValueError("stats_first=True needs row_norm=True (it orders the row statistics)")
    check_precision(precision)
    check_qkv(q, k, v, precision)
    batch, seq_len, num_heads, head_dim = q.shape
    errors = _config_errors(
        head_dim=head_dim,
        chunk=chunk,
        block_m=block_m,
        block_n=block_n,
        feature_tile=feature_tile,
        num_warps=num_warps,
        num_stages=num_stages,
        precision=precision,
        output_block_n=output_block_n,
        output_warps=output_warps,
        output_stages=output_stages,
    )
    if errors:
        raise ValueError("; ".join(errors))
    if isinstance(exact_prefix, bool) or not isinstance(exact_prefix, int) or exact_prefix < 0:
        raise ValueError(f"exact_prefix={exact_prefix!r} must be an int >= 0 (0 = no exact rows)")
    exact = _exact_kwargs(exact_kwargs, precision)
    scale = _check_scale(scale, head_dim)  # every argument checked before the device
    if out is None:
        out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    check_out(out, q.shape)
    check_launch_device(_output_kernel, {"q": q, "k": k, "v": v, "out": out})
    check_int32_offsets({"q": q, "k": k, "v": v, "out": out}, seq_len, head_dim)
    if q.numel() == 0:
        return out
    n_exact = min(exact_prefix, seq_len)
    if n_exact > 0:
        attention(
            q[:, :n_exact],
            k[:, :n_exact],
            v[:, :n_exact],
            causal=True,
            scale=scale,
            out=out[:, :n_exact],
            **exact,
        )
    if n_exact == seq_len:
        return out

    block_d = padded_head_dim(head_dim)
    tiles = block_d // feature_tile
    features = num_features(head_dim, feature_tile)
    snapshots = num_chunks(seq_len, chunk) - 1
    if features * head_dim > INT32_MAX:
        raise ValueError(f"head_dim={head_dim} gives a state too large for int32 offsets")
    ws_dtype = torch.float16 if precision == "fp16" else torch.float32
    bh = batch * num_heads
    ws_num = torch.empty(
        (bh, max(snapshots, 0), features, head_dim), device=q.device, dtype=ws_dtype
    )
    ws_den = torch.empty((bh, max(snapshots, 0), features), device=q.device, dtype=torch.float32)
    sqrt_scale = math.sqrt(scale)
    emulate = is_interpreted(_output_kernel)
    if snapshots > 0:
        _prefix_state_kernel[(bh * (1 + tiles * (tiles + 1) // 2),)](
            k,
            v,
            ws_num,
            ws_den,
            k.stride(0),
            k.stride(1),
            k.stride(2),
            v.stride(0),
            v.stride(1),
            v.stride(2),
            num_heads,
            head_dim,
            snapshots,
            sqrt_scale,
            CHUNK=chunk,
            BLOCK_N=block_n,
            BLOCK_D=block_d,
            TILE=feature_tile,
            NUM_TILES=tiles,
            NUM_FEATURES=features,
            EVEN_D=block_d == head_dim,
            PRECISION=precision,
            EMULATE_BF16_DOT=emulate,
            FLAT=bool(prefix_flat),
            num_warps=num_warps,
            num_stages=num_stages,
        )
    first_block = n_exact // block_m
    query_blocks = triton.cdiv(seq_len, block_m) - first_block
    _output_kernel[(bh * query_blocks,)](
        q,
        k,
        v,
        out,
        ws_num,
        ws_den,
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
        max(snapshots, 0),
        first_block,
        query_blocks,
        n_exact,
        sqrt_scale,
        CHUNK=chunk,
        BLOCK_M=block_m,
        BLOCK_N=block_n if output_block_n is None else output_block_n,
        BLOCK_D=block_d,
        TILE=feature_tile,
        NUM_TILES=tiles,
        NUM_FEATURES=features,
        PRECISION=precision,
        EMULATE_BF16_DOT=emulate,
        ROW_NORM=bool(row_norm),
        STATS_FIRST=bool(stats_first),
        num_warps=num_warps if output_warps is None else output_warps,
        num_stages=num_stages if output_stages is None else output_stages,
    )
    return out


# --------------------------------------------------------------------------------------
# Guard
# --------------------------------------------------------------------------------------
def _sample_rows(seq_len: int, count: int, device: torch.device) -> torch.Tensor:
    """``count`` evenly spaced row indices in ``[0, seq_len)``, first and last included."""
    count = min(count, seq_len)
    if count == 1:
        return torch.zeros(1, dtype=torch.long, device=device)
    steps = torch.arange(count, dtype=torch.long, device=device)
    return steps * (seq_len - 1) // (count - 1)


def score_spread(
    q: torch.Tensor, k: torch.Tensor, scale: float | None = None, sample_rows: int = 256
) -> torch.Tensor:
    """Estimate of ``max |s_ij|``, ``s = scale * q_i . k_j``: 0-d fp32 on q's device.

    Deterministic sample: ``sample_rows`` evenly spaced positions (first and last
    included; all rows when ``sample_rows >= S``) taken as query rows and as key rows
    for every (batch, head); the result is the max of ``|s|`` over all sampled pairs
    (``j > i`` too: the score distribution does not depend on the position). It is an
    ESTIMATE, not a bound: it never exceeds the true max over all pairs, and equals it
    when every row is sampled; an outlier row between the samples goes unseen. Cost:
    ``B * H * sample_rows^2 * hd`` multiply-adds in fp32. No host synchronisation.
    """
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} has shape {shape}; expected 4 dims [B, S, H, head_dim]")
    if q.shape != k.shape:
        raise ValueError(
            f"k has shape {tuple(k.shape)} but q has {tuple(q.shape)}; pass matching q, k"
        )
    if isinstance(sample_rows, bool) or not isinstance(sample_rows, int) or sample_rows < 1:
        raise ValueError(f"sample_rows={sample_rows!r} must be an int >= 1")
    seq_len, head_dim = q.shape[1], q.shape[3]
    scale = head_dim**-0.5 if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale={scale} must be finite")
    if q.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=q.device)
    rows = _sample_rows(seq_len, sample_rows, q.device)
    qs = q.index_select(1, rows).float().transpose(1, 2)  # [B, H, R, hd]
    ks = k.index_select(1, rows).float().transpose(1, 2)
    scores = torch.matmul(qs, ks.transpose(-2, -1)) * scale
    return scores.abs().amax().float()


@dataclass(frozen=True)
class GuardDecision:
    """What :func:`guarded_attention` did and why."""

    spread: float
    threshold: float
    path: Literal["polynomial", "exact"]
    reason: str


def guarded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    threshold: float,
    scale: float | None = None,
    chunk: int = 256,
    exact_prefix: int = 0,
    precision: str = "fp16",
    exact_kwargs: Mapping[str, Any] | None = None,
    polynomial_kwargs: Mapping[str, Any] | None = None,
    sample_rows: int = 256,
    out: torch.Tensor | None = None,
    row_norm: bool = False,
    stats_first: bool = False,
    exact_fn: Callable[..., torch.Tensor] | None = None,
    exact_label: str = "Triton",
) -> tuple[torch.Tensor, GuardDecision]:
    """Polynomial attention when the sampled score spread allows it, else exact attention.

    Reads :func:`score_spread` once (the only host synchronisation); ``spread >
    threshold`` (or a non-finite spread) takes the exact path,
    :func:`kernels.attention.attention` with ``exact_kwargs`` (block_m, block_n,
    num_warps, num_stages, precision; precision defaults to ``precision``); otherwise
    :func:`polynomial_attention` with ``chunk``, ``exact_prefix``, ``precision``,
    ``exact_kwargs`` and ``polynomial_kwargs`` (block_m, block_n, feature_tile, num_warps,
    num_stages, output_block_n, output_warps, output_stages, prefix_flat), ``row_norm``
    and ``stats_first``. Both paths' arguments are
    validated before the spread is read. ``exact_fn(q, k, v, scale, out)`` (causal, writes
    and returns ``out``) replaces the Triton kernel on the exact path, e.g. a library
    attention that is faster at the shape; ``exact_label`` names it in the decision.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise ValueError(f"threshold={threshold!r} must be a number (max allowed |score|)")
    if not math.isfinite(threshold) or threshold < 0:
        raise ValueError(f"threshold={threshold!r} must be finite and >= 0")
    _check_causal(causal)
    check_precision(precision)
    check_qkv(q, k, v, precision)
    exact = _exact_kwargs(exact_kwargs, precision)
    poly = dict(polynomial_kwargs or {})
    allowed = (
        "block_m",
        "block_n",
        "feature_tile",
        "num_warps",
        "num_stages",
        "output_block_n",
        "output_warps",
        "output_stages",
        "prefix_flat",
    )
    for key in poly:
        if key not in allowed:
            raise ValueError(
                f"polynomial_kwargs has unknown key {key!r}; allowed: {', '.join(allowed)}"
            )
    head_dim = q.shape[3]
    errors = _config_errors(
        head_dim=head_dim,
        chunk=chunk,
        precision=precision,
        **{
            "block_m": 64,
            "block_n": 64,
            "feature_tile": 8,
            "num_warps": 4,
            "num_stages": 2,
            **{key: value for key, value in poly.items() if key != "prefix_flat"},
        },
    )
    if stats_first and not row_norm:
        errors.append("stats_first=True needs row_norm=True (it orders the row statistics)")
    if not isinstance(poly.get("prefix_flat", False), bool):
        errors.append(f"prefix_flat={poly['prefix_flat']!r} must be True or False")
    if errors:
        raise ValueError("; ".join(errors))
    if out is not None:
        check_out(out, q.shape)  # both paths write it: checked before the spread is read
    scale = _check_scale(scale, head_dim)
    spread = float(score_spread(q, k, scale, sample_rows))  # the one host sync
    if not math.isfinite(spread) or spread > threshold:
        why = "is not finite" if not math.isfinite(spread) else f"> threshold {threshold:g}"
        decision = GuardDecision(
            spread,
            float(threshold),
            "exact",
            f"sampled score spread {spread:.4g} {why}: the polynomial weight error "
            f"~|s|^3/6 would be too large, exact softmax attention used ({exact_label})",
        )
        if exact_fn is not None:
            if out is None:
                out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
            return exact_fn(q, k, v, scale, out), decision
        return attention(q, k, v, causal=causal, scale=scale, out=out, **exact), decision
    decision = GuardDecision(
        spread,
        float(threshold),
        "polynomial",
        f"sampled score spread {spread:.4g} <= threshold {threshold:g}: polynomial attention used",
    )
    result = polynomial_attention(
        q,
        k,
        v,
        causal=True,
        scale=scale,
        out=out,
        chunk=chunk,
        exact_prefix=exact_prefix,
        precision=precision,
        exact_kwargs=exact_kwargs,
        row_norm=row_norm,
        stats_first=stats_first,
        **poly,
    )
    return result, decision
