"""Whole layers: the per-layer path of ``autotune.build`` (unfused), or the fused block
(``kernels.block``: each pre-norm layer in two Triton launches, the final norm fused into
the last; any token mask applied on the device, so no call reads it on the host)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from autotune.backends.base import BlockBackend, register
from autotune.backends.precision import triton_precision
from autotune.core.device import DeviceInfo
from autotune.core.reference import TransformerConfig


@register
class Unfused(BlockBackend):
    value = False


@register
class FusedBlock(BlockBackend):
    value = True
    rank = 1
    needs = "CUDA with triton (or TRITON_INTERPRET=1), S, d_model, FFN <= 256"
    triton = True
    fused = True

    def kernel_reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        from kernels import block as fused

        reasons = []
        if plan.gemm_precision != plan.attn_precision:
            reasons.append(
                "fused_block runs every product at one operand precision: set gemm_precision "
                f"= attn_precision ({plan.attn_precision}), got {plan.gemm_precision}"
            )
        if plan.row_qkv_stages:
            reasons.append(
                f"row_qkv_stages={plan.row_qkv_stages} sets the QKV rows kernel's stages, a "
                "kernel of fused_layer=rows; fused_block runs the layer in its own kernels"
            )
        if plan.attn_head_chunk:
            reasons.append(
                f"attn_head_chunk={plan.attn_head_chunk} picks the one-tile form of the "
                "per-layer Triton attention; fused_block runs the attention inside its own kernel"
            )
        if plan.attn_maxnreg:
            reasons.append(
                f"attn_maxnreg={plan.attn_maxnreg} caps the flash attention kernel; "
                "fused_block runs the attention inside its own kernel"
            )
        if plan.attn_gluon_flash:
            reasons.append(
                "attn_gluon_flash=True replaces the per-layer flash attention kernel; "
                "fused_block runs the attention inside its own kernel"
            )
        return reasons + fused.not_supported_reasons(
            seq_len=config.seq_len,
            d_model=config.d_model,
            num_heads=config.num_heads,
            ffn_dim=config.ffn_dim,
            block_m=plan.attn_block_m,
            num_warps=plan.attn_warps,
            num_stages=plan.attn_stages,
            precision=triton_precision(plan.attn_precision),
            device_type=device.type,
            capability=device.capability,
            smem_bytes=device.smem_per_block or None,
        )

    def prepare(self, model: Any) -> Any:
        from kernels.block import weights_from_model

        return weights_from_model(model)

    def forward(
        self,
        prepared: Any,
        x: Tensor,
        mask: Tensor | None,
        plan: Any,
        config: Any,
        out: Tensor | None = None,
    ) -> Tensor:
        from kernels.block import fused_forward

        layers, final = prepared
        return fused_forward(
            x.contiguous(),
            layers,
            final,
            num_heads=config.num_heads,
            causal=config.causal,
            key_mask=mask,
            precision=triton_precision(plan.attn_precision),
            block_m=plan.attn_block_m,
            num_warps=plan.attn_warps,
            num_stages=plan.attn_stages,
            out=out,
        )
