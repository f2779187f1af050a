"""ffn_in's bias + exact (erf) GELU: an epilogue kernel and a GEMM with that epilogue.

- :func:`bias_gelu`: ``GELU(y + bias)`` for ``y = x @ W^T`` computed elsewhere (cuBLAS).
- :func:`linear_gelu`: ``GELU(x @ W^T + bias)`` in one Triton GEMM (fp32 accumulation,
  operands per ``precision`` as in :mod:`kernels.attention`); :func:`linear` is the same
  GEMM without the GELU (e.g. for ffn_out).

GELU is the exact form ``0.5 * v * (1 + erf(v / sqrt(2)))`` (``approximate="none"``), not
the tanh approximation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import gelu_exact
from kernels._precision import (
    HALF_PRECISIONS,
    check_precision,
    dot,
    launch_reasons,
    precision_reasons,
    to_operand,
)
from kernels._triton import (
    SUPPORTED_NUM_WARPS,
    check_launch_device,
    device_reasons,
    is_interpreted,
    is_power_of_2,
    next_power_of_2,
)

MIN_DOT_BLOCK = 16  # tl.dot needs every tile dimension >= 16
MAX_TILE_ELEMENTS = 1 << 20

__all__ = [
    "bias_gelu",
    "bias_gelu_not_supported_reasons",
    "bias_gelu_reference",
    "estimate_linear_shared_memory_bytes",
    "linear",
    "linear_gelu",
    "linear_gelu_not_supported_reasons",
    "linear_gelu_reference",
]


# --------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------
def bias_gelu_reference(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(y + bias, approximate="none")


def linear_gelu_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, gelu: bool = True
) -> torch.Tensor:
    y = torch.nn.functional.linear(x, weight, bias)
    return torch.nn.functional.gelu(y, approximate="none") if gelu else y


# --------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------
@triton.jit
def _bias_gelu_kernel(
    y_ptr,
    bias_ptr,
    out_ptr,
    num_rows,
    num_cols,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_ok = cols < num_cols
    ok = (rows < num_rows)[:, None] & col_ok[None, :]
    offsets = rows.to(tl.int64)[:, None] * num_cols + cols[None, :]
    y = tl.load(y_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)  # half: exact upcast
    out = gelu_exact(y + b[None, :])
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _linear_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_om,
    HAS_BIAS: tl.constexpr,
    APPLY_GELU: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
):
    # Grouped ordering: GROUP_M row blocks share the W column blocks they load (L2 reuse).
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Tail rows/cols re-read valid rows/cols (modulo) instead of masking every load;
    # the store below is masked. int64: M * K can exceed 2**31.
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + cols[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        else:
            k_ok = offs_k < K - k0
            a = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
        a = to_operand(a, PRECISION, EMULATE_BF16_DOT)
        b = to_operand(b, PRECISION, EMULATE_BF16_DOT)
        acc = dot(a, b, acc, PRECISION, EMULATE_BF16_DOT)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    n_ok = offs_n < N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    if APPLY_GELU:
        acc = gelu_exact(acc)
    ok = (offs_m < M)[:, None] & n_ok[None, :]
    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc, mask=ok)


# --------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------
def _bias_gelu_tile(num_cols: int, block: int) -> tuple[int, int]:
    """(BLOCK_ROWS, BLOCK_COLS) covering ``block`` elements: whole rows when they fit."""
    block_cols = min(next_power_of_2(num_cols), block)
    return block // block_cols, block_cols


def _bias_gelu_config_errors(*, num_cols: int, block: int, num_warps: int) -> list[str]:
    reasons: list[str] = []
    if num_cols < 1:
        reasons.append(f"num_cols={num_cols} must be >= 1")
    if not is_power_of_2(block) or block > MAX_TILE_ELEMENTS:
        reasons.append(f"block={block} must be a power of two <= {MAX_TILE_ELEMENTS}")
    if num_warps not in SUPPORTED_NUM_WARPS:
        reasons.append(f"num_warps={num_warps} must be one of {SUPPORTED_NUM_WARPS}")
    return reasons


def bias_gelu_not_supported_reasons(
    *, num_cols: int, block: int, num_warps: int, device_type: str
) -> list[str]:
    """Why this bias+GELU configuration should not run here; empty list = supported."""
    reasons = _bias_gelu_config_errors(num_cols=num_cols, block=block, num_warps=num_warps)
    if not reasons and block < 32 * num_warps:
        reasons.append(
            f"block={block} < {32 * num_warps} threads of num_warps={num_warps}; "
            "use a larger block or fewer warps"
        )
    reasons.extend(device_reasons(device_type, _bias_gelu_kernel))
    return reasons


def estimate_linear_shared_memory_bytes(
    *, block_m: int, block_n: int, block_k: int, num_stages: int, precision: str
) -> int:
    """Shared memory of one GEMM program in bytes: a model of what Triton allocates.

    Calibrated against ``metadata.shared`` of this kernel compiled by Triton 3.9 for sm_90
    (25 tiles). X and W tiles are staged as loaded (fp32): with ``tile = block_m * block_k
    + block_k * block_n`` elements,

    - fp32 operands: ``num_stages * tile * 4`` (exact for tf32; ieee / tf32x3 need less);
    - fp16 / bf16, num_stages >= 2: ``(num_stages - 1) * tile * 4 + block_k * block_n * 2``
      (the converted W operand), exact; num_stages == 1: ``tile * 4``, exact.

    Triton 3.6 may allocate differently; a tile under the limit can still fail with
    OutOfResources at its first launch: record that as "unsupported".
    """
    tile = block_m * block_k + block_k * block_n
    if precision in HALF_PRECISIONS and num_stages >= 2:
        return (num_stages - 1) * tile * 4 + block_k * block_n * 2
    return max(num_stages, 1) * tile * 4


def _linear_config_errors(
    *,
    block_m: int,
    block_n: int,
    block_k: int,
    group_m: int,
    num_warps: int,
    num_stages: int,
    precision: str,
) -> list[str]:
    reasons: list[str] = []
    for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if not is_power_of_2(value) or value < MIN_DOT_BLOCK:
            reasons.append(f"{name}={value} must be a power of two >= {MIN_DOT_BLOCK}")
    if group_m < 1:
        reasons.append(f"group_m={group_m} must be >= 1")
    if num_warps not in SUPPORTED_NUM_WARPS:
        reasons.append(f"num_warps={num_warps} must be one of {SUPPORTED_NUM_WARPS}")
    if num_stages < 1:
        reasons.append(f"num_stages={num_stages} must be >= 1")
    reasons.extend(precision_reasons(precision, None))
    return reasons


def linear_gelu_not_supported_reasons(
    *,
    num_rows: int | None,
    in_features: int,
    out_features: int,
    block_m: int,
    block_n: int,
    block_k: int,
    group_m: int,
    num_warps: int,
    num_stages: int,
    precision: str,
    device_type: str,
    capability: tuple[int, int] | None,
    smem_bytes: int | None,
) -> list[str]:
    """Why this GEMM configuration should not run here; empty list = supported."""
    reasons = _linear_config_errors(
        block_m=block_m,
        block_n=block_n,
        block_k=block_k,
        group_m=group_m,
        num_warps=num_warps,
        num_stages=num_stages,
        precision=precision,
    )
    sizes = [("block_n", block_n, out_features), ("block_k", block_k, in_features)]
    if num_rows is not None:
        sizes.append(("block_m", block_m, num_rows))
    for name, block, size in sizes:
        padded = max(MIN_DOT_BLOCK, next_power_of_2(size))
        if is_power_of_2(block) and block > padded:
            reasons.append(f"{name.upper()}={block} > padded size {padded}")
    return launch_reasons(
        kernel=_linear_kernel,
        device_type=device_type,
        precision=precision,
        capability=capability,
        smem_bytes=smem_bytes,
        smem_needed=lambda: estimate_linear_shared_memory_bytes(
            block_m=block_m,
            block_n=block_n,
            block_k=block_k,
            num_stages=num_stages,
            precision=precision,
        ),
        reasons=reasons,
    )


# --------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------
def _as_rows(name: str, t: torch.Tensor) -> torch.Tensor:
    """View a float32 ``[..., F]`` tensor (2 or 3 dims) as ``[rows, F]`` without copying."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise ValueError(f"{name} has dtype {t.dtype}; pass float32")
    if t.dim() not in (2, 3):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [M, F] or [B, S, F]")
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError as exc:
        raise ValueError(
            f"{name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed "
            "as [rows, features]; call .contiguous()"
        ) from exc


