"""Row statistics and in-place probabilities for the streamed oracle's score chunks.

The oracle (``autotune/oracle.py``) computes softmax exactly as the reference does -
``exp(s - max) / sum`` on fp32 scores, the normalised probabilities then multiplied with
V by a TF32 matmul - but over key chunks, so it needs each row's maximum and sum before it
can form the probabilities (two passes over the scores). Its cost at case 14 is the bytes
moved per score, so both passes here touch a score chunk once:

- ``row_stats(sc, ...)``: per row, the maximum and ``sum(exp(s - max))`` of one chunk, with
  the causal and key masks applied on the fly (one read);
- ``probs_(sc, m, l, ...)``: ``exp(s - m) / l`` in place, masked entries 0 (one read, one
  write).

``sc`` is ``[BH, qn, kn]`` fp32 contiguous (BH = batch x heads), rows are query positions
``i0 + r`` and columns key positions ``j0 + c``; ``key_mask`` is ``[B, S]`` bool (True =
valid). On CUDA with Triton these are single kernels; elsewhere the PyTorch functions
below (the reference for the kernels) run.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels._triton import triton_available

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the torch path serves
    triton = None  # type: ignore[assignment]


def _masked(sc: Tensor, i0: int, j0: int, causal: bool, key_mask: Tensor | None) -> Tensor:
    """A copy of ``sc`` with masked entries set to -inf (torch path)."""
    bh, qn, kn = sc.shape
    out = sc.clone()
    if causal:
        rows = torch.arange(i0, i0 + qn, device=sc.device)[:, None]
        cols = torch.arange(j0, j0 + kn, device=sc.device)[None, :]
        out.masked_fill_(cols > rows, float("-inf"))
    if key_mask is not None:
        b = key_mask.shape[0]
        keys = key_mask[:, j0 : j0 + kn].repeat_interleave(bh // b, dim=0)
        out.masked_fill_(~keys[:, None, :], float("-inf"))
    return out


def row_stats_torch(
    sc: Tensor, i0: int, j0: int, causal: bool, key_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    x = _masked(sc, i0, j0, causal, key_mask)
    m = x.amax(dim=-1)
    shift = torch.where(m == float("-inf"), 0.0, m)
    return m, torch.exp(x - shift[..., None]).sum(dim=-1)


def probs_torch_(
    sc: Tensor, m: Tensor, l: Tensor, i0: int, j0: int, causal: bool, key_mask: Tensor | None
) -> Tensor:
    x = _masked(sc, i0, j0, causal, key_mask)
    sc.copy_(torch.exp(x - m[..., None]) / l[..., None])
    return sc


if triton is not None:

    @triton.jit
    def _masked_scores(
        base, cols, n_cols, i, b, j0, km_ptr, km_stride,
        CAUSAL: tl.constexpr, HAS_KM: tl.constexpr,
    ):  # fmt: skip
        """Scores of row ``i`` at columns ``cols`` with the causal and key masks as -inf."""
        ok = cols < n_cols
        x = tl.load(base + cols, mask=ok, other=float("-inf"))
        if CAUSAL:
            x = tl.where(j0 + cols > i, float("-inf"), x)
        if HAS_KM:
            km = tl.load(km_ptr + b * km_stride + j0 + cols, mask=ok, other=0)
            x = tl.where(km != 0, x, float("-inf"))
        return x

    @triton.jit
    def _row_stats_kernel(
        s_ptr, m_ptr, l_ptr, km_ptr, n_cols, qn, heads, i0, j0, km_stride,
        CAUSAL: tl.constexpr, HAS_KM: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        r = tl.program_id(0)
        i = i0 + r % qn
        b = (r // qn) // heads
        base = s_ptr + r.to(tl.int64) * n_cols
        m = tl.full((), float("-inf"), tl.float32)
        l = tl.zeros((), tl.float32)
        for c0 in range(0, n_cols, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            x = _masked_scores(base, cols, n_cols, i, b, j0, km_ptr, km_stride, CAUSAL, HAS_KM)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            l = l * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)
            m = m_new
        tl.store(m_ptr + r, m)
        tl.store(l_ptr + r, l)

    @triton.jit
    def _probs_kernel(
        s_ptr, m_ptr, l_ptr, km_ptr, n_cols, qn, heads, i0, j0, km_stride,
        CAUSAL: tl.constexpr, HAS_KM: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        r = tl.program_id(0)
        i = i0 + r % qn
        b = (r // qn) // heads
        base = s_ptr + r.to(tl.int64) * n_cols
        m = tl.load(m_ptr + r)
        l = tl.load(l_ptr + r)
        for c0 in range(0, n_cols, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            x = _masked_scores(base, cols, n_cols, i, b, j0, km_ptr, km_stride, CAUSAL, HAS_KM)
            tl.store(base + cols, tl.exp(x - m) / l, mask=cols < n_cols)


def _use_triton(sc: Tensor, use_triton: bool | None) -> bool:
    """Triton on CUDA by default; ``use_triton=True`` also runs the kernels on CPU
    tensors under ``TRITON_INTERPRET=1`` (tests)."""
    if use_triton is None:
        use_triton = sc.is_cuda
    return use_triton and triton is not None and triton_available()[0]


def _launch(kernel, sc, m, l, i0, j0, causal, key_mask):  # type: ignore[no-untyped-def]
    bh, qn, kn = sc.shape
    heads = bh // (key_mask.shape[0] if key_mask is not None else bh)
    km = key_mask.to(torch.int8) if key_mask is not None else sc
    kernel[(bh * qn,)](
        sc, m, l, km, kn, qn, max(heads, 1), i0, j0,
        km.stride(0) if key_mask is not None else 0,
        CAUSAL=causal, HAS_KM=key_mask is not None,
        BLOCK=min(1024, triton.next_power_of_2(kn)),
    )  # fmt: skip


def row_stats(
    sc: Tensor,
    i0: int,
    j0: int,
    causal: bool,
    key_mask: Tensor | None,
    use_triton: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-row maximum and ``sum(exp(s - max))`` of a masked score chunk ``[BH, qn, kn]``."""
    if not _use_triton(sc, use_triton):
        return row_stats_torch(sc, i0, j0, causal, key_mask)
    sc = sc.contiguous()
    m = torch.empty(sc.shape[:2], device=sc.device, dtype=torch.float32)
    l = torch.empty_like(m)
    _launch(_row_stats_kernel, sc, m, l, i0, j0, causal, key_mask)
    return m, l


def probs_(
    sc: Tensor,
    m: Tensor,
    l: Tensor,
    i0: int,
    j0: int,
    causal: bool,
    key_mask: Tensor | None,
    use_triton: bool | None = None,
) -> Tensor:
    """``exp(s - m) / l`` in place on a contiguous score chunk; masked entries become 0."""
    if not _use_triton(sc, use_triton):
        return probs_torch_(sc, m, l, i0, j0, causal, key_mask)
    if not sc.is_contiguous():
        raise ValueError("probs_ works in place: the score chunk must be contiguous")
    _launch(_probs_kernel, sc, m.contiguous(), l.contiguous(), i0, j0, causal, key_mask)
    return sc
