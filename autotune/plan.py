"""Plans: one frozen, hashable, JSON-round-trippable choice of every implementation knob.

A plan is data. Search spaces produce plans, the builder turns them into modules and
the generated tables store them. A JSON plan may name only some knobs; the others take
the reference's choice. The short hash covers only the knobs that differ from the
reference, so adding a knob later does not change the hash of an existing plan.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune import backends


@dataclasses.dataclass(frozen=True)
class Knob:
    """One implementation choice: its values (or integer range), default and needs."""

    name: str
    default: Any
    help: str
    choices: tuple[Any, ...] = ()
    int_range: tuple[int, int] | None = None  # inclusive, for integer knobs
    needs: Mapping[Any, str] = dataclasses.field(default_factory=dict)
    group: str = "harness"

    def validate(self, value: Any) -> Any:
        if self.int_range is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"knob {self.name!r} takes an integer in {self.int_range[0]}.."
                    f"{self.int_range[1]}, got {value!r}"
                )
            lo, hi = self.int_range
            if not lo <= value <= hi:
                raise ValueError(f"knob {self.name!r} takes an integer in {lo}..{hi}, got {value}")
            return value
        if value not in self.choices or type(value) is not type(self.default):
            valid = ", ".join(json.dumps(c) for c in self.choices)
            raise ValueError(f"knob {self.name!r} has no value {value!r}; valid values: {valid}")
        return value

    def describe_values(self) -> str:
        if self.int_range is not None:
            return f"integer {self.int_range[0]}..{self.int_range[1]}"
        return " | ".join(json.dumps(c) for c in self.choices)


PRECISIONS = ("fp32", "ieee", "fp16", "bf16")

KNOBS: tuple[Knob, ...] = (
    Knob(
        "attention",
        "reference",
        "attention backend",
        choices=backends.values("attention"),
        needs=backends.needs("attention"),
    ),
    Knob(
        "qkv",
        "separate",
        "QKV projection: three GEMMs, or one packed GEMM with views into its output",
        choices=("separate", "packed"),
    ),
    Knob(
        "heads",
        "contiguous",
        "head layout: contiguous [B,H,S,hd] copies, or strided views with no copies",
        choices=("contiguous", "strided"),
    ),
    Knob(
        "mask",
        "apply",
        "mask handling: always apply, or drop masks proven no-ops at run time "
        "(all-True; causal with right padding for valid rows)",
        choices=("apply", "elide"),
    ),
    Knob(
        "attn_precision",
        "fp32",
        "operand precision inside attention (fp32 = TF32 matmuls as the reference)",
        choices=PRECISIONS,
        needs={"bf16": "CUDA sm_80+ or CPU", "fp16": "any device (slow on CPU)"},
    ),
    Knob(
        "attn_drop_bits",
        0,
        "the per-layer path's half q, k, v rounded to nearest with their lowest N mantissa "
        "bits cleared, in place, before the attention (0 = off): fewer operand bits flip in "
        "the tensor cores, so an attention at the power cap runs at a higher clock; coarser "
        "operands, held to the rule like any precision. Above 0 it needs gemm_precision = "
        "attn_precision = fp16 (N <= 9) or bf16 (N <= 6), no fused layer and compile none",
        int_range=(0, 9),
    ),
    Knob(
        "attn_drop_bits_late",
        0,
        "q, k, v at sequence positions attn_drop_late_from and after rounded with N mantissa "
        "bits cleared instead of attn_drop_bits (0 = off): under a causal mask a late query "
        "averages many keys, so its context carries an operand's rounding error divided by "
        "about the square root of its position, and the early rows, whose few keys weigh "
        "most, keep the finer operands. Above 0 it needs what attn_drop_bits needs, N above "
        "attn_drop_bits and attn_drop_late_from >= 1",
        int_range=(0, 9),
    ),
    Knob(
        "attn_drop_late_from",
        0,
        "the first sequence position attn_drop_bits_late rounds (0 with it off)",
        int_range=(0, 1 << 24),
    ),
    Knob(
        "gemm_precision",
        "fp32",
        "operand precision of the projection and FFN GEMMs (fp32 accumulation)",
        choices=PRECISIONS,
        needs={"bf16": "CUDA sm_80+ or CPU", "fp16": "any device (slow on CPU)"},
    ),
    Knob(
        "batch_chunk",
        0,
        "process the batch in chunks of N sequences (0 = whole batch): bounded memory",
        int_range=(0, 1 << 20),
    ),
    Knob(
        "batch_streams",
        1,
        "issue the batch chunks round-robin on N CUDA streams (1 = one stream): chunks are "
        "independent sequences, so one chunk's memory-bound kernels run beside another's "
        "attention; N chunks' activations are live at once. Above 1 it needs CUDA, "
        "batch_chunk > 0, cuda_graph false, host_io false and compile none",
        int_range=(1, 8),
    ),
    Knob(
        "query_chunk",
        0,
        "reference attention in query-prefix chunks of N rows (0 = all rows at once): each "
        "chunk's scores [N, keys up to its last row] exist one at a time, bounding memory",
        int_range=(0, 1 << 20),
    ),
    Knob(
        "compile",
        "none",
        "torch.compile mode of the forward",
        choices=(
            "none",
            "default",
            "reduce-overhead",
            "max-autotune-no-cudagraphs",
            "max-autotune",
        ),
        needs={"reduce-overhead": "CUDA, and cuda_graph false (it captures graphs itself)"},
    ),
    Knob(
        "host_io",
        False,
        "the caller's input and output live in host memory: batch chunks are copied in and "
        "out, overlapped with compute, so the whole batch never occupies the device",
        choices=(False, True),
        needs={True: "CUDA, cuda_graph false"},
    ),
    Knob(
        "cuda_graph",
        False,
        "capture the whole forward as one CUDA graph per shape and mask contract",
        choices=(False, True),
        needs={True: "CUDA"},
    ),
    # Triton kernels (kernels/): tiles of the fused attention, fused LayerNorm, FFN epilogue.
    Knob(
        "attn_block_m",
        64,
        "Triton attention: query rows per program",
        choices=(16, 32, 64, 128),
        group="kernels",
    ),
    Knob(
        "attn_block_n",
        64,
        "Triton attention: keys per inner step",
        choices=(16, 32, 64, 128),
        group="kernels",
    ),
    Knob(
        "attn_warps",
        4,
        "Triton attention: warps per program (fused_layer=seq: of the whole layer's program)",
        choices=(1, 2, 4, 8, 16),
        group="kernels",
    ),
    Knob(
        "attn_stages",
        2,
        "Triton attention: software pipeline stages",
        choices=(1, 2, 3, 4),
        group="kernels",
    ),
    Knob(
        "attn_maxnreg",
        0,
        "Triton attention (attention=triton, per layer or in fused_layer=rows without "
        "row_attn_post): the most registers a thread of the flash attention kernel (Triton's, "
        "or Gluon's with attn_gluon_flash) may hold, ptxas's maxnreg (0: the compiler's "
        "choice); more programs resident an SM, or spills "
        "(`autotune kernels inspect` shows both; the same arithmetic)",
        choices=(0, 80, 96, 128),
        needs={
            v: "attention=triton, fused_layer none or rows without row_attn_post"
            for v in (80, 96, 128)
        },
        group="kernels",
    ),
    Knob(
        "attn_head_chunk",
        0,
        "Triton attention (attention=triton, per layer or in fused_layer=rows without "
        "row_attn_post): 0 runs the flash form (online softmax over key blocks of "
        "attn_block_n); a width holds every key of the sequence in one tile (S <= 256) and "
        "walks the head dim in chunks of that width, an exact softmax: a score tile and one "
        "output chunk in registers instead of the whole [attn_block_m, head_dim] accumulator "
        "(large head dims)",
        choices=(0, 16, 32, 64, 128),
        needs={
            v: "attention=triton, fused_layer none or rows without row_attn_post, S <= 256"
            for v in (16, 32, 64, 128)
        },
        group="kernels",
    ),
    Knob(
        "attn_gluon_flash",
        False,
        "Triton attention (attention=triton, per layer or in fused_layer=rows without "
        "row_attn_post): the flash attention in Gluon for Hopper (sm_90), each key block's "
        "softmax beside the previous block's p @ v (wgmma): 64 query rows a warpgroup of "
        "attn_warps (attn_block_m does not apply), attn_block_n 64 or 128 keys a step, "
        "attn_stages 3 or 4 key and value buffers (fp16 q, k, v and context, head dims "
        "16-128; the same arithmetic as the Triton kernel's fp16 form)",
        choices=(False, True),
        needs={True: "attention=triton, fused_layer none or rows without row_attn_post"},
        group="kernels",
    ),
    Knob(
        "layernorm",
        "torch",
        "LayerNorm: torch ops, or the fused residual-add + LayerNorm + row-zeroing Triton kernel",
        choices=backends.values("layernorm"),
        needs=backends.needs("layernorm"),
        group="kernels",
    ),
    Knob(
        "ffn_act",
        "torch",
        "ffn_in bias + exact GELU: torch ops, a Triton epilogue after a bias-free GEMM, "
        "or a Triton GEMM with the GELU epilogue; or blas_tanh, the bias and the tanh GELU "
        "in the GEMM's own (cuBLASLt) epilogue",
        choices=backends.values("ffn_act"),
        needs=backends.needs("ffn_act"),
        group="kernels",
    ),
    Knob(
        "poly_chunk",
        256,
        "polynomial attention: keys per chunk of the linear scan (state memory per chunk)",
        choices=(64, 128, 256, 512, 1024),
        group="kernels",
    ),
    Knob(
        "poly_exact_prefix",
        0,
        "polynomial attention: the first N query rows are computed by exact softmax attention",
        int_range=(0, 1 << 20),
        group="kernels",
    ),
    Knob(
        "poly_guard",
        0.5,
        "polynomial attention: the run-time guard takes the exact path when the sampled "
        "spread of the scaled scores max|q.k|/sqrt(hd) exceeds this",
        choices=(0.125, 0.25, 0.5, 1.0, 2.0, 2.25, 4.0, 8.0),
        group="kernels",
    ),
    Knob(
        "poly_norm",
        "taylor",
        "polynomial attention weights: 'taylor' 1 + s + s^2/2, or 'row' 1 + t + (t^2 - var)/2 "
        "with t = s - mean over each row's own scores (no bias that stays with many keys)",
        choices=("taylor", "row"),
        group="kernels",
    ),
    Knob(
        "poly_stats_first",
        False,
        "polynomial attention with poly_norm=row: its output kernel takes each row's score "
        "statistics before the prefix dots and sums the prefix in one accumulator (fewer "
        "live registers; the same weights, summed in another order)",
        choices=(False, True),
        needs={True: "attention=polynomial, poly_norm=row"},
        group="kernels",
    ),
    Knob(
        "poly_out_block_n",
        0,
        "polynomial attention: keys a step of its output kernel (0: 64, as its prefix scan)",
        choices=(0, 16, 32),
        needs={16: "attention=polynomial", 32: "attention=polynomial"},
        group="kernels",
    ),
    Knob(
        "poly_out_stages",
        0,
        "polynomial attention: pipeline stages of its output kernel (0: 2, as its prefix scan)",
        choices=(0, 3, 4),
        needs={3: "attention=polynomial", 4: "attention=polynomial"},
        group="kernels",
    ),
    Knob(
        "poly_prefix_flat",
        False,
        "polynomial attention: its prefix scan as one loop over every key block (pipelined "
        "across chunk boundaries; the same sums in the same order)",
        choices=(False, True),
        needs={True: "attention=polynomial"},
        group="kernels",
    ),
    Knob(
        "poly_prefix_stages",
        0,
        "polynomial attention: pipeline stages of its prefix scan (0: 2; also the output "
        "kernel's when poly_out_stages is 0)",
        choices=(0, 3, 4),
        needs={3: "attention=polynomial", 4: "attention=polynomial"},
        group="kernels",
    ),
    Knob(
        "fused_block",
        False,
        "the whole pre-norm layer in two Triton launches (attention half, FFN half; the final "
        "norm fused into the last); tiles from attn_block_m/attn_warps/attn_stages, operand "
        "precision from attn_precision",
        choices=backends.values("fused_block"),
        needs=backends.needs("fused_block"),
        group="kernels",
    ),
    Knob(
        "fused_layer",
        "none",
        "whole layers for any batch: heads = two launches a layer (LayerNorm1, projections and "
        "attention per query block, head and sequence; then out-proj, LayerNorm2, FFN and "
        "residuals per row block), rows = three (LayerNorm1 + QKV per row block, the flash "
        "attention, the same row kernel), seq = one (a query block of one sequence per "
        "program: every head, out-proj, FFN; attn_block_m rows, attn_warps); attention tiles "
        "from attn_*, operand precisions from attn_precision and gemm_precision",
        choices=backends.values("fused_layer"),
        needs=backends.needs("fused_layer"),
        group="kernels",
    ),
    Knob(
        "row_block",
        32,
        "fused_layer heads and rows: rows per program of the row kernels",
        choices=(16, 32, 64, 128),
        group="kernels",
    ),
    Knob(
        "row_warps",
        4,
        "fused_layer heads and rows: warps per program of the row kernels",
        choices=(2, 4, 8),
        group="kernels",
    ),
    Knob(
        "mask_bounds",
        False,
        "the Triton attention (fused_layer=rows, or attention=triton per layer) with a token "
        "mask: one launch (per forward, or per layer) finds each sequence's all-valid key "
        "prefix and last valid key on the device; the attention skips the mask inside the "
        "prefix and every key block past the last valid key (the same result)",
        choices=(False, True),
        needs={True: "attention=triton (per layer or fused_layer=rows)"},
        group="kernels",
    ),
    Knob(
        "row_ffn_block",
        0,
        "fused_layer heads, rows and seq: how many FFN columns the fused kernel computes a "
        "step (0: its default, 64, or 32 where d_model > 128); a smaller block keeps fewer "
        "registers live a step",
        choices=(0, 16, 32, 64, 128),
        group="kernels",
    ),
    Knob(
        "ffn_gelu",
        "erf",
        "fused_layer heads, rows and seq: the FFN's GELU, erf (the reference's form, "
        "libdevice erf) or poly: v * sigmoid(p(v)), p an odd quintic on v clamped to +-8, one "
        "exp2 and a fast division, within 2.6e-5 of the erf GELU for every input (40x under "
        "the fp16 rounding of its output; the rule decides per case)",
        choices=("erf", "poly"),
        needs={"poly": "fused_layer=heads, rows or seq"},
        group="kernels",
    ),
    Knob(
        "row_maxnreg",
        0,
        "fused_layer heads and rows: the most registers a thread of the row kernels (QKV "
        "rows, post rows) may hold, ptxas's maxnreg (0: the compiler's choice). Fewer "
        "registers, more programs resident on an SM to hide latency; too few spill to local "
        "memory (`autotune kernels inspect` shows both before any device time; the same "
        "arithmetic)",
        choices=(0, 128, 168),
        needs={128: "fused_layer=heads or rows", 168: "fused_layer=heads or rows"},
        group="kernels",
    ),
    Knob(
        "row_qkv_stages",
        0,
        "fused_layer=rows: software pipeline stages of the QKV rows kernel's loop over the "
        "packed weights (0: Triton's default, 3). Fewer stages, less shared memory a program "
        "and more programs resident an SM (case 6 offline: 73.7 KB and 3 blocks at 3 stages, "
        "57.3 KB and 4 blocks at 2); the same arithmetic",
        choices=(0, 1, 2),
        needs={1: "fused_layer=rows", 2: "fused_layer=rows"},
        group="kernels",
    ),
    Knob(
        "row_fold_residual",
        False,
        "the post-attention rows kernel (fused_layer=heads or rows, not row_attn_post): the "
        "output projection accumulates onto x + bo instead of onto zeros with x added after "
        "it (the residual's load issued before the projection's loop); the same sums in "
        "another order, fp32 rounding apart",
        choices=(False, True),
        needs={True: "fused_layer=heads or rows, without row_attn_post"},
        group="kernels",
    ),
    Knob(
        "row_stage",
        False,
        "the post-attention rows kernel (fused_layer=heads or rows): the residual x + "
        "attention waits in the output rows during the FFN instead of in registers (fewer "
        "live registers; the same result, bit for bit)",
        choices=(False, True),
        needs={True: "fused_layer=heads or rows"},
        group="kernels",
    ),
    Knob(
        "row_attn_post",
        False,
        "fused_layer=rows: the flash attention and the post-attention rows kernel as one "
        "kernel (two launches a layer): a program per query block and sequence runs every "
        "head in turn, accumulates the output projection, then the FFN of its rows "
        "(attn_block_m rows, attn_warps); no context buffer",
        choices=(False, True),
        needs={True: "fused_layer=rows"},
        group="kernels",
    ),
    Knob(
        "row_next_qkv",
        False,
        "fused_layer=rows: each layer's post-attention rows kernel but the last's also "
        "computes the next layer's LayerNorm1 and QKV projections from the rows it has just "
        "written (two launches a layer and one; the residual stream read once a layer "
        "fewer; the same arithmetic on the same values)",
        choices=(False, True),
        needs={True: "fused_layer=rows without row_attn_post"},
        group="kernels",
    ),
    Knob(
        "row_gluon",
        False,
        "fused_layer=heads or rows: the post-attention rows kernel (and rows' QKV rows "
        "kernel) in Gluon for Hopper (sm_90): persistent programs with the layer's weights "
        "resident in shared memory, each GEMM "
        "one wgmma, the next tile's context copied in during this tile's FFN (fp16 operands, "
        "d_model = ffn_dim in 32/64/128, 4 or 8 row warps; the residual rides in the "
        "accumulators, so the Triton kernel's row_stage, row_fold_residual and row_ffn_block "
        "do not apply)",
        choices=(False, True),
        needs={True: "fused_layer=heads or rows without row_attn_post"},
        group="kernels",
    ),
    Knob(
        "attn_gluon",
        0,
        "fused_layer=heads: the heads attention in Gluon for Hopper (sm_90) with this many "
        "heads a program (0: the Triton heads kernel): persistent programs, each owning a "
        "group of heads (their q, k, v weight rows resident in shared memory) and looping "
        "over sequences, every key in one tile (S <= 64 a warpgroup of attn_warps), each "
        "GEMM one wgmma (fp16 operands, d_model 32/64/128, head dims 16-128, and 8 in pairs: "
        "an even number a program; attn_block_m, attn_block_n and attn_stages do not apply)",
        choices=(0, 1, 2, 4, 8, 16),
        needs={n: "fused_layer=heads" for n in (1, 2, 4, 8, 16)},
        group="kernels",
    ),
    Knob(
        "row_next_norm",
        False,
        "fused_layer=heads: each layer's post-attention rows kernel but the last's also "
        "writes the next layer's LayerNorm1 of the rows it has just written, as GEMM "
        "operands; the next heads attention loads them instead of normalising the residual "
        "stream's key and query rows in every program (the same arithmetic on the same "
        "values; compiled, the LayerNorm may sum in another order)",
        choices=(False, True),
        needs={True: "fused_layer=heads"},
        group="kernels",
    ),
    Knob(
        "pdl",
        False,
        "fused_layer=heads or rows: their kernels (attention, QKV rows, post rows; not the "
        "key-bounds kernel or torch ops) launched with programmatic dependent launch "
        "(Hopper and newer): the next kernel's launch overlaps the tail of the one before "
        "it, and it waits for that one to finish before its first load (the same "
        "arithmetic; fewer microseconds between dependent launches)",
        choices=(False, True),
        needs={True: "fused_layer=heads or rows without row_attn_post; CUDA sm_90+"},
        group="kernels",
    ),
    Knob(
        "pdl_trigger",
        "start",
        "pdl=True: where each kernel lets the next one launch: start (right after its own "
        "wait; the next kernel's programs become resident and wait while it runs) or end "
        "(after its last store; only the next launch's latency overlaps its tail)",
        choices=("start", "end"),
        needs={"end": "pdl=True"},
        group="kernels",
    ),
    Knob(
        "one_launch",
        False,
        "fused_layer=heads with row_next_norm: the whole forward in one launch "
        "(kernels.stack): persistent programs, at most one a multiprocessor, run every "
        "layer's heads attention and post rows as phases with a grid-wide barrier between "
        "them, at max(attn_warps, row_warps) warps and attn_stages (the same arithmetic; no "
        "launch between layers)",
        choices=(False, True),
        needs={True: "fused_layer=heads with row_next_norm, no attn_gluon, row_gluon or pdl"},
        group="kernels",
    ),
    Knob(
        "weights_first",
        False,
        "fused_layer=heads (its Triton kernels): each heads attention and post rows program "
        "loads its weight tiles (the head's q, k, v; Wo, W1 and W2 whole) before anything "
        "else, with pdl before its wait for the previous kernel, so the loads overlap that "
        "kernel's tail; then the output projection and the FFN each in a single step, not "
        "in column blocks (the same arithmetic; d_model and ffn_dim, padded, at most 128)",
        choices=(False, True),
        needs={
            True: "fused_layer=heads; attn_gluon, row_gluon and row_ffn_block 0; one_launch off"
        },
        group="kernels",
    ),
)

KNOBS_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}


# Knobs that existed and were removed: stored plans (studies.db's trials, plan files) that
# hold one at its default value read as the same plan without it (the hash leaves defaults
# out, so it is unchanged); any other value is refused with the reason.
RETIRED_KNOBS: dict[str, tuple[Any, str]] = {
    "attn_ws": (
        False,
        "session 26: the warp-specialised attention failed its checks compiled on the H200 "
        "and ran slower than cuDNN; docs/kernels_h200.md",
    ),
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every implementation choice; defaults are the reference's choices."""

    attention: str = "reference"
    qkv: str = "separate"
    heads: str = "contiguous"
    mask: str = "apply"
    attn_precision: str = "fp32"
    attn_drop_bits: int = 0
    attn_drop_bits_late: int = 0
    attn_drop_late_from: int = 0
    gemm_precision: str = "fp32"
    batch_chunk: int = 0
    batch_streams: int = 1
    query_chunk: int = 0
    compile: str = "none"
    host_io: bool = False
    cuda_graph: bool = False
    attn_block_m: int = 64
    attn_block_n: int = 64
    attn_warps: int = 4
    attn_stages: int = 2
    attn_maxnreg: int = 0
    attn_head_chunk: int = 0
    attn_gluon_flash: bool = False
    layernorm: str = "torch"
    ffn_act: str = "torch"
    poly_chunk: int = 256
    poly_exact_prefix: int = 0
    poly_guard: float = 0.5
    poly_norm: str = "taylor"
    poly_stats_first: bool = False
    poly_out_block_n: int = 0
    poly_out_stages: int = 0
    poly_prefix_flat: bool = False
    poly_prefix_stages: int = 0
    fused_block: bool = False
    fused_layer: str = "none"
    row_block: int = 32
    row_warps: int = 4
    mask_bounds: bool = False
    row_ffn_block: int = 0
    ffn_gelu: str = "erf"
    row_maxnreg: int = 0
    row_qkv_stages: int = 0
    row_fold_residual: bool = False
    row_stage: bool = False
    row_attn_post: bool = False
    row_next_qkv: bool = False
    row_gluon: bool = False
    attn_gluon: int = 0
    row_next_norm: bool = False
    pdl: bool = False
    pdl_trigger: str = "start"
    one_launch: bool = False
    weights_first: bool = False

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            KNOBS_BY_NAME[field.name].validate(getattr(self, field.name))

    # --- serialisation -------------------------------------------------------------
    def to_dict(self, *, full: bool = True) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if full:
            return data
        default = dataclasses.asdict(REFERENCE_PLAN)
        return {k: v for k, v in data.items() if v != default[k]}

    def to_json(self, *, full: bool = False) -> str:
        return json.dumps(self.to_dict(full=full), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        if not isinstance(data, Mapping):
            raise ValueError(f"a plan is a JSON object of knob: value, got {data!r}")
        retired = {k: v for k, v in data.items() if k in RETIRED_KNOBS}
        for name, value in retired.items():
            default, why = RETIRED_KNOBS[name]
            if value != default:
                raise ValueError(
                    f"knob {name}={value!r} was removed ({why}); only {name}={default!r} "
                    "still reads (as the plan without it): drop the key from the plan"
                )
        data = {k: v for k, v in data.items() if k not in retired}
        unknown = sorted(set(data) - set(KNOBS_BY_NAME))
        if unknown:
            close = {u: difflib.get_close_matches(u, KNOBS_BY_NAME, n=1) for u in unknown}
            hints = [f"{u!r} (did you mean {c[0]!r}?)" for u, c in close.items() if c]
            raise ValueError(
                f"unknown knob(s) {unknown}"
                + (f": {', '.join(hints)}" if hints else "")
                + "; run 'autotune knobs' for every knob and its values"
            )
        return cls(**dict(data))

    @classmethod
    def from_describe(cls, text: str) -> Plan:
        """A plan from the ``knob=value ...`` form every command prints (``describe``)."""
        data: dict[str, Any] = {}
        for token in text.split():
            name, sep, raw = token.partition("=")
            knob = KNOBS_BY_NAME.get(name)
            if not sep:
                raise ValueError(f"plan token {token!r}: write knob=value, e.g. qkv=packed")
            if name in data:
                raise ValueError(f"plan text sets {name} twice ({text!r}): give each knob once")
            if name in RETIRED_KNOBS:  # read as from_dict reads it (its default: dropped)
                default = RETIRED_KNOBS[name][0]
                data[name] = default if raw in (str(default), json.dumps(default)) else raw
                continue
            if knob is None:
                cls.from_dict({name: raw})  # raises: the unknown knob named, with a hint
            data[name] = _knob_value(knob, raw)
        return cls.from_dict(data)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"plan is not valid JSON ({exc}): {text[:80]!r}") from exc
        return cls.from_dict(data)

    @property
    def hash(self) -> str:
        """Stable short hash over the knobs that differ from the reference plan."""
        return hashlib.sha256(self.to_json(full=False).encode()).hexdigest()[:12]

    def replace(self, **changes: Any) -> Plan:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        diff = self.to_dict(full=False)
        if not diff:
            return "reference"
        return " ".join(f"{k}={v}" for k, v in sorted(diff.items()))

    @property
    def uses_triton(self) -> bool:
        """Whether any backend the plan picks runs the project's Triton kernels."""
        return backends.uses_triton(self)

    @property
    def reads_mask_on_host(self) -> bool:
        """Whether every call reads the mask's values on the host (one synchronisation on
        CUDA): to drop a mask proven a no-op (``mask=elide`` with a PyTorch attention), or
        to route a general mask elsewhere. The Triton attention and the fused layers take
        any mask on the device."""
        return backends.reads_mask_on_host(self)


