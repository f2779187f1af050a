"""Attention in PyTorch: the reference's arithmetic (optionally in query-prefix chunks)
and ``scaled_dot_product_attention`` with each of its backends, or PyTorch's own pick."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from autotune.backends.base import (
    MASK_RIGHT_PADDED,
    AttentionBackend,
    AttentionCall,
    register,
)
from autotune.backends.precision import DTYPES, context_dtype, matmul_precision, operand_bytes
from autotune.core.device import DeviceInfo
from autotune.core.reference import TransformerConfig


class TorchAttention(AttentionBackend):
    """Heads split (contiguous copies or strided views), operands cast to the attention
    precision, the key mask dropped where it is proven a no-op; ``core`` does the rest."""

    def attend(self, call: AttentionCall) -> Tensor:
        c, plan = call.config, call.plan
        b, s, d = call.q.shape

        def heads(t: Tensor) -> Tensor:
            t = t.view(b, s, c.num_heads, c.head_dim).transpose(1, 2)
            return t.contiguous() if plan.heads == "contiguous" else t

        q, k, v = heads(call.q), heads(call.k), heads(call.v)
        prec = plan.attn_precision
        if prec in DTYPES:
            q, k, v = q.to(DTYPES[prec]), k.to(DTYPES[prec]), v.to(DTYPES[prec])
        # The key mask is needed unless it was proven a no-op: all-True (no mask reaches
        # here), or causal with right padding (valid rows only see valid keys; padded rows
        # are zeroed after out_proj).
        mask = call.mask
        if mask is not None and c.causal and call.kind == MASK_RIGHT_PADDED:
            mask = None
        with matmul_precision(prec):
            ctx = self.core(q, k, v, mask, c, plan)
        # In the output projection's operand type: an fp16 context with fp16 GEMMs goes in
        # as it is (it went through fp32 and back before: two passes over the context, the
        # same bits; case 14's exact route, about 5 GB a chunk and layer).
        return ctx.transpose(1, 2).reshape(b, s, d).to(context_dtype(plan))

    def core(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, config: Any, plan: Any
    ) -> Tensor:
        raise NotImplementedError


@register
class ReferenceAttention(TorchAttention):
    """The reference's arithmetic; materialises the scores."""

    value = "reference"
    needs = "any device"
    takes_query_chunk = True

    def core(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, config: Any, plan: Any
    ) -> Tensor:
        return reference_attention(
            q, k, v, key_mask, config.causal, config.head_dim**-0.5, plan.query_chunk
        )

    def workspace_bytes(self, plan: Any, config: TransformerConfig, batch: int) -> int:
        return dense_scores_bytes(plan, config, batch)


def dense_scores_bytes(plan: Any, config: TransformerConfig, batch: int) -> int:
    """Scores, masked scores and probabilities of ``batch`` sequences (one query chunk)."""
    s = config.seq_len
    rows = plan.query_chunk if 0 < plan.query_chunk < s else s
    return 3 * batch * config.num_heads * rows * s * max(operand_bytes(plan.attn_precision), 4)


def reference_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_mask: Tensor | None,
    causal: bool,
    scale: float,
    query_chunk: int = 0,
) -> Tensor:
    """The reference's attention arithmetic; with ``query_chunk`` the query rows go in
    prefix chunks: rows [i0, i1) against keys [0, i1) when causal (the keys after i1 are
    masked for every row of the chunk anyway), so only one chunk's scores exist at once."""
    s = q.shape[-2]
    if 0 < query_chunk < s:
        parts = []
        for i0 in range(0, s, query_chunk):
            i1 = min(s, i0 + query_chunk)
            kend = i1 if causal else s
            parts.append(
                _attention_block(
                    q[..., i0:i1, :],
                    k[..., :kend, :],
                    v[..., :kend, :],
                    key_mask,
                    causal,
                    scale,
                    i0,
                )
            )
        return torch.cat(parts, dim=-2)
    return _attention_block(q, k, v, key_mask, causal, scale, 0)


def _attention_block(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool, scale: float, i0: int
) -> Tensor:
    rows, keys = q.shape[-2], k.shape[-2]
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        row = torch.arange(i0, i0 + rows, device=q.device)[:, None]
        col = torch.arange(keys, device=q.device)[None, :]
        scores = scores.masked_fill(col > row, float("-inf"))
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask[:, None, None, :keys], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)