def _check_bias(bias: torch.Tensor, size: int, half_ok: bool = False) -> None:
    dtypes = (torch.float32, torch.float16, torch.bfloat16) if half_ok else (torch.float32,)
    if bias.shape != (size,) or bias.dtype not in dtypes or bias.stride(0) != 1:
        kinds = "float32, float16 or bfloat16" if half_ok else "float32"
        raise ValueError(
            f"bias has shape {tuple(bias.shape)}, dtype {bias.dtype}, strides {bias.stride()}; "
            f"expected a contiguous {kinds} vector of {size}"
        )


def bias_gelu(
    y: torch.Tensor,
    bias: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    inplace: bool = False,
    block: int = 1024,
    num_warps: int = 4,
) -> torch.Tensor:
    """``GELU_exact(y + bias)`` over the last dim; into ``out``, into ``y`` (inplace) or new
    (y's dtype). ``y`` may be float32, float16 or bfloat16 (a half GEMM's output): the sum
    and GELU are fp32, rounded once on store to ``out``'s dtype (float32 or y's). ``bias``
    may be half too (a half GEMM's bias, upcast exactly in the kernel: no cast kernel)."""
    if not isinstance(y, torch.Tensor):
        raise ValueError(f"y must be a torch.Tensor, got {type(y).__name__}")
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    if y.dtype not in dtypes or y.dim() < 1 or not y.is_contiguous():
        raise ValueError(
            f"y has dtype {y.dtype}, shape {tuple(y.shape)}, strides {y.stride()}; expected a "
            "contiguous float32, float16 or bfloat16 [..., features] tensor (call .contiguous())"
        )
    num_cols = y.shape[-1]
    _check_bias(bias, num_cols, half_ok=True)
    if out is not None and inplace:
        raise ValueError("pass either out= or inplace=True, not both")
    errors = _bias_gelu_config_errors(num_cols=max(num_cols, 1), block=block, num_warps=num_warps)
    if errors:
        raise ValueError("; ".join(errors))
    if inplace:
        out = y
    elif out is None:
        out = torch.empty_like(y)
    elif (
        out.shape != y.shape or out.dtype not in (torch.float32, y.dtype) or not out.is_contiguous()
    ):
        raise ValueError(
            f"out has shape {tuple(out.shape)}, dtype {out.dtype}, contiguous="
            f"{out.is_contiguous()}; expected contiguous float32 or {y.dtype} {tuple(y.shape)}"
        )
    check_launch_device(_bias_gelu_kernel, {"y": y, "bias": bias, "out": out})
    if y.numel() == 0:
        return out
    num_rows = y.numel() // num_cols
    block_rows, block_cols = _bias_gelu_tile(num_cols, block)
    grid = (triton.cdiv(num_rows, block_rows), triton.cdiv(num_cols, block_cols))
    _bias_gelu_kernel[grid](
        y,
        bias,
        out,
        num_rows,
        num_cols,
        BLOCK_ROWS=block_rows,
        BLOCK_COLS=block_cols,
        num_warps=num_warps,
    )
    return out


