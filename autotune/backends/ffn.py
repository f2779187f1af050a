"""``ffn_in`` + GELU: torch ops, a Triton bias+GELU epilogue after a bias-free GEMM, a
Triton GEMM with the GELU epilogue (``kernels.ffn``), all the exact GELU; or the BLAS
GEMM's own bias + GELU epilogue, the tanh form (``blas_tanh``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from autotune.backends.base import FfnBackend, register
from autotune.backends.precision import DTYPES, linear, matmul_precision, triton_precision

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


@register
class BlasTanhGelu(FfnBackend):
    """The GEMM's own epilogue adds the bias and applies GELU before the one store: on
    CUDA ``torch._addmm_activation(..., use_gelu=True)``, cuBLASLt's GELU_BIAS epilogue,
    one kernel and no GELU pass over memory (PyTorch runs ``gelu(approximate="tanh")``
    after the GEMM where cuBLASLt cannot take the shape). cuBLASLt's GELU is the tanh
    form, within 4.8e-4 of the exact GELU (at 2.7, a quarter of an fp16 step there): an
    approximation the correctness gate judges like any other. Off CUDA the same function,
    a GEMM and ``gelu(approximate="tanh")``, so a CPU run computes what the GPU does
    (aten's CPU ``_addmm_activation`` is the exact GELU)."""

    value = "blas_tanh"
    rank = 3
    half_io = True  # a half operand in, the half product rounded once out

    def inner(
        self, h: Tensor, weight: Tensor, bias: Tensor, gemm_precision: str, half: bool = False
    ) -> Tensor:
        dtype = DTYPES.get(gemm_precision)
        if not h.is_cuda:
            if dtype is None:
                return F.gelu(linear(h, weight, bias, gemm_precision), approximate="tanh")
            # as the epilogue computes it: half operands, fp32 sums, bias and GELU
            wide = F.linear(h.to(dtype).float(), weight.float(), bias.float())
            out = F.gelu(wide, approximate="tanh").to(dtype)
            return out if half else out.float()
        shape = h.shape
        x = h.reshape(-1, shape[-1])
        if dtype is not None:
            x = x.to(dtype)  # no-op for the half operand a half plan hands along
        with matmul_precision(gemm_precision):
            out = torch._addmm_activation(bias, x, weight.t(), use_gelu=True)
        out = out.view(*shape[:-1], -1)
        return out if dtype is None or half else out.float()
