"""LayerNorm with its residual add: torch ops, or the fused Triton kernel
(``kernels.layernorm``: add, row zeroing and LayerNorm in one pass)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from autotune.backends.base import NormBackend, register
from autotune.core.reference import LAYERNORM_EPS


@register
class TorchNorm(NormBackend):
    value = "torch"

    def add_norm(
        self,
        x: Tensor,
        delta: Tensor,
        weight: Tensor,
        bias: Tensor,
        mask: Tensor | None = None,
        zero_sum_rows: bool = False,
        zero_out_rows: bool = False,
    ) -> tuple[Tensor, Tensor]:
        keep = None if mask is None else ~mask.unsqueeze(-1)
        x = x + delta
        if zero_sum_rows and keep is not None:
            x = x.masked_fill(keep, 0.0)
        h = F.layer_norm(x, (x.shape[-1],), weight, bias, LAYERNORM_EPS)
        if zero_out_rows and keep is not None:
            h = h.masked_fill(keep, 0.0)
        return x, h


@register
class TritonNorm(NormBackend):
    value = "triton"
    rank = 1
    needs = "CUDA with triton, or TRITON_INTERPRET=1 on the CPU"
    triton = True

    def add_norm(
        self,
        x: Tensor,
        delta: Tensor,
        weight: Tensor,
        bias: Tensor,
        mask: Tensor | None = None,
        zero_sum_rows: bool = False,
        zero_out_rows: bool = False,
    ) -> tuple[Tensor, Tensor]:
        from kernels.layernorm import add_layernorm

        zeroing = mask is not None and (zero_sum_rows or zero_out_rows)
        return add_layernorm(
            x,
            delta,
            weight,
            bias,
            eps=LAYERNORM_EPS,
            row_mask=mask.reshape(-1) if zeroing and mask is not None else None,
            zero_sum_rows=zeroing and zero_sum_rows,
            zero_out_rows=zeroing and zero_out_rows,
        )
