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

    def inner(
        self, h: Tensor, weight: Tensor, bias: Tensor, gemm_precision: str, half: bool = False
    ) -> Tensor:
        out = F.gelu(linear(h, weight, bias, gemm_precision))
        return out.to(h.dtype) if half else out


@register
class TritonEpilogue(FfnBackend):
    value = "triton_epilogue"
    rank = 1
    needs = TRITON_NEEDS
    triton = True
    half_io = True

    def inner(
        self, h: Tensor, weight: Tensor, bias: Tensor, gemm_precision: str, half: bool = False
    ) -> Tensor:
        from kernels.ffn import bias_gelu

        # half: the GEMM's half output is read, and the GELU's written, as they are; a
        # half bias is upcast in the kernel (exactly), not by a cast kernel each call
        y = linear(h, weight, None, gemm_precision, keep_half=half)
        return bias_gelu(y, bias, inplace=True)


@register
class TritonGemm(FfnBackend):
    value = "triton_gemm"
    rank = 2
    needs = TRITON_NEEDS
    triton = True

    def inner(
        self, h: Tensor, weight: Tensor, bias: Tensor, gemm_precision: str, half: bool = False
    ) -> Tensor:
        from kernels.ffn import linear_gelu

        shape = h.shape
        out = linear_gelu(
            h.reshape(-1, shape[-1]), weight, bias, precision=triton_precision(gemm_precision)
        ).view(*shape[:-1], -1)
        return out.to(h.dtype) if half else out