REFERENCE_PLAN = Plan()

# What a user writes in one line instead of tuning, as plans: the SDPA swap, and it under
# torch.compile. Export measures them beside its finalists and ships the faster passing
# one; ``autotune bench --anchors`` times them beside the table.
ANCHORS: dict[str, Plan] = {
    "sdpa": Plan(attention="sdpa_auto"),
    "sdpa+reduce-overhead": Plan(attention="sdpa_auto", compile="reduce-overhead"),
    "max-autotune": Plan(attention="sdpa_auto", compile="max-autotune"),
}
# max-autotune compiles for minutes per shape and failed the accuracy rule on cases 1, 2
# and 6 on the H200 (its TF32 Triton GEMMs drift): export leaves it out unless asked.
EXPORT_ANCHORS = ("sdpa", "sdpa+reduce-overhead")


def parse_anchors(spec: str | None) -> list[str]:
    """``--anchors``: None or "none" (no anchors), "all", or a comma list of ANCHORS names."""
    if spec is None or spec.strip() in ("", "none"):
        return []
    names = list(ANCHORS) if spec == "all" else [a.strip() for a in spec.split(",")]
    unknown = [a for a in names if a not in ANCHORS]
    if unknown:
        raise ValueError(f"unknown anchors {unknown}; valid: {', '.join(ANCHORS)}, all or none")
    return names


