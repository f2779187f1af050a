"""The project's fused Triton attention (``kernels.attention``): online softmax, scores
never stored; any key mask applied on the device, so no call inspects the mask on the
host (no sync), whatever ``mask`` says."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from autotune.backends.base import AttentionBackend, AttentionCall, register
from autotune.backends.precision import context_dtype, half_qkv, triton_precision
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

    if plan.attn_gluon_flash:
        return gluon_flash_reasons(plan, config, device)
    return tri_attn.not_supported_reasons(
        head_dim=config.head_dim,
        seq_len=config.seq_len,
        **tiles(plan).kwargs(),
        precision=triton_precision(plan.attn_precision),
        device_type=device.type,
        capability=device.capability,
        smem_bytes=device.smem_per_block or None,
        prune_pointless=prune,
        head_chunk=plan.attn_head_chunk,
        half_inputs=half_qkv(plan),
    )


def gluon_flash_reasons(plan: Any, config: TransformerConfig, device: DeviceInfo) -> list[str]:
    """Why ``attn_gluon_flash`` cannot run this plan here (``kernels.gluon_flash``: Hopper
    only, fp16 operands and context; its own tiles)."""
    from kernels import attention as tri_attn

    reasons = [
        f"attn_gluon_flash: {why}"
        for why in tri_attn.gluon_reasons(
            head_dim=config.head_dim,
            block_n=plan.attn_block_n,
            num_warps=plan.attn_warps,
            num_stages=plan.attn_stages,
            precision=triton_precision(plan.attn_precision),
            head_chunk=plan.attn_head_chunk,
        )
    ]
    if context_dtype(plan) != torch.float16:
        reasons.append(
            "attn_gluon_flash writes an fp16 context: set gemm_precision=fp16 (got "
            f"{plan.gemm_precision})"
        )
    if device.type != "cuda":
        reasons.append(
            "attn_gluon_flash runs on a CUDA device of compute capability 9.x (Gluon has no "
            "interpreter); leave it False here"
        )
    elif device.capability is not None and device.capability[0] != 9:
        reasons.append(f"attn_gluon_flash is built for Hopper (sm_90: wgmma); this is {device.sm}")
    return reasons


@register
class TritonAttention(AttentionBackend):
    value = "triton"
    rank = 5
    needs = "CUDA with triton, or TRITON_INTERPRET=1 on the CPU"
    triton = True

    def needs_mask_kind(self, plan: Any) -> bool:
        return False

    def kernel_reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        if plan.fused_layer == "heads" and plan.attn_gluon:
            # the Gluon heads attention replaces this kernel and takes none of its tiles (its
            # own rules: kernels.gluon_heads.gluon_heads_problems, through the layer)
            return []
        return attention_kernel_reasons(plan, config, device, prune=prune)

    def attend(self, call: AttentionCall) -> Tensor:
        from kernels.attention import attention, key_mask_bounds

        c = call.config
        # mask_bounds: one small launch finds each sequence's all-valid key prefix and last
        # valid key; key blocks inside the prefix skip the mask, blocks past the end are
        # skipped (an all-True mask then costs what no mask costs). Same result.
        bounds = (
            key_mask_bounds(call.mask) if call.plan.mask_bounds and call.mask is not None else None
        )
        b, s, d = call.q.shape
        shape = (b, s, c.num_heads, c.head_dim)
        out = torch.empty(b, s, d, device=call.q.device, dtype=context_dtype(call.plan))
        attention(
            call.q.view(shape),
            call.k.view(shape),
            call.v.view(shape),
            causal=c.causal,
            key_mask=call.mask,  # exact for every mask; None: no mask
            key_bounds=bounds,
            out=out.view(shape),
            **tiles(call.plan).kwargs(),
            precision=triton_precision(call.plan.attn_precision),
            maxnreg=call.plan.attn_maxnreg,
            head_chunk=call.plan.attn_head_chunk,
            gluon=call.plan.attn_gluon_flash,
        )
        return out
