"""A whole pre-norm Transformer layer in two Triton launches, for short sequences.

Kernel A (attention half), grid ``(B, cdiv(S, BLOCK_M))``: for ``BLOCK_M`` query rows of one
sequence, ``h = LayerNorm1(x)``, then per head ``q = h @ Wq_h^T + bq_h``; for every key block
it needs (keys ``<=`` the last query row when causal, keys ``< key_lengths[b]``) it recomputes
``LayerNorm1`` of the key rows and their ``k``/``v`` for that head (no Q/K/V tensor is ever
stored: the recomputation is the price of one launch), runs an online softmax in fp32
(``exp2`` with ``head_dim**-0.5 * log2(e)`` folded in after the product), and folds the
head's context straight into the output projection: ``out += ctx_h @ Wo[:, head]^T``
(which is ``concat(heads) @ Wo^T``). Then ``out += bo``, padded query rows of ``out`` are
zeroed, and ``x1 = x + out`` is stored.

Kernel B (FFN half), grid ``(cdiv(B*S, BLOCK_M),)``: ``h = LayerNorm2(x1)``,
``f = GELU_erf(h @ W1^T + b1) @ W2^T + b2`` over the FFN dim in chunks, ``x2 = x1 + f``,
padded rows zeroed; with ``FINAL_NORM`` the final LayerNorm is applied too (padded rows
zeroed again). Kernel B reads and writes only its own rows, so it runs in place on x1.

Arithmetic follows shared/REFERENCE.md ("Model"): LayerNorm (biased variance, eps 1e-5),
softmax state, GELU and the residual stream are always fp32; only the dot operands follow
``precision`` (``ieee`` / ``tf32`` / ``tf32x3``: fp32 operands with that
``input_precision``; ``fp16``: operands converted inside the kernel, fp32 accumulation).

Weights are the ``nn.Linear`` / ``nn.LayerNorm`` parameters as they are (``[out, in]``,
contiguous fp32); :func:`prepare_block_weights` only gathers and checks them once.

Limits (see :func:`not_supported_reasons`): ``seq_len``, ``d_model`` and ``ffn_dim`` up to
256 (every dimension is padded to a power of two >= 16 and masked), ``head_dim`` 8..128.
Each query block recomputes K/V for all earlier keys, so the work grows like
``S**2 * D**2 / BLOCK_M``: this design is for short sequences only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import torch
import triton
import triton.language as tl

from kernels._common import MIN_BLOCK, fused_row_tile_reasons, gelu_exact, gelu_poly, padded_dim
from kernels._precision import check_precision, dot, launch_reasons, precision_reasons, to_operand
from kernels._triton import (
    SUPPORTED_NUM_WARPS,
    check_launch_device,
    is_interpreted,
    is_power_of_2,
)

LAYERNORM_EPS = 1e-5
LOG2_E = math.log2(math.e)
MAX_SEQ_LEN = 256
MAX_D_MODEL = 256
MAX_FFN_DIM = 256
MIN_HEAD_DIM = 8
MAX_HEAD_DIM = 128
BLOCK_PRECISIONS = ("ieee", "tf32", "tf32x3", "fp16")
DEFAULT_SMEM_LIMIT = 200 * 1024  # used when the caller does not know the device's limit

__all__ = [
    "BlockWeights",
    "block_reference",
    "estimate_shared_memory_bytes",
    "fused_forward",
    "fused_layer",
    "lengths_from_mask",
    "not_supported_reasons",
    "prepare_block_weights",
    "weights_from_model",
]


# --------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------
_PARAM_NAMES = {
    "norm1_weight": "norm1.weight",
    "norm1_bias": "norm1.bias",
    "q_weight": "attention.q_proj.weight",
    "q_bias": "attention.q_proj.bias",
    "k_weight": "attention.k_proj.weight",
    "k_bias": "attention.k_proj.bias",
    "v_weight": "attention.v_proj.weight",
    "v_bias": "attention.v_proj.bias",
    "o_weight": "attention.out_proj.weight",
    "o_bias": "attention.out_proj.bias",
    "norm2_weight": "norm2.weight",
    "norm2_bias": "norm2.bias",
    "ffn_in_weight": "ffn_in.weight",
    "ffn_in_bias": "ffn_in.bias",
    "ffn_out_weight": "ffn_out.weight",
    "ffn_out_bias": "ffn_out.bias",
}


@dataclasses.dataclass(frozen=True)
class BlockWeights:
    """One layer's parameters, contiguous fp32 in ``nn.Linear`` layout ``[out, in]``."""

    norm1_weight: torch.Tensor
    norm1_bias: torch.Tensor
    q_weight: torch.Tensor
    q_bias: torch.Tensor
    k_weight: torch.Tensor
    k_bias: torch.Tensor
    v_weight: torch.Tensor
    v_bias: torch.Tensor
    o_weight: torch.Tensor
    o_bias: torch.Tensor
    norm2_weight: torch.Tensor
    norm2_bias: torch.Tensor
    ffn_in_weight: torch.Tensor
    ffn_in_bias: torch.Tensor
    ffn_out_weight: torch.Tensor
    ffn_out_bias: torch.Tensor

    @property
    def d_model(self) -> int:
        return int(self.q_weight.shape[1])

    @property
    def ffn_dim(self) -> int:
        return int(self.ffn_in_weight.shape[0])

    @property
    def device(self) -> torch.device:
        return self.q_weight.device

    def check(self) -> None:
        """Raise ValueError naming the first parameter with a wrong shape/dtype/layout."""
        d, f = self.d_model, self.ffn_dim
        expected = {
            "norm1_weight": (d,),
            "norm1_bias": (d,),
            "q_weight": (d, d),
            "q_bias": (d,),
            "k_weight": (d, d),
            "k_bias": (d,),
            "v_weight": (d, d),
            "v_bias": (d,),
            "o_weight": (d, d),
            "o_bias": (d,),
            "norm2_weight": (d,),
            "norm2_bias": (d,),
            "ffn_in_weight": (f, d),
            "ffn_in_bias": (f,),
            "ffn_out_weight": (d, f),
            "ffn_out_bias": (d,),
        }
        for name, shape in expected.items():
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != shape or t.dtype != torch.float32 or not t.is_contiguous():
                raise ValueError(
                    f"{name} has shape {tuple(t.shape)}, dtype {t.dtype}, contiguous="
                    f"{t.is_contiguous()}; expected contiguous float32 {shape} "
                    "(pass it through prepare_block_weights)"
                )
            if t.device != self.device:
                raise ValueError(
                    f"{name} is on {t.device} but q_weight is on {self.device}; "
                    "move all weights to one device"
                )


