"""Fused residual add + LayerNorm (+ padded-row zeroing) for the pre-norm block.

For rows (tokens) ``x[N, D]``, optional ``delta[N, D]`` and optional ``row_mask[N]``
(True = real token)::

    s = x + delta                      (s = x when delta is None)
    if zero_sum_rows: s[~row_mask] = 0
    y = LayerNorm(s; weight, bias, eps)  biased variance, rsqrt(var + eps), all fp32
    if zero_out_rows: y[~row_mask] = 0

returns ``(s, y)``. In the layer: ``add_layernorm(x, attn_out, norm2...)`` gives the new
residual and LN2's output; ``add_layernorm(x, ffn_out, next norm1, row_mask,
zero_sum_rows=True)`` closes a layer and opens the next; the final norm uses
``zero_out_rows=True``. One program normalises ``block_rows`` whole rows.

Half hand-offs: ``delta`` may be fp16 / bf16 (a half GEMM's output, upcast on load) and
``out_dtype`` fp16 / bf16 stores ``y`` as the next GEMM's operand (rounded once, on store,
as a cast after an fp32 ``y`` would): the same values, without the two cast kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._triton import (
    SUPPORTED_NUM_WARPS,
    check_launch_device,
    device_reasons,
    is_power_of_2,
    next_power_of_2,
)

MAX_TILE_ELEMENTS = 1 << 20  # Triton's limit on the elements of one tensor
MAX_VALUES_PER_THREAD = 256  # beyond this a row tile spills registers heavily

__all__ = ["add_layernorm", "add_layernorm_reference", "not_supported_reasons"]


# --------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------
def add_layernorm_reference(
    x: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    *,
    eps: float = 1e-5,
    row_mask: torch.Tensor | None = None,
    zero_sum_rows: bool = False,
    zero_out_rows: bool = False,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch version of :func:`add_layernorm` (never in place)."""
    s = x.clone() if delta is None else x + delta.float()
    if zero_sum_rows:
        s[~row_mask.reshape(s.shape[:-1])] = 0
    y = torch.nn.functional.layer_norm(s, (s.shape[-1],), weight, bias, eps)
    if zero_out_rows:
        y[~row_mask.reshape(y.shape[:-1])] = 0
    return s, y.to(out_dtype)


# --------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------
@triton.jit
def _add_layernorm_kernel(
    x_ptr,
    delta_ptr,
    mask_ptr,
    w_ptr,
    b_ptr,
    s_ptr,
    y_ptr,
    num_rows,
    d_model,
    stride_x,
    stride_delta,
    stride_s,
    stride_y,
    eps,
    HAS_DELTA: tl.constexpr,
    HAS_MASK: tl.constexpr,
    ZERO_SUM_ROWS: tl.constexpr,
    ZERO_OUT_ROWS: tl.constexpr,
    STORE_SUM: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = rows < num_rows
    rows64 = rows.to(tl.int64)  # N * D can exceed 2**31 (case 14: 3.2e9 elements)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < d_model
    ok = row_ok[:, None] & col_ok[None, :]

    s = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=ok, other=0.0)
    if HAS_DELTA:
        d_offsets = rows64[:, None] * stride_delta + cols[None, :]
        s += tl.load(delta_ptr + d_offsets, mask=ok, other=0.0).to(tl.float32)
    if HAS_MASK:
        keep = tl.load(mask_ptr + rows, mask=row_ok, other=0) != 0
        if ZERO_SUM_ROWS:
            s = tl.where(keep[:, None], s, 0.0)
    if STORE_SUM:
        tl.store(s_ptr + rows64[:, None] * stride_s + cols[None, :], s, mask=ok)

    mean = tl.sum(s, axis=1) / d_model
    diff = tl.where(ok, s - mean[:, None], 0.0)
    var = tl.sum(diff * diff, axis=1) / d_model
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0)
    y = diff * rstd[:, None] * w[None, :] + b[None, :]
    if HAS_MASK and ZERO_OUT_ROWS:
        y = tl.where(keep[:, None], y, 0.0)
    y_offsets = rows64[:, None] * stride_y + cols[None, :]
    tl.store(y_ptr + y_offsets, y.to(y_ptr.dtype.element_ty), mask=ok)


