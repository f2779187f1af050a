"""The streamed exact oracle: the reference's arithmetic with a bounded working set.

fp32 scores and softmax, matmuls under the same flags as the reference (TF32 on CUDA
under the official settings), computed batch slice by batch slice and, inside attention,
query chunk by key chunk, so nothing quadratic in the sequence is ever stored. Softmax
keeps its definition (subtract the row maximum, exponentiate, divide by the row sum); only
the order of the sums differs from the dense reference, so the oracle agrees with it far
inside the correctness rule wherever both run, and it judges shapes (case 14) that the
dense reference cannot run. The input and output stay where the caller put them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from autotune.reference import LAYERNORM_EPS, ReferenceTransformer, TransformerConfig


def streamed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    key_mask: Tensor | None,
    scale: float,
    query_chunk: int,
    key_chunk: int,
) -> Tensor:
    """softmax((q k^T) * scale + masks) v for q, k, v [b, H, S, hd], chunked.

    Pass 1 finds each row's maximum and the sum of exp(score - max) (rescaled online
    across key chunks); pass 2 recomputes the scores and accumulates p @ v. Scores are
    never held for more than ``query_chunk x key_chunk`` at a time.
    """
    s = q.shape[-2]
    out = torch.empty_like(q)
    neg_inf = float("-inf")
    for i0 in range(0, s, query_chunk):
        i1 = min(s, i0 + query_chunk)
        qi = q[:, :, i0:i1]
        kend = i1 if causal else s

        def scores(j0: int, j1: int, qi: Tensor = qi, i0: int = i0, i1: int = i1) -> Tensor:
            sc = torch.matmul(qi, k[:, :, j0:j1].transpose(-2, -1)) * scale
            sc = sc.float()
            if causal and j1 > i0:
                rows = torch.arange(i0, i1, device=q.device)[:, None]
                cols = torch.arange(j0, j1, device=q.device)[None, :]
                sc = sc.masked_fill(cols > rows, neg_inf)
            if key_mask is not None:
                sc = sc.masked_fill(~key_mask[:, None, None, j0:j1], neg_inf)
            return sc

        m = torch.full(qi.shape[:-1], neg_inf, device=q.device, dtype=torch.float32)
        l = torch.zeros_like(m)
        for j0 in range(0, kend, key_chunk):
            sc = scores(j0, min(kend, j0 + key_chunk))
            m_new = torch.maximum(m, sc.amax(dim=-1))
            shift = torch.where(m_new == neg_inf, 0.0, m_new)  # a row still all -inf
            l = l * torch.exp(m - shift) + torch.exp(sc - shift[..., None]).sum(dim=-1)
            m = m_new
        acc = torch.zeros(qi.shape, device=q.device, dtype=torch.float32)
        for j0 in range(0, kend, key_chunk):
            j1 = min(kend, j0 + key_chunk)
            p = torch.exp(scores(j0, j1) - m[..., None]) / l[..., None]
            acc = acc + torch.matmul(p.to(q.dtype), v[:, :, j0:j1]).float()
        out[:, :, i0:i1] = acc.to(q.dtype)
    return out


class StreamedOracle(ReferenceTransformer):
    """The reference model (same parameters) evaluated with a bounded working set."""

    def __init__(
        self,
        config: TransformerConfig,
        *,
        batch_chunk: int = 1,
        query_chunk: int = 1024,
        key_chunk: int = 4096,
    ) -> None:
        super().__init__(config)
        for name, value in (
            ("batch_chunk", batch_chunk),
            ("query_chunk", query_chunk),
            ("key_chunk", key_chunk),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.batch_chunk = batch_chunk
        self.query_chunk = query_chunk
        self.key_chunk = key_chunk

    def forward(self, x: Tensor, valid_token_mask: Tensor | None = None) -> Tensor:
        out = torch.empty_like(x)
        for b0 in range(0, x.shape[0], self.batch_chunk):
            b1 = min(x.shape[0], b0 + self.batch_chunk)
            mask = valid_token_mask[b0:b1] if valid_token_mask is not None else None
            out[b0:b1] = self._forward_slice(x[b0:b1], mask)
        return out

    def _forward_slice(self, x: Tensor, mask: Tensor | None) -> Tensor:
        c = self.config
        keep = None if mask is None else mask[..., None]
        for layer in self.layers:
            h = layer.norm1(x)
            att = layer.attention
            b, s, d = h.shape

            def heads(t: Tensor, b: int = b, s: int = s) -> Tensor:
                return t.view(b, s, c.num_heads, c.head_dim).transpose(1, 2).contiguous()

            q, k, v = heads(att.q_proj(h)), heads(att.k_proj(h)), heads(att.v_proj(h))
            del h
            ctx = streamed_attention(
                q,
                k,
                v,
                causal=c.causal,
                key_mask=mask,
                scale=c.head_dim**-0.5,
                query_chunk=self.query_chunk,
                key_chunk=self.key_chunk,
            )
            del q, k, v
            a = att.out_proj(ctx.transpose(1, 2).contiguous().view(b, s, d))
            del ctx
            if keep is not None:
                a = a.masked_fill(~keep, 0.0)
            x = x + a
            del a
            x = x + layer.ffn_out(F.gelu(layer.ffn_in(layer.norm2(x))))
            if keep is not None:
                x = x.masked_fill(~keep, 0.0)
        x = F.layer_norm(
            x, (c.d_model,), self.final_norm.weight, self.final_norm.bias, LAYERNORM_EPS
        )
        if keep is not None:
            x = x.masked_fill(~keep, 0.0)
        return x
