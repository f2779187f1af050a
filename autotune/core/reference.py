"""The reference: what every candidate is judged against.

Written from ``shared/REFERENCE.md``: the configuration, the pre-norm model with the
official parameter names, the official input generator, the per-element correctness
rule and the official runtime settings. Nothing here imports optuna, pandas,
sqlalchemy or matplotlib: the runtime dispatcher depends on this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autotune.core.threads import SharedSection

ATOL = 0.002
RTOL = 0.02
STRICT_ATOL = 0.001
STRICT_RTOL = 0.01
LAYERNORM_EPS = 1e-5
ACCURACY_SEEDS = tuple(1234 + t for t in range(5))
TIMING_SEED = 1234 + 100000
WEIGHT_SEED = 1234


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Shape of the fixed Transformer: validated on construction."""

    batch_size: int
    seq_len: int
    d_model: int
    num_heads: int
    ffn_dim: int
    num_layers: int
    causal: bool = False

    def __post_init__(self) -> None:
        for name in ("batch_size", "seq_len", "d_model", "num_heads", "ffn_dim", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
            if value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be True or False, got {self.causal!r}")
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads}); "
                f"choose num_heads among the divisors of {self.d_model}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"unknown config fields {unknown}; valid fields are {sorted(fields)}")
        return cls(**data)


def _zero_rows(x: Tensor, valid: Tensor) -> Tensor:
    """x[~valid] = 0 for x [B, S, ...] and valid [B, S] bool, out of place."""
    return x.masked_fill(~valid.view(*valid.shape, *([1] * (x.dim() - 2))), 0.0)