# --------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------
def _config_errors(*, d_model: int, block_rows: int, num_warps: int) -> list[str]:
    reasons: list[str] = []
    if d_model < 1:
        reasons.append(f"d_model={d_model} must be >= 1")
    if not is_power_of_2(block_rows):
        reasons.append(f"block_rows={block_rows} must be a power of two")
    if num_warps not in SUPPORTED_NUM_WARPS:
        reasons.append(f"num_warps={num_warps} must be one of {SUPPORTED_NUM_WARPS}")
    tile = block_rows * next_power_of_2(max(d_model, 1))
    if not reasons and tile > MAX_TILE_ELEMENTS:
        reasons.append(
            f"block_rows * BLOCK_D = {tile} > {MAX_TILE_ELEMENTS} elements per tile; "
            "lower block_rows"
        )
    return reasons


def not_supported_reasons(
    *,
    d_model: int,
    block_rows: int,
    num_warps: int,
    device_type: str,
    num_rows: int | None = None,
) -> list[str]:
    """Why this LayerNorm configuration should not run here; empty list = supported."""
    reasons = _config_errors(d_model=d_model, block_rows=block_rows, num_warps=num_warps)
    if not reasons:
        tile = block_rows * next_power_of_2(d_model)
        per_thread = tile // (32 * num_warps)
        if per_thread > MAX_VALUES_PER_THREAD:
            reasons.append(
                f"{per_thread} fp32 values per thread (block_rows={block_rows} x BLOCK_D="
                f"{next_power_of_2(d_model)} over {num_warps} warps) > "
                f"{MAX_VALUES_PER_THREAD}: registers would spill; lower block_rows or add warps"
            )
    if num_rows is not None and block_rows > next_power_of_2(max(num_rows, 1)):
        reasons.append(f"block_rows={block_rows} > padded row count {next_power_of_2(num_rows)}")
    reasons.extend(device_reasons(device_type, _add_layernorm_kernel))
    return reasons


# --------------------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------------------
HALF_DTYPES = (torch.float16, torch.bfloat16)


