"""The post rows kernel of ``fused_layer=rows`` in Gluon, for Hopper (sm_90): persistent,
with the layer's weights resident in shared memory (plan knob ``row_gluon``).

The Triton post rows kernel (``kernels.layer._post_rows_kernel``) is one chain per program:
the output projection, LayerNorm2, the FFN, the residual (and with ``next_qkv`` the next
layer's LayerNorm1 and QKV projections), each GEMM a loop over weight chunks fetched from
L2 with a pipeline prologue of its own. Session 22's PC sampling found it waiting on those
loads and on instruction fetch, one program an SM (case 1, 255 registers) or two (case 6);
neither warps, registers, tiles nor pdl shortened it (``docs/kernels_h200.md``). Here:

- every weight matrix is copied into shared memory once per program with asynchronous
  copies issued at the start, one commit group per GEMM, and each GEMM waits only for its
  own group: the FFN's and the next QKV's weights arrive while the output projection and
  LayerNorm2 run;
- each GEMM is one ``warpgroup_mma`` (wgmma) over the whole reduction, its B operand the
  resident weight (``[out, in]`` as stored, a transposed view), its A operand the context
  tile in shared memory or the normalised / activated rows in registers;
- programs are persistent (a grid of at most the resident programs, each looping over row
  tiles), and the next tile's context is copied in while this tile's FFN runs;
- the residual rides in the accumulators: the projection starts at ``x + bo`` and the FFN's
  second GEMM at ``x1 + b2`` (sums in another order than the Triton kernel's; fp32).

The same arithmetic otherwise (fp16 operands, fp32 accumulation, LayerNorm and GELU in
fp32). Gluon has no interpreter: this kernel runs on a CUDA device of compute capability 9.x
only and compiles offline (``kernels.sass.offline_launches``); ``not_supported_reasons``
in ``kernels.layer`` refuses it elsewhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from kernels._common import GELU_POLY, GELU_POLY_CLAMP, pdl_launch

try:  # Gluon ships with Triton >= 3.4; its API moves between releases (3.6 on the H200)
    import triton.language as tl
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    GLUON_ERROR = ""
except ImportError as exc:  # pragma: no cover - Triton without Gluon
    GLUON_ERROR = f"this Triton has no Gluon ({exc})"

SUPPORTED_D_MODELS = (32, 64, 128)
ROW_BLOCK = 64  # one warpgroup's wgmma rows
SMEM_LIMIT = 232_448  # bytes a block may hold on sm_90 (227 KiB)

if not GLUON_ERROR:
    # 3.6 names them async_copy_global_to_shared and thread_barrier; later releases
    # async_load and barrier.
    _cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

    _GP0: gl.constexpr = gl.constexpr(GELU_POLY[0])
    _GP1: gl.constexpr = gl.constexpr(GELU_POLY[1])
    _GP2: gl.constexpr = gl.constexpr(GELU_POLY[2])
    _GP_CLAMP: gl.constexpr = gl.constexpr(GELU_POLY_CLAMP)

    @gluon.jit
    def _gelu(v, GELU_POLY_FORM: gl.constexpr):
        """The erf GELU, or ``kernels._common.gelu_poly``'s form (the same constants)."""
        if GELU_POLY_FORM:
            m = gl.maximum(v, -_GP_CLAMP, propagate_nan=tl.PropagateNan.ALL)
            c = gl.minimum(m, _GP_CLAMP)
            c2 = c * c
            z = c * (_GP0 + c2 * (_GP1 + c2 * _GP2))
            # m / (1 + 2^z) as the hardware's approximate division (a reciprocal and a
            # multiply): with |c| <= 8, |z| < 40 and 1 + 2^z is in [1, 2^40], inside its
            # range, so none of div.full's scaling (~5 instructions an element; this 2).
            # (rcp.approx and a multiply spilled 16 B under Triton 3.9 in the rows form.)
            return gl.inline_asm_elementwise("div.approx.ftz.f32 $0, $1, $2;", "=r,r,r",
                                             [m, 1.0 + gl.exp2(z)], dtype=gl.float32,
                                             is_pure=True, pack=1)  # fmt: skip
        else:
            return 0.5 * v * (1.0 + gl.erf(v * 0.7071067811865476))

    @gluon.jit
    def _layernorm(x, w_ptr, b_ptr, offs_c, D: gl.constexpr, eps):
        """LayerNorm of the rows of an fp32 tile (every column real: D is exact)."""
        mean = gl.sum(x, axis=1) / D
        xc = x - gl.expand_dims(mean, 1)
        var = gl.sum(xc * xc, axis=1) / D
        rstd = gl.rsqrt(var + eps)
        w = gl.load(w_ptr + offs_c)
        b = gl.load(b_ptr + offs_c)
        return xc * gl.expand_dims(rstd, 1) * gl.expand_dims(w, 0) + gl.expand_dims(b, 0)

    @gluon.jit
    def _copy_weight(smem, w_ptr, N: gl.constexpr, K: gl.constexpr, LOAD: gl.constexpr):
        """Issue the asynchronous copies of a contiguous ``[N, K]`` matrix into ``smem``."""
        offs_n = gl.arange(0, N, layout=gl.SliceLayout(1, LOAD))
        offs_k = gl.arange(0, K, layout=gl.SliceLayout(0, LOAD))
        _cp_async(smem, w_ptr + gl.expand_dims(offs_n, 1) * K + gl.expand_dims(offs_k, 0))

    @gluon.jit
    def _load_rows(x_ptr, tile, num_rows, offs_r, offs_c, D: gl.constexpr,
                   BLOCK_R: gl.constexpr):  # fmt: skip
        """A tile's fp32 rows ``[BLOCK_R, D]`` (rows past the end: zeros)."""
        rows = tile * BLOCK_R + offs_r
        io = gl.expand_dims(rows.to(gl.int64), 1) * D + gl.expand_dims(offs_c, 0)
        mask = gl.expand_dims(rows < num_rows, 1) & gl.expand_dims(offs_c < D, 0)
        return gl.load(x_ptr + io, mask=mask, other=0.0)

    @gluon.jit
    def _grid_dependency_wait(USE_GDC: gl.constexpr):
        """With ``USE_GDC`` (launched with programmatic dependent launch): wait until the
        previous kernel of the stream has finished and its writes are visible (call it
        after the weights' copies, which nothing writes, and before any other load or
        store); with ``USE_GDC == 1`` then let the next kernel launch."""
        if USE_GDC:
            gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [],
                                      dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip
            if USE_GDC == 1:
                _grid_dependency_launch(1)

    @gluon.jit
    def _grid_dependency_launch(USE_GDC: gl.constexpr):
        """Let the next kernel of the stream launch (``USE_GDC`` 1: at the start, called by
        the wait; 2: at the end, after the last store)."""
        if USE_GDC:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r",
                                      [], dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip

    @gluon.jit
    def _copies_visible():
        """After a ``wait_group``: this thread's completed copies ordered before the async
        proxy's reads (wgmma reads shared memory through it), then every thread's."""
        fence_async_shared()
        _cta_barrier()

    @gluon.jit
    def _project(h, w_s, b_ptr, out_ptrs, mask, zeros, offs_c):
        """``h @ W^T + b`` (``W`` resident ``[N, K]`` in ``w_s``) rounded once to the
        output's dtype (fp16 q, k, v; fp32 or bf16 with those attention precisions)."""
        p = warpgroup_mma(h, w_s.permute((1, 0)), zeros, use_acc=False, is_async=True)
        p = warpgroup_mma_wait(num_outstanding=0, deps=(p,))
        p = p + gl.expand_dims(gl.load(b_ptr + offs_c), 0)
        gl.store(out_ptrs, p.to(out_ptrs.dtype.element_ty), mask=mask)

    @gluon.jit
    def _copy_ctx(smem, ctx_ptr, tile, num_rows, D: gl.constexpr, BLOCK_R: gl.constexpr,
                  LOAD: gl.constexpr):  # fmt: skip
        """Issue the copies of a tile's context rows (rows past the end: zeros)."""
        rows = tile * BLOCK_R + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, LOAD))
        offs_k = gl.arange(0, D, layout=gl.SliceLayout(0, LOAD))
        ptrs = ctx_ptr + gl.expand_dims(rows.to(gl.int64), 1) * D + gl.expand_dims(offs_k, 0)
        mask = gl.expand_dims(rows < num_rows, 1) & gl.expand_dims(offs_k < D, 0)
        _cp_async(smem, ptrs, mask=mask)

    @gluon.jit
    def _post_rows_gluon_kernel(
        x_ptr, ctx_ptr, out_ptr, key_mask_ptr,
        wo_ptr, bo_ptr, n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, nfw_ptr, nfb_ptr,
        qkv_ptr, n1w_ptr, n1b_ptr, wqkv_ptr, bqkv_ptr, normed_ptr,
        num_rows, eps,
        D: gl.constexpr, BLOCK_R: gl.constexpr,
        HAS_KEY_MASK: gl.constexpr, FINAL_NORM: gl.constexpr, GELU_POLY_FORM: gl.constexpr,
        NEXT_QKV: gl.constexpr, NEXT_NORM: gl.constexpr, PREFETCH_X: gl.constexpr,
        ACC: gl.constexpr, OPERAND: gl.constexpr, SMEM_W: gl.constexpr,
        SMEM_CTX: gl.constexpr, LOAD_W: gl.constexpr, LOAD_CTX: gl.constexpr,
        STOP: gl.constexpr = 0, USE_GDC: gl.constexpr = 0,
    ):  # fmt: skip
        """``out = x + attention + FFN(LayerNorm2(x + attention))`` (and the final
        LayerNorm, or the next layer's QKV, or its LayerNorm1 rows) for row tiles
        ``pid, pid + P, ...`` of ``num_rows`` tokens; ``attention = ctx @ Wo^T + bo``.
        Weights ``[out, in]`` fp16, the FFN ``D`` wide; ``qkv`` rows ``[3 D]`` fp16;
        ``normed`` rows ``[D]`` fp16 (the heads variant's ``row_next_norm``). ``STOP``
        (debugging only) stores a stage's rows instead of the output: 1 ``x1``, 2
        LayerNorm2's, 3 the FFN's GELU. ``USE_GDC`` (programmatic dependent launch,
        ``kernels._common.gdc_mode``): the weights' copies are issued before the wait for
        the previous kernel, the first tile's context after it."""
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        num_tiles = gl.cdiv(num_rows, BLOCK_R)

        # Resident weights, one commit group each: Wo with the first tile's context, W1,
        # W2, and the next layer's packed QKV weight (with USE_GDC the context last, after
        # the wait for the previous kernel, which wrote it).
        wo_s = gl.allocate_shared_memory(gl.float16, [D, D], SMEM_W)
        w1_s = gl.allocate_shared_memory(gl.float16, [D, D], SMEM_W)
        w2_s = gl.allocate_shared_memory(gl.float16, [D, D], SMEM_W)
        ctx_s = gl.allocate_shared_memory(gl.float16, [BLOCK_R, D], SMEM_CTX)
        _copy_weight(wo_s, wo_ptr, D, D, LOAD_W)
        if not USE_GDC:
            _copy_ctx(ctx_s, ctx_ptr, pid, num_rows, D, BLOCK_R, LOAD_CTX)
        async_copy.commit_group()
        _copy_weight(w1_s, w1_ptr, D, D, LOAD_W)
        async_copy.commit_group()
        _copy_weight(w2_s, w2_ptr, D, D, LOAD_W)
        async_copy.commit_group()
        if NEXT_QKV:
            # q, k, v: the packed weight's [D, D] row blocks (shapes are powers of two)
            wq_s = gl.allocate_shared_memory(gl.float16, [D, D], SMEM_W)
            wk_s = gl.allocate_shared_memory(gl.float16, [D, D], SMEM_W)
            wv_s = gl.allocate_shared_memory(gl.float16, [D, D], SMEM_W)
            _copy_weight(wq_s, wqkv_ptr, D, D, LOAD_W)
            _copy_weight(wk_s, wqkv_ptr + D * D, D, D, LOAD_W)
            _copy_weight(wv_s, wqkv_ptr + 2 * D * D, D, D, LOAD_W)
            async_copy.commit_group()
        # Groups committed after the first tile's context: W1, W2 (and Wqkv); after a
        # later tile's context: none. With USE_GDC every weight's group comes before it.
        LATER: gl.constexpr = 3 if NEXT_QKV else 2
        FIRST: gl.constexpr = 0 if USE_GDC else LATER
        _grid_dependency_wait(USE_GDC)
        if USE_GDC:
            _copy_ctx(ctx_s, ctx_ptr, pid, num_rows, D, BLOCK_R, LOAD_CTX)
            async_copy.commit_group()

        offs_r = gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, ACC))
        offs_c = gl.arange(0, D, layout=gl.SliceLayout(0, ACC))
        zeros = gl.zeros([BLOCK_R, D], gl.float32, ACC)
        x_next = zeros
        if PREFETCH_X:  # the first tile's residual rows
            x_next = _load_rows(x_ptr, pid, num_rows, offs_r, offs_c, D, BLOCK_R)
        for tile in range(pid, num_tiles, nprog):
            rows = tile * BLOCK_R + offs_r
            row_ok = rows < num_rows
            io = gl.expand_dims(rows.to(gl.int64), 1) * D + gl.expand_dims(offs_c, 0)
            io_mask = gl.expand_dims(row_ok, 1) & gl.expand_dims(offs_c < D, 0)
            # x + bo: the output projection's starting accumulator, loaded while this
            # tile's context copies land (with PREFETCH_X, during the previous tile).
            if PREFETCH_X:  # noqa: SIM108 (a constexpr branch: one side is compiled)
                acc = x_next
            else:
                acc = gl.load(x_ptr + io, mask=io_mask, other=0.0)
            if HAS_KEY_MASK:  # rows are tokens: the mask's byte of each row, used at the end
                valid = gl.load(key_mask_ptr + rows, mask=row_ok, other=0) != 0
            acc = acc + gl.expand_dims(gl.load(bo_ptr + offs_c), 0)
            if tile == pid:
                async_copy.wait_group(FIRST)  # Wo and the context
            else:
                async_copy.wait_group(0)  # the context
            _copies_visible()
            acc = warpgroup_mma(ctx_s, wo_s.permute((1, 0)), acc, is_async=True)
            x1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _cta_barrier()  # every warp is done with ctx_s: the next tile's copies go in
            _copy_ctx(ctx_s, ctx_ptr, tile + nprog, num_rows, D, BLOCK_R, LOAD_CTX)
            async_copy.commit_group()
            if PREFETCH_X == 1:  # the next tile's residual rows, in flight during the FFN
                x_next = _load_rows(x_ptr, tile + nprog, num_rows, offs_r, offs_c, D, BLOCK_R)

            # LayerNorm2 and the FFN; W1 and W2 arrive during the first tile's work.
            h32 = _layernorm(x1, n2w_ptr, n2b_ptr, offs_c, D, eps)
            h = gl.convert_layout(h32.to(gl.float16), OPERAND)
            if tile == pid:  # W1 (later tiles: resident, nothing to wait for)
                async_copy.wait_group(LATER)
                _copies_visible()
            f = warpgroup_mma(h, w1_s.permute((1, 0)), zeros, use_acc=False, is_async=True)
            f = warpgroup_mma_wait(num_outstanding=0, deps=(f,))
            f = f + gl.expand_dims(gl.load(b1_ptr + offs_c), 0)
            a32 = _gelu(f, GELU_POLY_FORM)
            g = gl.convert_layout(a32.to(gl.float16), OPERAND)
            y = x1 + gl.expand_dims(gl.load(b2_ptr + offs_c), 0)
            if tile == pid:  # W2
                async_copy.wait_group(LATER - 1)
                _copies_visible()
            y = warpgroup_mma(g, w2_s.permute((1, 0)), y, is_async=True)
            y = warpgroup_mma_wait(num_outstanding=0, deps=(y,))
            if HAS_KEY_MASK:
                y = gl.where(gl.expand_dims(valid, 1), y, 0.0)
            if FINAL_NORM:
                y = _layernorm(y, nfw_ptr, nfb_ptr, offs_c, D, eps)
                if HAS_KEY_MASK:
                    y = gl.where(gl.expand_dims(valid, 1), y, 0.0)
            if STOP == 1:  # debugging (scripts/gluon_rows_debug.py): a stage's fp32 rows
                y = x1
            if STOP == 2:
                y = h32
            if STOP == 3:
                y = a32
            gl.store(out_ptr + io, y, mask=io_mask)
            if PREFETCH_X == 2:  # the next tile's residual rows, in flight from here on
                x_next = _load_rows(x_ptr, tile + nprog, num_rows, offs_r, offs_c, D, BLOCK_R)

            if NEXT_NORM:  # the next heads attention's operand rows
                hn = _layernorm(y, n1w_ptr, n1b_ptr, offs_c, D, eps)
                gl.store(normed_ptr + io, hn.to(gl.float16), mask=io_mask)
            if NEXT_QKV:
                hq = _layernorm(y, n1w_ptr, n1b_ptr, offs_c, D, eps)
                hq = gl.convert_layout(hq.to(gl.float16), OPERAND)
                if tile == pid:  # Wqkv; the next tile's context may still fly
                    async_copy.wait_group(1)
                    _copies_visible()
                qkv_io = gl.expand_dims(rows.to(gl.int64), 1) * (3 * D) + gl.expand_dims(offs_c, 0)
                _project(hq, wq_s, bqkv_ptr, qkv_ptr + qkv_io, io_mask, zeros, offs_c)
                _project(hq, wk_s, bqkv_ptr + D, qkv_ptr + qkv_io + D, io_mask, zeros, offs_c)
                _project(hq, wv_s, bqkv_ptr + 2 * D, qkv_ptr + qkv_io + 2 * D, io_mask, zeros,
                         offs_c)  # fmt: skip
        async_copy.wait_group(0)  # the last, empty, context copies
        if USE_GDC == 2:
            _grid_dependency_launch(USE_GDC)

    @gluon.jit
    def _qkv_rows_gluon_kernel(
        x_ptr, qkv_ptr, n1w_ptr, n1b_ptr, wqkv_ptr, bqkv_ptr, num_rows, eps,
        D: gl.constexpr, BLOCK_R: gl.constexpr, ACC: gl.constexpr, OPERAND: gl.constexpr,
        SMEM_W: gl.constexpr, LOAD_W: gl.constexpr, PREFETCH_X: gl.constexpr,
        USE_GDC: gl.constexpr = 0,
    ):  # fmt: skip
        """``qkv = LayerNorm1(x) @ Wqkv^T + bqkv`` (fp16 rows ``[3 D]``) for row tiles
        ``pid, pid + P, ...``: the QKV rows kernel of ``fused_layer=rows`` with the packed
        weight's q, k, v blocks resident in shared memory (every layer without the chain;
        the first layer with it); with ``PREFETCH_X`` the next tile's rows load during this
        tile's GEMMs (8 warps: at 4 the second copy of the tile spilled, offline)."""
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        num_tiles = gl.cdiv(num_rows, BLOCK_R)
        wq_s = gl.allocate_shared_memory(gl.float16, [D, D], SMEM_W)
        wk_s = gl.allocate_shared_memory(gl.float16, [D, D], SMEM_W)
        wv_s = gl.allocate_shared_memory(gl.float16, [D, D], SMEM_W)
        _copy_weight(wq_s, wqkv_ptr, D, D, LOAD_W)
        _copy_weight(wk_s, wqkv_ptr + D * D, D, D, LOAD_W)
        _copy_weight(wv_s, wqkv_ptr + 2 * D * D, D, D, LOAD_W)
        async_copy.commit_group()
        _grid_dependency_wait(USE_GDC)  # the weights in flight; then the previous kernel
        offs_r = gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, ACC))
        offs_c = gl.arange(0, D, layout=gl.SliceLayout(0, ACC))
        zeros = gl.zeros([BLOCK_R, D], gl.float32, ACC)
        x_next = zeros
        if PREFETCH_X:
            x_next = _load_rows(x_ptr, pid, num_rows, offs_r, offs_c, D, BLOCK_R)
        for tile in range(pid, num_tiles, nprog):
            rows = tile * BLOCK_R + offs_r
            io_mask = gl.expand_dims(rows < num_rows, 1) & gl.expand_dims(offs_c < D, 0)
            if PREFETCH_X:
                x = x_next
                x_next = _load_rows(x_ptr, tile + nprog, num_rows, offs_r, offs_c, D, BLOCK_R)
            else:
                x = _load_rows(x_ptr, tile, num_rows, offs_r, offs_c, D, BLOCK_R)
            h = _layernorm(x, n1w_ptr, n1b_ptr, offs_c, D, eps)
            h = gl.convert_layout(h.to(gl.float16), OPERAND)
            if tile == pid:  # the weights (later tiles: resident)
                async_copy.wait_group(0)
                _copies_visible()
            qkv_io = gl.expand_dims(rows.to(gl.int64), 1) * (3 * D) + gl.expand_dims(offs_c, 0)
            _project(h, wq_s, bqkv_ptr, qkv_ptr + qkv_io, io_mask, zeros, offs_c)
            _project(h, wk_s, bqkv_ptr + D, qkv_ptr + qkv_io + D, io_mask, zeros, offs_c)
            _project(h, wv_s, bqkv_ptr + 2 * D, qkv_ptr + qkv_io + 2 * D, io_mask, zeros,
                     offs_c)  # fmt: skip
        if USE_GDC == 2:
            _grid_dependency_launch(USE_GDC)


