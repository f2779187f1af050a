"""LayerNorm with its residual add: torch ops, or the fused Triton kernel
(``kernels.layernorm``: add, row zeroing and LayerNorm in one pass)."""

from __future__ import annotations

import torch
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
        delta: Tensor | None,
        weight: Tensor,
        bias: Tensor,
        rows: Tensor | None = None,
        zero_out: bool = False,
        out_dtype: torch.dtype = torch.float32,
        out: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        padded = None if rows is None else ~rows.unsqueeze(-1)
        if delta is not None:
            x = x + delta.float()
        if padded is not None:
            x = x.masked_fill(padded, 0.0)
        h = F.layer_norm(x, (x.shape[-1],), weight, bias, LAYERNORM_EPS)
        if zero_out and padded is not None:
            h = h.masked_fill(padded, 0.0)
        if out is not None:
            return x, out.copy_(h)
        return x, h.to(out_dtype)


@register
class TritonNorm(NormBackend):
    value = "triton"
    rank = 1
    needs = "CUDA with triton, or TRITON_INTERPRET=1 on the CPU"
    triton = True
    half_io = True

    def add_norm(
        self,
        x: Tensor,
        delta: Tensor | None,
        weight: Tensor,
        bias: Tensor,
        rows: Tensor | None = None,
        zero_out: bool = False,
        out_dtype: torch.dtype = torch.float32,
        out: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        from kernels.layernorm import add_layernorm

        return add_layernorm(
            x,
            delta,
            weight,
            bias,
            eps=LAYERNORM_EPS,
            row_mask=None if rows is None else rows.reshape(-1),
            zero_sum_rows=rows is not None,
            zero_out_rows=rows is not None and zero_out,
            out_dtype=out_dtype,
            keep_sum=out is None,  # the last LayerNorm's sum: read by nothing after it
            out=out,
        )