def _as_rows(name: str, t: torch.Tensor, half_ok: bool = False) -> torch.Tensor:
    """View a float32 (or, with ``half_ok``, fp16 / bf16) ``[..., D]`` tensor as ``[N, D]``
    rows without copying."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32 and not (half_ok and t.dtype in HALF_DTYPES):
        allowed = "float32, float16 or bfloat16" if half_ok else "float32"
        raise ValueError(f"{name} has dtype {t.dtype}; pass {allowed}")
    if t.dim() not in (2, 3):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [N, D] or [B, S, D]")
    if t.stride(-1) != 1:
        raise ValueError(
            f"{name} has last-dim stride {t.stride(-1)}; it must be 1 (call .contiguous())"
        )
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError as exc:
        raise ValueError(
            f"{name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed "
            "as [N, D] rows; call .contiguous()"
        ) from exc


def _check_vector(name: str, t: torch.Tensor, d_model: int) -> None:
    if t.shape != (d_model,) or t.dtype != torch.float32 or t.stride(0) != 1:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}, dtype {t.dtype}, strides {t.stride()}; "
            f"expected a contiguous float32 vector of {d_model} (d_model)"
        )


def _row_mask_bytes(row_mask: torch.Tensor, num_rows: int) -> torch.Tensor:
    if row_mask.dtype != torch.bool:
        raise ValueError(
            f"row_mask has dtype {row_mask.dtype}; pass a bool tensor (True = real token)"
        )
    if row_mask.numel() != num_rows:
        raise ValueError(
            f"row_mask has shape {tuple(row_mask.shape)} ({row_mask.numel()} "
            f"rows); expected {num_rows} rows, one per token of x"
        )
    return row_mask.reshape(num_rows).contiguous().view(torch.uint8)


def add_layernorm(
    x: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    *,
    eps: float = 1e-5,
    row_mask: torch.Tensor | None = None,
    zero_sum_rows: bool = False,
    zero_out_rows: bool = False,
    inplace: bool = False,
    block_rows: int = 1,
    num_warps: int = 4,
    out_dtype: torch.dtype = torch.float32,
    keep_sum: bool = True,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``s = x + delta`` (+ row zeroing) and ``y = LayerNorm(s)``; returns ``(s, y)``.

    ``s`` and ``y`` have x's shape. ``s`` is x itself when there is nothing to write
    (no delta, no zero_sum_rows) or when ``inplace=True``; otherwise a new tensor. ``delta``
    may be half (upcast on load); ``y`` is ``out_dtype`` (float32, float16 or bfloat16),
    computed in fp32 and rounded once on store. ``keep_sum=False``: the sum is not stored
    (a stack's last LayerNorm; the returned ``s`` is then ``x``, not the sum); ``out``: ``y``
    is written there (x's shape, ``out_dtype``, contiguous) instead of a new tensor.
    """
    rows = _as_rows("x", x)
    num_rows, d_model = rows.shape
    if out_dtype != torch.float32 and out_dtype not in HALF_DTYPES:
        raise ValueError(f"out_dtype={out_dtype}; pass torch.float32, float16 or bfloat16")
    delta_rows = None
    if delta is not None:
        delta_rows = _as_rows("delta", delta, half_ok=True)
        if delta.shape != x.shape:
            raise ValueError(
                f"delta has shape {tuple(delta.shape)} but x has {tuple(x.shape)}; they must match"
            )
    _check_vector("weight", weight, d_model)
    _check_vector("bias", bias, d_model)
    if (zero_sum_rows or zero_out_rows) and row_mask is None:
        raise ValueError("zero_sum_rows / zero_out_rows need row_mask (True = real token)")
    if row_mask is not None and not (zero_sum_rows or zero_out_rows):
        raise ValueError(
            "row_mask is given but zero_sum_rows and zero_out_rows are both "
            "False, so it would be ignored; set one of them or drop row_mask"
        )
    errors = _config_errors(d_model=d_model, block_rows=block_rows, num_warps=num_warps)
    if errors:
        raise ValueError("; ".join(errors))
    tensors = {"x": x, "weight": weight, "bias": bias}
    if delta is not None:
        tensors["delta"] = delta
    if row_mask is not None:
        tensors["row_mask"] = row_mask
    check_launch_device(_add_layernorm_kernel, tensors)

    store_sum = (delta is not None or zero_sum_rows) and keep_sum
    if not store_sum or inplace:
        s = x
    else:
        s = torch.empty_like(x, memory_format=torch.contiguous_format)
    s_rows = s.view(-1, d_model) if s is not x else rows
    if out is None:
        y = torch.empty(x.shape, device=x.device, dtype=out_dtype)
    elif tuple(out.shape) != tuple(x.shape) or out.dtype != out_dtype or not out.is_contiguous():
        raise ValueError(
            f"out has shape {tuple(out.shape)}, dtype {out.dtype}; expected contiguous "
            f"{out_dtype} {tuple(x.shape)} (x's shape, out_dtype)"
        )
    else:
        y = out
    if num_rows == 0:
        return s, y
    mask_bytes = _row_mask_bytes(row_mask, num_rows) if row_mask is not None else rows
    grid = (triton.cdiv(num_rows, block_rows),)
    _add_layernorm_kernel[grid](
        rows,
        delta_rows if delta_rows is not None else rows,
        mask_bytes,
        weight,
        bias,
        s_rows,
        y,
        num_rows,
        d_model,
        rows.stride(0),
        delta_rows.stride(0) if delta_rows is not None else 0,
        s_rows.stride(0),
        d_model,
        float(eps),
        HAS_DELTA=delta is not None,
        HAS_MASK=row_mask is not None,
        ZERO_SUM_ROWS=bool(zero_sum_rows),
        ZERO_OUT_ROWS=bool(zero_out_rows),
        STORE_SUM=store_sum,
        BLOCK_ROWS=block_rows,
        BLOCK_D=next_power_of_2(d_model),
        num_warps=num_warps,
    )
    return s, y
