"""Guarded degree-2 polynomial attention (``kernels.polynomial``, causal): a run-time
guard on the sampled score spread takes exact attention (cuDNN's on CUDA with half
operands, else the Triton kernel) when the approximation could fail; its decision is
logged per call."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from autotune.backends.base import AttentionBackend, AttentionCall, register
from autotune.backends.precision import context_dtype, triton_precision
from autotune.backends.triton_attention import attention_kernel_reasons, tiles
from autotune.core.device import DeviceInfo
from autotune.core.reference import TransformerConfig


def output_kwargs(plan: Any) -> dict[str, int]:
    """The tiles of the polynomial kernels the plan sets (0: the kernels' default): the
    output kernel's keys a step and stages, the prefix scan's stages."""
    kwargs = {
        "output_block_n": plan.poly_out_block_n,
        "output_stages": plan.poly_out_stages,
        "num_stages": plan.poly_prefix_stages,
    }
    return {key: value for key, value in kwargs.items() if value}


def polynomial_kwargs(plan: Any) -> dict[str, Any]:
    """``polynomial_kwargs`` of :func:`kernels.polynomial.guarded_attention`: the tiles
    (:func:`output_kwargs`) and the prefix scan's form."""
    return output_kwargs(plan) | ({"prefix_flat": True} if plan.poly_prefix_flat else {})


def _cudnn_or_triton(exact_kwargs: dict[str, Any], refused: list[str]) -> Any:
    """The guard's exact path on CUDA: causal attention of ``[B, S, H, hd]`` half views
    through cuDNN (SDPA), written into ``out``; the Triton kernel where cuDNN refuses the
    call (a RuntimeError other than out-of-memory, raised before any work), the refusal
    appended to ``refused``."""

    def exact(q: Tensor, k: Tensor, v: Tensor, scale: float, out: Tensor) -> Tensor:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from kernels.attention import attention

        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                ctx = F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                    is_causal=True, scale=scale,
                )  # fmt: skip
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as exc:
            refused.append(str(exc).splitlines()[0][:160])
            return attention(q, k, v, causal=True, scale=scale, out=out, **exact_kwargs)
        return out.copy_(ctx.transpose(1, 2))

    return exact


@register
class PolynomialAttention(AttentionBackend):
    value = "polynomial"
    rank = 7
    needs = (
        "CUDA with triton (or TRITON_INTERPRET=1), causal: guarded degree-2 "
        "polynomial attention, exact attention (cuDNN, or the Triton kernel) when the "
        "guard refuses"
    )
    triton = True
    general_masks = False

    def reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        reasons = super().reasons(plan, config, device, prune=prune)
        if not config.causal:
            reasons.append("attention=polynomial needs a causal model (its scan is causal)")
        if plan.cuda_graph:
            reasons.append(
                "attention=polynomial reads its guard on the host each layer; set cuda_graph false"
            )
        if plan.poly_stats_first and plan.poly_norm != "row":
            reasons.append(
                "poly_stats_first=True orders the row statistics of poly_norm=row; got "
                f"poly_norm={plan.poly_norm}"
            )
        return reasons

    def kernel_reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        from kernels import polynomial as poly

        # The guard's exact path is the Triton attention.
        reasons = attention_kernel_reasons(plan, config, device, prune=prune)
        return reasons + poly.not_supported_reasons(
            head_dim=config.head_dim,
            chunk=plan.poly_chunk,
            precision=triton_precision(plan.attn_precision),
            capability=device.capability,
            device_type=device.type,
            smem_bytes=device.smem_per_block or None,
            **output_kwargs(plan),
        )

    def attend(self, call: AttentionCall) -> Tensor:
        """With right padding the key mask is a no-op for valid rows (causal), and padded
        rows are zeroed after out_proj."""
        from kernels.polynomial import guarded_attention

        c, plan = call.config, call.plan
        b, s, d = call.q.shape
        shape = (b, s, c.num_heads, c.head_dim)
        out = torch.empty(b, s, d, device=call.q.device, dtype=context_dtype(plan))
        precision = triton_precision(plan.attn_precision)
        exact_kwargs = tiles(plan).kwargs() | {"precision": precision}
        # The guard's exact path: cuDNN's attention where it runs (half operands on CUDA;
        # 3.15 s against the Triton kernel's ~3.3 s at case 14, docs/case14.md), else the
        # Triton kernel.
        cudnn = call.q.is_cuda and call.q.dtype in (torch.float16, torch.bfloat16)
        refused: list[str] = []
        _, decision = guarded_attention(
            call.q.view(shape),
            call.k.view(shape),
            call.v.view(shape),
            causal=True,
            scale=c.head_dim**-0.5,
            threshold=plan.poly_guard,
            chunk=plan.poly_chunk,
            exact_prefix=min(plan.poly_exact_prefix, s),
            precision=precision,
            out=out.view(shape),
            exact_kwargs=exact_kwargs,
            polynomial_kwargs=polynomial_kwargs(plan),
            row_norm=plan.poly_norm == "row",
            stats_first=plan.poly_stats_first,
            exact_fn=_cudnn_or_triton(exact_kwargs, refused) if cudnn else None,
            exact_label="cuDNN" if cudnn else "Triton",
        )
        if refused:  # the decision names the path that ran
            decision = dataclasses.replace(
                decision,
                reason=decision.reason.replace(
                    "(cuDNN)", f"(Triton: cuDNN refused the call: {refused[0]})"
                ),
            )
        call.guard_log.append(decision)
        return out

    def workspace_bytes(self, plan: Any, config: TransformerConfig, batch: int) -> int:
        """Guard and exact-path bookkeeping (with cuDNN's half context on the exact path,
        before its copy into the output), and the chunk states of ``batch`` sequences."""
        bookkeeping = batch * config.num_heads * config.seq_len * 4
        bookkeeping += batch * config.seq_len * config.d_model * 2
        try:
            from kernels.polynomial import workspace_bytes

            states = workspace_bytes(
                batch=batch,
                seq_len=config.seq_len,
                num_heads=config.num_heads,
                head_dim=config.head_dim,
                chunk=plan.poly_chunk,
                precision=triton_precision(plan.attn_precision),
            )
        except (ImportError, ValueError):  # no triton, or a config the plan check refuses
            hd = config.head_dim
            n_chunks = -(-config.seq_len // plan.poly_chunk)
            states = batch * config.num_heads * n_chunks * (1 + hd + hd * hd) * (hd + 1) * 4
        return int(bookkeeping + states)
