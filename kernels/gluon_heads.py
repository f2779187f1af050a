"""The heads attention of ``fused_layer=heads`` in Gluon, for Hopper (sm_90): LayerNorm1's
rows, the heads' q, k, v projections and their attention over one key tile, persistent, a
group of heads' projection weights resident in shared memory (plan knob ``attn_gluon``).

The Triton heads kernel (``kernels.layer._heads_attention_kernel``) is one program a (query
block, head, sequence): it projects its query rows and, per key block, every key row of its
head again, so the sequence's rows are read and projected once a query block and a head,
the weights fetched from L2 by every program. Here a program owns a group of ``G`` heads
for the whole run and loops over sequences (``S <= 64`` a warpgroup: every key in one tile):

- the group's q, k, v weight rows (``[G * hd, D]`` each) are copied into shared memory once
  a program; the sequence's LayerNorm1 rows (``normed``, the previous layer's post rows
  wrote them) are copied into shared memory with ``cp.async``, the next sequence's while
  this one's last heads run; without ``normed`` (the first layer) they are normalised here
  from the fp32 residual rows and stored there;
- per head three wgmma make q, k and v (fp32 accumulators that start as the bias, one more
  wgmma each of a ones tile by the bias's fp16 high and low parts; rounded to fp16 once);
  k and v go to shared memory (two buffers by head parity, so one CTA barrier a head
  orders writes after every warp's reads), q stays in registers as the next wgmma's A
  operand;
- the scores are one wgmma over every key (``[S, S]``, fp32), masked (causal, keys past
  the sequence, the key mask), an exact softmax in the log2 domain, the probabilities
  rounded to fp16 and multiplied by v in one more wgmma, divided by the row sums at the end
  (a row with no valid key: context 0, as the Triton kernel); a slot's context is stored
  once, converted to 16-byte vectors (slots up to 64 columns);
- the key mask is read once a sequence (one past its last valid key, and whether every key
  before that is valid): a full or right-padded sequence (the official inputs' masks) is
  masked by position alone, one compare an element, and only a sequence with holes runs
  the heads' code that reads the mask's bytes (session 31: the bytes were read by each
  head, on the scores' critical path, 16 loads a thread).

fp16 operands and fp32 accumulation throughout, as the Triton kernel with fp16 GEMM and
attention precisions; the same one-tile softmax as its single key block. Gluon has no
interpreter: this runs on a CUDA device of compute capability 9.x and compiles offline
(``kernels.sass.offline_launches``); ``kernels.layer.not_supported_reasons`` refuses it
elsewhere.
"""

from __future__ import annotations

import dataclasses

import torch

from kernels import gluon_rows
from kernels._common import pdl_launch

GLUON_ERROR = gluon_rows.GLUON_ERROR
if not GLUON_ERROR:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from kernels.gluon_rows import (
        _copies_visible,
        _copy_weight,
        _cp_async,
        _cta_barrier,
        _grid_dependency_launch,
        _grid_dependency_wait,
        _layernorm,
    )

SUPPORTED_D_MODELS = gluon_rows.SUPPORTED_D_MODELS
# wgmma's K is a multiple of 16 (the scores' K is the head dim): heads of 8 go in pairs
SUPPORTED_HEAD_DIMS = (8, 16, 32, 64, 128)
WARPGROUP_ROWS = 64  # one warpgroup's wgmma rows: a program's key tile is 64 a warpgroup
BIAS_K = 16  # the bias's wgmma reduction (fp16's smallest): its high and low parts, zeros
# slots up to this wide store their context in 16-byte vectors (through a shared memory
# conversion of [S, slot columns] fp16); wider slots from the accumulator's rows
WIDE_STORE_MAX = 64
SMEM_LIMIT = gluon_rows.SMEM_LIMIT

