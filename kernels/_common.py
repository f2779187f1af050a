"""What the kernel families share on the host and in the kernels: tile padding, the
tile settings of an attention launch, input checks of q/k/v/out, and exact GELU.

Imports triton (for the ``@triton.jit`` helper); import it only from kernel modules.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import triton
import triton.language as tl

from kernels._triton import INT32_MAX, next_power_of_2

MIN_BLOCK = 16  # tl.dot needs every tile dimension >= 16
_HALF_INPUTS = {"fp16": torch.float16, "bf16": torch.bfloat16}


# Row tiles of 128 in the kernels that compute projections and attention in one program
# (the fused heads layer, the fused block) miscompile on CUDA under Triton 3.6 (H200,
# sm_90): compute-sanitizer memcheck found out-of-bounds shared-memory reads in the heads
# kernel's P @ V at 128/64 and 128/32 tiles with 8 warps, and 4-warp settings returned
# non-finite outputs with no finding (session 7, docs/results/h200/memcheck_s7.csv). Refused
# on every CUDA device: a wrong kernel must never reach a study or a table.
MAX_FUSED_ROW_TILE = 64
# The one-launch layer (fused_layer=seq) holds every key's LayerNorm beside the query block:
# at d_model 128 and S 128 its 64- and 128-row tiles ended in "an illegal memory access" on
# the H200 (session 10, docs/logs/h200_s10_seq.log), its 16- and 32-row tiles ran and
# passed the gate at the same per-sequence shape (cases 2-4).
MAX_SEQ_ROW_TILE = 32


def fused_row_tile_reasons(
    name: str, value: int, kernel: str, device_type: str, limit: int = MAX_FUSED_ROW_TILE
) -> list[str]:
    """Why a row tile of a fused projection + attention kernel must not run on CUDA."""
    if device_type != "cuda" or value <= limit:
        return []
    evidence = (
        "an illegal memory access on the H200, docs/logs/h200_s10_seq.log"
        if limit == MAX_SEQ_ROW_TILE
        else "out-of-bounds shared-memory reads and non-finite outputs under "
        "compute-sanitizer, docs/results/h200/memcheck_s7.csv"
    )
    return [
        f"{name}={value} in the {kernel} miscompiles on CUDA (Triton 3.6, H200: {evidence}); "
        f"use {name} <= {limit}"
    ]


def padded_dim(n: int) -> int:
    """A tile dimension: ``n`` rounded up to a power of two, at least 16."""
    return max(MIN_BLOCK, next_power_of_2(n))


def padded_head_dim(head_dim: int) -> int:
    """BLOCK_D: head_dim rounded up to a power of two, at least 16."""
    return padded_dim(head_dim)


@dataclasses.dataclass(frozen=True)
class Tiles:
    """The tile settings of an attention-style launch: query rows per program, keys per
    inner step, warps per program, software pipeline stages."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2

    def kwargs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Programmatic dependent launch (Hopper and newer): a kernel launched with it may start
# while the previous kernel of the stream is still running; it must not touch memory that
# kernel wrote (or reads) before ``gdc_wait`` returns, which is when that kernel has
# finished and its writes are visible.
PDL_MIN_CAPABILITY = (9, 0)


def pdl_reasons(device_type: str, capability: tuple[int, int] | None) -> list[str]:
    """Why programmatic dependent launch cannot be used here ([] when it can)."""
    if device_type != "cuda" or capability is None:
        return [
            "pdl=True (programmatic dependent launch) needs a CUDA GPU of compute capability "
            f"{PDL_MIN_CAPABILITY[0]}.{PDL_MIN_CAPABILITY[1]} or newer; got {device_type}"
        ]
    if tuple(capability) < PDL_MIN_CAPABILITY:
        return [
            f"pdl=True (programmatic dependent launch) needs compute capability "
            f"{PDL_MIN_CAPABILITY[0]}.{PDL_MIN_CAPABILITY[1]} or newer; this GPU is "
            f"sm_{capability[0]}{capability[1]}"
        ]
    return []


# ptxas's .maxnreg bounds (registers a thread; the hardware's most is 255).
MIN_MAXNREG, MAX_MAXNREG = 24, 255


def maxnreg_errors(name: str, maxnreg: int) -> list[str]:
    """Why ``maxnreg`` is not a register cap ptxas takes ([] when it is, or 0)."""
    if maxnreg and not MIN_MAXNREG <= maxnreg <= MAX_MAXNREG:
        return [
            f"{name} must be 0 (the compiler's choice) or in {MIN_MAXNREG}..{MAX_MAXNREG} "
            f"registers a thread, got {maxnreg}"
        ]
    return []


def maxnreg_launch(maxnreg: int) -> dict[str, int]:
    """The launch option capping a kernel's registers a thread, only when set (0: the
    compiler's choice, a launch exactly as before)."""
    return {"maxnreg": maxnreg} if maxnreg else {}


def pdl_launch(pdl: bool) -> dict[str, bool]:
    """The launch option of programmatic dependent launch, only when it is on (a plan
    without it launches exactly as before, whatever the Triton version)."""
    return {"launch_pdl": True} if pdl else {}


# Where a kernel launched with pdl lets the next kernel of the stream launch: "start" (right
# after its own gdc_wait: the next kernel's programs become resident and wait while this one
# runs) or "end" (after its last store: only the next launch's latency overlaps this tail).
PDL_TRIGGERS = ("start", "end")


def gdc_mode(pdl: bool, trigger: str = "start") -> int:
    """The kernels' ``USE_GDC``: 0 without pdl, 1 with the trigger at the start, 2 at the end."""
    if trigger not in PDL_TRIGGERS:
        raise ValueError(f"pdl trigger must be one of {PDL_TRIGGERS}, got {trigger!r}")
    if trigger != "start" and not pdl:
        raise ValueError(f"pdl trigger {trigger!r} places the trigger of pdl=True; got pdl=False")
    return PDL_TRIGGERS.index(trigger) + 1 if pdl else 0


