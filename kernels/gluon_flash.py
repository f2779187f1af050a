"""The flash attention of long sequences in Gluon, for Hopper (sm_90): the softmax of one key
block runs on the CUDA cores while the tensor cores multiply the previous block's
probabilities by its values (plan knob ``attn_gluon_flash``).

The Triton flash attention (``kernels.attention._attention_fwd_kernel``) waits for each
block's ``p @ v`` before it starts the next block's scores: per key block the scores'
wgmma, the softmax (MUFU exponentials, FMAs, two row reductions) and the ``p @ v`` wgmma run
one after another in each warpgroup, and only other programs on the SM fill the gaps. Here,
per warpgroup (FlashAttention-3's intra-warpgroup overlap, without warp specialisation):

- the query tile is copied into shared memory once; the key and value blocks through
  rings of ``STAGES`` buffers each, ``cp.async`` copies issued ``STAGES - 1`` steps before
  the wgmma that reads them (a key block is free once its scores are, a value block a step
  later, so step ``j`` copies key block ``j + STAGES - 1`` and value block
  ``j + STAGES - 2``);
- step ``j`` issues block ``j``'s scores ``q @ k_j^T`` and block ``j - 1``'s
  ``p_{j-1} @ v_{j-1}`` back to back, waits for the scores alone, runs block ``j``'s
  online softmax (the running maximum, the exponentials in the log2 domain, the row sums)
  while the second wgmma runs, then waits for it and rescales the accumulator by the
  maximum's change (after the product that used the old maximum);
- key blocks every query row of the tile sees in full take no mask; the rest (the causal
  diagonal, keys past the sequence or its key bounds, a key mask with holes) compare per
  element, as the Triton kernel's masked step;
- the context (divided by the row sums; a row with no valid key: 0) is stored once in
  16-byte vectors through a shared-memory conversion.

The same arithmetic as the Triton kernel at fp16 attention precision: fp16 operands, fp32
scores and accumulator, the probabilities rounded to fp16 for the second product and
summed unrounded. Gluon has no interpreter: this runs on a CUDA device of compute capability
9.x and compiles offline (``kernels.sass.offline_launches``); ``problems`` says why it
cannot take a configuration.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kernels import gluon_rows
from kernels._common import maxnreg_launch, pdl_launch

GLUON_ERROR = gluon_rows.GLUON_ERROR
if not GLUON_ERROR:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from kernels.gluon_rows import (
        _copies_visible,
        _cp_async,
        _grid_dependency_launch,
        _grid_dependency_wait,
    )

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)  # wgmma's K (the scores') is a multiple of 16
BLOCK_NS = (64, 128)  # keys a step
STAGES = (3, 4)  # key and value buffers (copies issued STAGES - 1 steps ahead)
WARPGROUP_ROWS = 64
SMEM_LIMIT = gluon_rows.SMEM_LIMIT
LOG2_E = math.log2(math.e)

if not GLUON_ERROR:

    @gluon.jit
    def _copy_block(smem, base, row0, limit, stride_s, ROWS: gl.constexpr, HD: gl.constexpr,
                    LOAD: gl.constexpr):  # fmt: skip
        """Issue the copies of rows ``row0 .. row0 + ROWS`` of one head (``[ROWS, HD]``
        fp16, rows ``stride_s`` apart) into ``smem``; rows at or past ``limit``: zeros (never
        read from memory)."""
        offs_r = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, LOAD))
        offs_d = gl.arange(0, HD, layout=gl.SliceLayout(0, LOAD))
        ptrs = base + gl.expand_dims(offs_r.to(gl.int64) * stride_s, 1) + gl.expand_dims(offs_d, 0)
        ok = gl.expand_dims(offs_r < limit, 1) & gl.expand_dims(offs_d < HD, 0)
        _cp_async(smem, ptrs, mask=ok)

    @gluon.jit
    def _softmax_step(s, m_i, l_i, j, hi, offs_m, km_base, qk_scale, BLOCK_N: gl.constexpr,
                      MASKED: gl.constexpr, CAUSAL: gl.constexpr,
                      HAS_KEY_MASK: gl.constexpr, ACC_S: gl.constexpr):  # fmt: skip
        """Block ``j``'s scores ``s`` (fp32) into probabilities ``p`` (fp32, log2 domain),
        the new running maximum and row sums, and ``alpha`` (the old sums' and the
        accumulator's factor). ``MASKED``: compared per element (keys at or past ``hi``,
        causal, the key mask's bytes). No branch: one between a wgmma's issue and its wait
        makes ptxas wait for it at the branch."""
        if MASKED:
            offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, ACC_S))
            valid = gl.expand_dims(offs_n < hi, 0)
            if CAUSAL:
                valid = valid & (gl.expand_dims(offs_n, 0) <= gl.expand_dims(offs_m, 1))
            if HAS_KEY_MASK:
                kb = gl.load(km_base + offs_n, mask=offs_n < hi, other=0)
                valid = valid & gl.expand_dims(kb != 0, 0)
            s = gl.where(valid, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)  # the scale > 0
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # no valid key yet: no NaN
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_use, 1))
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, m_new, l_i, alpha

    @gluon.jit
    def _key_step(q_s, k_s, v_s, pin_s, acc, p16, m_i, l_i, j, hi, offs_m, k_base, v_base, km_base,
                  stride_ks, stride_vs, qk_scale, zeros_s, HD: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr,
                  CAUSAL: gl.constexpr, HAS_KEY_MASK: gl.constexpr, ACC_S: gl.constexpr,
                  ACC_O: gl.constexpr, P_OP: gl.constexpr, LOAD: gl.constexpr):  # fmt: skip
        """Step ``j >= 1``: block ``j``'s scores and block ``j - 1``'s ``p @ v`` issued back
        to back, block ``j``'s softmax while the second runs; the copies of key block
        ``j + STAGES - 1`` (into key block ``j - 1``'s buffer: its scores are done) and
        value block ``j + STAGES - 2`` (into value block ``j - 2``'s: its product is
        done), one commit group."""
        # Key block j and value block j - 1 landed (their group is the j-th; STAGES - 2
        # newer ones may still be in flight), every warp's copies visible, and every
        # warpgroup past step j - 1's waits.
        async_copy.wait_group(STAGES - 2)
        _copies_visible()
        # (block m's buffer is m % STAGES; no negative operand: the remainder takes the
        # dividend's sign)
        _copy_block(k_s.index((j + STAGES - 1) % STAGES), k_base, (j + STAGES - 1) * BLOCK_N,
                    hi, stride_ks, BLOCK_N, HD, LOAD)  # fmt: skip
        _copy_block(v_s.index((j + STAGES - 2) % STAGES), v_base, (j + STAGES - 2) * BLOCK_N,
                    hi, stride_vs, BLOCK_N, HD, LOAD)  # fmt: skip
        async_copy.commit_group()
        s = warpgroup_mma(q_s, k_s.index(j % STAGES).permute((1, 0)), zeros_s, use_acc=False,
                          is_async=True)  # fmt: skip
        acc = warpgroup_mma(p16, v_s.index((j - 1) % STAGES), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))  # the scores; p @ v runs on
        p, m_i, l_i, alpha = _softmax_step(
            s, m_i, l_i, j, hi, offs_m, km_base, qk_scale, BLOCK_N, MASKED, CAUSAL,
            HAS_KEY_MASK, ACC_S,
        )  # fmt: skip
        # The new probabilities are rounded into the registers of the product's A operand
        # after its wait (FlashAttention-3's order): ptxas gives them those registers (the
        # loop carries them), and a write to one while the tensor cores read it makes it
        # wait for the product there, ahead of the exponentials (offline SASS, Triton 3.6).
        # ptxas hoists the wait for the product above arithmetic that does not need it
        # (offline SASS, Triton 3.6: right after the scores' wait), but not above a memory
        # access: the row sums (every exponential of the step feeds them) stored to a
        # scratch row first pin the softmax before it.
        pin_s.store(l_i)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p16))[0]
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, ACC_O)), 1)
        p_next = gl.convert_layout(p.to(gl.float16), P_OP)
        return acc, p_next, m_i, l_i

    @gluon.jit
    def _flash_gluon_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr, km_ptr, kbounds_ptr,
        stride_mb, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
        num_heads, seq_len, qk_scale,
        HD: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
        CAUSAL: gl.constexpr, HAS_KEY_MASK: gl.constexpr, HAS_KEY_BOUNDS: gl.constexpr,
        ACC_S: gl.constexpr, ACC_O: gl.constexpr, P_OP: gl.constexpr, SMEM_Q: gl.constexpr,
        SMEM_KV: gl.constexpr, SMEM_PIN: gl.constexpr, LOAD: gl.constexpr,
        STORE: gl.constexpr, USE_GDC: gl.constexpr = 0,
    ):  # fmt: skip
        """The context of query rows ``[start_m, start_m + BLOCK_M)`` of one (sequence,
        head): a 1-D grid, (sequence, head)-major, the causal diagonal's costliest query
        blocks first (as the Triton kernel)."""
        num_m_blocks = gl.cdiv(seq_len, BLOCK_M)
        pid = gl.program_id(0)
        pid_bh = pid // num_m_blocks
        start_m = (num_m_blocks - 1 - pid % num_m_blocks) * BLOCK_M
        off_b = (pid_bh // num_heads).to(gl.int64)
        off_h = (pid_bh % num_heads).to(gl.int64)
        q_base = q_ptr + off_b * stride_qb + off_h * stride_qh
        k_base = k_ptr + off_b * stride_kb + off_h * stride_kh
        v_base = v_ptr + off_b * stride_vb + off_h * stride_vh
        km_base = km_ptr + off_b * stride_mb

        q_s = gl.allocate_shared_memory(gl.float16, [BLOCK_M, HD], SMEM_Q)
        k_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, HD], SMEM_KV)
        v_s = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, HD], SMEM_KV)
        pin_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M], SMEM_PIN)  # never read

        _grid_dependency_wait(USE_GDC)
        # Keys [0, full_hi) are valid for every row of the tile; [full_hi, hi) are masked;
        # keys at or past hi are never loaded (the Triton kernel's bounds).
        hi = seq_len
        full_hi = seq_len
        if CAUSAL:
            hi = gl.minimum(seq_len, start_m + BLOCK_M)
            full_hi = gl.minimum(seq_len, start_m + 1)
        if HAS_KEY_MASK:
            if HAS_KEY_BOUNDS:  # keys [0, prefix) all valid, keys >= end all masked
                prefix = gl.load(kbounds_ptr + off_b * 2)
                hi = gl.minimum(hi, gl.load(kbounds_ptr + off_b * 2 + 1))
                full_hi = gl.minimum(full_hi, prefix)
            else:  # any key may be masked: every block compares
                full_hi = 0
        n_full = full_hi // BLOCK_N  # blocks every row of the tile sees in full
        n_blocks = gl.maximum(gl.cdiv(hi, BLOCK_N), 1)  # block 0 at least: a row of zeros

        # Commit group i (one for each step, the i-th read at step i): the query tile and
        # key block 0; then key block i and value block i - 1 up to STAGES - 2 here, the
        # steps issue the rest.
        _copy_block(q_s, q_base, start_m, seq_len, stride_qs, BLOCK_M, HD, LOAD)
        _copy_block(k_s.index(0), k_base, 0, hi, stride_ks, BLOCK_N, HD, LOAD)
        async_copy.commit_group()
        for i in gl.static_range(1, STAGES - 1):
            _copy_block(k_s.index(i), k_base, i * BLOCK_N, hi, stride_ks, BLOCK_N, HD, LOAD)
            _copy_block(v_s.index(i - 1), v_base, (i - 1) * BLOCK_N, hi, stride_vs, BLOCK_N,
                        HD, LOAD)  # fmt: skip
            async_copy.commit_group()

        offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ACC_S))
        zeros_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, ACC_S)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, ACC_S))
        l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, ACC_S))
        acc = gl.zeros([BLOCK_M, HD], gl.float32, ACC_O)

        # Block 0: its scores alone (no product of an earlier block to overlap).
        async_copy.wait_group(STAGES - 2)  # the query tile and key block 0
        _copies_visible()
        # key block STAGES - 1 and value block STAGES - 2 into buffers nothing read yet
        _copy_block(k_s.index(STAGES - 1), k_base, (STAGES - 1) * BLOCK_N, hi, stride_ks,
                    BLOCK_N, HD, LOAD)  # fmt: skip
        _copy_block(v_s.index(STAGES - 2), v_base, (STAGES - 2) * BLOCK_N, hi, stride_vs,
                    BLOCK_N, HD, LOAD)  # fmt: skip
        async_copy.commit_group()
        s = warpgroup_mma(q_s, k_s.index(0).permute((1, 0)), zeros_s, use_acc=False,
                          is_async=True)  # fmt: skip
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        if n_full > 0:  # (nothing in flight: a branch costs no overlap here)
            p, m_i, l_i, _ = _softmax_step(
                s, m_i, l_i, 0, hi, offs_m, km_base, qk_scale, BLOCK_N, False, CAUSAL,
                HAS_KEY_MASK, ACC_S,
            )  # fmt: skip
        else:
            p, m_i, l_i, _ = _softmax_step(
                s, m_i, l_i, 0, hi, offs_m, km_base, qk_scale, BLOCK_N, True, CAUSAL,
                HAS_KEY_MASK, ACC_S,
            )  # fmt: skip
        p16 = gl.convert_layout(p.to(gl.float16), P_OP)

        # The blocks every row sees in full, then the masked ones: two loops, no branch in
        # a step (n_full <= n_blocks).
        for j in range(1, n_full):
            acc, p16, m_i, l_i = _key_step(
                q_s, k_s, v_s, pin_s, acc, p16, m_i, l_i, j, hi, offs_m, k_base, v_base, km_base,
                stride_ks, stride_vs, qk_scale, zeros_s, HD, BLOCK_N, STAGES, False, CAUSAL,
                HAS_KEY_MASK, ACC_S, ACC_O, P_OP, LOAD,
            )  # fmt: skip
        for j in range(gl.maximum(n_full, 1), n_blocks):
            acc, p16, m_i, l_i = _key_step(
                q_s, k_s, v_s, pin_s, acc, p16, m_i, l_i, j, hi, offs_m, k_base, v_base, km_base,
                stride_ks, stride_vs, qk_scale, zeros_s, HD, BLOCK_N, STAGES, True, CAUSAL,
                HAS_KEY_MASK, ACC_S, ACC_O, P_OP, LOAD,
            )  # fmt: skip

        # The last value block (commit group n_blocks; STAGES - 2 newer ones may still be in
        # flight), visible to every warp's wgmma.
        async_copy.wait_group(STAGES - 2)
        _copies_visible()
        last = (n_blocks - 1) % STAGES
        acc = warpgroup_mma(p16, v_s.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        async_copy.wait_group(0)  # the copies past the last block (empty or masked off)
        l_i = gl.convert_layout(gl.where(l_i == 0.0, 1.0, l_i), gl.SliceLayout(1, ACC_O))
        out = gl.convert_layout((acc / gl.expand_dims(l_i, 1)).to(gl.float16), STORE)
        offs_r = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, STORE))
        offs_d = gl.arange(0, HD, layout=gl.SliceLayout(0, STORE))
        o_base = o_ptr + off_b * stride_ob + off_h * stride_oh
        rows = gl.expand_dims(offs_r.to(gl.int64) * stride_os, 1)
        ok = gl.expand_dims(offs_r < seq_len, 1) & gl.expand_dims(offs_d < HD, 0)
        gl.store(o_base + rows + gl.expand_dims(offs_d, 0), out, mask=ok)
        if USE_GDC == 2:
            _grid_dependency_launch(USE_GDC)


@dataclasses.dataclass(frozen=True)
class GluonFlashLayouts:
    """The kernel's layouts (constexpr arguments) for a head dim, key block and warp count."""

    acc_s: object  # the scores [BLOCK_M, BLOCK_N]
    acc_o: object  # the context's accumulator [BLOCK_M, HD]
    p_op: object  # the probabilities as the second product's A operand
    smem_q: object
    smem_kv: object
    smem_pin: object  # the scratch row of the row sums' pinning stores
    load: object  # [rows, HD] copies in 16-byte vectors
    store: object  # the context [BLOCK_M, HD] in 16-byte vectors


def block_m(num_warps: int) -> int:
    """Query rows a program holds: 64 a warpgroup."""
    return WARPGROUP_ROWS * (num_warps // 4)


def gluon_flash_layouts(head_dim: int, block_n: int, num_warps: int) -> GluonFlashLayouts:
    """wgmma accumulators with the warpgroups stacked on the rows, the default swizzled
    shared layouts, 16-byte copies and stores (``kernels.gluon_heads``' layouts)."""
    from kernels.gluon_heads import _blocked

    bm = block_m(num_warps)

    def acc(n: int) -> object:
        return gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16]
        )

    acc_o = acc(head_dim)
    return GluonFlashLayouts(
        acc_s=acc(block_n),
        acc_o=acc_o,
        p_op=gl.DotOperandLayout(operand_index=0, parent=acc_o, k_width=2),
        smem_q=gl.NVMMASharedLayout.get_default_for([bm, head_dim], gl.float16),
        smem_kv=gl.NVMMASharedLayout.get_default_for([block_n, head_dim], gl.float16),
        smem_pin=gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]),
        load=_blocked(min(bm, block_n), head_dim, num_warps),
        store=_blocked(bm, head_dim, num_warps),
    )