class ReferenceAttention(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def _split(self, t: Tensor) -> Tensor:
        b, s, _ = t.shape
        c = self.config
        return t.view(b, s, c.num_heads, c.head_dim).transpose(1, 2).contiguous()

    def forward(self, x: Tensor, valid_token_mask: Tensor | None = None) -> Tensor:
        b, s, d = x.shape
        q = self._split(self.q_proj(x))
        k = self._split(self.k_proj(x))
        v = self._split(self.v_proj(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (self.config.head_dim**-0.5)
        if self.config.causal:
            upper = torch.triu(torch.ones(s, s, dtype=torch.bool, device=x.device), diagonal=1)
            scores = scores.masked_fill(upper, float("-inf"))
        if valid_token_mask is not None:
            scores = scores.masked_fill(~valid_token_mask[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(x.dtype)
        context = torch.matmul(probs, v).transpose(1, 2).contiguous().view(b, s, d)
        out = self.out_proj(context)
        if valid_token_mask is not None:
            out = _zero_rows(out, valid_token_mask)
        return out


class ReferenceLayer(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        d = config.d_model
        self.norm1 = nn.LayerNorm(d, eps=LAYERNORM_EPS)
        self.attention = ReferenceAttention(config)
        self.norm2 = nn.LayerNorm(d, eps=LAYERNORM_EPS)
        self.ffn_in = nn.Linear(d, config.ffn_dim)
        self.ffn_out = nn.Linear(config.ffn_dim, d)

    def forward(self, x: Tensor, valid_token_mask: Tensor | None = None) -> Tensor:
        x = x + self.attention(self.norm1(x), valid_token_mask)
        x = x + self.ffn_out(F.gelu(self.ffn_in(self.norm2(x))))
        if valid_token_mask is not None:
            x = _zero_rows(x, valid_token_mask)
        return x


class ReferenceTransformer(nn.Module):
    """The benchmark's baseline model, parameter names exactly as the original."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(ReferenceLayer(config) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.d_model, eps=LAYERNORM_EPS)

    def forward(self, x: Tensor, valid_token_mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, valid_token_mask)
        x = self.final_norm(x)
        if valid_token_mask is not None:
            x = _zero_rows(x, valid_token_mask)
        return x


def build_reference(
    config: TransformerConfig, device: str | torch.device = "cpu", seed: int = WEIGHT_SEED
) -> ReferenceTransformer:
    """The reference with the official weights: ``torch.manual_seed(seed)`` then build."""
    torch.manual_seed(seed)
    return ReferenceTransformer(config).to(device).eval()


def generate_random_case(
    config: TransformerConfig,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 1234,
    padding_ratio: float = 0.0,
    input_scale: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """The official input generator: ``x`` [B, S, D] and a bool mask [B, S] (True = real)."""
    if not padding_ratio < 1.0:
        raise ValueError(
            f"padding_ratio must be below 1 (<= 0 means no padding), got {padding_ratio}"
        )
    b, s, d = config.batch_size, config.seq_len, config.d_model
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    x = torch.randn(b, s, d, generator=generator, device=device, dtype=dtype) * input_scale
    if padding_ratio <= 0:
        mask = torch.ones(b, s, dtype=torch.bool, device=device)
        return x, mask
    min_valid = max(1, round(s * (1 - padding_ratio)))
    lengths = torch.randint(min_valid, s + 1, (b,), generator=generator, device=device)
    mask = torch.arange(s, device=device)[None, :] < lengths[:, None]
    x = _zero_rows(x, mask)
    return x, mask


@dataclasses.dataclass(frozen=True)
class CorrectnessReport:
    """Per-element verdict of the rule ``err <= atol or err <= rtol*|ref|`` (finite both)."""

    passed: bool
    n_elements: int
    n_failed: int
    n_nonfinite: int
    max_abs_err: float
    max_rel_err: float
    worst_index: tuple[int, ...]
    budget_share: float  # max(err / max(atol, rtol*|ref|)); <= 1 passes; inf if non-finite
    atol: float = ATOL
    rtol: float = RTOL

    @property
    def violation(self) -> float:
        """Continuous constraint value: worst budget share minus 1; <= 0 is feasible."""
        return self.budget_share - 1.0

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["worst_index"] = list(self.worst_index)
        for key in ("max_abs_err", "max_rel_err", "budget_share"):
            if not math.isfinite(data[key]):
                data[key] = str(data[key])
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CorrectnessReport:
        data = dict(data)
        data["worst_index"] = tuple(data["worst_index"])
        for key in ("max_abs_err", "max_rel_err", "budget_share"):
            data[key] = float(data[key])
        return cls(**data)

    def summary(self) -> str:
        if self.passed:
            return (
                f"0 of {self.n_elements} elements over budget "
                f"(max abs {self.max_abs_err:.3g}, worst {self.budget_share:.3f} of allowance)"
            )
        extra = f", {self.n_nonfinite} non-finite" if self.n_nonfinite else ""
        return (
            f"{self.n_failed} elements over budget{extra} "
            f"(worst {self.budget_share:.3g}x of allowance at {list(self.worst_index)}, "
            f"max abs {self.max_abs_err:.3g})"
        )


def check_outputs(
    candidate: Tensor, reference: Tensor, atol: float = ATOL, rtol: float = RTOL
) -> CorrectnessReport:
    """Apply the correctness rule element by element; both upcast to fp32."""
    if candidate.shape != reference.shape:
        raise ValueError(
            f"shape mismatch: candidate {tuple(candidate.shape)} vs reference "
            f"{tuple(reference.shape)}; the candidate must return the reference's shape"
        )
    cand = candidate.detach().to(torch.float32)
    ref = reference.detach().to(device=cand.device, dtype=torch.float32)
    err = (cand - ref).abs()
    allowance = torch.clamp(rtol * ref.abs(), min=atol)
    finite = torch.isfinite(cand) & torch.isfinite(ref)
    ok = finite & ((err <= atol) | (err <= rtol * ref.abs()))
    share = torch.where(finite, err / allowance, torch.full_like(err, math.inf))
    n = ref.numel()
    if n == 0:
        return CorrectnessReport(True, 0, 0, 0, 0.0, 0.0, (), 0.0, atol, rtol)
    flat_share = share.reshape(-1)
    worst_flat = int(torch.argmax(torch.nan_to_num(flat_share, nan=math.inf)).item())
    worst_index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst_flat), ref.shape))
    err_finite = torch.where(finite, err, torch.zeros_like(err))
    rel = err_finite / ref.abs().clamp_min(torch.finfo(torch.float32).tiny)
    n_failed = int((~ok).sum().item())
    return CorrectnessReport(
        passed=n_failed == 0,
        n_elements=n,
        n_failed=n_failed,
        n_nonfinite=int((~finite).sum().item()),
        max_abs_err=float(err_finite.max().item()) if finite.any() else math.inf,
        max_rel_err=float(rel.max().item()),
        worst_index=worst_index,
        budget_share=float(flat_share[worst_flat].item()),
        atol=atol,
        rtol=rtol,
    )


def matmul_precision() -> str | None:
    """``torch.get_float32_matmul_precision()``, or None where torch refuses to say (torch
    2.13 raises once the legacy ``allow_tf32`` flags and the precision setting disagree)."""
    try:
        return _get_precision()
    except RuntimeError:
        return None


# The flags read on every call, straight from torch's C layer where it has them (the
# public accessors go through Python properties: microseconds per call on the hot path).
_get_precision = getattr(torch._C, "_get_float32_matmul_precision", None) or (
    torch.get_float32_matmul_precision
)
_cublas_tf32_raw = getattr(torch._C, "_get_cublas_allow_tf32", None) or (
    lambda: torch.backends.cuda.matmul.allow_tf32
)
_cudnn_tf32_raw = getattr(torch._C, "_get_cudnn_allow_tf32", None) or (
    lambda: torch.backends.cudnn.allow_tf32
)


def cublas_tf32() -> bool | None:
    """The CUDA matmuls' TF32 flag, or None where torch refuses to read it (the newer
    ``fp32_precision`` API set against the legacy flags)."""
    try:
        return _cublas_tf32_raw()
    except RuntimeError:
        return None


def cudnn_tf32() -> bool | None:
    """cuDNN's TF32 flag, or None where torch refuses to read it (torch 2.13 raises once
    the process set ``torch.backends.fp32_precision``, the newer API)."""
    try:
        return _cudnn_tf32_raw()
    except RuntimeError:
        return None


def _any_autocast_fallback() -> bool:
    return any(torch.is_autocast_enabled(d) for d in ("cuda", "cpu"))


# Whether autocast is on for any device: one C call where this torch has it (~40 ns).
any_autocast = getattr(torch._C, "_is_any_autocast_enabled", _any_autocast_fallback)


def settings_key() -> tuple[Any, ...]:
    """What a forward's numerics and a captured graph depend on besides the inputs: grad
    and inference mode, the TF32 flags, the matmul precision and autocast (a few C
    calls)."""
    return (
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        cublas_tf32(),
        cudnn_tf32(),
        matmul_precision(),
        any_autocast(),
    )


# torch's newer precision settings (``torch.backends.fp32_precision`` and its children),
# where this torch has them: saved and restored in this order, the root first.
_FP32_PRECISION_PATHS = (
    "",
    "cuda.matmul",
    "cudnn",
    "cudnn.conv",
    "cudnn.rnn",
    "mkldnn",
    "mkldnn.matmul",
    "mkldnn.conv",
    "mkldnn.rnn",
)


def _precision_holder(path: str) -> Any:
    """``torch.backends`` or the sub-backend at ``path`` (None where this torch lacks it)."""
    obj: Any = torch.backends
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part, None)
    return obj if obj is not None and hasattr(obj, "fp32_precision") else None


_FP32_PRECISION_HOLDERS = tuple(
    (lambda path=path: _precision_holder(path)) for path in _FP32_PRECISION_PATHS
)

# (the legacy flags where readable: matmul precision and both allow_tf32, else None;
#  the matmul precision where readable; every newer-API setting, root first)
FlagsState = tuple[tuple[Any, ...] | None, str | None, tuple[Any, ...]]


def flags_state() -> FlagsState:
    """The process's precision settings, all of them, as they can be put back."""
    try:
        legacy: tuple[Any, ...] | None = (_get_precision(), _cublas_tf32_raw(), _cudnn_tf32_raw())
    except RuntimeError:  # the newer API is in use: some legacy flag is unreadable
        legacy = None
    newer = tuple(
        getattr(holder(), "fp32_precision", None) if holder() is not None else None
        for holder in _FP32_PRECISION_HOLDERS
    )
    return legacy, matmul_precision(), newer


def restore_flags(state: FlagsState) -> None:
    """Put back what ``flags_state()`` read: the legacy flags first (they write the newer
    settings under them), then every newer setting as it was, root first (a child left
    at "none" inherits again, as before). Where the process had mixed the two APIs (a
    legacy getter raised), the legacy getters may read or raise differently afterwards;
    every newer setting is as it was."""
    legacy, precision, newer = state
    if legacy is not None:  # the precision last: it decides what the getters read back
        torch.backends.cuda.matmul.allow_tf32 = legacy[1]
        torch.backends.cudnn.allow_tf32 = legacy[2]
        torch.set_float32_matmul_precision(legacy[0])
    elif precision is not None:
        torch.set_float32_matmul_precision(precision)
    for holder, value in zip(_FP32_PRECISION_HOLDERS, newer, strict=True):
        obj = holder()
        if obj is not None and value is not None and obj.fp32_precision != value:
            obj.fp32_precision = value


def _set_official_flags() -> None:
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


# The flags are the process's, not a thread's: threads inside official_settings() at once
# share one saved state, saved by the first to enter and put back by the last to leave.
_OFFICIAL = SharedSection(flags_state, _set_official_flags, restore_flags)


def official_settings() -> contextlib.AbstractContextManager[None]:
    """The benchmark's runtime flags (matmul precision "high", TF32 on), restored on exit.

    The flags are process-wide: while any thread is inside, every thread sees them.
    Entered by several threads at once (or nested), they are saved by the first to enter
    and restored by the last to leave. Flags set through torch's newer ``fp32_precision``
    API are restored through it."""
    return _OFFICIAL()


def official_settings_active() -> bool:
    return matmul_precision() == "high" and cublas_tf32() is True and cudnn_tf32() is True
