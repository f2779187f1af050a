"""The project's fused Triton attention (``kernels.attention``): online softmax, scores
never stored; any key mask applied on the device, so no call inspects the mask on the
host (no sync), whatever ``mask`` says."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from autotune.backends.base import AttentionBackend, AttentionCall, register
from autotune.backends.precision import context_dtype, half_qkv, triton_precision
from autotune.core.device import DeviceInfo
from autotune.core.reference import TransformerConfig


def tiles(plan: Any, warp_specialize: bool = False) -> Any:
    """The plan's attention tiles (``attn_block_m/n``, ``attn_warps``, ``attn_stages``); for
    the warp-specialised form ``attn_block_m`` is each consumer warpgroup's rows, so a
    program holds twice that."""
    from kernels._common import Tiles

    rows = plan.attn_block_m * (2 if warp_specialize else 1)
    return Tiles(rows, plan.attn_block_n, plan.attn_warps, plan.attn_stages)


WS_CONSUMER_ROWS = (64, 128)  # attn_block_m with attn_ws: a program of 128 or 256 rows


def attention_kernel_reasons(
    plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
) -> list[str]:
    from kernels import attention as tri_attn

    def reasons(warp_specialize: bool) -> list[str]:
        return tri_attn.not_supported_reasons(
            head_dim=config.head_dim,
            seq_len=config.seq_len,
            **tiles(plan, warp_specialize).kwargs(),
            precision=triton_precision(plan.attn_precision),
            device_type=device.type,
            capability=device.capability,
            smem_bytes=device.smem_per_block or None,
            prune_pointless=prune,
            head_chunk=plan.attn_head_chunk,
            half_inputs=half_qkv(plan),
            warp_specialize=warp_specialize,
        )

    found = reasons(False)  # the flash form: a call with a key mask runs it
    if not plan.attn_ws:
        return found
    if plan.attn_block_m not in WS_CONSUMER_ROWS:
        found.append(
            f"attn_ws=True takes attn_block_m {WS_CONSUMER_ROWS[0]} or {WS_CONSUMER_ROWS[1]} "
            "(each consumer warpgroup's rows; a program holds twice that), got "
            f"{plan.attn_block_m}"
        )
    else:
        found += [r for r in reasons(True) if r not in found]
    if plan.attn_maxnreg:
        found.append(
            f"attn_ws=True runs the warp-specialised kernel, whose warpgroups Triton sizes "
            f"itself; attn_maxnreg={plan.attn_maxnreg} caps the flash form's: drop one"
        )
    if plan.mask != "elide":
        found.append(
            f"attn_ws=True takes no key mask: it needs mask=elide (an all-valid mask dropped "
            f"after a look on the host; any other runs the flash form), got mask={plan.mask}"
        )
    return found


@register
class TritonAttention(AttentionBackend):
    value = "triton"
    rank = 5
    needs = "CUDA with triton, or TRITON_INTERPRET=1 on the CPU"
    triton = True

    def needs_mask_kind(self, plan: Any) -> bool:
        # Any mask is applied on the device, so no call needs the mask's kind, but for the
        # warp-specialised form with mask=elide: it takes no key mask, so an all-valid mask
        # is dropped after a look on the host (one sync: case 14's oracle-judged plans)
        # and a real one sends the call to the flash form.
        return bool(plan.attn_ws) and plan.mask == "elide"

    def kernel_reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        return attention_kernel_reasons(plan, config, device, prune=prune)

    def attend(self, call: AttentionCall) -> Tensor:
        from kernels.attention import attention, key_mask_bounds

        c = call.config
        # mask_bounds: one small launch finds each sequence's all-valid key prefix and last
        # valid key; key blocks inside the prefix skip the mask, blocks past the end are
        # skipped (an all-True mask then costs what no mask costs). Same result.
        bounds = (
            key_mask_bounds(call.mask) if call.plan.mask_bounds and call.mask is not None else None
        )
        b, s, d = call.q.shape
        shape = (b, s, c.num_heads, c.head_dim)
        # the warp-specialised form takes no key mask: a masked call runs the flash form
        ws = bool(call.plan.attn_ws) and call.mask is None
        out = torch.empty(b, s, d, device=call.q.device, dtype=context_dtype(call.plan))
        attention(
            call.q.view(shape),
            call.k.view(shape),
            call.v.view(shape),
            causal=c.causal,
            key_mask=call.mask,  # exact for every mask; None: no mask
            key_bounds=bounds,
            out=out.view(shape),
            **tiles(call.plan, ws).kwargs(),
            precision=triton_precision(call.plan.attn_precision),
            maxnreg=call.plan.attn_maxnreg,
            head_chunk=call.plan.attn_head_chunk,
            warp_specialize=ws,
        )
        return out
