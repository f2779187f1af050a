"""The project's fused Triton attention (``kernels.attention``): online softmax, scores
never stored; right padding as key lengths, a general mask takes the reference path."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from autotune.backends.base import MASK_RIGHT_PADDED, AttentionBackend, AttentionCall, register
from autotune.backends.precision import triton_precision
from autotune.core.device import DeviceInfo
from autotune.core.reference import TransformerConfig


def tiles(plan: Any) -> Any:
    """The plan's attention tiles (``attn_block_m/n``, ``attn_warps``, ``attn_stages``)."""
    from kernels._common import Tiles

    return Tiles(plan.attn_block_m, plan.attn_block_n, plan.attn_warps, plan.attn_stages)


def attention_kernel_reasons(
    plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
) -> list[str]:
    from kernels import attention as tri_attn

    return tri_attn.not_supported_reasons(
        head_dim=config.head_dim,
        seq_len=config.seq_len,
        **tiles(plan).kwargs(),
        precision=triton_precision(plan.attn_precision),
        device_type=device.type,
        capability=device.capability,
        smem_bytes=device.smem_per_block or None,
        prune_pointless=prune,
    )


@register
class TritonAttention(AttentionBackend):
    value = "triton"
    rank = 5
    needs = "CUDA with triton, or TRITON_INTERPRET=1 on the CPU"
    triton = True
    general_masks = False

    def kernel_reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        return attention_kernel_reasons(plan, config, device, prune=prune)

    def attend(self, call: AttentionCall) -> Tensor:
        from kernels.attention import attention

        c = call.config
        b, s, d = call.q.shape
        shape = (b, s, c.num_heads, c.head_dim)
        lengths = None
        # Causal + right padding: valid rows never see a padded key, so the key mask is a
        # no-op there; non-causal right padding is a key-length bound.
        if call.mask is not None and not (c.causal and call.kind == MASK_RIGHT_PADDED):
            lengths = call.mask.sum(dim=1, dtype=torch.int32)
        out = torch.empty(b, s, d, device=call.q.device, dtype=torch.float32)
        attention(
            call.q.view(shape),
            call.k.view(shape),
            call.v.view(shape),
            causal=c.causal,
            key_lengths=lengths,
            out=out.view(shape),
            **tiles(call.plan).kwargs(),
            precision=triton_precision(call.plan.attn_precision),
        )
        return out