if not GLUON_ERROR:
    _BIAS_K: gl.constexpr = gl.constexpr(BIAS_K)
    _WIDE_STORE_MAX: gl.constexpr = gl.constexpr(WIDE_STORE_MAX)

    @gluon.jit
    def _copy_rows(smem, src_ptr, b, batch, seq_len, D: gl.constexpr, BLOCK_S: gl.constexpr,
                   LOAD: gl.constexpr):  # fmt: skip
        """Issue the copies of sequence ``b``'s fp16 rows ``[BLOCK_S, D]`` (rows past the
        sequence, and every row of a sequence past the batch: zeros)."""
        offs_s = gl.arange(0, BLOCK_S, layout=gl.SliceLayout(1, LOAD))
        offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, LOAD))
        rows = b.to(gl.int64) * seq_len + offs_s
        ptrs = src_ptr + gl.expand_dims(rows, 1) * D + gl.expand_dims(offs_d, 0)
        mask = gl.expand_dims((offs_s < seq_len) & (b < batch), 1) & gl.expand_dims(offs_d < D, 0)
        _cp_async(smem, ptrs, mask=mask)

    @gluon.jit
    def _project(a_s, w_s, bias_s, ones_s, zeros):
        """Issue ``rows @ W^T + b`` (``W`` resident ``[slot columns, D]``), asynchronously:
        the accumulator starts as ``ones @ B^T``, ``B`` the bias's ``[slot columns, 16]``
        matrix (its fp16 high and low parts in the first two columns, zeros after), so the
        bias is added by the tensor cores in fp32, no register load of it; both operands in
        shared memory (with the ones in registers those wgmma held 7.8% of case 6's
        samples at their issue, session 33: whether this is faster is for the device)."""
        acc = warpgroup_mma(ones_s, bias_s.permute((1, 0)), zeros, use_acc=False, is_async=True)
        return warpgroup_mma(a_s, w_s.permute((1, 0)), acc, is_async=True)

    @gluon.jit
    def _slot_projections(a_s, wq, wk, wv, bq_s, bk_s, bv_s, ones_s, zeros,
                          TOGETHER: gl.constexpr):  # fmt: skip
        """The slot's q, k, v (fp16, with their bias, rounded once): with ``TOGETHER`` the
        three projections issued back to back and waited for once (three accumulators live:
        up to 64 columns), else one at a time."""
        if TOGETHER:
            q = _project(a_s, wq, bq_s, ones_s, zeros)
            k = _project(a_s, wk, bk_s, ones_s, zeros)
            v = _project(a_s, wv, bv_s, ones_s, zeros)
            q, k, v = warpgroup_mma_wait(num_outstanding=0, deps=(q, k, v))
        else:
            q = _project(a_s, wq, bq_s, ones_s, zeros)
            q = warpgroup_mma_wait(num_outstanding=0, deps=(q,))
            k = _project(a_s, wk, bk_s, ones_s, zeros)
            k = warpgroup_mma_wait(num_outstanding=0, deps=(k,))
            v = _project(a_s, wv, bv_s, ones_s, zeros)
            v = warpgroup_mma_wait(num_outstanding=0, deps=(v,))
        return q.to(gl.float16), k.to(gl.float16), v.to(gl.float16)

    @gluon.jit
    def _key_extent(kb, offs, seq_len):
        """A sequence's key mask (its bytes ``kb`` at key positions ``offs``, loaded a
        sequence ahead) as two scalars, from one reduction: whether its valid keys are a
        prefix (a full or right-padded mask, which the heads apply by position, reading no
        byte), and the keys to attend: the prefix's length, else ``seq_len`` (the bytes
        then mask). One sum packs the count ``c`` of valid keys and the sum of their
        positions from 1, which is ``c (c + 1) / 2`` only for the prefix ``1..c``."""
        valid = (offs < seq_len) & (kb != 0)
        packed = gl.sum(gl.where(valid, ((offs + 1) << 11) + 1, 0), axis=0)  # S <= 128
        count = packed & 2047
        prefix = (packed >> 11) == count * (count + 1) // 2
        return gl.where(prefix, count, seq_len), prefix

    @gluon.jit
    def _mask_bytes(key_mask_ptr, b, batch, seq_len, offs):
        """Issue the load of sequence ``b``'s key mask bytes (none past the batch)."""
        ok = (offs < seq_len) & (b < batch)
        return gl.load(key_mask_ptr + b.to(gl.int64) * seq_len + offs, mask=ok, other=0)

    @gluon.jit
    def _attend(q, k_tile, v_tile, key_mask_ptr, b, seq_len, key_end, qk_scale,
                BLOCK_S: gl.constexpr, HD: gl.constexpr, CAUSAL: gl.constexpr,
                MASK_BYTES: gl.constexpr, ACC_H: gl.constexpr, ACC_S: gl.constexpr,
                Q_OP: gl.constexpr, P_OP: gl.constexpr):  # fmt: skip
        """One head's context ``softmax(mask(q k^T * scale)) v`` over every key of sequence
        ``b`` (fp32 ``[S, hd]``): the scores one wgmma, masked (keys at or past ``key_end``,
        with ``MASK_BYTES`` the key mask's bytes too, causal), the exact softmax in the log2
        domain (the scale folded into the exponent's FMA), the probabilities rounded to
        fp16 for the second wgmma and the row sums divided out at the end, by their
        reciprocal (a row with no valid key: 0)."""
        s = warpgroup_mma(gl.convert_layout(q, Q_OP), k_tile.permute((1, 0)),
                          gl.zeros([BLOCK_S, BLOCK_S], gl.float32, ACC_S), use_acc=False,
                          is_async=True)  # fmt: skip
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        offs_i = gl.arange(0, BLOCK_S, layout=gl.SliceLayout(1, ACC_S))
        offs_j = gl.arange(0, BLOCK_S, layout=gl.SliceLayout(0, ACC_S))
        if CAUSAL:  # one compare an element: key j < min(i + 1, key_end)
            limit = gl.minimum(offs_i + 1, key_end)
        else:
            limit = gl.full([BLOCK_S], 0, gl.int32, gl.SliceLayout(1, ACC_S)) + key_end
        valid = gl.expand_dims(offs_j, 0) < gl.expand_dims(limit, 1)
        if MASK_BYTES:  # a mask with holes: this head reads its bytes
            key_in = offs_j < key_end
            kb = gl.load(key_mask_ptr + b.to(gl.int64) * seq_len + offs_j, mask=key_in, other=0)
            valid = valid & gl.expand_dims(kb != 0, 0)
        s = gl.where(valid, s, float("-inf"))
        m = gl.max(s, axis=1) * qk_scale  # the scale > 0: the same maximum, scaled
        m = gl.where(m == float("-inf"), 0.0, m)  # no valid key: p = 0, not NaN
        p = gl.exp2(s * qk_scale - gl.expand_dims(m, 1))  # log2 domain
        denom = gl.sum(p, axis=1)
        o = warpgroup_mma(gl.convert_layout(p.to(gl.float16), P_OP), v_tile,
                          gl.zeros([BLOCK_S, HD], gl.float32, ACC_H), use_acc=False,
                          is_async=True)  # fmt: skip
        o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
        denom = gl.convert_layout(gl.where(denom == 0.0, 1.0, denom), gl.SliceLayout(1, ACC_H))
        # one division a row, a multiply an element (a division an element was ~70
        # instructions a thread a head: ptxas's scaled approximate division)
        return o * gl.expand_dims(1.0 / denom, 1)

    @gluon.jit
    def _sequence_slots(a_s, wq_s, wk_s, wv_s, k_s, v_s, b_s, ones_s, normed_ptr, ctx_ptr,
                        key_mask_ptr, b, step, batch, seq_len, key_end, qk_scale, count, col0,
                        D: gl.constexpr, HD: gl.constexpr, PAIR: gl.constexpr,
                        SLOTS: gl.constexpr, BLOCK_S: gl.constexpr, CAUSAL: gl.constexpr,
                        MASK_BYTES: gl.constexpr, NORMED: gl.constexpr,
                        KV_BUFS: gl.constexpr, ACC_H: gl.constexpr, ACC_S: gl.constexpr,
                        Q_OP: gl.constexpr, P_OP: gl.constexpr, LOAD: gl.constexpr,
                        STORE: gl.constexpr, STOP: gl.constexpr):  # fmt: skip
        """Sequence ``b``'s slots of heads, one after another (its rows in ``a_s``, every
        copy before them complete and visible): each slot's q, k, v, its heads'
        attention and their context columns stored; after the last slot's projections the
        next sequence's rows are copied into ``a_s``. ``count`` slots came before (the k,
        v buffer's parity)."""
        SW: gl.constexpr = PAIR * HD
        for t in range(SLOTS):
            # A loop, not unrolled: unrolled over 4 heads it spilled 664 B a thread
            # (offline, Triton 3.6, case 6); as a loop, no spills.
            buf = (count + t) % KV_BUFS
            c0 = col0 + t * SW  # the slot's first column
            offs_h = gl.arange(0, SW, layout=gl.SliceLayout(0, ACC_H))
            zeros_h = gl.zeros([BLOCK_S, SW], gl.float32, ACC_H)
            q, k, v = _slot_projections(a_s, wq_s.index(t), wk_s.index(t), wv_s.index(t),
                                        b_s.index(t), b_s.index(SLOTS + t),
                                        b_s.index(2 * SLOTS + t), ones_s, zeros_h,
                                        SW <= 64)  # fmt: skip
            k_s.index(buf).store(k)
            v_s.index(buf).store(v)
            # Every warp's k, v stored (and, with one buffer or at the last slot, every
            # warp's reads of the rows done) before anyone's wgmma reads them.
            fence_async_shared()
            _cta_barrier()
            if NORMED and t == SLOTS - 1:  # the rows are free: the next sequence's
                _copy_rows(a_s, normed_ptr, b + step, batch, seq_len, D, BLOCK_S, LOAD)
            async_copy.commit_group()  # (an empty group at the other slots)
            o_slot = zeros_h  # the slot's context: each head's own columns
            for j in gl.static_range(PAIR):
                mine = gl.expand_dims(offs_h // HD == j, 0)  # head j's columns of the slot
                qj = q
                if PAIR > 1:  # the other head's q columns zeroed: head j's scores
                    qj = gl.where(mine, q, 0.0)
                o = _attend(qj, k_s.index(buf), v_s.index(buf), key_mask_ptr, b, seq_len,
                            key_end, qk_scale, BLOCK_S, SW, CAUSAL, MASK_BYTES, ACC_H,
                            ACC_S, Q_OP, P_OP)  # fmt: skip
                if STOP == 1:  # debugging (scripts/gluon_heads_debug.py): a projection
                    o = q.to(gl.float32)
                if STOP == 2:
                    o = k.to(gl.float32)
                if STOP == 3:
                    o = v.to(gl.float32)
                if SW > _WIDE_STORE_MAX:  # each head's columns from the accumulator's rows
                    offs_r = gl.arange(0, BLOCK_S, layout=gl.SliceLayout(1, ACC_H))
                    rows_out = b.to(gl.int64) * seq_len + offs_r
                    ptrs = (ctx_ptr + gl.expand_dims(rows_out, 1) * D
                            + gl.expand_dims(c0 + offs_h, 0))  # fmt: skip
                    ok_out = gl.expand_dims(offs_r < seq_len, 1) & mine
                    gl.store(ptrs, o.to(gl.float16), mask=ok_out)
                elif PAIR > 1:
                    o_slot = gl.where(mine, o, o_slot)
                else:
                    o_slot = o
            if SW <= _WIDE_STORE_MAX:
                # One store a slot in 16-byte vectors (a layout conversion through shared
                # memory), not 4-byte pieces of the accumulator's rows: a quarter of the
                # store instructions, whole 32-byte sectors.
                o16 = gl.convert_layout(o_slot.to(gl.float16), STORE)
                offs_sr = gl.arange(0, BLOCK_S, layout=gl.SliceLayout(1, STORE))
                offs_sc = gl.arange(0, SW, layout=gl.SliceLayout(0, STORE))
                rows_out = b.to(gl.int64) * seq_len + offs_sr
                ptrs = (ctx_ptr + gl.expand_dims(rows_out, 1) * D
                        + gl.expand_dims(c0 + offs_sc, 0))  # fmt: skip
                ok_out = gl.expand_dims(offs_sr < seq_len, 1) & gl.expand_dims(offs_sc < SW, 0)
                gl.store(ptrs, o16, mask=ok_out)
            if KV_BUFS == 1:  # every warp done with k, v before the next slot's stores
                _cta_barrier()

    @gluon.jit
    def _heads_attention_gluon_kernel(
        x_ptr, normed_ptr, ctx_ptr, key_mask_ptr, n1w_ptr, n1b_ptr, wqkv_ptr, bqkv_ptr,
        batch, seq_len, qk_scale, eps,
        D: gl.constexpr, HD: gl.constexpr, PAIR: gl.constexpr, G: gl.constexpr,
        GROUPS: gl.constexpr, BLOCK_S: gl.constexpr, CAUSAL: gl.constexpr,
        HAS_KEY_MASK: gl.constexpr, NORMED: gl.constexpr, KV_BUFS: gl.constexpr,
        ACC_H: gl.constexpr, ACC_S: gl.constexpr, Q_OP: gl.constexpr, P_OP: gl.constexpr,
        SMEM_A: gl.constexpr, SMEM_W: gl.constexpr, SMEM_KV: gl.constexpr,
        SMEM_B: gl.constexpr, LOAD: gl.constexpr, LOAD_W: gl.constexpr, LOAD_B: gl.constexpr,
        STORE: gl.constexpr, VEC: gl.constexpr,
        STOP: gl.constexpr = 0,
        USE_GDC: gl.constexpr = 0,
    ):  # fmt: skip
        """The context ``[B, S, D]`` (fp16) of heads ``g * G .. g * G + G - 1`` for
        sequences ``s0, s0 + P / GROUPS, ...``: program ``pid`` owns group ``pid % GROUPS``
        and starts at sequence ``pid // GROUPS`` (the grid is a multiple of ``GROUPS``).
        ``wqkv`` the packed ``[3 D, D]`` fp16 weight, ``bqkv`` its fp32 bias; ``normed``
        the LayerNorm1 rows (fp16, with ``NORMED``) or ``x`` the fp32 residual rows.
        Heads go in slots of ``PAIR`` heads (``PAIR * HD`` columns): with head dim 8 two a
        slot, 16 columns, wgmma's smallest reduction for the scores; each head's scores take
        the slot's q with the other head's columns zeroed (the same sums), its context the
        slot's v, of which it stores its own columns. ``STOP`` (debugging only) stores a
        stage in the head's context columns instead: 1 q, 2 k, 3 v (fp16, with their bias).
        ``USE_GDC`` (programmatic dependent launch, ``kernels._common.gdc_mode``): the
        weights' copies are issued before the wait for the previous kernel, the rows
        after it."""
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        group = pid % GROUPS
        step = nprog // GROUPS
        first = pid // GROUPS
        SW: gl.constexpr = PAIR * HD  # a slot's columns of q, k, v and of the context
        SLOTS: gl.constexpr = G // PAIR
        col0 = group * (G * HD)  # the group's first column

        wq_s = gl.allocate_shared_memory(gl.float16, [SLOTS, SW, D], SMEM_W)
        wk_s = gl.allocate_shared_memory(gl.float16, [SLOTS, SW, D], SMEM_W)
        wv_s = gl.allocate_shared_memory(gl.float16, [SLOTS, SW, D], SMEM_W)
        a_s = gl.allocate_shared_memory(gl.float16, [BLOCK_S, D], SMEM_A)
        k_s = gl.allocate_shared_memory(gl.float16, [KV_BUFS, BLOCK_S, SW], SMEM_KV)
        v_s = gl.allocate_shared_memory(gl.float16, [KV_BUFS, BLOCK_S, SW], SMEM_KV)
        # the group's q, k, v biases as wgmma B operands ([q slots, k slots, v slots] of
        # [SW, 16] fp16: each bias's high and low fp16 parts in columns 0 and 1, zeros
        # after), once a program: each projection's accumulator starts as ones @ B^T
        b_s = gl.allocate_shared_memory(gl.float16, [3 * SLOTS, SW, _BIAS_K], SMEM_B)
        offs_bn = gl.arange(0, SW, layout=gl.SliceLayout(1, LOAD_B))
        offs_bk = gl.expand_dims(gl.arange(0, _BIAS_K, layout=gl.SliceLayout(0, LOAD_B)), 0)
        for part in gl.static_range(3):
            for w in gl.static_range(SLOTS):
                bias = gl.load(bqkv_ptr + part * D + col0 + w * SW + offs_bn)
                hi = bias.to(gl.float16)
                lo = (bias - hi.to(gl.float32)).to(gl.float16)
                parts = gl.where(offs_bk == 0, gl.expand_dims(hi, 1), gl.expand_dims(lo, 1))
                b_s.index(part * SLOTS + w).store(gl.where(offs_bk < 2, parts, 0.0).to(gl.float16))
        # the biases' A operand, ones (the same shared layout: 16 halves a row)
        ones_s = gl.allocate_shared_memory(gl.float16, [BLOCK_S, _BIAS_K], SMEM_B)
        ones_s.store(gl.full([BLOCK_S, _BIAS_K], 1.0, gl.float16, LOAD_B))
        # A commit group of the weights, then one of the first sequence's rows (after the
        # wait for the previous kernel, which wrote them: USE_GDC); each sequence's rows
        # after that are a group of their own, the only one in flight.
        for w in gl.static_range(SLOTS):  # each slot's [SW, D] rows of Wq, Wk, Wv
            slot_w = wqkv_ptr + (col0 + w * SW) * D
            _copy_weight(wq_s.index(w), slot_w, SW, D, LOAD_W)
            _copy_weight(wk_s.index(w), slot_w + D * D, SW, D, LOAD_W)
            _copy_weight(wv_s.index(w), slot_w + 2 * D * D, SW, D, LOAD_W)
        async_copy.commit_group()
        _grid_dependency_wait(USE_GDC)
        if NORMED:
            _copy_rows(a_s, normed_ptr, first, batch, seq_len, D, BLOCK_S, LOAD)
        async_copy.commit_group()

        offs_ls = gl.arange(0, BLOCK_S, layout=gl.SliceLayout(1, LOAD))
        offs_ld = gl.arange(0, D, layout=gl.SliceLayout(0, LOAD))
        if HAS_KEY_MASK:  # a sequence's mask bytes are loaded a sequence ahead
            offs_m = gl.arange(0, BLOCK_S, layout=VEC)
            kb_next = _mask_bytes(key_mask_ptr, first, batch, seq_len, offs_m)
        count = 0  # slots done by this program: the k, v buffer's parity
        for b in range(first, batch, step):
            if not NORMED:  # the first layer: LayerNorm1 of the residual rows, here
                rows = b.to(gl.int64) * seq_len + offs_ls
                io = gl.expand_dims(rows, 1) * D + gl.expand_dims(offs_ld, 0)
                ok = gl.expand_dims(offs_ls < seq_len, 1) & gl.expand_dims(offs_ld < D, 0)
                x = gl.load(x_ptr + io, mask=ok, other=0.0)
                a_s.store(_layernorm(x, n1w_ptr, n1b_ptr, offs_ld, D, eps).to(gl.float16))
            if HAS_KEY_MASK:  # its keys (loaded during the last sequence), the next's
                kb = kb_next
                kb_next = _mask_bytes(key_mask_ptr, b + step, batch, seq_len, offs_m)
                key_end, key_prefix = _key_extent(kb, offs_m, seq_len)
            async_copy.wait_group(0)  # the weights (first) and this sequence's rows
            _copies_visible()  # (the fence also orders the stores above before wgmma)
            if HAS_KEY_MASK:
                if key_prefix:  # a full or right-padded mask: masked by position alone
                    _sequence_slots(a_s, wq_s, wk_s, wv_s, k_s, v_s, b_s, ones_s, normed_ptr,
                                    ctx_ptr, key_mask_ptr, b, step, batch, seq_len, key_end,
                                    qk_scale, count, col0, D, HD, PAIR, SLOTS, BLOCK_S,
                                    CAUSAL, False, NORMED, KV_BUFS, ACC_H, ACC_S, Q_OP,
                                    P_OP, LOAD, STORE, STOP)  # fmt: skip
                else:  # holes: each head reads the mask's bytes
                    _sequence_slots(a_s, wq_s, wk_s, wv_s, k_s, v_s, b_s, ones_s, normed_ptr,
                                    ctx_ptr, key_mask_ptr, b, step, batch, seq_len, key_end,
                                    qk_scale, count, col0, D, HD, PAIR, SLOTS, BLOCK_S,
                                    CAUSAL, True, NORMED, KV_BUFS, ACC_H, ACC_S, Q_OP,
                                    P_OP, LOAD, STORE, STOP)  # fmt: skip
            else:
                _sequence_slots(a_s, wq_s, wk_s, wv_s, k_s, v_s, b_s, ones_s, normed_ptr,
                                ctx_ptr, key_mask_ptr, b, step, batch, seq_len, seq_len,
                                qk_scale, count, col0, D, HD, PAIR, SLOTS, BLOCK_S, CAUSAL,
                                False, NORMED, KV_BUFS, ACC_H, ACC_S, Q_OP, P_OP, LOAD,
                                STORE, STOP)  # fmt: skip
            count += SLOTS
        async_copy.wait_group(0)  # the last, empty, copies
        if USE_GDC == 2:
            _grid_dependency_launch(USE_GDC)


@dataclasses.dataclass(frozen=True)
class GluonHeadsLayouts:
    """The kernel's layouts (constexpr arguments) for a width, head dim and warp count."""

    acc_h: object  # q, k, v and the context: [S, slot columns]
    acc_s: object  # the scores: [S, S]
    q_op: object  # q as the scores' A operand
    p_op: object  # the probabilities as the context's A operand
    smem_a: object
    smem_w: object
    smem_kv: object
    load: object  # the sequence's rows [S, D]: 16-byte copies
    load_w: object  # a slot's weight rows [slot columns, D]
    smem_b: object  # a bias as a wgmma B operand [slot columns, BIAS_K], fp16
    load_b: object  # the biases' B operands, written once a program
    store: object  # a slot's context [S, slot columns]: 16-byte stores
    vec: object  # a vector of a thread an element: the key mask's bytes


def block_s(num_warps: int) -> int:
    """Rows (queries and keys) a program's tile holds: 64 a warpgroup."""
    return WARPGROUP_ROWS * (num_warps // 4)


def slot_width(head_dim: int) -> int:
    """A slot's columns: the head dim, or two heads of 8 (wgmma's smallest K is 16)."""
    return max(head_dim, 16)


def copy_layout(rows: int, cols: int, num_warps: int) -> tuple[int, int, int]:
    """``(vector, threads along a row, rows spanned)`` of the copies of a ``[rows, cols]``
    fp16 tile by ``num_warps`` warps, warps on the rows: 16-byte vectors, narrower where
    the tile has fewer than 8 halves a thread (so no two threads copy one element)."""
    vec = 8
    while vec > 1 and rows * cols < vec * 32 * num_warps:
        vec //= 2
    along = min(32, cols // vec)
    return vec, along, (32 // along) * num_warps


def _blocked(rows: int, cols: int, num_warps: int) -> object:
    vec, along, span = copy_layout(rows, cols, num_warps)
    # every supported shape (tests/kernels/test_gluon_heads.py): no element copied twice
    assert span <= rows and along * vec <= cols, (rows, cols, num_warps)
    return gl.BlockedLayout(
        size_per_thread=[1, vec],
        threads_per_warp=[32 // along, along],
        warps_per_cta=[num_warps, 1],
        order=[1, 0],
    )


def gluon_heads_layouts(d_model: int, head_dim: int, num_warps: int) -> GluonHeadsLayouts:
    """wgmma accumulators with the warpgroups stacked on the rows (so the accumulator to
    A-operand conversions stay in registers), 128-byte swizzled (or a row wide) shared
    layouts, and copy layouts of 16-byte vectors (narrower for a small weight slot)."""
    bs, sw = block_s(num_warps), slot_width(head_dim)

    def acc(n: int) -> object:
        return gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16]
        )

    acc_h, acc_s = acc(sw), acc(bs)
    return GluonHeadsLayouts(
        acc_h=acc_h,
        acc_s=acc_s,
        q_op=gl.DotOperandLayout(operand_index=0, parent=acc_s, k_width=2),
        p_op=gl.DotOperandLayout(operand_index=0, parent=acc_h, k_width=2),
        smem_a=gl.NVMMASharedLayout.get_default_for([bs, d_model], gl.float16),
        smem_w=gl.NVMMASharedLayout.get_default_for([sw, d_model], gl.float16),
        smem_kv=gl.NVMMASharedLayout.get_default_for([bs, sw], gl.float16),
        load=_blocked(bs, d_model, num_warps),
        load_w=_blocked(sw, d_model, num_warps),
        smem_b=gl.NVMMASharedLayout.get_default_for([sw, BIAS_K], gl.float16),
        load_b=_blocked(sw, BIAS_K, num_warps),
        store=_blocked(bs, sw, num_warps),
        vec=gl.BlockedLayout(
            size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[num_warps], order=[0]
        ),
    )


def kv_buffers(d_model: int, head_dim: int, heads: int, num_warps: int) -> int:
    """Two k, v buffers (one barrier a head) where they fit in shared memory, else one."""
    two = gluon_heads_shared_bytes(d_model, head_dim, heads, num_warps, 2)
    return 2 if two <= SMEM_LIMIT else 1


def gluon_heads_shared_bytes(
    d_model: int, head_dim: int, heads: int, num_warps: int, kv_bufs: int = 0
) -> int:
    """Shared memory a program holds: the group's q, k, v weight rows, the sequence's rows,
    and the k, v buffers of a slot, fp16 (``kv_bufs`` 0: as ``kv_buffers`` picks); the
    group's q, k, v biases as ``[columns, BIAS_K]`` fp16 matrices and their A operand
    (``[S, BIAS_K]`` ones); and the compiler's
    scratch, the larger of the reductions over a sequence's key mask (4 bytes a warp that
    holds distinct keys) and the context's conversion to 16-byte stores (a slot's
    ``[S, columns]`` fp16, slots up to ``WIDE_STORE_MAX`` columns). The compiler may align
    the buffers a few dozen bytes further (case 7's shape: 64 B)."""
    bs, sw = block_s(num_warps), slot_width(head_dim)
    kv_bufs = kv_bufs or kv_buffers(d_model, head_dim, heads, num_warps)
    tiles = 2 * (3 * heads * head_dim * d_model + bs * d_model + 2 * kv_bufs * bs * sw)
    # scratch (shared by the compiler): the key mask's reductions, the context's conversion
    scratch = max(4 * (bs // 32), 2 * bs * sw if sw <= WIDE_STORE_MAX else 0)
    return tiles + 2 * (3 * heads * head_dim + bs) * BIAS_K + scratch


def gluon_heads_problems(
    *, seq_len: int, d_model: int, num_heads: int, heads: int, gemm_precision: str,
    attn_precision: str, num_warps: int,
) -> list[str]:  # fmt: skip
    """Why this kernel cannot take a layer of this shape and setting (empty: it can)."""
    out = [GLUON_ERROR] if GLUON_ERROR else []
    head_dim = d_model // num_heads if num_heads and d_model % num_heads == 0 else 0
    if d_model not in SUPPORTED_D_MODELS:
        out.append(f"d_model {d_model} is not one of {SUPPORTED_D_MODELS}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        out.append(
            f"head_dim {head_dim or 'undefined'} is not one of {SUPPORTED_HEAD_DIMS} "
            "(wgmma's reduction over the head dim takes multiples of 16; 8 goes in pairs)"
        )
    pair = slot_width(head_dim) // head_dim if head_dim in SUPPORTED_HEAD_DIMS else 1
    if heads < 1 or num_heads % heads or heads % pair:
        fits = [g for g in range(pair, num_heads + 1, pair) if num_heads % g == 0]
        why = f"{heads} heads a program does not divide num_heads={num_heads}"
        if head_dim in SUPPORTED_HEAD_DIMS and heads >= 1 and not num_heads % heads:
            why = (f"head dim {head_dim} runs in pairs of heads (16 columns, wgmma's smallest "
                   f"reduction): {heads} heads a program is odd")  # fmt: skip
        out.append(f"{why}; set attn_gluon (tiling.gluon_heads) to one of {fits}")
    for name, value in (("gemm_precision", gemm_precision), ("attn_precision", attn_precision)):
        if value != "fp16":
            out.append(
                f"the {name.split('_')[0]} operands are {value!r} here; the Gluon heads "
                f"attention takes fp16 ({name}=fp16)"
            )
    if num_warps not in (4, 8):
        out.append(f"{num_warps} attention warps: wgmma takes 4 (one warpgroup) or 8")
    elif seq_len > block_s(num_warps):
        way = (
            "use 8 attention warps (S <= 128) or attn_gluon=0 (the Triton heads kernel)"
            if num_warps == 4 and seq_len <= block_s(8)
            else "use attn_gluon=0 (the Triton heads kernel) or fused_layer=rows"
        )
        out.append(
            f"seq_len {seq_len} > {block_s(num_warps)} (every key in one tile: 64 rows a "
            f"warpgroup of {num_warps} warps); {way}"
        )
    if out:
        return out
    need = gluon_heads_shared_bytes(d_model, head_dim, heads, num_warps)
    if need > SMEM_LIMIT:
        out.append(f"{need} bytes of shared memory a program (the limit is {SMEM_LIMIT})")
    return out


def launch_heads_attention_gluon(
    x: torch.Tensor,
    normed: torch.Tensor | None,
    ctx: torch.Tensor,
    mask_bytes: torch.Tensor | None,
    norm1: tuple[torch.Tensor, torch.Tensor],
    wqkv: torch.Tensor,
    bqkv: torch.Tensor,
    *,
    num_heads: int,
    heads: int,
    causal: bool,
    eps: float,
    num_warps: int,
    max_programs: int = 0,
    stop: int = 0,
    use_gdc: int = 0,
) -> None:
    """Launch the kernel over ``x [B, S, D]``'s sequences into ``ctx`` (fp16 ``[B, S, D]``):
    ``normed`` the LayerNorm1 rows (fp16) or None (normalised here from ``x``);
    ``wqkv`` ``[3 D, D]`` fp16, ``bqkv`` ``[3 D]`` fp32. A persistent grid of the programs
    the SMs hold, a multiple of the head groups, at most one a (sequence, group); with
    ``max_programs``, at most that many a group (debugging: several sequences a program).
    ``stop``: the kernel's ``STOP``; ``use_gdc``: its ``USE_GDC`` (launched with
    programmatic dependent launch when set)."""

    batch, seq_len, d_model = x.shape
    head_dim = d_model // num_heads
    groups = num_heads // heads
    lay = gluon_heads_layouts(d_model, head_dim, num_warps)
    kv_bufs = kv_buffers(d_model, head_dim, heads, num_warps)
    args = (
        x, normed if normed is not None else x, ctx,
        mask_bytes if mask_bytes is not None else x, *norm1, wqkv, bqkv,
        batch, seq_len, head_dim**-0.5 * 1.4426950408889634, eps,
    )  # fmt: skip
    kwargs = dict(
        D=d_model, HD=head_dim, PAIR=slot_width(head_dim) // head_dim, G=heads,
        GROUPS=groups, BLOCK_S=block_s(num_warps),
        CAUSAL=bool(causal), HAS_KEY_MASK=mask_bytes is not None, NORMED=normed is not None,
        KV_BUFS=kv_bufs, ACC_H=lay.acc_h, ACC_S=lay.acc_s, Q_OP=lay.q_op, P_OP=lay.p_op,
        SMEM_A=lay.smem_a, SMEM_W=lay.smem_w, SMEM_KV=lay.smem_kv, SMEM_B=lay.smem_b,
        LOAD=lay.load, LOAD_W=lay.load_w, LOAD_B=lay.load_b,
        STORE=lay.store, VEC=lay.vec, STOP=stop,
        USE_GDC=use_gdc, num_warps=num_warps,
        **pdl_launch(bool(use_gdc)),  # the warmup's binary is the launch's
    )  # fmt: skip
    key = ("heads", x.device.index, d_model, head_dim, heads, num_warps, causal,
           mask_bytes is not None, normed is not None, stop, use_gdc)  # fmt: skip
    programs = gluon_rows.persistent_programs(
        key,
        lambda: _heads_attention_gluon_kernel.warmup(*args, grid=(groups,), **kwargs),
        num_warps, x.device, batch * groups, max_programs * groups, groups,
    )  # fmt: skip
    _heads_attention_gluon_kernel[(programs,)](*args, **kwargs)
