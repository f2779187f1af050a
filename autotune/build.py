"""The builder: plan + config -> an nn.Module with the reference's names and signature.

``not_supported_reasons(plan, config, device)`` says, before any work, why a plan cannot
run on a case and device (xformers style). ``build_candidate`` returns a
``CandidateTransformer``: a subclass of the reference (so the state dict is the same)
whose forward follows the plan. Derived weights (packed QKV, fp16 copies) are made once
per weight version, never per call. Inputs the plan has no fast path for (a general
mask, a shape its CUDA graph was not captured for) take a slower path that is still
right: a candidate is a drop-in for the reference on every input.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from autotune.core.device import DeviceInfo, triton_usable
from autotune.core.reference import LAYERNORM_EPS, ReferenceTransformer, TransformerConfig
from autotune.plan import Plan

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

# Mask kinds found at run time (never assumed).
MASK_NONE = "none"  # no mask given, or an all-True mask that the plan may drop
MASK_RIGHT_PADDED = "right-padded"  # every row is a prefix of True
MASK_GENERAL = "general"


class UnsupportedPlan(ValueError):
    """Raised when a plan cannot be built for a case/device; carries every reason."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


def not_supported_reasons(
    plan: Plan, config: TransformerConfig, device: DeviceInfo, *, prune: bool = False
) -> list[str]:
    """Every reason the plan cannot run on this case and device (empty: supported).

    ``prune`` adds reasons a search should skip a plan that would run but waste its
    time (Triton tiles larger than the padded sequence)."""
    reasons: list[str] = []
    cuda = device.type == "cuda"
    cap = device.capability or (0, 0)
    for what, prec in (
        ("attn_precision", plan.attn_precision),
        ("gemm_precision", plan.gemm_precision),
    ):
        if prec == "bf16" and cuda and cap < (8, 0):
            reasons.append(f"{what}=bf16 needs sm_80+, device is {device.sm}")
    att = plan.attention
    if att == "sdpa_efficient" and not cuda:
        reasons.append("attention=sdpa_efficient needs CUDA (the CPU has math and flash only)")
    if att in ("sdpa_flash", "sdpa_cudnn") and cuda:
        if plan.attn_precision not in ("fp16", "bf16"):
            reasons.append(
                f"attention={att} on CUDA needs attn_precision fp16 or bf16, "
                f"got {plan.attn_precision}"
            )
        if cap < (8, 0):
            reasons.append(f"attention={att} needs sm_80+, device is {device.sm}")
        if config.head_dim % 8 != 0 or config.head_dim > 256:
            reasons.append(
                f"attention={att} needs head_dim a multiple of 8 and <= 256, got {config.head_dim}"
            )
    if att == "sdpa_cudnn" and not cuda:
        reasons.append("attention=sdpa_cudnn needs CUDA")
    if att == "sdpa_efficient" and cuda and config.head_dim > 256:
        reasons.append(f"attention=sdpa_efficient needs head_dim <= 256, got {config.head_dim}")
    if plan.uses_triton:
        ok, why = triton_usable(device)
        if not ok:
            reasons.append(why)
        elif att in ("triton", "polynomial"):  # polynomial: the guard's exact path
            from kernels import attention as tri_attn

            reasons += tri_attn.not_supported_reasons(
                head_dim=config.head_dim,
                seq_len=config.seq_len,
                block_m=plan.attn_block_m,
                block_n=plan.attn_block_n,
                num_warps=plan.attn_warps,
                num_stages=plan.attn_stages,
                precision=_triton_precision(plan.attn_precision),
                device_type=device.type,
                capability=device.capability,
                smem_bytes=device.smem_per_block or None,
                prune_pointless=prune,
            )
    if plan.fused_block and triton_usable(device)[0]:
        from kernels import block as fused

        if plan.gemm_precision != plan.attn_precision:
            reasons.append(
                "fused_block runs every product at one operand precision: set gemm_precision "
                f"= attn_precision ({plan.attn_precision}), got {plan.gemm_precision}"
            )
        reasons += fused.not_supported_reasons(
            seq_len=config.seq_len,
            d_model=config.d_model,
            num_heads=config.num_heads,
            ffn_dim=config.ffn_dim,
            block_m=plan.attn_block_m,
            num_warps=plan.attn_warps,
            num_stages=plan.attn_stages,
            precision=_triton_precision(plan.attn_precision),
            device_type=device.type,
            capability=device.capability,
            smem_bytes=device.smem_per_block or None,
        )
    if att == "polynomial":
        if not config.causal:
            reasons.append("attention=polynomial needs a causal model (its scan is causal)")
        if plan.cuda_graph:
            reasons.append(
                "attention=polynomial reads its guard on the host each layer; set cuda_graph false"
            )
        if triton_usable(device)[0]:
            from kernels import polynomial as poly

            reasons += poly.not_supported_reasons(
                head_dim=config.head_dim,
                chunk=plan.poly_chunk,
                precision=_triton_precision(plan.attn_precision),
                capability=device.capability,
                device_type=device.type,
                smem_bytes=device.smem_per_block or None,
            )
    if plan.query_chunk and att != "reference":
        reasons.append(
            f"query_chunk={plan.query_chunk} applies to attention=reference (the fused "
            f"backends never hold the scores), got attention={att}"
        )
    if plan.host_io:
        if not cuda:
            reasons.append("host_io=true needs CUDA (on the CPU the input is already host memory)")
        if plan.cuda_graph:
            reasons.append("host_io=true streams chunks through the device; set cuda_graph false")
    if plan.cuda_graph and not cuda:
        reasons.append("cuda_graph=true needs CUDA")
    if plan.compile in ("reduce-overhead", "max-autotune"):
        if not cuda:
            reasons.append(f"compile={plan.compile} needs CUDA (it captures CUDA graphs)")
        if plan.cuda_graph:
            reasons.append(
                f"compile={plan.compile} already captures CUDA graphs; set cuda_graph false"
            )
    if plan.compile != "none" and plan.uses_triton:
        reasons.append(
            "compile with the project's Triton kernels is not supported; set compile none"
        )
    return reasons