def prepare_block_weights(
    layer: torch.nn.Module | Mapping[str, torch.Tensor] | BlockWeights,
    *,
    prefix: str = "",
    device: torch.device | str | None = None,
) -> BlockWeights:
    """Gather one layer's parameters once (not per call) from a ``ReferenceLayer``-like
    module, or a state dict with REFERENCE.md's names (``prefix`` e.g. ``"layers.0."``).

    Tensors are detached, made contiguous fp32 (copied only when they are not already),
    and moved to ``device`` when given.
    """
    if isinstance(layer, BlockWeights):
        tensors = {name: getattr(layer, name) for name in _PARAM_NAMES}
    else:
        state = layer.state_dict() if isinstance(layer, torch.nn.Module) else layer
        missing = [prefix + key for key in _PARAM_NAMES.values() if prefix + key not in state]
        if missing:
            raise ValueError(
                f"layer parameters {missing} are missing; pass a ReferenceLayer or its state "
                "dict (with prefix='layers.{i}.' for a whole model's state dict)"
            )
        tensors = {name: state[prefix + key] for name, key in _PARAM_NAMES.items()}
    prepared = {}
    for name, t in tensors.items():
        t = t.detach()
        if device is not None:
            t = t.to(device)
        prepared[name] = t.to(torch.float32).contiguous()
    weights = BlockWeights(**prepared)
    weights.check()
    return weights


def weights_from_model(
    model: torch.nn.Module, device: torch.device | str | None = None
) -> tuple[list[BlockWeights], tuple[torch.Tensor, torch.Tensor]]:
    """``(per-layer weights, (final_norm weight, bias))`` of a ``ReferenceTransformer``."""
    layers = [prepare_block_weights(layer, device=device) for layer in model.layers]
    norm = model.final_norm
    final = tuple(
        (p.detach().to(device) if device is not None else p.detach()).float().contiguous()
        for p in (norm.weight, norm.bias)
    )
    return layers, (final[0], final[1])


def lengths_from_mask(valid_token_mask: torch.Tensor) -> torch.Tensor:
    """int32 ``key_lengths`` [B] from a right-padded bool mask [B, S].

    Checks that the mask really is right padding (a device sync: not for the hot path).
    """
    if valid_token_mask.dtype != torch.bool or valid_token_mask.dim() != 2:
        raise ValueError(
            f"valid_token_mask has dtype {valid_token_mask.dtype} and shape "
            f"{tuple(valid_token_mask.shape)}; expected bool [B, S]"
        )
    lengths = valid_token_mask.sum(dim=1).to(torch.int32)
    seq = torch.arange(valid_token_mask.shape[1], device=valid_token_mask.device)
    if not bool(torch.equal(seq[None, :] < lengths[:, None], valid_token_mask)):
        raise ValueError(
            "valid_token_mask is not right padding (True then False in every row); "
            "the fused layer only supports key_lengths-style masks"
        )
    return lengths