def gluon_flash_shared_bytes(head_dim: int, block_n: int, stages: int, num_warps: int) -> int:
    """Shared memory a program holds: the query tile and ``stages`` key and value blocks,
    fp16. The context's conversion to 16-byte stores needs the query tile's bytes, and the
    compiler puts it there (the tile is dead by then: offline, Triton 3.6, every shape of
    ``tests/kernels/test_gluon_flash.py``)."""
    bm = block_m(num_warps)
    return 2 * (bm * head_dim + 2 * stages * block_n * head_dim) + 4 * bm


def gluon_flash_problems(
    *, head_dim: int, block_n: int, stages: int, num_warps: int, precision: str,
    key_lengths: bool = False,
) -> list[str]:  # fmt: skip
    """Why this kernel cannot take a configuration (empty: it can)."""
    out = [GLUON_ERROR] if GLUON_ERROR else []
    if head_dim not in SUPPORTED_HEAD_DIMS:
        out.append(
            f"head_dim {head_dim} is not one of {SUPPORTED_HEAD_DIMS} (wgmma's reduction "
            "over the head dim takes multiples of 16; a power of two for Gluon's tiles)"
        )
    if block_n not in BLOCK_NS:
        out.append(f"attn_block_n {block_n} is not one of {BLOCK_NS} (keys a step)")
    if stages not in STAGES:
        out.append(
            f"attn_stages {stages} is not one of {STAGES} (key and value buffers: the copies "
            "issued stages - 1 steps ahead)"
        )
    if num_warps not in (4, 8):
        out.append(f"{num_warps} attention warps: wgmma takes 4 (one warpgroup) or 8")
    if precision != "fp16":
        out.append(f"attn_precision {precision!r}: the Gluon flash attention takes fp16")
    if key_lengths:
        out.append("key_lengths: pass the key mask (and its key_bounds) instead")
    if not out:
        need = gluon_flash_shared_bytes(head_dim, block_n, stages, num_warps)
        if need > SMEM_LIMIT:
            out.append(f"{need} bytes of shared memory a program (the limit is {SMEM_LIMIT})")
    return out