def _triton_precision(prec: str) -> str:
    return "tf32" if prec == "fp32" else prec


@contextlib.contextmanager
def _matmul_precision(prec: str) -> Iterator[None]:
    """``ieee``: turn TF32 off for the ops inside; other precisions leave flags alone."""
    if prec != "ieee":
        yield
        return
    prev = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def _sdpa_backend(name: str) -> Any:
    from torch.nn.attention import SDPBackend

    return {
        "sdpa_math": SDPBackend.MATH,
        "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
        "sdpa_flash": SDPBackend.FLASH_ATTENTION,
        "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    }[name]


def classify_mask(mask: Tensor | None) -> str:
    """What the mask is, checked on its values (one host sync)."""
    if mask is None:
        return MASK_NONE
    if mask.dim() != 2 or mask.dtype != torch.bool:
        raise ValueError(
            f"valid_token_mask must be a bool tensor [B, S], got {mask.dtype} {tuple(mask.shape)}"
        )
    all_valid = mask.all()
    prefix = (mask[:, 1:] <= mask[:, :-1]).all() & mask[:, 0].all()
    flags = torch.stack([all_valid, prefix]).tolist()
    if flags[0]:
        return MASK_NONE
    if flags[1]:
        return MASK_RIGHT_PADDED
    return MASK_GENERAL


class _LayerWeights:
    """The tensors one layer's forward reads. Plain parameters are referenced, not copied;
    derived tensors (packed QKV, fp16/bf16 copies) are made here, once per weight version."""

    __slots__ = (
        "ffn_in_b",
        "ffn_in_w",
        "ffn_out_b",
        "ffn_out_w",
        "k",
        "n1",
        "n2",
        "out_b",
        "out_w",
        "q",
        "qkv_b",
        "qkv_w",
        "sources",
        "v",
    )

    def __init__(self, layer: Any, plan: Plan) -> None:
        att = layer.attention
        gdt = _DTYPES.get(plan.gemm_precision)
        self.sources: list[Tensor] = []  # parameters that derived tensors were made from

        def cast(t: Tensor) -> Tensor:
            if gdt is None:
                return t
            self.sources.append(t)
            return t.detach().to(gdt)

        self.n1 = (layer.norm1.weight, layer.norm1.bias)
        self.n2 = (layer.norm2.weight, layer.norm2.bias)
        if plan.qkv == "packed":
            parts_w = [att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]
            parts_b = [att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]
            self.sources += parts_w + parts_b
            self.qkv_w = torch.cat([p.detach() for p in parts_w], 0)
            self.qkv_b = torch.cat([p.detach() for p in parts_b], 0)
            if gdt is not None:
                self.qkv_w, self.qkv_b = self.qkv_w.to(gdt), self.qkv_b.to(gdt)
        else:
            self.q = (cast(att.q_proj.weight), cast(att.q_proj.bias))
            self.k = (cast(att.k_proj.weight), cast(att.k_proj.bias))
            self.v = (cast(att.v_proj.weight), cast(att.v_proj.bias))
        self.out_w, self.out_b = cast(att.out_proj.weight), cast(att.out_proj.bias)
        self.ffn_in_w, self.ffn_in_b = cast(layer.ffn_in.weight), cast(layer.ffn_in.bias)
        self.ffn_out_w, self.ffn_out_b = cast(layer.ffn_out.weight), cast(layer.ffn_out.bias)


def _version(t: Tensor) -> int:
    """A tensor's in-place version (inference tensors keep none: -1)."""
    return -1 if t.is_inference() else t._version


class CandidateTransformer(ReferenceTransformer):
    """The reference's parameters with a forward that follows a plan."""

    def __init__(self, config: TransformerConfig, plan: Plan, device: DeviceInfo) -> None:
        super().__init__(config)
        reasons = not_supported_reasons(plan, config, device)
        if reasons:
            raise UnsupportedPlan(reasons)
        self.plan = plan
        self.device_info = device
        self._weights: list[_LayerWeights] | None = None
        self._weights_version: tuple[int, ...] | None = None
        self._graphs: dict[tuple[Any, ...], _CapturedForward] = {}
        self._block: Any = None  # fused-block weights (views of the parameters)
        self.last_route: str = ""
        # Polynomial attention: the guard's decision for every layer (and batch chunk) of
        # the last forward, in order: what ran, and why.
        self.guard_log: list[Any] = []
        self._core: Callable[..., Tensor] = self._forward_core
        if plan.compile != "none":
            _raise_dynamo_limits()
            self._core = torch.compile(self._forward_core, mode=plan.compile, dynamic=False)

    # --- weights --------------------------------------------------------------------
    def _weight_version(self) -> tuple[int, ...]:
        """Versions and storage of the parameters that derived tensors were made from."""
        if self._weights is None:
            return ()
        return tuple(
            v for w in self._weights for p in w.sources for v in (_version(p), p.data_ptr())
        )

    def prepared_weights(self) -> list[_LayerWeights]:
        if self._weights is None or self._weight_version() != self._weights_version:
            with torch.no_grad():
                self._weights = [_LayerWeights(layer, self.plan) for layer in self.layers]
            self._weights_version = self._weight_version()
            self._graphs.clear()  # graphs read derived weights captured at this version
        return self._weights

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # .to()/.cuda()/.half() replace parameter storage: derived weights must be remade.
        self._weights = None
        self._block = None
        self._graphs.clear()
        return super()._apply(fn, recurse)

    # --- forward --------------------------------------------------------------------
    def forward(self, x: Tensor, valid_token_mask: Tensor | None = None) -> Tensor:
        c = self.config
        if x.dim() != 3 or x.shape[-1] != c.d_model:
            raise ValueError(f"x must be [B, S, {c.d_model}], got {tuple(x.shape)}")
        if valid_token_mask is not None and valid_token_mask.shape != x.shape[:2]:
            raise ValueError(
                f"valid_token_mask must be {tuple(x.shape[:2])}, got "
                f"{tuple(valid_token_mask.shape)}"
            )
        if self.plan.mask == "elide" or self.plan.fused_block:
            # The fused block takes right padding as key lengths: the mask is classified
            # (verified on its values) and a general mask takes the unfused path.
            kind = classify_mask(valid_token_mask)
        else:
            kind = MASK_NONE if valid_token_mask is None else MASK_GENERAL
        weights = self.prepared_weights()
        self.guard_log = []
        home = self.final_norm.weight.device
        if home.type == "cuda" and x.device.type == "cpu":
            self.last_route = f"host-streamed mask={kind}"
            return self._host_streamed(x, valid_token_mask, kind, weights, home)
        if self.plan.cuda_graph and x.is_cuda:
            return self._graph_forward(x, valid_token_mask, kind, weights)
        self.last_route = f"eager mask={kind}"
        return self._chunked(x, valid_token_mask, kind, weights)

    def _host_streamed(
        self,
        x: Tensor,
        mask: Tensor | None,
        kind: str,
        weights: list[_LayerWeights],
        device: torch.device,
    ) -> Tensor:
        """Input and output stay in host memory; batch chunks travel to the device and
        back on a copy stream, the next chunk's upload and the last chunk's download
        overlapped with compute. Pinned host memory makes the copies asynchronous."""
        b = x.shape[0]
        chunk = self.plan.batch_chunk if 0 < self.plan.batch_chunk < b else b
        out = torch.empty(x.shape, dtype=x.dtype, pin_memory=x.is_pinned())
        compute = torch.cuda.current_stream(device)
        copy = torch.cuda.Stream(device)
        use_mask = mask is not None and kind != MASK_NONE

        def upload(start: int) -> tuple[Tensor, Tensor | None, torch.cuda.Event]:
            with torch.cuda.stream(copy):
                xs = x[start : start + chunk].to(device, non_blocking=True)
                ms = mask[start : start + chunk].to(device, non_blocking=True) if use_mask else None
                ready = torch.cuda.Event()
                ready.record(copy)
            return xs, ms, ready

        starts = list(range(0, b, chunk))
        nxt = upload(starts[0])
        for i, start in enumerate(starts):
            xs, ms, ready = nxt
            compute.wait_event(ready)
            xs.record_stream(compute)
            if ms is not None:
                ms.record_stream(compute)
            if i + 1 < len(starts):
                nxt = upload(starts[i + 1])
            y = self._core(xs, ms, kind, weights)
            done = torch.cuda.Event()
            done.record(compute)
            with torch.cuda.stream(copy):
                copy.wait_event(done)
                out[start : start + chunk].copy_(y, non_blocking=True)
                y.record_stream(copy)
            del xs, ms, y
        copy.synchronize()  # the host reads ``out`` as soon as this returns
        return out

    def _chunked(
        self, x: Tensor, mask: Tensor | None, kind: str, weights: list[_LayerWeights]
    ) -> Tensor:
        chunk = self.plan.batch_chunk
        if chunk <= 0 or chunk >= x.shape[0]:
            return self._core(x, mask if kind != MASK_NONE else None, kind, weights)
        out = torch.empty_like(x)
        for start in range(0, x.shape[0], chunk):
            sl = slice(start, start + chunk)
            m = mask[sl] if (mask is not None and kind != MASK_NONE) else None
            out[sl] = self._core(x[sl], m, kind, weights)
        return out

    def _graph_forward(
        self, x: Tensor, mask: Tensor | None, kind: str, weights: list[_LayerWeights]
    ) -> Tensor:
        key = (
            tuple(x.shape),
            x.dtype,
            x.device,
            kind,
            torch.is_inference_mode_enabled(),
            torch.backends.cuda.matmul.allow_tf32,
            torch.get_float32_matmul_precision(),
        )
        graph = self._graphs.get(key)
        if graph is None:
            graph = _CapturedForward(lambda xx, mm: self._chunked(xx, mm, kind, weights), x, mask)
            self._graphs[key] = graph
        self.last_route = f"graph mask={kind}"
        return graph.replay(x, mask)

    def _forward_core(
        self, x: Tensor, mask: Tensor | None, kind: str, weights: list[_LayerWeights]
    ) -> Tensor:
        if self.plan.fused_block and kind != MASK_GENERAL:
            return self._fused_forward(x, mask)
        return self._unfused_forward(x, mask, kind, weights)

    def _fused_forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        from kernels import block as fused

        if self._block is None:
            self._block = fused.weights_from_model(self)
        layers, final = self._block
        lengths = None if mask is None else mask.sum(dim=1, dtype=torch.int32)
        return fused.fused_forward(
            x.contiguous(),
            layers,
            final,
            num_heads=self.config.num_heads,
            causal=self.config.causal,
            key_lengths=lengths,
            precision=_triton_precision(self.plan.attn_precision),
            block_m=self.plan.attn_block_m,
            num_warps=self.plan.attn_warps,
            num_stages=self.plan.attn_stages,
        )

    def _unfused_forward(
        self, x: Tensor, mask: Tensor | None, kind: str, weights: list[_LayerWeights]
    ) -> Tensor:
        zero_rows = mask is not None
        keep = None if mask is None else mask.unsqueeze(-1)
        use_triton_ln = self.plan.layernorm == "triton"
        h = None
        for i, (_layer, w) in enumerate(zip(self.layers, weights, strict=True)):
            if h is None:
                h = self._layernorm(x, w.n1)
            a = self._attention(h, mask, kind, w)
            if use_triton_ln:
                from kernels.layernorm import add_layernorm

                x, h = add_layernorm(x, a, *w.n2, eps=LAYERNORM_EPS)
            else:
                x = x + a
                h = self._layernorm(x, w.n2)
            f = self._ffn(h, w)
            last = i == len(self.layers) - 1
            nxt = self.final_norm if last else self.layers[i + 1].norm1
            if use_triton_ln:
                from kernels.layernorm import add_layernorm

                x, h = add_layernorm(
                    x,
                    f,
                    nxt.weight,
                    nxt.bias,
                    eps=LAYERNORM_EPS,
                    row_mask=mask.reshape(-1) if mask is not None else None,
                    zero_sum_rows=zero_rows,
                    zero_out_rows=zero_rows and last,
                )
            else:
                x = x + f
                if keep is not None:
                    x = x.masked_fill(~keep, 0.0)
                h = None
        if h is None or not use_triton_ln:
            h = F.layer_norm(
                x,
                (self.config.d_model,),
                self.final_norm.weight,
                self.final_norm.bias,
                LAYERNORM_EPS,
            )
            if keep is not None:
                h = h.masked_fill(~keep, 0.0)
        return h

    def _layernorm(self, x: Tensor, wb: tuple[Tensor, Tensor]) -> Tensor:
        return F.layer_norm(x, (self.config.d_model,), wb[0], wb[1], LAYERNORM_EPS)

    def _linear(self, x: Tensor, weight: Tensor, bias: Tensor, keep_half: bool = False) -> Tensor:
        """x @ W^T + b at the plan's GEMM precision; fp32 out unless ``keep_half``."""
        prec = self.plan.gemm_precision
        if prec in _DTYPES:
            y = F.linear(x.to(_DTYPES[prec]), weight, bias)
            return y if keep_half else y.float()
        with _matmul_precision(prec):
            return F.linear(x, weight, bias)

    def _ffn(self, h: Tensor, w: _LayerWeights) -> Tensor:
        act = self.plan.ffn_act
        if act == "torch":
            inner = F.gelu(self._linear(h, w.ffn_in_w, w.ffn_in_b))
        elif act == "triton_epilogue":
            from kernels.ffn import bias_gelu

            prec = self.plan.gemm_precision
            if prec in _DTYPES:
                y = F.linear(h.to(_DTYPES[prec]), w.ffn_in_w).float()
            else:
                with _matmul_precision(prec):
                    y = F.linear(h, w.ffn_in_w)
            inner = bias_gelu(y, w.ffn_in_b.float(), inplace=True)
        else:
            from kernels.ffn import linear_gelu

            shape = h.shape
            inner = linear_gelu(
                h.reshape(-1, shape[-1]),
                w.ffn_in_w,
                w.ffn_in_b,
                precision=_triton_precision(self.plan.gemm_precision),
            ).view(*shape[:-1], -1)
        return self._linear(inner, w.ffn_out_w, w.ffn_out_b)

    # --- attention ------------------------------------------------------------------
    def _attention(self, h: Tensor, mask: Tensor | None, kind: str, w: _LayerWeights) -> Tensor:
        _b, _s, d = h.shape
        # fp16/bf16 GEMMs feeding attention of the same precision hand over their half
        # output as is: no round trip through fp32 (two kernels and 3x the bytes saved).
        keep = self.plan.gemm_precision == self.plan.attn_precision in _DTYPES
        if self.plan.qkv == "packed":
            qkv = self._linear(h, w.qkv_w, w.qkv_b, keep_half=keep)
            q, k, v = qkv.split(d, dim=-1)
        else:
            q = self._linear(h, *w.q, keep_half=keep)
            k = self._linear(h, *w.k, keep_half=keep)
            v = self._linear(h, *w.v, keep_half=keep)
        if self.plan.attention == "polynomial" and kind != MASK_GENERAL:
            context = self._polynomial_attention(q, k, v)
        elif self.plan.attention in ("triton", "polynomial") and kind != MASK_GENERAL:
            context = self._triton_attention(q, k, v, mask, kind)
        else:
            context = self._torch_attention(q, k, v, mask, kind)
        out = self._linear(context, w.out_w, w.out_b)
        if mask is not None:
            out = out.masked_fill(~mask.unsqueeze(-1), 0.0)
        return out

    def _triton_attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, kind: str
    ) -> Tensor:
        from kernels.attention import attention as triton_attention

        c = self.config
        b, s, d = q.shape
        shape = (b, s, c.num_heads, c.head_dim)
        lengths = None
        # Causal + right padding: valid rows never see a padded key, so the key mask is a
        # no-op there; non-causal right padding is a key-length bound.
        if mask is not None and not (c.causal and kind == MASK_RIGHT_PADDED):
            lengths = mask.sum(dim=1, dtype=torch.int32)
        out = torch.empty(b, s, d, device=q.device, dtype=torch.float32)
        triton_attention(
            q.view(shape),
            k.view(shape),
            v.view(shape),
            causal=c.causal,
            key_lengths=lengths,
            out=out.view(shape),
            block_m=self.plan.attn_block_m,
            block_n=self.plan.attn_block_n,
            num_warps=self.plan.attn_warps,
            num_stages=self.plan.attn_stages,
            precision=_triton_precision(self.plan.attn_precision),
        )
        return out

    def _polynomial_attention(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Guarded polynomial attention (causal; with right padding the key mask is a
        no-op for valid rows, and padded rows are zeroed after out_proj). The guard's
        decision is appended to ``guard_log``."""
        from kernels.polynomial import guarded_attention

        c = self.config
        b, s, d = q.shape
        shape = (b, s, c.num_heads, c.head_dim)
        out = torch.empty(b, s, d, device=q.device, dtype=torch.float32)
        precision = _triton_precision(self.plan.attn_precision)
        _, decision = guarded_attention(
            q.view(shape),
            k.view(shape),
            v.view(shape),
            causal=True,
            scale=c.head_dim**-0.5,
            threshold=self.plan.poly_guard,
            chunk=self.plan.poly_chunk,
            exact_prefix=min(self.plan.poly_exact_prefix, s),
            precision=precision,
            out=out.view(shape),
            exact_kwargs={
                "block_m": self.plan.attn_block_m,
                "block_n": self.plan.attn_block_n,
                "num_warps": self.plan.attn_warps,
                "num_stages": self.plan.attn_stages,
                "precision": precision,
            },
        )
        self.guard_log.append(decision)
        return out

    def _torch_attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, kind: str
    ) -> Tensor:
        c = self.config
        b, s, d = q.shape

        def heads(t: Tensor) -> Tensor:
            t = t.view(b, s, c.num_heads, c.head_dim).transpose(1, 2)
            return t.contiguous() if self.plan.heads == "contiguous" else t

        q, k, v = heads(q), heads(k), heads(v)
        prec = self.plan.attn_precision
        if prec in _DTYPES:
            q, k, v = q.to(_DTYPES[prec]), k.to(_DTYPES[prec]), v.to(_DTYPES[prec])
        scale = c.head_dim**-0.5
        # The key mask is needed unless it was proven a no-op: all-True (kind none), or
        # causal with right padding (valid rows only see valid keys; padded rows are
        # zeroed after out_proj).
        need_key_mask = mask is not None and not (c.causal and kind == MASK_RIGHT_PADDED)
        with _matmul_precision(prec):
            if self.plan.attention == "reference" or (
                self.plan.attention in ("triton", "polynomial") and kind == MASK_GENERAL
            ):
                ctx = _reference_attention(
                    q, k, v, mask if need_key_mask else None, c.causal, scale, self.plan.query_chunk
                )
            else:
                ctx = self._sdpa(q, k, v, mask if need_key_mask else None, scale)
        return ctx.transpose(1, 2).reshape(b, s, d).float()

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
        from torch.nn.attention import sdpa_kernel

        c = self.config
        backend = self.plan.attention
        attn_mask = None
        is_causal = c.causal
        if mask is not None:
            attn_mask = mask[:, None, None, :]
            if c.causal:
                s = q.shape[-2]
                tril = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
                attn_mask = attn_mask & tril
            is_causal = False
            if backend == "sdpa_flash":
                # Flash takes no explicit mask: a general mask goes to a backend that does.
                backend = "sdpa_efficient" if q.is_cuda else "sdpa_math"
        if backend == "sdpa_auto":  # PyTorch's own choice: what a user swapping in SDPA gets
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale
            )
        with sdpa_kernel(_sdpa_backend(backend)):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale
            )


def _reference_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_mask: Tensor | None,
    causal: bool,
    scale: float,
    query_chunk: int = 0,
) -> Tensor:
    """The reference's attention arithmetic; with ``query_chunk`` the query rows go in
    prefix chunks: rows [i0, i1) against keys [0, i1) when causal (the keys after i1 are
    masked for every row of the chunk anyway), so only one chunk's scores exist at once."""
    s = q.shape[-2]
    if 0 < query_chunk < s:
        parts = []
        for i0 in range(0, s, query_chunk):
            i1 = min(s, i0 + query_chunk)
            kend = i1 if causal else s
            parts.append(
                _attention_block(
                    q[..., i0:i1, :],
                    k[..., :kend, :],
                    v[..., :kend, :],
                    key_mask,
                    causal,
                    scale,
                    i0,
                )
            )
        return torch.cat(parts, dim=-2)
    return _attention_block(q, k, v, key_mask, causal, scale, 0)


def _attention_block(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool, scale: float, i0: int
) -> Tensor:
    rows, keys = q.shape[-2], k.shape[-2]
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        row = torch.arange(i0, i0 + rows, device=q.device)[:, None]
        col = torch.arange(keys, device=q.device)[None, :]
        scores = scores.masked_fill(col > row, float("-inf"))
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask[:, None, None, :keys], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)