# --------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------
def _zero_rows(x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    return x if valid is None else x.masked_fill(~valid[..., None], 0.0)


def block_reference(
    x: torch.Tensor,
    weights: BlockWeights,
    *,
    num_heads: int,
    causal: bool,
    key_lengths: torch.Tensor | None = None,
    final_norm: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Plain PyTorch version of :func:`fused_layer`, step by step as REFERENCE.md says."""
    F = torch.nn.functional
    b, s, d = x.shape
    hd = d // num_heads
    valid = None
    if key_lengths is not None:
        valid = torch.arange(s, device=x.device)[None, :] < key_lengths.to(x.device)[:, None]
    w = weights
    h = F.layer_norm(x, (d,), w.norm1_weight, w.norm1_bias, LAYERNORM_EPS)

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, s, num_heads, hd).transpose(1, 2).contiguous()

    q = split(F.linear(h, w.q_weight, w.q_bias))
    k = split(F.linear(h, w.k_weight, w.k_bias))
    v = split(F.linear(h, w.v_weight, w.v_bias))
    scores = torch.matmul(q, k.transpose(-2, -1)) * (hd**-0.5)
    if causal:
        upper = torch.triu(torch.ones(s, s, dtype=torch.bool, device=x.device), diagonal=1)
        scores = scores.masked_fill(upper, float("-inf"))
    if valid is not None:
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(x.dtype)
    ctx = torch.matmul(probs, v).transpose(1, 2).contiguous().view(b, s, d)
    x = x + _zero_rows(F.linear(ctx, w.o_weight, w.o_bias), valid)
    h = F.layer_norm(x, (d,), w.norm2_weight, w.norm2_bias, LAYERNORM_EPS)
    x = x + F.linear(
        F.gelu(F.linear(h, w.ffn_in_weight, w.ffn_in_bias)), w.ffn_out_weight, w.ffn_out_bias
    )
    x = _zero_rows(x, valid)
    if final_norm is not None:
        x = _zero_rows(F.layer_norm(x, (d,), final_norm[0], final_norm[1], LAYERNORM_EPS), valid)
    return x


# --------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------
@triton.jit
def _layernorm_rows(x, w_ptr, b_ptr, offs_d, d_ok, d_model, eps):
    """LayerNorm of the rows of an fp32 tile whose padded columns are 0; padded columns
    of the result are 0 too."""
    w = tl.load(w_ptr + offs_d, mask=d_ok, other=0.0)
    b = tl.load(b_ptr + offs_d, mask=d_ok, other=0.0)
    mean = tl.sum(x, 1) / d_model
    xc = tl.where(d_ok[None, :], x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, 1) / d_model
    rstd = 1.0 / tl.sqrt(var + eps)
    return xc * rstd[:, None] * w[None, :] + b[None, :]


@triton.jit
def _head_weight(
    w_ptr, col0, offs_d, d_ok, offs_c, c_ok, d_model,
    PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """The ``W[col0:col0+hd, :]^T`` tile ``[BLOCK_D, BLOCK_HD]`` of one head, as an operand:
    element (k, c) = W[col0 + c, k]."""
    wt = tl.load(
        w_ptr + (col0 + offs_c)[None, :] * d_model + offs_d[:, None],
        mask=d_ok[:, None] & c_ok[None, :],
        other=0.0,
    )
    return to_operand(wt, PRECISION, EMULATE_BF16_DOT)


@triton.jit
def _head_projection_of(
    h_op, wt, b_ptr, col0, offs_c, c_ok,
    BLOCK_ROWS: tl.constexpr, BLOCK_HD: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """``h @ wt + b[col0:col0+hd]`` -> fp32 [BLOCK_ROWS, BLOCK_HD] (``wt`` from
    ``_head_weight``)."""
    acc = dot(
        h_op, wt, tl.zeros([BLOCK_ROWS, BLOCK_HD], dtype=tl.float32), PRECISION, EMULATE_BF16_DOT
    )
    bias = tl.load(b_ptr + col0 + offs_c, mask=c_ok, other=0.0)
    return acc + bias[None, :]


@triton.jit
def _head_projection(
    h_op,
    w_ptr,
    b_ptr,
    col0,
    offs_d,
    d_ok,
    offs_c,
    c_ok,
    d_model,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_HD: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
):
    """``h @ W[col0:col0+hd, :]^T + b[col0:col0+hd]`` -> fp32 [BLOCK_ROWS, BLOCK_HD]."""
    wt = _head_weight(w_ptr, col0, offs_d, d_ok, offs_c, c_ok, d_model, PRECISION, EMULATE_BF16_DOT)
    return _head_projection_of(
        h_op, wt, b_ptr, col0, offs_c, c_ok, BLOCK_ROWS, BLOCK_HD, PRECISION, EMULATE_BF16_DOT
    )


@triton.jit
def _online_softmax_step(
    qk, valid, m_i, l_i, acc, v, PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr
):
    """One key block of the online softmax: ``qk`` the scaled scores (log2 domain),
    ``valid`` the (row, key) pairs that count, ``v`` the block's fp32 values; returns the
    new running max, sum and fp32 accumulator."""
    qk = tl.where(valid, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    # A row with no valid key so far keeps m = -inf: subtract 0 instead (no NaN).
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    p = to_operand(p, PRECISION, EMULATE_BF16_DOT)
    v = to_operand(v, PRECISION, EMULATE_BF16_DOT)
    acc = dot(p, v, acc, PRECISION, EMULATE_BF16_DOT)
    return m_new, l_i, acc


@triton.jit
def _attention_half_kernel(
    x_ptr,
    out_ptr,
    key_lengths_ptr,
    key_mask_ptr,
    n1w_ptr,
    n1b_ptr,
    wq_ptr,
    bq_ptr,
    wk_ptr,
    bk_ptr,
    wv_ptr,
    bv_ptr,
    wo_ptr,
    bo_ptr,
    seq_len,
    d_model,
    num_heads,
    head_dim,
    qk_scale,
    eps,
    CAUSAL: tl.constexpr,
    HAS_KEY_LENGTHS: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_HD: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
):
    off_b = tl.program_id(0).to(tl.int64)
    start_m = tl.program_id(1) * BLOCK_M
    x_base = x_ptr + off_b * seq_len * d_model
    o_base = out_ptr + off_b * seq_len * d_model

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.arange(0, BLOCK_HD)
    d_ok = offs_d < d_model
    c_ok = offs_c < head_dim
    row_ok = offs_m < seq_len

    x_q = tl.load(
        x_base + offs_m[:, None] * d_model + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    h_q = _layernorm_rows(x_q, n1w_ptr, n1b_ptr, offs_d, d_ok, d_model, eps)
    h_q = to_operand(h_q, PRECISION, EMULATE_BF16_DOT)

    kv_len = seq_len
    if HAS_KEY_LENGTHS:
        kv_len = tl.minimum(tl.load(key_lengths_ptr + off_b).to(tl.int32), seq_len)
        kv_len = tl.maximum(kv_len, 0)
    hi = kv_len
    if CAUSAL:
        hi = tl.minimum(kv_len, start_m + BLOCK_M)

    out = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for hh in range(0, num_heads):
        col0 = hh * head_dim
        q = _head_projection(
            h_q,
            wq_ptr,
            bq_ptr,
            col0,
            offs_d,
            d_ok,
            offs_c,
            c_ok,
            d_model,
            BLOCK_M,
            BLOCK_HD,
            PRECISION,
            EMULATE_BF16_DOT,
        )
        q = to_operand(q, PRECISION, EMULATE_BF16_DOT)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_HD], dtype=tl.float32)
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + offs_n0
            x_k = tl.load(
                x_base + offs_n[:, None] * d_model + offs_d[None, :],
                mask=(offs_n < seq_len)[:, None] & d_ok[None, :],
                other=0.0,
            )
            h_k = _layernorm_rows(x_k, n1w_ptr, n1b_ptr, offs_d, d_ok, d_model, eps)
            h_k = to_operand(h_k, PRECISION, EMULATE_BF16_DOT)
            k = _head_projection(
                h_k,
                wk_ptr,
                bk_ptr,
                col0,
                offs_d,
                d_ok,
                offs_c,
                c_ok,
                d_model,
                BLOCK_N,
                BLOCK_HD,
                PRECISION,
                EMULATE_BF16_DOT,
            )
            v = _head_projection(
                h_k,
                wv_ptr,
                bv_ptr,
                col0,
                offs_d,
                d_ok,
                offs_c,
                c_ok,
                d_model,
                BLOCK_N,
                BLOCK_HD,
                PRECISION,
                EMULATE_BF16_DOT,
            )
            kt = to_operand(tl.trans(k), PRECISION, EMULATE_BF16_DOT)
            qk = dot(
                q, kt, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), PRECISION, EMULATE_BF16_DOT
            )
            qk = qk * qk_scale  # log2 domain: head_dim**-0.5 * log2(e)
            valid = (offs_n < kv_len)[None, :]
            if HAS_KEY_MASK:  # any key may be masked: the mask's byte, read here
                key_ok = tl.load(key_mask_ptr + off_b * seq_len + offs_n, mask=offs_n < seq_len)
                valid = valid & (key_ok != 0)[None, :]
            if CAUSAL:
                valid = valid & (offs_n[None, :] <= offs_m[:, None])
            m_i, l_i, acc = _online_softmax_step(
                qk, valid, m_i, l_i, acc, v, PRECISION, EMULATE_BF16_DOT
            )
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # no valid key at all: context 0, not NaN
        ctx = to_operand(acc / l_safe[:, None], PRECISION, EMULATE_BF16_DOT)
        # Wo[:, head]^T tile [BLOCK_HD, BLOCK_D]: element (c, n) = Wo[n, col0 + c].
        wo_t = tl.load(
            wo_ptr + offs_d[None, :] * d_model + (col0 + offs_c)[:, None],
            mask=c_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        wo_t = to_operand(wo_t, PRECISION, EMULATE_BF16_DOT)
        out = dot(ctx, wo_t, out, PRECISION, EMULATE_BF16_DOT)

    out += tl.load(bo_ptr + offs_d, mask=d_ok, other=0.0)[None, :]
    if HAS_KEY_LENGTHS:
        out = tl.where((offs_m < kv_len)[:, None], out, 0.0)  # padded query rows
    if HAS_KEY_MASK:
        row_valid = tl.load(key_mask_ptr + off_b * seq_len + offs_m, mask=row_ok, other=0)
        out = tl.where((row_valid != 0)[:, None], out, 0.0)  # padded query rows
    tl.store(
        o_base + offs_m[:, None] * d_model + offs_d[None, :],
        x_q + out,
        mask=row_ok[:, None] & d_ok[None, :],
    )


@triton.jit
def _w1_tile(
    w1_ptr, offs_d, d_ok, offs_f, f_ok, d_model,
    PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """The FFN's ``W1^T`` operand tile of columns ``offs_f`` [BLOCK_D, BLOCK_F]: element
    (k, j) = W1[offs_f[j], k]."""
    w1_t = tl.load(
        w1_ptr + offs_f[None, :] * d_model + offs_d[:, None],
        mask=d_ok[:, None] & f_ok[None, :],
        other=0.0,
    )
    return to_operand(w1_t, PRECISION, EMULATE_BF16_DOT)


@triton.jit
def _w2_tile(
    w2_ptr, offs_d, d_ok, offs_f, f_ok, ffn_dim,
    PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr,
):  # fmt: skip
    """The FFN's ``W2^T`` operand tile of rows ``offs_f`` [BLOCK_F, BLOCK_D]: element
    (j, n) = W2[n, offs_f[j]]."""
    w2_t = tl.load(
        w2_ptr + offs_d[None, :] * ffn_dim + offs_f[:, None],
        mask=f_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    return to_operand(w2_t, PRECISION, EMULATE_BF16_DOT)


@triton.jit
def _ffn_hidden(
    h, w1_t, b1_ptr, offs_f, f_ok,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr, GELU_POLY: tl.constexpr,
):  # fmt: skip
    """``GELU(h @ w1_t + b1[offs_f])`` as the second GEMM's operand: FFN columns ``offs_f``."""
    a = dot(h, w1_t, tl.zeros([BLOCK_M, BLOCK_F], dtype=tl.float32), PRECISION, EMULATE_BF16_DOT)
    a = a + tl.load(b1_ptr + offs_f, mask=f_ok, other=0.0)[None, :]
    a = gelu_poly(a) if GELU_POLY else gelu_exact(a)
    return to_operand(a, PRECISION, EMULATE_BF16_DOT)  # padded columns: GELU(0) = 0


@triton.jit
def _ffn_of_rows(
    x1, n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, w2_ptr, offs_d, d_ok, d_model, ffn_dim, eps,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_F: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16_DOT: tl.constexpr, GELU_POLY: tl.constexpr,
    w1_pre=0, w2_pre=0, PRELOAD: tl.constexpr = False,
):  # fmt: skip
    """``GELU(LayerNorm2(x1) @ W1^T + b1) @ W2^T`` (no ``b2``) of an fp32 row tile, the FFN
    dim ``BLOCK_F`` columns at a time; fp32 [BLOCK_M, BLOCK_D], padded columns 0. The erf
    GELU, or with ``GELU_POLY`` ``kernels._common.gelu_poly`` (within 2.6e-5 of it). With
    ``PRELOAD`` the weights are ``w1_pre``, ``w2_pre`` (``_w1_tile``, ``_w2_tile`` of every column:
    ``BLOCK_F >= ffn_dim``), loaded by the caller: one step, nothing loaded here but b1."""
    offs_f0 = tl.arange(0, BLOCK_F)
    h = _layernorm_rows(x1, n2w_ptr, n2b_ptr, offs_d, d_ok, d_model, eps)
    h = to_operand(h, PRECISION, EMULATE_BF16_DOT)
    f = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if PRELOAD:
        a = _ffn_hidden(
            h, w1_pre, b1_ptr, offs_f0, offs_f0 < ffn_dim, BLOCK_M, BLOCK_F, PRECISION,
            EMULATE_BF16_DOT, GELU_POLY,
        )  # fmt: skip
        f = dot(a, w2_pre, f, PRECISION, EMULATE_BF16_DOT)
    else:
        for f0 in range(0, ffn_dim, BLOCK_F):
            offs_f = f0 + offs_f0
            f_ok = offs_f < ffn_dim
            # W2's load after the first GEMM, as before weights_first (the same code).
            w1_t = _w1_tile(w1_ptr, offs_d, d_ok, offs_f, f_ok, d_model, PRECISION,
                            EMULATE_BF16_DOT)  # fmt: skip
            a = _ffn_hidden(
                h, w1_t, b1_ptr, offs_f, f_ok, BLOCK_M, BLOCK_F, PRECISION, EMULATE_BF16_DOT,
                GELU_POLY,
            )  # fmt: skip
            w2_t = _w2_tile(w2_ptr, offs_d, d_ok, offs_f, f_ok, ffn_dim, PRECISION,
                            EMULATE_BF16_DOT)  # fmt: skip
            f = dot(a, w2_t, f, PRECISION, EMULATE_BF16_DOT)
    return f


@triton.jit
def _ffn_half_kernel(
    x_ptr,
    out_ptr,
    key_lengths_ptr,
    key_mask_ptr,
    n2w_ptr,
    n2b_ptr,
    w1_ptr,
    b1_ptr,
    w2_ptr,
    b2_ptr,
    nfw_ptr,
    nfb_ptr,
    num_rows,
    seq_len,
    d_model,
    ffn_dim,
    eps,
    HAS_KEY_LENGTHS: tl.constexpr,
    HAS_KEY_MASK: tl.constexpr,
    FINAL_NORM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_F: tl.constexpr,
    PRECISION: tl.constexpr,
    EMULATE_BF16_DOT: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < d_model
    row_ok = offs_m < num_rows
    io_mask = row_ok[:, None] & d_ok[None, :]
    offsets = offs_m.to(tl.int64)[:, None] * d_model + offs_d[None, :]

    x1 = tl.load(x_ptr + offsets, mask=io_mask, other=0.0)
    f = _ffn_of_rows(
        x1, n2w_ptr, n2b_ptr, w1_ptr, b1_ptr, w2_ptr, offs_d, d_ok, d_model, ffn_dim, eps,
        BLOCK_M, BLOCK_D, BLOCK_F, PRECISION, EMULATE_BF16_DOT, False,
    )  # fmt: skip
    y = x1 + f + tl.load(b2_ptr + offs_d, mask=d_ok, other=0.0)[None, :]
    if HAS_KEY_LENGTHS:
        length = tl.load(key_lengths_ptr + offs_m // seq_len, mask=row_ok, other=0)
        valid = (offs_m % seq_len) < length
        y = tl.where(valid[:, None], y, 0.0)
    if HAS_KEY_MASK:  # rows are tokens: the mask's byte of each row
        valid = tl.load(key_mask_ptr + offs_m, mask=row_ok, other=0) != 0
        y = tl.where(valid[:, None], y, 0.0)
    if FINAL_NORM:
        y = tl.where(d_ok[None, :], y, 0.0)
        y = _layernorm_rows(y, nfw_ptr, nfb_ptr, offs_d, d_ok, d_model, eps)
        if HAS_KEY_LENGTHS or HAS_KEY_MASK:
            y = tl.where(valid[:, None], y, 0.0)
    tl.store(out_ptr + offsets, y, mask=io_mask)


# --------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------
def ffn_chunk(d_model: int, ffn_dim: int) -> int:
    """BLOCK_F: the FFN columns one step of kernel B handles."""
    return min(padded_dim(ffn_dim), 64 if padded_dim(d_model) <= 128 else 32)


def estimate_shared_memory_bytes(
    *,
    seq_len: int,
    d_model: int,
    num_heads: int,
    ffn_dim: int,
    block_m: int,
    num_stages: int,
    precision: str,
) -> int:
    """Shared memory of one program (the larger of the two kernels), in bytes.

    A model fitted from above to ``metadata.shared`` of both kernels compiled by Triton 3.9
    for sm_90 (10 configurations: d_model 32..256, head_dim 8..128, block_m 16..64,
    num_stages 1..2, ieee / tf32 / fp16). ``E`` counts the fp32 operand tiles of every
    ``tl.dot`` (4 B each; kernel A: h_q, Wq^T, q, h_k, Wk^T, Wv^T, k^T, p, v, Wo^T; kernel B:
    h, W1^T, a, W2^T); the compiled kernels used 0.50..0.71 E (fp32 operands) and
    0.31..0.50 E (fp16) at num_stages 1, 0.92 E at ieee num_stages 2. The estimate is
    ``E * (f + 0.2 * (num_stages - 1))`` with f = 0.75 for fp32 operands, 0.55 for fp16.
    Case 1 (S 128, D 128, H 4, FFN 128, block_m 32, tf32, 1 stage): estimated 73,728 B,
    compiled 69,632 B (kernel A) and 57,344 B (kernel B). Triton 3.6 may allocate
    differently: a configuration under the limit can still fail with OutOfResources.
    """
    bd, bhd = padded_dim(d_model), padded_dim(d_model // max(num_heads, 1))
    bm = bn = block_m
    bf = ffn_chunk(d_model, ffn_dim)
    kernel_a = (bn * bd + 2 * bd * bhd + bhd * bn + bm * bn + bn * bhd) + (
        bm * bd + bm * bhd + bhd * bd
    )
    kernel_b = (bd * bf + bm * bf + bf * bd) + bm * bd
    elements = max(kernel_a, kernel_b)
    factor = (0.55 if precision == "fp16" else 0.75) + 0.2 * (max(num_stages, 1) - 1)
    return int(elements * 4 * factor)


def not_supported_reasons(
    *,
    seq_len: int,
    d_model: int,
    num_heads: int,
    ffn_dim: int,
    block_m: int,
    num_warps: int,
    num_stages: int,
    precision: str,
    device_type: str,
    capability: tuple[int, int] | None,
    smem_bytes: int | None,
) -> list[str]:
    """Why this fused-layer configuration should not run here; empty list = supported."""
    reasons = _config_errors(
        seq_len=seq_len,
        d_model=d_model,
        num_heads=num_heads,
        ffn_dim=ffn_dim,
        block_m=block_m,
        num_warps=num_warps,
        num_stages=num_stages,
        precision=precision,
    )
    reasons += fused_row_tile_reasons("block_m", block_m, "fused block", device_type)
    if not reasons and block_m > padded_dim(seq_len):
        reasons.append(
            f"block_m={block_m} > padded seq len {padded_dim(seq_len)}; use a smaller block_m"
        )
    if smem_bytes is None and device_type == "cuda":
        smem_bytes = DEFAULT_SMEM_LIMIT
    return launch_reasons(
        kernel=_attention_half_kernel,
        device_type=device_type,
        precision=precision,
        capability=capability,
        smem_bytes=smem_bytes,
        smem_needed=lambda: estimate_shared_memory_bytes(
            seq_len=seq_len,
            d_model=d_model,
            num_heads=num_heads,
            ffn_dim=ffn_dim,
            block_m=block_m,
            num_stages=num_stages,
            precision=precision,
        ),
        reasons=reasons,
    )


def _config_errors(
    *,
    seq_len: int,
    d_model: int,
    num_heads: int,
    ffn_dim: int,
    block_m: int,
    num_warps: int,
    num_stages: int,
    precision: str,
) -> list[str]:
    """Reasons a configuration cannot run at all (the launcher raises on these)."""
    reasons: list[str] = []
    for name, value, limit in (
        ("seq_len", seq_len, MAX_SEQ_LEN),
        ("d_model", d_model, MAX_D_MODEL),
        ("ffn_dim", ffn_dim, MAX_FFN_DIM),
    ):
        if not 1 <= value <= limit:
            reasons.append(
                f"{name}={value} is outside 1..{limit} for the fused layer (whole rows and "
                "recomputed K/V per query block); use the per-op kernels"
            )
    if num_heads < 1 or d_model % num_heads:
        reasons.append(f"num_heads={num_heads} must be >= 1 and divide d_model={d_model}")
    else:
        head_dim = d_model // num_heads
        if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
            reasons.append(
                f"head_dim={head_dim} is outside {MIN_HEAD_DIM}..{MAX_HEAD_DIM}; "
                "use a different number of heads"
            )
    if not is_power_of_2(block_m) or block_m < MIN_BLOCK:
        reasons.append(f"block_m={block_m} must be a power of two >= {MIN_BLOCK}")
    if num_warps not in SUPPORTED_NUM_WARPS:
        reasons.append(f"num_warps={num_warps} must be one of {SUPPORTED_NUM_WARPS}")
    if num_stages < 1:
        reasons.append(f"num_stages={num_stages} must be >= 1")
    if precision not in BLOCK_PRECISIONS:
        known = precision_reasons(precision, None)
        reasons.append(
            known[0]
            if known
            else f"precision={precision!r} is not supported by the fused layer; use one of "
            f"{', '.join(BLOCK_PRECISIONS)}"
        )
    return reasons


# --------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------
def _check_x(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise ValueError(f"x has dtype {x.dtype}; pass float32 (x.float())")
    if x.dim() != 3 or not x.is_contiguous():
        raise ValueError(
            f"x has shape {tuple(x.shape)} and strides {x.stride()}; expected a contiguous "
            "[B, S, D] tensor (call .contiguous())"
        )


def _output_buffer(out: torch.Tensor | None, x: torch.Tensor, reads_x: str) -> torch.Tensor:
    """``out`` checked as the kernels' output for ``x`` (contiguous fp32 of x's shape, not
    x's storage: ``reads_x`` says why), or a new one when None."""
    if out is None:
        return torch.empty_like(x)
    if tuple(out.shape) != tuple(x.shape) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(
            f"out has shape {tuple(out.shape)}, dtype {out.dtype}; expected contiguous "
            f"float32 {tuple(x.shape)}"
        )
    if out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        raise ValueError(f"out shares storage with x; {reads_x}, pass another buffer")
    return out


def _check_key_lengths(key_lengths: torch.Tensor | None, batch: int) -> None:
    if key_lengths is None:
        return
    if not isinstance(key_lengths, torch.Tensor) or key_lengths.dtype not in (
        torch.int32,
        torch.int64,
    ):
        raise ValueError(
            f"key_lengths has dtype {getattr(key_lengths, 'dtype', type(key_lengths))}; "
            "pass an int32/int64 tensor [B] (lengths_from_mask(mask) builds one)"
        )
    if tuple(key_lengths.shape) != (batch,) or not key_lengths.is_contiguous():
        raise ValueError(
            f"key_lengths has shape {tuple(key_lengths.shape)}; expected a contiguous [{batch}]"
        )


def _mask_bytes(key_mask: torch.Tensor, batch: int, seq_len: int) -> torch.Tensor:
    """A bool [B, S] token mask as contiguous bytes the kernels read."""
    if not isinstance(key_mask, torch.Tensor) or key_mask.dtype != torch.bool:
        raise ValueError(
            f"key_mask has dtype {getattr(key_mask, 'dtype', type(key_mask))}; pass bool [B, S]"
        )
    if tuple(key_mask.shape) != (batch, seq_len):
        raise ValueError(
            f"key_mask has shape {tuple(key_mask.shape)}; expected ({batch}, {seq_len})"
        )
    return key_mask.contiguous().view(torch.uint8)


def _check_norm(final_norm: tuple[torch.Tensor, torch.Tensor], d_model: int) -> None:
    if not isinstance(final_norm, (tuple, list)) or len(final_norm) != 2:
        raise ValueError("final_norm must be a (weight, bias) pair")
    for name, t in zip(("weight", "bias"), final_norm, strict=True):
        if (
            not isinstance(t, torch.Tensor)
            or tuple(t.shape) != (d_model,)
            or t.dtype != torch.float32
            or not t.is_contiguous()
        ):
            raise ValueError(
                f"final_norm {name} has shape {tuple(getattr(t, 'shape', ()))} and dtype "
                f"{getattr(t, 'dtype', None)}; expected contiguous float32 ({d_model},)"
            )


def fused_layer(
    x: torch.Tensor,
    layer_weights: BlockWeights | torch.nn.Module,
    *,
    num_heads: int,
    causal: bool,
    key_lengths: torch.Tensor | None = None,
    key_mask: torch.Tensor | None = None,
    final_norm: tuple[torch.Tensor, torch.Tensor] | None = None,
    precision: str = "tf32",
    block_m: int = 32,
    num_warps: int = 4,
    num_stages: int = 1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One pre-norm layer (``x [B, S, D]`` fp32 contiguous) in two launches.

    Returns the layer's output, or ``final_norm(output)`` (padded rows zeroed) when
    ``final_norm=(weight, bias)``. ``key_lengths`` [B] (int) masks keys ``>= length`` and
    zeroes those rows, as the reference does with ``mask = arange(S) < lengths``;
    ``key_mask`` [B, S] bool does the same for any mask (read on the device, no sync).
    ``out`` may be given (same shape, must not overlap ``x``); kernel B runs in place in it.
    """
    _check_x(x)
    if not isinstance(layer_weights, BlockWeights):
        layer_weights = prepare_block_weights(layer_weights, device=x.device)
    w = layer_weights
    batch, seq_len, d_model = x.shape
    if w.d_model != d_model:
        raise ValueError(
            f"layer weights have d_model={w.d_model} but x has {d_model} features; "
            "pass the matching layer"
        )
    w.check()
    check_precision(precision)
    _check_key_lengths(key_lengths, batch)
    mask_bytes = None if key_mask is None else _mask_bytes(key_mask, batch, seq_len)
    if key_lengths is not None and mask_bytes is not None:
        raise ValueError("pass key_lengths or key_mask, not both")
    if final_norm is not None:
        _check_norm(final_norm, d_model)
    errors = _config_errors(
        seq_len=seq_len,
        d_model=d_model,
        num_heads=num_heads,
        ffn_dim=w.ffn_dim,
        block_m=block_m,
        num_warps=num_warps,
        num_stages=num_stages,
        precision=precision,
    )
    if errors:
        raise ValueError("; ".join(errors))
    out = _output_buffer(out, x, "kernel A reads all of x")
    tensors = {"x": x, "out": out, "weights": w.q_weight}
    if key_lengths is not None:
        tensors["key_lengths"] = key_lengths
    if mask_bytes is not None:
        tensors["key_mask"] = mask_bytes
    if final_norm is not None:
        tensors["final_norm"] = final_norm[0]
    check_launch_device(_attention_half_kernel, tensors)
    if x.numel() == 0:
        return out

    head_dim = d_model // num_heads
    block_d, block_hd = padded_dim(d_model), padded_dim(head_dim)
    emulate = is_interpreted(_attention_half_kernel)
    lengths = key_lengths if key_lengths is not None else x  # dummy pointer when unused
    mask_arg = mask_bytes if mask_bytes is not None else x
    _attention_half_kernel[(batch, triton.cdiv(seq_len, block_m))](
        x,
        out,
        lengths,
        mask_arg,
        w.norm1_weight,
        w.norm1_bias,
        w.q_weight,
        w.q_bias,
        w.k_weight,
        w.k_bias,
        w.v_weight,
        w.v_bias,
        w.o_weight,
        w.o_bias,
        seq_len,
        d_model,
        num_heads,
        head_dim,
        head_dim**-0.5 * LOG2_E,
        LAYERNORM_EPS,
        CAUSAL=bool(causal),
        HAS_KEY_LENGTHS=key_lengths is not None,
        HAS_KEY_MASK=mask_bytes is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_m,
        BLOCK_D=block_d,
        BLOCK_HD=block_hd,
        PRECISION=precision,
        EMULATE_BF16_DOT=emulate,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    num_rows = batch * seq_len
    norm_w, norm_b = final_norm if final_norm is not None else (w.norm2_weight, w.norm2_bias)
    _ffn_half_kernel[(triton.cdiv(num_rows, block_m),)](
        out,
        out,
        lengths,
        mask_arg,
        w.norm2_weight,
        w.norm2_bias,
        w.ffn_in_weight,
        w.ffn_in_bias,
        w.ffn_out_weight,
        w.ffn_out_bias,
        norm_w,
        norm_b,
        num_rows,
        seq_len,
        d_model,
        w.ffn_dim,
        LAYERNORM_EPS,
        HAS_KEY_LENGTHS=key_lengths is not None,
        HAS_KEY_MASK=mask_bytes is not None,
        FINAL_NORM=final_norm is not None,
        BLOCK_M=block_m,
        BLOCK_D=block_d,
        BLOCK_F=ffn_chunk(d_model, w.ffn_dim),
        PRECISION=precision,
        EMULATE_BF16_DOT=emulate,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def fused_forward(
    x: torch.Tensor,
    all_layer_weights: Sequence[BlockWeights | torch.nn.Module],
    final_norm_weights: tuple[torch.Tensor, torch.Tensor] | torch.nn.Module,
    *,
    num_heads: int,
    causal: bool,
    key_lengths: torch.Tensor | None = None,
    key_mask: torch.Tensor | None = None,
    precision: str = "tf32",
    block_m: int = 32,
    num_warps: int = 4,
    num_stages: int = 1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every layer (2 launches each), the final norm fused into the last layer's kernel B.

    ``final_norm_weights`` is ``(weight, bias)`` or an ``nn.LayerNorm``. Uses two [B, S, D]
    buffers (``out`` and one temporary) alternately; ``x`` is never written.
    """
    if len(all_layer_weights) == 0:
        raise ValueError("all_layer_weights is empty; pass at least one layer")
    if isinstance(final_norm_weights, torch.nn.Module):
        final_norm_weights = (
            final_norm_weights.weight.detach().float().contiguous(),
            final_norm_weights.bias.detach().float().contiguous(),
        )
    _check_x(x)
    num_layers = len(all_layer_weights)
    if out is None:
        out = torch.empty_like(x)
    spare = torch.empty_like(x) if num_layers > 1 else None
    # Pick the first buffer so that the last layer writes into ``out``.
    buffers = [out, spare] if num_layers % 2 == 1 else [spare, out]
    current = x
    for i, layer in enumerate(all_layer_weights):
        last = i == num_layers - 1
        current = fused_layer(
            current,
            layer,
            num_heads=num_heads,
            causal=causal,
            key_lengths=key_lengths,
            key_mask=key_mask,
            final_norm=final_norm_weights if last else None,
            precision=precision,
            block_m=block_m,
            num_warps=num_warps,
            num_stages=num_stages,
            out=buffers[i % 2],
        )
    return current
