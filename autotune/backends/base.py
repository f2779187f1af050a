"""The registry: one object per implementation choice of a plan knob.

A backend declares which knob value it implements, what it needs (in words, for
``autotune knobs``), whether it runs the project's Triton kernels, the reasons it cannot
run a plan on a case and device (``reasons``, always; ``kernel_reasons``, only where
Triton can run at all), and, by family, its forward and its working memory. Knob values
of ``attention``, ``layernorm``, ``ffn_act``, ``fused_block`` and ``fused_layer`` are the registered
values; the builder, the memory model and the plan ask the registry instead of
branching on names. Adding a backend is one new module that registers a class.

Plans are passed in as they are (anything with the knobs as attributes): this package
sits below ``autotune.plan``, which takes its knob values from here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
from torch import Tensor

from autotune.backends import precision
from autotune.core.device import DeviceInfo, triton_usable
from autotune.core.reference import TransformerConfig

# Mask kinds found at run time (never assumed).
MASK_NONE = "none"  # no mask given, or an all-True mask that the plan may drop
MASK_RIGHT_PADDED = "right-padded"  # every row is a prefix of True
MASK_GENERAL = "general"


class Backend:
    """One value of one knob. Subclasses set the class attributes and override hooks."""

    knob: ClassVar[str]
    value: ClassVar[Any]
    needs: ClassVar[str] = ""  # what it needs, in words ("" = any device)
    triton: ClassVar[bool] = False  # runs the project's Triton kernels
    rank: ClassVar[int] = 0  # where the value stands among its knob's values

    def reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        """Why the plan cannot run on this case and device (empty: it can)."""
        return []

    def kernel_reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        """Reasons of the Triton kernels' own checks; asked only where Triton runs."""
        return []


@dataclasses.dataclass
class AttentionCall:
    """One attention call: projections ``[B, S, D]`` (fp32, or the half operand type when
    the GEMMs hand theirs over), the mask and its kind, the plan and the case."""

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    kind: str
    plan: Any
    config: TransformerConfig
    guard_log: list[Any]  # polynomial attention appends its guard's decision


class AttentionBackend(Backend):
    knob = "attention"
    general_masks: ClassVar[bool] = True  # False: a general mask takes the reference path
    takes_query_chunk: ClassVar[bool] = False

    def reasons(
        self, plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool
    ) -> list[str]:
        reasons = []
        if plan.query_chunk and not self.takes_query_chunk:
            reasons.append(
                f"query_chunk={plan.query_chunk} applies to attention=reference (the fused "
                f"backends never hold the scores), got attention={self.value}"
            )
        if self.value != "polynomial":
            for knob in (
                "poly_stats_first",
                "poly_out_block_n",
                "poly_out_stages",
                "poly_prefix_flat",
                "poly_prefix_stages",
            ):
                if getattr(plan, knob):
                    reasons.append(
                        f"{knob}={getattr(plan, knob)} applies to attention=polynomial (its "
                        f"kernels), got attention={self.value}"
                    )
        return reasons

    def needs_mask_kind(self, plan: Any) -> bool:
        """Whether a call must know the mask's kind (none, right-padded, general), which
        is read on the host (one sync): to drop a mask proven a no-op (``mask=elide``), or
        to send a general mask elsewhere (``general_masks`` False)."""
        return plan.mask == "elide" or not self.general_masks

    def attend(self, call: AttentionCall) -> Tensor:
        """The attention context ``[B, S, D]`` before ``out_proj``: float32, or the half
        operand type of the plan's GEMMs (``precision.context_dtype``), which the output
        projection rounds to anyway."""
        raise NotImplementedError

    def workspace_bytes(self, plan: Any, config: TransformerConfig, batch: int) -> int:
        """Bytes it holds beyond the projections for ``batch`` sequences (scores, log-sum-exp,
        masks, states)."""
        return 0