class _CapturedForward:
    """One CUDA graph of the whole forward for a fixed shape and mask contract.

    The mask kind the graph was captured under is part of its key: every call checks
    the kind again, so a graph captured on an all-True mask never serves a padded input.
    """

    def __init__(
        self, fn: Callable[[Tensor, Tensor | None], Tensor], x: Tensor, mask: Tensor | None
    ) -> None:
        self.static_x = x.clone()
        self.static_mask = mask.clone() if mask is not None else None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: lazy init, cuBLAS handles, autotuning
                fn(self.static_x, self.static_mask)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_out = fn(self.static_x, self.static_mask)

    def replay(self, x: Tensor, mask: Tensor | None) -> Tensor:
        self.static_x.copy_(x)
        if self.static_mask is not None and mask is not None:
            self.static_mask.copy_(mask)
        self.graph.replay()
        return self.static_out.clone()


def _raise_dynamo_limits() -> None:
    """Many shapes in one process must not hit the recompile limit and silently run eager."""
    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 256))
    if hasattr(cfg, "accumulated_cache_size_limit"):
        cfg.accumulated_cache_size_limit = max(cfg.accumulated_cache_size_limit, 4096)
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4096)
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        cfg.fail_on_recompile_limit_hit = True


def build_candidate(
    plan: Plan,
    config: TransformerConfig,
    device: DeviceInfo,
    state_dict: dict[str, Tensor] | None = None,
) -> CandidateTransformer:
    """Build the module for a plan, load weights, move to the device, eval mode."""
    model = CandidateTransformer(config, plan, device)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model.to(device.torch_device).eval()