def _launch_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    apply_gelu: bool,
    out: torch.Tensor | None,
    precision: str,
    block_m: int,
    block_n: int,
    block_k: int,
    group_m: int,
    num_warps: int,
    num_stages: int,
) -> torch.Tensor:
    x_rows = _as_rows("x", x)
    num_rows, in_features = x_rows.shape
    if (
        not isinstance(weight, torch.Tensor)
        or weight.dim() != 2
        or weight.dtype != torch.float32
        or weight.shape[1] != in_features
    ):
        raise ValueError(
            f"weight has shape {tuple(getattr(weight, 'shape', ()))} and dtype "
            f"{getattr(weight, 'dtype', None)}; expected float32 [out_features, "
            f"{in_features}] (nn.Linear layout)"
        )
    out_features = weight.shape[0]
    if bias is not None:
        _check_bias(bias, out_features)
    check_precision(precision)
    errors = _linear_config_errors(
        block_m=block_m,
        block_n=block_n,
        block_k=block_k,
        group_m=group_m,
        num_warps=num_warps,
        num_stages=num_stages,
        precision=precision,
    )
    if errors:
        raise ValueError("; ".join(errors))
    out_shape = (*x.shape[:-1], out_features)
    if out is None:
        out = torch.empty(out_shape, device=x.device, dtype=torch.float32)
    elif tuple(out.shape) != out_shape or out.dtype != torch.float32 or out.stride(-1) != 1:
        raise ValueError(
            f"out has shape {tuple(out.shape)}, dtype {out.dtype}, last-dim "
            f"stride {out.stride(-1)}; expected float32 {out_shape} with "
            "last-dim stride 1"
        )
    out_rows = _as_rows("out", out)
    tensors = {"x": x, "weight": weight, "out": out}
    if bias is not None:
        tensors["bias"] = bias
    check_launch_device(_linear_kernel, tensors)
    if num_rows == 0 or out_features == 0:
        return out
    if in_features == 0:
        raise ValueError("x has 0 input features; nothing to multiply")
    grid = (triton.cdiv(num_rows, block_m) * triton.cdiv(out_features, block_n),)
    _linear_kernel[grid](
        x_rows,
        weight,
        bias if bias is not None else weight,
        out_rows,
        num_rows,
        out_features,
        in_features,
        x_rows.stride(0),
        x_rows.stride(1),
        weight.stride(0),
        weight.stride(1),
        out_rows.stride(0),
        HAS_BIAS=bias is not None,
        APPLY_GELU=apply_gelu,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M=group_m,
        EVEN_K=in_features % block_k == 0,
        PRECISION=precision,
        EMULATE_BF16_DOT=is_interpreted(_linear_kernel),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def linear_gelu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    precision: str = "tf32",
    block_m: int = 64,
    block_n: int = 64,
    block_k: int = 32,
    group_m: int = 8,
    num_warps: int = 4,
    num_stages: int = 3,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``GELU_exact(x @ weight^T + bias)``; x ``[M, K]`` or ``[B, S, K]``, weight ``[N, K]``."""
    return _launch_linear(
        x,
        weight,
        bias,
        apply_gelu=True,
        out=out,
        precision=precision,
        block_m=block_m,
        block_n=block_n,
        block_k=block_k,
        group_m=group_m,
        num_warps=num_warps,
        num_stages=num_stages,
    )


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    precision: str = "tf32",
    block_m: int = 64,
    block_n: int = 64,
    block_k: int = 32,
    group_m: int = 8,
    num_warps: int = 4,
    num_stages: int = 3,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ weight^T + bias`` with the same GEMM (no activation)."""
    return _launch_linear(
        x,
        weight,
        bias,
        apply_gelu=False,
        out=out,
        precision=precision,
        block_m=block_m,
        block_n=block_n,
        block_k=block_k,
        group_m=group_m,
        num_warps=num_warps,
        num_stages=num_stages,
    )