class SdpaAttention(TorchAttention):
    """``F.scaled_dot_product_attention`` pinned to one backend (``sdpa_backend``), or
    PyTorch's own choice (None)."""

    sdpa_backend: ClassVar[str | None] = None

    def core(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, config: Any, plan: Any
    ) -> Tensor:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = self.sdpa_backend
        attn_mask = None
        is_causal = config.causal
        if key_mask is not None:
            attn_mask = key_mask[:, None, None, :]
            if config.causal:
                s = q.shape[-2]
                tril = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
                attn_mask = attn_mask & tril
            is_causal = False
            if backend == "FLASH_ATTENTION":
                # Flash takes no explicit mask: a general mask goes to a backend that does.
                backend = "EFFICIENT_ATTENTION" if q.is_cuda else "MATH"
        scale = config.head_dim**-0.5
        if backend is None:  # PyTorch's own choice: what a user swapping in SDPA gets
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale
            )
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale
            )

    def workspace_bytes(self, plan: Any, config: TransformerConfig, batch: int) -> int:
        s = config.seq_len
        lse = batch * config.num_heads * s * 4 * 2  # log-sum-exp and workspace
        return lse + (batch * s * s if plan.mask == "apply" else 0)  # bool [B,1,S,S] mask


@register
class SdpaMath(SdpaAttention):
    value = "sdpa_math"
    rank = 1
    needs = "any device"
    sdpa_backend = "MATH"

    def workspace_bytes(self, plan: Any, config: TransformerConfig, batch: int) -> int:
        return dense_scores_bytes(plan, config, batch)


@register
class SdpaEfficient(SdpaAttention):
    value = "sdpa_efficient"
    rank = 2
    sdpa_backend = "EFFICIENT_ATTENTION"
    needs = "CUDA"

    def reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        reasons = super().reasons(plan, config, device, prune=prune)
        if device.type != "cuda":
            reasons.append("attention=sdpa_efficient needs CUDA (the CPU has math and flash only)")
        elif config.head_dim > 256:
            reasons.append(f"attention=sdpa_efficient needs head_dim <= 256, got {config.head_dim}")
        return reasons


class HalfOnlySdpa(SdpaAttention):
    """Flash and cuDNN: fp16/bf16 operands on sm_80+, head_dim a multiple of 8 up to 256."""

    cpu_ok: ClassVar[bool] = False

    def reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        reasons = super().reasons(plan, config, device, prune=prune)
        att = self.value
        if device.type != "cuda":
            if not self.cpu_ok:
                reasons.append(f"attention={att} needs CUDA")
            return reasons
        if plan.attn_precision not in ("fp16", "bf16"):
            reasons.append(
                f"attention={att} on CUDA needs attn_precision fp16 or bf16, "
                f"got {plan.attn_precision}"
            )
        if (device.capability or (0, 0)) < (8, 0):
            reasons.append(f"attention={att} needs sm_80+, device is {device.sm}")
        if config.head_dim % 8 != 0 or config.head_dim > 256:
            reasons.append(
                f"attention={att} needs head_dim a multiple of 8 and <= 256, got {config.head_dim}"
            )
        return reasons


@register
class SdpaFlash(HalfOnlySdpa):
    value = "sdpa_flash"
    rank = 3
    sdpa_backend = "FLASH_ATTENTION"
    cpu_ok = True
    needs = "CUDA sm_80+ with fp16/bf16 attention precision (CPU: any precision)"


@register
class SdpaCudnn(HalfOnlySdpa):
    value = "sdpa_cudnn"
    rank = 4
    sdpa_backend = "CUDNN_ATTENTION"
    needs = "CUDA sm_80+ with fp16/bf16 attention precision"


@register
class SdpaAuto(SdpaAttention):
    value = "sdpa_auto"
    rank = 6
    needs = "any device (PyTorch picks the backend; the 'SDPA swap' anchor)"

    def workspace_bytes(self, plan: Any, config: TransformerConfig, batch: int) -> int:
        return 0