@triton.jit
def grid_dependency_enter(USE_GDC: tl.constexpr):
    """With ``USE_GDC`` (the kernel launched with ``launch_pdl=True``): wait until the
    previous kernel of the stream has finished and its writes are visible; with
    ``USE_GDC == 1`` then let the next kernel launch (its programs wait in their own
    ``gdc_wait``). Call it before the kernel's first load or store; nothing otherwise."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
        if USE_GDC == 1:
            tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def grid_dependency_exit(USE_GDC: tl.constexpr):
    """With ``USE_GDC == 2``: let the next kernel launch once every program of this one has
    passed here. Call it after the kernel's last store; nothing otherwise."""
    if USE_GDC == 2:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def gelu_exact(v):
    """erf GELU (the reference's), on an fp32 tile."""
    return 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))


# GELU_POLY's odd polynomial p(c) = c (a0 + a1 c^2 + a2 c^4), fitted (minimax-weighted least
# squares on |v| <= 5) so that v * sigmoid(p(v)) matches the erf GELU, stored times
# -log2(e) for exp2. p increases up to |c| = 8.35, where sigmoid(p) is 1e-12 from 0 or 1.
GELU_POLY = (-2.30112131, -0.106775747, 0.0010142665)
GELU_POLY_CLAMP = 8.0
# Its largest error against the erf GELU over all fp32 inputs (fp64 check on |v| <= 60,
# step 5e-5; fp32 evaluation 2.55e-5; below -8 the result is within 8e-12 of 0): 40 times
# under the fp16 rounding (9.8e-4 on |v| < 4) its half-operand output goes through next.
# tests/kernels/test_layer.py holds the kernel to this bound.
GELU_POLY_MAX_ERR = 2.6e-5
_GP0: tl.constexpr = tl.constexpr(GELU_POLY[0])
_GP1: tl.constexpr = tl.constexpr(GELU_POLY[1])
_GP2: tl.constexpr = tl.constexpr(GELU_POLY[2])
_GP_CLAMP: tl.constexpr = tl.constexpr(GELU_POLY_CLAMP)


@triton.jit
def gelu_poly(v):
    """The GELU as ``v * sigmoid(p(v))`` (``p`` an odd quintic on ``v`` clamped to +-8): one
    exp2 and one fast division, where the erf GELU's libdevice erf is two polynomials and an
    exp2 with selects. Within ``GELU_POLY_MAX_ERR`` of the erf GELU for every fp32 input:
    below -8 the numerator is clamped too (the result is then within 8e-12 of the GELU's
    ~0); NaN stays NaN."""
    m = tl.maximum(v, -_GP_CLAMP, propagate_nan=tl.PropagateNan.ALL)
    c = tl.minimum(m, _GP_CLAMP)
    c2 = c * c
    z = c * (_GP0 + c2 * (_GP1 + c2 * _GP2))
    return tl.fdiv(m, 1.0 + tl.exp2(z), ieee_rounding=False)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, precision: str) -> None:
    """q, k, v: tensors ``[B, S, H, head_dim]`` of one shape and dtype (fp32, or the half
    operand type of ``precision``), last-dim stride 1."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}; expected 4 dims [B, S, H, head_dim] "
                "(view a [B, S, D] tensor as [B, S, H, D // H])"
            )
        half = _HALF_INPUTS.get(precision)
        if t.dtype != torch.float32 and t.dtype != half:
            allowed = "float32" + (f" or {half}" if half is not None else "")
            raise ValueError(
                f"{name} has dtype {t.dtype}; with precision={precision!r} pass {allowed} "
                "(half inputs only when they are already the operand type)"
            )
        if t.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {t.dtype} but q has {q.dtype}; use one dtype")
        if t.stride(-1) != 1:
            raise ValueError(
                f"{name} has last-dim stride {t.stride(-1)}; it must be 1 "
                "(call .contiguous() on the projection output)"
            )
        if t.shape != q.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but q has {tuple(q.shape)}; "
                "q, k and v must have the same [B, S, H, head_dim]"
            )


# bfloat16 outputs are not offered: Triton's interpreter truncates fp32 -> bf16 where the
# device and torch round to nearest, so the CPU checks could not vouch for the same bits.
OUT_DTYPES = (torch.float32, torch.float16)


def check_out(out: torch.Tensor, shape: torch.Size) -> None:
    """The output: the queries' shape, last-dim stride 1, float32, or float16 for a
    consumer that would round it to fp16 anyway (the kernels compute in fp32 and round
    once, on the store, to nearest even: the same bits as rounding an fp32 output after)."""
    if out.shape != shape or out.dtype not in OUT_DTYPES:
        raise ValueError(
            f"out has shape {tuple(out.shape)} and dtype {out.dtype}; expected "
            f"{tuple(shape)} of float32 or float16 (view a [B, S, D] buffer as "
            "[B, S, H, head_dim])"
        )
    if out.stride(-1) != 1:
        raise ValueError(f"out has last-dim stride {out.stride(-1)}; it must be 1")


def check_int32_offsets(tensors: dict[str, torch.Tensor], seq_len: int, head_dim: int) -> None:
    """Offsets inside one (batch, head) slice are int32 in the kernels."""
    for name, t in tensors.items():
        span = (seq_len - 1) * t.stride(1) + head_dim
        if span > INT32_MAX:
            raise ValueError(
                f"{name}: seq_len * stride(1) = {span} overflows int32 offsets; "
                "split the sequence or use a tighter layout"
            )
