"""The oracle's fused row statistics and in-place probabilities: the Triton kernels
(the interpreter on the CPU; compiled on the GPU with the ``device`` fixture's CUDA) against
their PyTorch reference, masks and all-masked rows included."""

from __future__ import annotations

import pytest
import torch

from kernels.rowsoftmax import probs_, row_stats


def _chunk(bh: int, qn: int, kn: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(bh, qn, kn, generator=g) * 3.0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize(("i0", "j0"), [(0, 0), (5, 3), (16, 0)])
def test_kernels_match_torch(device: str, causal: bool, with_mask: bool, i0: int, j0: int) -> None:
    heads, b, qn, kn, s = 2, 2, 7, 13, 40
    sc = _chunk(b * heads, qn, kn, 3).to(device)
    key_mask = None
    if with_mask:
        key_mask = torch.ones(b, s, dtype=torch.bool)
        key_mask[1, j0 + 4 :] = False
        key_mask[0, j0 + 1] = False
        key_mask = key_mask.to(device)
    m_ref, l_ref = row_stats(sc, i0, j0, causal, key_mask, use_triton=False)
    m, l = row_stats(sc, i0, j0, causal, key_mask, use_triton=True)
    torch.testing.assert_close(m, m_ref, equal_nan=True)
    torch.testing.assert_close(l, l_ref, rtol=1e-5, atol=0, equal_nan=True)
    p_ref = probs_(sc.clone(), m_ref, l_ref, i0, j0, causal, key_mask, use_triton=False)
    p = probs_(sc.clone(), m, l, i0, j0, causal, key_mask, use_triton=True)
    torch.testing.assert_close(p, p_ref, rtol=1e-5, atol=1e-7, equal_nan=True)


def test_probabilities_of_one_chunk_are_the_softmax(device: str) -> None:
    sc = _chunk(3, 5, 9, 1).to(device)
    m, l = row_stats(sc, 0, 0, False, None, use_triton=True)
    p = probs_(sc.clone(), m, l, 0, 0, False, None, use_triton=True)
    torch.testing.assert_close(p, torch.softmax(sc, dim=-1), rtol=1e-5, atol=1e-7)


def test_a_row_with_every_key_masked_gives_nan_like_the_reference(device: str) -> None:
    sc = _chunk(1, 2, 4, 2).to(device)
    key_mask = torch.zeros(1, 4, dtype=torch.bool, device=device)
    m, l = row_stats(sc, 0, 0, False, key_mask, use_triton=True)
    assert torch.isinf(m).all() and (l == 0).all()
    p = probs_(sc.clone(), m, l, 0, 0, False, key_mask, use_triton=True)
    ref = torch.softmax(sc.masked_fill(~key_mask[:, None, :], float("-inf")), dim=-1)
    assert torch.isnan(p).all() and torch.isnan(ref).all()