@dataclasses.dataclass(frozen=True)
class GluonRowsLayouts:
    """The kernels' layouts for a model width and warp count (constexpr arguments): one
    shared layout and one copy layout serve the weights and the context tile alike (both
    fp16 rows of D)."""

    acc: object
    operand: object
    smem: object
    load: object


def gluon_layouts(d_model: int, num_warps: int) -> GluonRowsLayouts:
    """wgmma's accumulator ``[64, D]`` (one warpgroup on the rows, warpgroups split the
    columns), its register A operand, 128-byte swizzled (or as wide as a row) shared
    layouts, and a load layout of 16-byte vectors for the asynchronous copies."""
    warps_n = num_warps // 4
    acc = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, warps_n], instr_shape=[16, d_model // warps_n, 16]
    )
    operand = gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2)
    swizzle = min(128, 2 * d_model)
    smem = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=2)
    cols = d_model // 8  # threads along a row, 8 halves (16 bytes) each
    load = gl.BlockedLayout(
        size_per_thread=[1, 8],
        threads_per_warp=[32 // cols, cols],
        warps_per_cta=[num_warps, 1],
        order=[1, 0],
    )
    return GluonRowsLayouts(acc, operand, smem, load)


def prefetch_mode(num_warps: int) -> int:
    """The post rows kernel's ``PREFETCH_X``: where the next tile's residual rows are loaded.
    8 warps (registers to spare): 1, right after the output projection, in flight during
    the whole FFN; 4 warps (255 registers at the FFN: mode 1 spills): 2, after the output's
    store, in flight during the next LayerNorm and the loop's top."""
    return 1 if num_warps == 8 else 2


def gluon_shared_bytes(d_model: int, next_qkv: bool, num_warps: int = 4) -> int:
    """Shared memory a program holds: Wo, W1, W2 (and the three QKV blocks) and one context
    tile, fp16; with 8 warps 4 KiB more for the operand's layout conversion (offline,
    Triton 3.6: 114,688 / 212,992 B at 4 warps and D 128, 118,784 / 217,088 at 8)."""
    weights = (3 + (3 if next_qkv else 0)) * d_model * d_model * 2
    return weights + ROW_BLOCK * d_model * 2 + (4096 if num_warps == 8 else 0)


def gluon_problems(
    d_model: int, ffn_dim: int, gemm_precision: str, num_warps: int, next_qkv: bool
) -> list[str]:
    """Why this kernel cannot take a layer of this shape and setting (empty: it can)."""
    out = []
    if GLUON_ERROR:
        out.append(GLUON_ERROR)
    if d_model not in SUPPORTED_D_MODELS:
        out.append(f"d_model {d_model} is not one of {SUPPORTED_D_MODELS}")
    if ffn_dim != d_model:
        out.append(f"ffn_dim {ffn_dim} differs from d_model {d_model} (one weight shape)")
    if gemm_precision != "fp16":
        out.append(f"gemm_precision {gemm_precision!r} is not 'fp16'")
    if num_warps not in (4, 8):
        out.append(f"{num_warps} row warps: wgmma takes 4 (one warpgroup) or 8")
    need = gluon_shared_bytes(d_model, next_qkv, num_warps)
    if need > SMEM_LIMIT:
        out.append(f"{need} bytes of shared memory a program (the limit is {SMEM_LIMIT})")
    return out


_PROGRAMS: dict[tuple, int] = {}  # resident programs an SM, per compiled configuration


def _programs_per_sm(key: tuple, compile_kernel: Callable[[], Any], num_warps: int) -> int:
    """Programs an SM holds (registers, shared memory, warps) of the compiled kernel. On the
    device the register count is the loaded kernel's; offline (``kernels.sass.
    offline_launches``: ``warmup`` compiles for the offline architecture and records no
    launch) it is read from the cubin, so the offline grid is the device's."""
    from kernels import _triton
    from kernels.sass import _cubin_facts, blocks_per_sm

    arch = _triton.OFFLINE_ARCH
    key = (arch, *key)
    if key not in _PROGRAMS:
        compiled = compile_kernel()
        registers = getattr(compiled, "n_regs", None)
        # ``warmup`` compiles without loading: the register count is set when the binary
        # is loaded (``_init_handles``, Triton 3.6; only on a device), else read from the
        # cubin.
        if registers is None and arch is None and hasattr(compiled, "_init_handles"):
            compiled._init_handles()
            registers = getattr(compiled, "n_regs", None)
        if registers is None:
            registers = _cubin_facts(compiled.asm["cubin"])[0]
        limits = blocks_per_sm(arch or 90, num_warps, int(registers), int(compiled.metadata.shared))
        _PROGRAMS[key] = max(1, limits["blocks"])
    return _PROGRAMS[key]


def persistent_programs(
    key: tuple, compile_kernel: Callable[[], Any], num_warps: int, device: torch.device,
    items: int, max_programs: int = 0, multiple: int = 1,
) -> int:  # fmt: skip
    """A persistent grid: the programs the SMs hold (``_programs_per_sm`` times the SMs; 132
    offline, an H100's or H200's), at most one an item and at most ``max_programs`` when set,
    rounded down to a multiple of ``multiple`` (at least one multiple)."""
    from kernels import _triton

    sms = 132 if _triton.OFFLINE_ARCH is not None else _sm_count(device)
    slots = _programs_per_sm(key, compile_kernel, num_warps) * sms
    programs = min(items, slots, max_programs or items)
    return max(multiple, programs // multiple * multiple)


def launch_qkv_rows_gluon(
    x: torch.Tensor,
    qkv: torch.Tensor,
    qkv_weights: tuple[torch.Tensor, ...],
    num_rows: int,
    d_model: int,
    eps: float,
    *,
    num_warps: int,
    max_programs: int = 0,
    use_gdc: int = 0,
) -> None:
    """Launch the QKV rows kernel over ``num_rows`` rows of ``x`` into ``qkv`` (fp16
    ``[rows, 3 D]``; ``qkv_weights`` from ``kernels.layer._qkv_weights``): a persistent
    grid of the programs the SMs hold, at most one a tile. ``use_gdc``: the kernel's
    ``USE_GDC`` (``kernels._common.gdc_mode``; launched with programmatic dependent launch
    when set)."""

    lay = gluon_layouts(d_model, num_warps)
    args = (x, qkv, *qkv_weights, num_rows, eps)
    kwargs = dict(
        D=d_model, BLOCK_R=ROW_BLOCK, ACC=lay.acc, OPERAND=lay.operand, SMEM_W=lay.smem,
        LOAD_W=lay.load, PREFETCH_X=num_warps == 8, USE_GDC=use_gdc, num_warps=num_warps,
        **pdl_launch(bool(use_gdc)),  # the warmup's binary is the launch's
    )  # fmt: skip
    programs = persistent_programs(
        ("qkv", x.device.index, d_model, num_warps, use_gdc),
        lambda: _qkv_rows_gluon_kernel.warmup(*args, grid=(1,), **kwargs),
        num_warps, x.device, -(-num_rows // ROW_BLOCK), max_programs,
    )  # fmt: skip
    _qkv_rows_gluon_kernel[(programs,)](*args, **kwargs)


def qkv_shared_bytes(d_model: int, num_warps: int = 4) -> int:
    """Shared memory a QKV rows program holds: the three weight blocks (fp16), with 8 warps
    4 KiB more for the operand's layout conversion."""
    return 3 * d_model * d_model * 2 + (4096 if num_warps == 8 else 0)


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch_post_rows_gluon(
    x: torch.Tensor,
    ctx: torch.Tensor,
    out: torch.Tensor,
    mask_arg: torch.Tensor,
    post_weights: tuple[torch.Tensor, ...],
    qkv: torch.Tensor,
    qkv_weights: tuple[torch.Tensor, ...],
    normed: torch.Tensor,
    num_rows: int,
    d_model: int,
    eps: float,
    *,
    has_key_mask: bool,
    final_norm: bool,
    gelu_poly: bool,
    next_qkv: bool,
    num_warps: int,
    next_norm: bool = False,
    stop: int = 0,
    max_programs: int = 0,
    use_gdc: int = 0,
) -> None:
    """Launch the kernel over ``num_rows`` rows (arguments as the Triton post rows
    kernel's: ``post_weights`` from ``kernels.layer._post_weights``, ``qkv_weights`` from
    ``_qkv_weights``, ``normed`` the heads variant's next LayerNorm1 rows; placeholders
    where unused): a persistent grid of the programs the
    SMs hold, at most one a tile (at most ``max_programs`` when set: a debugging run's
    several tiles a program). ``stop``: the kernel's ``STOP``; ``use_gdc``: its ``USE_GDC``
    (launched with programmatic dependent launch when set)."""

    lay = gluon_layouts(d_model, num_warps)
    args = (x, ctx, out, mask_arg, *post_weights, qkv, *qkv_weights, normed, num_rows, eps)
    kwargs = dict(
        D=d_model, BLOCK_R=ROW_BLOCK, HAS_KEY_MASK=has_key_mask, FINAL_NORM=final_norm,
        GELU_POLY_FORM=gelu_poly, NEXT_QKV=next_qkv, NEXT_NORM=next_norm,
        PREFETCH_X=prefetch_mode(num_warps), ACC=lay.acc,
        OPERAND=lay.operand, SMEM_W=lay.smem, SMEM_CTX=lay.smem, LOAD_W=lay.load,
        LOAD_CTX=lay.load, num_warps=num_warps, STOP=stop, USE_GDC=use_gdc,
        **pdl_launch(bool(use_gdc)),  # the warmup's binary is the launch's
    )  # fmt: skip
    key = (x.device.index, d_model, has_key_mask, final_norm, gelu_poly, next_qkv, next_norm,
           num_warps, stop, use_gdc)  # fmt: skip
    programs = persistent_programs(
        key,
        lambda: _post_rows_gluon_kernel.warmup(*args, grid=(1,), **kwargs),
        num_warps, x.device, -(-num_rows // ROW_BLOCK), max_programs,
    )  # fmt: skip
    _post_rows_gluon_kernel[(programs,)](*args, **kwargs)
