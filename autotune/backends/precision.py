"""Operand precisions (``attn_precision``, ``gemm_precision``): fp32 (TF32 matmuls, as the
reference under the official flags), ieee (TF32 off), fp16 and bf16 operands with fp32
accumulation. What each needs, and the helpers every backend computes with."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from autotune.core.device import DeviceInfo
from autotune.core.threads import SharedSection

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def context_dtype(plan: Any) -> torch.dtype:
    """The dtype the project's attention kernels write their context in: float16 when the
    GEMMs are fp16 (``linear`` rounds an fp32 context to it anyway, and the kernels round
    once on their store, to nearest even: the same bits), else float32."""
    return torch.float16 if plan.gemm_precision == "fp16" else torch.float32


def half_qkv(plan: Any) -> bool:
    """Whether the per-layer path hands q, k, v to the attention as the GEMMs' half output:
    fp16/bf16 GEMMs feeding attention of the same precision (no round trip through fp32)."""
    return plan.gemm_precision == plan.attn_precision in DTYPES


def triton_precision(prec: str) -> str:
    """The Triton kernels' name of an operand precision (fp32 is their tf32)."""
    return "tf32" if prec == "fp32" else prec


def operand_bytes(prec: str) -> int:
    return 2 if prec in DTYPES else 4


def mantissa_bits(dtype: torch.dtype) -> int:
    """The stored mantissa bits of a floating dtype (fp16 10, bf16 7)."""
    return round(-math.log2(torch.finfo(dtype).eps))


def reasons(plan: Any, device: DeviceInfo, config: Any = None) -> list[str]:
    out = []
    cap = device.capability or (0, 0)
    for what in ("attn_precision", "gemm_precision"):
        if getattr(plan, what) == "bf16" and device.type == "cuda" and cap < (8, 0):
            out.append(f"{what}=bf16 needs sm_80+, device is {device.sm}")
    return out + drop_bits_reasons(plan, config)


def drop_bits_reasons(plan: Any, config: Any = None) -> list[str]:
    """``attn_drop_bits`` and its graded form (``attn_drop_bits_late`` from
    ``attn_drop_late_from``): they round the half q, k, v the per-layer path's projection
    hands to the attention (``half_qkv``), in place, outside any compiled region. With the
    case's ``config``, the graded form also needs a causal case whose sequence reaches the
    position (else it rounds no row, or early queries read the coarse late keys)."""
    n, late, start = plan.attn_drop_bits, plan.attn_drop_bits_late, plan.attn_drop_late_from
    if late == 0 and start:
        return [
            f"attn_drop_late_from={start} does nothing with attn_drop_bits_late=0; set "
            "attn_drop_bits_late above attn_drop_bits, or attn_drop_late_from 0"
        ]
    if n == 0 and late == 0:
        return []
    what = f"attn_drop_bits={n}" if late == 0 else f"attn_drop_bits_late={late}"
    if not half_qkv(plan):
        return [
            f"{what} rounds the half q, k, v the projection hands to attention; set "
            "gemm_precision and attn_precision both to fp16 or both to bf16"
        ]
    out = []
    bits = mantissa_bits(DTYPES[plan.attn_precision])
    for knob, value in (("attn_drop_bits", n), ("attn_drop_bits_late", late)):
        if value >= bits:
            prec = plan.attn_precision
            out.append(f"{knob}={value}: {prec} has {bits} mantissa bits; clear at most {bits - 1}")
    if late and late <= n:
        out.append(
            f"{what} is not above attn_drop_bits={n}: set it higher, or use attn_drop_bits alone"
        )
    if late and start == 0:
        out.append(
            f"{what} with attn_drop_late_from=0 rounds every position; set attn_drop_bits={late} "
            "instead, or attn_drop_late_from >= 1"
        )
    if late and config is not None:
        if start >= config.seq_len:
            out.append(
                f"attn_drop_late_from={start} is at or past the case's {config.seq_len} tokens: "
                "no row takes the late bits; set it below the sequence length, or "
                "attn_drop_bits_late 0"
            )
        if not config.causal:
            out.append(
                f"{what} rests on a causal mask (a late query averages many keys); the case "
                "is not causal: set attn_drop_bits_late 0"
            )
    if plan.fused_layer != "none" or plan.fused_block:
        out.append(f"{what} applies to the per-layer path; set fused_layer none, fused_block false")
    if plan.compile != "none":
        out.append(f"{what} rounds outside torch.compile; set compile none")
    return out


def _tf32_flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def _tf32_off() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _restore_tf32(saved: tuple[bool, bool]) -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# TF32 is a process-wide switch: threads inside ``matmul_precision("ieee")`` at once share
# one saved state, saved by the first to enter and put back by the last to leave (saving
# and restoring per thread left TF32 off for good when two such sections overlapped).
_IEEE = SharedSection(_tf32_flags, _tf32_off, _restore_tf32)
_NOTHING = contextlib.nullcontext()


def matmul_precision(prec: str) -> contextlib.AbstractContextManager[None]:
    """``ieee``: turn TF32 off for the ops inside; other precisions leave flags alone.

    The flags are the process's: another thread's matmuls in the same moment run without
    TF32 too (more exact), and its call sees flags other than the serving contract's."""
    return _IEEE() if prec == "ieee" else _NOTHING


def linear(
    x: Tensor, weight: Tensor, bias: Tensor | None, prec: str, keep_half: bool = False
) -> Tensor:
    """``x @ W^T + b`` at an operand precision; fp32 out unless ``keep_half``."""
    if prec in DTYPES:
        y = F.linear(x.to(DTYPES[prec]), weight, bias)
        return y if keep_half else y.float()
    with matmul_precision(prec):
        return F.linear(x, weight, bias)