def launch_flash_gluon(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    *,
    causal: bool,
    mask_bytes: torch.Tensor | None,
    key_bounds: torch.Tensor | None,
    scale: float,
    block_n: int,
    stages: int,
    num_warps: int,
    maxnreg: int = 0,
    use_gdc: int = 0,
) -> None:
    """Launch over ``q, k, v`` ``[B, S, H, hd]`` fp16 (any strides with a unit last one)
    into ``out`` (fp16, same shape). ``mask_bytes`` the key mask as bytes ``[B, S]`` (or
    None); ``key_bounds`` its ``kernels.attention.key_mask_bounds`` (or None); ``maxnreg``
    the most registers a thread may hold (0: the compiler's choice). The caller
    (``kernels.attention.attention``) checked the tensors."""
    batch, seq_len, num_heads, head_dim = q.shape
    bm = block_m(num_warps)
    lay = gluon_flash_layouts(head_dim, block_n, num_warps)
    grid = (batch * num_heads * math.ceil(seq_len / bm),)
    _flash_gluon_kernel[grid](
        q, k, v, out,
        mask_bytes if mask_bytes is not None else q,
        key_bounds if key_bounds is not None else q,
        mask_bytes.stride(0) if mask_bytes is not None else 0,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        num_heads, seq_len, scale * LOG2_E,
        HD=head_dim, BLOCK_M=bm, BLOCK_N=block_n, STAGES=stages, CAUSAL=bool(causal),
        HAS_KEY_MASK=mask_bytes is not None, HAS_KEY_BOUNDS=key_bounds is not None,
        ACC_S=lay.acc_s, ACC_O=lay.acc_o, P_OP=lay.p_op, SMEM_Q=lay.smem_q,
        SMEM_KV=lay.smem_kv, SMEM_PIN=lay.smem_pin, LOAD=lay.load, STORE=lay.store, USE_GDC=use_gdc,
        num_warps=num_warps, **pdl_launch(bool(use_gdc)), **maxnreg_launch(maxnreg),
    )  # fmt: skip
