"""``ffn_in`` + exact GELU: torch ops, a Triton bias+GELU epilogue after a bias-free GEMM,
or a Triton GEMM with the GELU epilogue (``kernels.ffn``)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from autotune.backends.base import FfnBackend, register
from autotune.backends.precision import linear, triton_precision

TRITON_NEEDS = "CUDA with triton, or TRITON_INTERPRET=1 on the CPU"


@register
class TorchFfn(FfnBackend):
    value = "torch"

    def inner(self, h: Tensor, weight: Tensor, bias: Tensor, gemm_precision: str) -> Tensor:
        return F.gelu(linear(h, weight, bias, gemm_precision))


@register
class TritonEpilogue(FfnBackend):
    value = "triton_epilogue"
    rank = 1
    needs = TRITON_NEEDS
    triton = True

    def inner(self, h: Tensor, weight: Tensor, bias: Tensor, gemm_precision: str) -> Tensor:
        from kernels.ffn import bias_gelu

        return bias_gelu(linear(h, weight, None, gemm_precision), bias.float(), inplace=True)


@register
class TritonGemm(FfnBackend):
    value = "triton_gemm"
    rank = 2
    needs = TRITON_NEEDS
    triton = True

    def inner(self, h: Tensor, weight: Tensor, bias: Tensor, gemm_precision: str) -> Tensor:
        from kernels.ffn import linear_gelu

        shape = h.shape
        return linear_gelu(
            h.reshape(-1, shape[-1]), weight, bias, precision=triton_precision(gemm_precision)
        ).view(*shape[:-1], -1)