def _knob_value(knob: Knob, raw: str) -> Any:
    """``raw`` as one of ``knob``'s values (as ``describe`` prints them, or as JSON)."""
    if knob.int_range is not None:
        try:
            return int(raw)
        except ValueError:
            return raw  # validate names the range
    for choice in knob.choices:
        if raw in (str(choice), json.dumps(choice)):
            return choice
    return raw  # validate lists the values


def parse_plan(text: str) -> Plan:
    """A plan from CLI text: ``reference``, JSON text, ``@path/to/plan.json``, or the
    ``knob=value ...`` form every command prints."""
    text = text.strip()
    if text == "reference":
        return REFERENCE_PLAN
    source = f"plan {text[:80]!r}"
    if text.startswith("@"):
        if not text[1:].strip():
            raise ValueError("plan '@' names no file; write @path/to/plan.json")
        path = Path(text[1:])
        if not path.is_file():
            raise ValueError(f"plan file {str(path)!r} does not exist")
        source = f"plan file {str(path)!r}"
        try:
            text = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{source} cannot be read ({exc})") from None
    if "=" in text and not text.startswith("{"):
        return Plan.from_describe(text)
    try:
        return Plan.from_json(text)
    except ValueError as exc:
        if "not valid JSON" not in str(exc):
            raise
        raise ValueError(
            f"{source} is neither JSON nor knob=value pairs; write e.g. "
            """'{"attention": "sdpa_flash", "qkv": "packed"}' or """
            "'attention=sdpa_flash qkv=packed'"
        ) from None
