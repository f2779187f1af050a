"""Operand precisions shared by the attention and GEMM kernels, and their jit helpers.

``ieee`` / ``tf32`` / ``tf32x3``: fp32 operands, ``tl.dot(..., input_precision=...)``.
``fp16`` / ``bf16``: fp32 values converted to that dtype inside the kernel after the load;
the dot accumulates in fp32.

Interpreter note: Triton 3.9's interpreter multiplies bf16 tensors as their raw uint16
bit patterns (garbage), and it ignores ``input_precision`` (tf32 runs as full fp32). With
``EMULATE_BF16_DOT`` the kernels round operands to bf16 and multiply them in fp32, which is
the same arithmetic as a bf16 tensor-core dot with fp32 accumulation. Launchers turn the
emulation on only for interpreted kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import triton
import triton.language as tl

FP32_PRECISIONS = ("ieee", "tf32", "tf32x3")
HALF_PRECISIONS = ("fp16", "bf16")
PRECISIONS = FP32_PRECISIONS + HALF_PRECISIONS

# Minimum CUDA capability for each precision on tensor cores.
MIN_CAPABILITY: dict[str, tuple[int, int]] = {
    "ieee": (7, 0),
    "tf32": (8, 0),
    "tf32x3": (8, 0),
    "fp16": (7, 0),
    "bf16": (8, 0),
}


def operand_bytes(precision: str) -> int:
    """Bytes per element of the dot operands for ``precision``."""
    return 2 if precision in HALF_PRECISIONS else 4


def precision_reasons(precision: str, capability: tuple[int, int] | None) -> list[str]:
    """Reasons ``precision`` cannot be used (unknown name, GPU too old)."""
    if precision not in PRECISIONS:
        return [f"precision={precision!r} is not one of {', '.join(PRECISIONS)}"]
    needed = MIN_CAPABILITY[precision]
    if capability is not None and tuple(capability) < needed:
        return [
            f"precision={precision!r} needs CUDA capability >= {needed[0]}.{needed[1]}, "
            f"device has {capability[0]}.{capability[1]}"
        ]
    return []


def launch_reasons(
    *,
    kernel: object,
    device_type: str,
    precision: str,
    capability: tuple[int, int] | None,
    smem_bytes: int | None,
    smem_needed: Callable[[], int],
    reasons: list[str],
) -> list[str]:
    """The checks every tiled kernel shares: a Triton backend for the device, the GPU's
    support for the operand precision, and (when nothing else is wrong) shared memory."""
    from kernels._triton import device_reasons

    reasons.extend(device_reasons(device_type, kernel))
    if device_type == "cuda":
        reasons.extend(precision_reasons(precision, capability))
    if smem_bytes is not None and not reasons:
        need = smem_needed()
        if need > smem_bytes:
            reasons.append(f"needs ~{need} B shared memory, device has {smem_bytes}")
    return reasons


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not supported; use one of {PRECISIONS}")


@triton.jit
def to_operand(x, PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr):
    """Convert an fp32 tile to the dot operand type of ``PRECISION``."""
    y = x
    if PRECISION == "fp16":
        y = x.to(tl.float16)
    if PRECISION == "bf16":
        y = x.to(tl.bfloat16).to(tl.float32) if EMULATE_BF16_DOT else x.to(tl.bfloat16)
    return y


@triton.jit
def dot(a, b, acc, PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr):
    """``acc + a @ b`` in fp32 with operands already passed through ``to_operand``."""
    if PRECISION == "fp16":
        out = tl.dot(a, b, acc)
    elif PRECISION == "bf16":
        # Emulated operands are bf16-rounded fp32: multiply them exactly ("ieee").
        out = tl.dot(a, b, acc, input_precision="ieee") if EMULATE_BF16_DOT else tl.dot(a, b, acc)
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out