class NormBackend(Backend):
    knob = "layernorm"
    # Takes a half ``delta`` and writes a half normed output in the same pass (no cast
    # kernels around it): the per-layer path then hands half GEMM operands along.
    half_io: ClassVar[bool] = False

    def add_norm(
        self,
        x: Tensor,
        delta: Tensor | None,
        weight: Tensor,
        bias: Tensor,
        rows: Tensor | None = None,
        zero_out: bool = False,
        out_dtype: torch.dtype = torch.float32,
        out: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``x + delta`` (fp32; ``delta`` may be half; None: ``x`` itself, the first
        layer's LayerNorm) and its LayerNorm as ``out_dtype``; with ``rows`` (the token
        mask) the sum's padded rows are zeroed, and with ``zero_out`` the normed output's
        too. ``out`` (the stack's last LayerNorm: the forward's output buffer): the
        LayerNorm is written there, and the sum, which nothing reads after it, need not be
        stored (the returned sum may then be ``x``)."""
        raise NotImplementedError


class FfnBackend(Backend):
    knob = "ffn_act"
    half_io: ClassVar[bool] = False  # reads and writes half operands without cast kernels

    def inner(
        self, h: Tensor, weight: Tensor, bias: Tensor, gemm_precision: str, half: bool = False
    ) -> Tensor:
        """``GELU(h @ weight^T + bias)`` (the exact GELU; ``blas_tanh`` the tanh form):
        float32, or with ``half`` (a half ``gemm_precision``) the next GEMM's half operand,
        computed in fp32 and rounded once."""
        raise NotImplementedError


class BlockBackend(Backend):
    """Whole-layer backends: ``fused`` ones run every layer themselves."""

    knob = "fused_block"
    fused: ClassVar[bool] = False

    def prepare(self, model: Any) -> Any:
        """What the forward reads of the model's weights (made once per weight version)."""
        return None

    def forward(
        self,
        prepared: Any,
        x: Tensor,
        mask: Tensor | None,
        plan: Any,
        config: Any,
        out: Tensor | None = None,
    ) -> Tensor:
        """The whole forward; written into ``out`` where the family can (a contiguous
        fp32 buffer of ``x``'s shape sharing no storage with it), else returned."""
        raise NotImplementedError


_REGISTRY: dict[str, dict[Any, Backend]] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: one instance of ``cls`` serves its knob value."""
    table = _REGISTRY.setdefault(cls.knob, {})
    if cls.value in table:
        raise ValueError(f"{cls.knob}={cls.value!r} is registered twice")
    table[cls.value] = cls()
    return cls


def get(knob: str, value: Any) -> Backend:
    try:
        return _REGISTRY[knob][value]
    except KeyError:
        valid = ", ".join(repr(v) for v in _REGISTRY.get(knob, {}))
        raise ValueError(f"no backend for {knob}={value!r}; registered: {valid}") from None


def attention(value: str) -> AttentionBackend:
    backend = get("attention", value)
    assert isinstance(backend, AttentionBackend)
    return backend


def _ranked(knob: str) -> list[Backend]:
    return sorted(_REGISTRY.get(knob, {}).values(), key=lambda b: b.rank)


def values(knob: str) -> tuple[Any, ...]:
    """The registered values of a backend knob, by rank."""
    return tuple(b.value for b in _ranked(knob))


def needs(knob: str) -> dict[Any, str]:
    return {b.value: b.needs for b in _ranked(knob) if b.needs}


def knobs() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def chosen(plan: Any) -> list[Backend]:
    """The backend of every backend knob, as the plan picks them."""
    return [get(knob, getattr(plan, knob)) for knob in _REGISTRY]


def uses_triton(plan: Any) -> bool:
    return any(b.triton for b in chosen(plan))


# The knobs whose backends run whole layers (``BlockBackend``): at most one is fused.
LAYER_KNOBS = ("fused_block", "fused_layer")


def layer_backend(plan: Any) -> BlockBackend:
    """The whole-layer backend the plan picks: a fused one, or the per-layer path."""
    picked = [get(knob, getattr(plan, knob)) for knob in LAYER_KNOBS if knob in _REGISTRY]
    for backend in picked:
        if getattr(backend, "fused", False):
            assert isinstance(backend, BlockBackend)
            return backend
    assert isinstance(picked[0], BlockBackend)
    return picked[0]


def reads_mask_on_host(plan: Any) -> bool:
    """Whether the plan's forward reads the mask's values on the host every call: the
    per-layer path with an attention that needs the mask's kind (``needs_mask_kind``)."""
    return not layer_backend(plan).fused and attention(plan.attention).needs_mask_kind(plan)


def not_supported_reasons(
    plan: Any, config: TransformerConfig, device: DeviceInfo, *, prune: bool = False
) -> list[str]:
    """Every reason the plan's backends cannot run on this case and device."""
    picked = chosen(plan)
    reasons = precision.reasons(plan, device, config)
    for backend in picked:
        reasons += backend.reasons(plan, config, device, prune=prune)
    if any(b.triton for b in picked):
        ok, why = triton_usable(device)
        if not ok:
            reasons.append(why)
        else:
            for backend in picked:
                if backend.triton:
                    reasons += backend.kernel_reasons(plan, config, device, prune=prune)
    return reasons
