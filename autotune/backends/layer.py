"""Fused layers for any batch size (``kernels.layer``, knob ``fused_layer``): ``heads``
runs a layer in two launches (LayerNorm1, the head's projections and attention per
(query block, head, sequence); then the output projection, LayerNorm2, FFN and residuals
per block of rows), ``rows`` in three (LayerNorm1 and QKV per block of rows, the flash
attention, the same post-rows kernel; two with ``row_attn_post``, the attention and the
post-rows work in one kernel) for sequences of any length, ``seq`` in one (a
block of query rows of one sequence per program, every head, the output projection and
the FFN; S and d_model <= 128). Any token mask is applied on the device: no call reads it
on the host."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from autotune.backends.base import BlockBackend, register
from autotune.backends.precision import triton_precision
from autotune.core.device import DeviceInfo
from autotune.core.reference import TransformerConfig


class FusedLayerFamily(BlockBackend):
    knob = "fused_layer"


@register
class NoFusedLayer(FusedLayerFamily):
    value = "none"

    def reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        reasons = []
        if plan.mask_bounds and plan.attention != "triton":
            reasons.append(
                "mask_bounds=True applies to the project's Triton attention (attention=triton, "
                f"per layer or in fused_layer=rows); got attention={plan.attention}"
            )
        if plan.row_stage:
            reasons.append(
                "row_stage=True applies to the post-attention rows kernel of "
                "fused_layer=heads or rows; got fused_layer=none"
            )
        if plan.row_maxnreg:
            reasons.append(
                f"row_maxnreg={plan.row_maxnreg} caps the registers of the row kernels of "
                "fused_layer=heads or rows; got fused_layer=none"
            )
        if plan.row_qkv_stages:
            reasons.append(
                f"row_qkv_stages={plan.row_qkv_stages} sets the QKV rows kernel's stages, a "
                "kernel of fused_layer=rows; got fused_layer=none"
            )
        if plan.row_fold_residual:
            reasons.append(
                "row_fold_residual=True applies to the post-attention rows kernel of "
                "fused_layer=heads or rows; got fused_layer=none"
            )
        if plan.attn_maxnreg and plan.attention != "triton":
            reasons.append(
                f"attn_maxnreg={plan.attn_maxnreg} caps the registers of the project's Triton "
                f"attention (attention=triton); got attention={plan.attention}"
            )
        if plan.attn_head_chunk and plan.attention != "triton":
            reasons.append(
                f"attn_head_chunk={plan.attn_head_chunk} picks the one-tile form of the "
                f"project's Triton attention (attention=triton); got attention={plan.attention}"
            )
        if plan.attn_gluon_flash and plan.attention != "triton":
            reasons.append(
                "attn_gluon_flash=True replaces the project's Triton flash attention "
                f"(attention=triton); got attention={plan.attention}"
            )
        if plan.row_ffn_block:
            reasons.append(
                f"row_ffn_block={plan.row_ffn_block} applies to the fused layers "
                "(fused_layer=heads, rows or seq); got fused_layer=none"
            )
        if plan.ffn_gelu != "erf":
            reasons.append(
                f"ffn_gelu={plan.ffn_gelu} applies to the fused layers' FFN (fused_layer=heads, "
                "rows or seq); got fused_layer=none"
            )
        if plan.row_attn_post:
            reasons.append(
                "row_attn_post=True fuses the attention and post-attention rows of "
                "fused_layer=rows; got fused_layer=none"
            )
        if plan.row_next_qkv:
            reasons.append(
                "row_next_qkv=True chains the post-attention rows and the next layer's QKV "
                "of fused_layer=rows; got fused_layer=none"
            )
        if plan.row_next_norm:
            reasons.append(
                "row_next_norm=True chains the post-attention rows and the next layer's "
                "LayerNorm1 of fused_layer=heads; got fused_layer=none"
            )
        if plan.row_gluon:
            reasons.append(
                "row_gluon=True replaces the post-attention rows kernel of fused_layer=heads or "
                "rows; got fused_layer=none"
            )
        if plan.attn_gluon:
            reasons.append(
                f"attn_gluon={plan.attn_gluon} replaces the heads attention kernel of "
                "fused_layer=heads; got fused_layer=none"
            )
        if plan.pdl:
            reasons.append(
                "pdl=True launches the kernels of fused_layer=heads or rows with programmatic "
                "dependent launch; got fused_layer=none"
            )
        if plan.one_launch:
            reasons.append(
                "one_launch=True runs the kernels of fused_layer=heads (with row_next_norm) "
                "in one launch; got fused_layer=none"
            )
        if plan.weights_first:
            reasons.append(
                "weights_first=True loads the weights early in the kernels of "
                "fused_layer=heads; got fused_layer=none"
            )
        return reasons + _trigger_reasons(plan)


def _trigger_reasons(plan: Any) -> list[str]:
    if plan.pdl_trigger != "start" and not plan.pdl:
        return [
            f"pdl_trigger={plan.pdl_trigger} places the launch trigger of pdl=True; got "
            "pdl=False (set pdl=True, or leave pdl_trigger=start)"
        ]
    return []


def tiling(plan: Any) -> Any:
    """The plan's launch settings: attention tiles and the row kernels' block and warps."""
    from kernels.layer import Tiling

    return Tiling(
        block_m=plan.attn_block_m,
        block_n=plan.attn_block_n,
        num_warps=plan.attn_warps,
        num_stages=plan.attn_stages,
        row_block=plan.row_block,
        row_warps=plan.row_warps,
        mask_bounds=plan.mask_bounds,
        stage_residual=plan.row_stage,
        fold_residual=plan.row_fold_residual,
        ffn_block=plan.row_ffn_block,
        gelu_poly=plan.ffn_gelu == "poly",
        row_maxnreg=plan.row_maxnreg,
        qkv_stages=plan.row_qkv_stages,
        attn_maxnreg=plan.attn_maxnreg,
        attn_head_chunk=plan.attn_head_chunk,
        gluon_flash=plan.attn_gluon_flash,
        attn_post=plan.row_attn_post,
        next_qkv=plan.row_next_qkv,
        next_norm=plan.row_next_norm,
        gluon_post=plan.row_gluon,
        gluon_heads=plan.attn_gluon,
        pdl=plan.pdl,
        # pdl_trigger without pdl is refused by the support rules (_trigger_reasons).
        pdl_trigger=plan.pdl_trigger if plan.pdl else "start",
        one_launch=plan.one_launch,
        weights_first=plan.weights_first,
    )


class _FusedLayer(FusedLayerFamily):
    rank = 1
    triton = True
    fused = True

    def reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        reasons = []
        if plan.fused_block:
            reasons.append(
                f"fused_layer={self.value} and fused_block=True both run whole layers; pick one"
            )
        if plan.attention != "triton":
            reasons.append(
                f"fused_layer={self.value} runs the project's Triton attention: set "
                f"attention=triton (its tiles and attn_precision apply), got {plan.attention}"
            )
        if plan.mask_bounds and self.value != "rows":
            reasons.append(
                f"mask_bounds=True applies to the flash attention of fused_layer=rows; "
                f"fused_layer={self.value} reads each key's mask byte in its own kernel"
            )
        if plan.row_attn_post and self.value != "rows":
            reasons.append(
                "row_attn_post=True fuses the attention and post-attention rows of "
                f"fused_layer=rows; fused_layer={self.value} has no separate attention kernel"
            )
        if plan.row_next_qkv and (self.value != "rows" or plan.row_attn_post):
            reasons.append(
                "row_next_qkv=True chains the post-attention rows kernel and the next layer's "
                "QKV of fused_layer=rows without row_attn_post; got "
                f"fused_layer={self.value}, row_attn_post={plan.row_attn_post}"
            )
        if plan.row_gluon and (self.value == "seq" or plan.row_attn_post):
            reasons.append(
                "row_gluon=True replaces the post-attention rows kernel of fused_layer=heads or "
                f"rows without row_attn_post; got fused_layer={self.value}, "
                f"row_attn_post={plan.row_attn_post}"
            )
        if plan.attn_gluon and self.value != "heads":
            reasons.append(
                f"attn_gluon={plan.attn_gluon} replaces the heads attention kernel of "
                f"fused_layer=heads; got fused_layer={self.value}"
            )
        if plan.row_next_norm and self.value != "heads":
            reasons.append(
                "row_next_norm=True chains the post-attention rows kernel and the next "
                "layer's LayerNorm1 of fused_layer=heads (rows chains the QKV itself: "
                f"row_next_qkv); got fused_layer={self.value}"
            )
        if plan.pdl and (self.value == "seq" or plan.row_attn_post):
            reasons.append(
                "pdl=True applies to fused_layer=heads or rows without row_attn_post; got "
                f"fused_layer={self.value}, row_attn_post={plan.row_attn_post}"
            )
        reasons += _trigger_reasons(plan)
        if plan.row_stage and self.value == "seq":
            reasons.append(
                "row_stage=True applies to the post-attention rows kernel of fused_layer=heads "
                "or rows; fused_layer=seq runs the whole layer in one kernel"
            )
        if plan.row_maxnreg and (self.value == "seq" or plan.row_attn_post):
            reasons.append(
                f"row_maxnreg={plan.row_maxnreg} caps the registers of the separate QKV rows "
                "and post rows kernels of fused_layer=heads or rows without row_attn_post; got "
                f"fused_layer={self.value}, row_attn_post={plan.row_attn_post}"
            )
        if plan.attn_maxnreg and (self.value != "rows" or plan.row_attn_post):
            reasons.append(
                f"attn_maxnreg={plan.attn_maxnreg} caps the flash attention kernel of "
                "fused_layer=rows without row_attn_post (heads and seq fuse the attention into "
                f"their own kernels); got fused_layer={self.value}, "
                f"row_attn_post={plan.row_attn_post}"
            )
        if plan.attn_head_chunk and (self.value != "rows" or plan.row_attn_post):
            reasons.append(
                f"attn_head_chunk={plan.attn_head_chunk} picks the one-tile form of the flash "
                "attention kernel, per layer or of fused_layer=rows without row_attn_post "
                "(heads and seq fuse the attention into their own kernels); got "
                f"fused_layer={self.value}, row_attn_post={plan.row_attn_post}"
            )
        if plan.attn_gluon_flash and (self.value != "rows" or plan.row_attn_post):
            reasons.append(
                "attn_gluon_flash=True replaces the flash attention kernel, per layer or of "
                "fused_layer=rows without row_attn_post (heads and seq fuse the attention into "
                f"their own kernels); got fused_layer={self.value}, "
                f"row_attn_post={plan.row_attn_post}"
            )
        if plan.row_qkv_stages and self.value != "rows":
            reasons.append(
                f"row_qkv_stages={plan.row_qkv_stages} sets the QKV rows kernel's stages, a "
                f"kernel of fused_layer=rows only; got fused_layer={self.value}"
            )
        if plan.row_fold_residual and (self.value == "seq" or plan.row_attn_post):
            reasons.append(
                "row_fold_residual=True applies to the post-attention rows kernel of "
                "fused_layer=heads or rows without row_attn_post; got "
                f"fused_layer={self.value}, row_attn_post={plan.row_attn_post}"
            )
        for knob in ("compile", "batch_chunk", "host_io", "query_chunk"):
            if getattr(plan, knob) not in ("none", 0, False):
                reasons.append(
                    f"fused_layer={self.value} takes the whole batch on the device with no "
                    f"torch.compile: {knob}={getattr(plan, knob)!r} does not apply"
                )
        return reasons

    def kernel_reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        from kernels import layer

        return layer.not_supported_reasons(
            variant=self.value,
            seq_len=config.seq_len,
            d_model=config.d_model,
            num_heads=config.num_heads,
            ffn_dim=config.ffn_dim,
            tiling=tiling(plan),
            gemm_precision=triton_precision(plan.gemm_precision),
            attn_precision=triton_precision(plan.attn_precision),
            device_type=device.type,
            capability=device.capability,
            smem_bytes=device.smem_per_block or None,
            prune_pointless=prune,
        )

    def prepare(self, model: Any) -> Any:
        from kernels.block import weights_from_model
        from kernels.layer import prepare_layer_weights

        layers, final = weights_from_model(model)
        precision = triton_precision(model.plan.gemm_precision)
        prepared = [prepare_layer_weights(w, precision) for w in layers]
        if model.plan.one_launch:  # the [L, ...] copies the one launch reads, made once
            from kernels.stack import stack_layers

            return stack_layers(prepared), final
        return prepared, final

    def forward(
        self,
        prepared: Any,
        x: Tensor,
        mask: Tensor | None,
        plan: Any,
        config: Any,
        out: Tensor | None = None,
    ) -> Tensor:
        from kernels.layer import layer_stack

        layers, final = prepared
        if plan.one_launch:
            from kernels.stack import stack_forward

            return stack_forward(
                x.contiguous(),
                layers,
                final,
                num_heads=config.num_heads,
                causal=config.causal,
                key_mask=mask,
                tiling=tiling(plan),
                gemm_precision=triton_precision(plan.gemm_precision),
                attn_precision=triton_precision(plan.attn_precision),
                out=out,
            )
        return layer_stack(
            x.contiguous(),
            layers,
            final,
            num_heads=config.num_heads,
            causal=config.causal,
            key_mask=mask,
            variant=self.value,
            tiling=tiling(plan),
            gemm_precision=triton_precision(plan.gemm_precision),
            attn_precision=triton_precision(plan.attn_precision),
            out=out,
        )


@register
class HeadsLayer(_FusedLayer):
    value = "heads"
    needs = "CUDA with triton (or TRITON_INTERPRET=1), S <= 256, d_model <= 256, head_dim 8-128"


@register
class RowsLayer(_FusedLayer):
    value = "rows"
    rank = 2
    needs = "CUDA with triton (or TRITON_INTERPRET=1), d_model <= 256"


@register
class SeqLayer(_FusedLayer):
    value = "seq"
    rank = 3
    needs = "CUDA with triton (or TRITON_INTERPRET=1), S <= 128, d_model <= 128, head_dim 8-128"
