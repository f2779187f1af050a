"""``autotune floors``: what the hardware allows per case, counted before any measurement.

Per forward of a case: the FLOPs (projections, attention with the causal half, FFN), the
fewest bytes a fused forward must move, and the time each takes at the device's ceilings;
then the floor of a forward run as ``launches`` kernels per layer (each layer's residual
stream read and written once per launch, its weights read once), with a launch latency
per kernel. With a bench CSV (``autotune bench --hot-path --csv``) the measured device time
per forward and kernel count stand beside it, and their ratio to the floor.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from autotune.core.cases import Case
from autotune.core.reference import TransformerConfig

# Ceilings measured on the lent H200 (../.library/device/KINDS.md, 2026-10-28/11-04): an
# 8192^3 bf16 product at 769-798 TFLOP/s on random data, device copies at ~4.3 TB/s
# (bytes read plus written). TF32 runs at half the fp16 rate on Hopper tensor cores. A
# captured kernel costs ~2.5 us however small (docs/fused_block.md: 8 kernels of the fused
# block, ~20 us of launch floor).
CEILINGS: dict[str, dict[str, float]] = {
    "h200": {"fp16_tflops": 790.0, "tf32_tflops": 395.0, "tb_per_s": 4.3, "launch_us": 2.5},
}


@dataclasses.dataclass(frozen=True)
class Floor:
    case: str
    flops: float  # per forward
    min_bytes: float  # input read, output written, weights read once (fp16), mask
    layer_bytes: float  # the same with every launch reading and writing the fp32 stream
    launches: int  # kernels per forward of the floor's design
    fp16_us: float
    tf32_us: float
    bytes_us: float
    launch_us: float
    floor_us: float  # max(fp16 arithmetic, layer bytes) + launches x latency


def forward_flops(c: TransformerConfig) -> float:
    """Multiply-adds x 2 of one forward: QKV and out projections, FFN, attention (causal:
    half of the S x S scores and of probs @ v)."""
    tokens = c.batch_size * c.seq_len
    proj = 2 * tokens * c.d_model * c.d_model * 4
    ffn = 2 * tokens * c.d_model * c.ffn_dim * 2
    pairs = c.seq_len * c.seq_len * (0.5 if c.causal else 1.0)
    attn = 2 * 2 * c.batch_size * c.num_heads * pairs * c.head_dim
    return float(c.num_layers * (proj + ffn + attn))


def weight_bytes(c: TransformerConfig, operand_bytes: int = 2) -> float:
    per_layer = (4 * c.d_model * c.d_model + 2 * c.d_model * c.ffn_dim) * operand_bytes
    biases_norms = (4 * c.d_model + c.ffn_dim + c.d_model + 4 * c.d_model) * 4
    return float(c.num_layers * (per_layer + biases_norms) + 2 * c.d_model * 4)


def floor_of(case: Case, ceilings: dict[str, float], launches_per_layer: int = 2) -> Floor:
    c = case.config
    stream = c.batch_size * c.seq_len * c.d_model * 4.0  # the fp32 residual stream
    mask = float(c.batch_size * c.seq_len)
    weights = weight_bytes(c)
    launches = launches_per_layer * c.num_layers
    flops = forward_flops(c)
    min_bytes = 2 * stream + weights + mask
    layer_bytes = 2 * stream * launches + weights + mask * launches
    fp16_us = flops / (ceilings["fp16_tflops"] * 1e12) * 1e6
    tf32_us = flops / (ceilings["tf32_tflops"] * 1e12) * 1e6
    bytes_us = layer_bytes / (ceilings["tb_per_s"] * 1e12) * 1e6
    launch_us = launches * ceilings["launch_us"]
    return Floor(
        case.id,
        flops,
        min_bytes,
        layer_bytes,
        launches,
        fp16_us,
        tf32_us,
        bytes_us,
        launch_us,
        max(fp16_us, bytes_us) + launch_us,
    )


def ceilings_for(profile: str, overrides: dict[str, float | None]) -> dict[str, float]:
    """The profile's measured ceilings with any given values in their place."""
    base = dict(CEILINGS.get(profile, {}))
    base.update({k: v for k, v in overrides.items() if v is not None})
    missing = [k for k in ("fp16_tflops", "tf32_tflops", "tb_per_s", "launch_us") if k not in base]
    if missing:
        flags = ", ".join("--" + k.replace("_", "-") for k in missing)
        raise ValueError(
            f"no measured ceilings for profile {profile!r} (known: {', '.join(CEILINGS)}); "
            f"give {flags}"
        )
    return base


def _fmt(value: float | None, spec: str, width: int) -> str:
    text = (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else format(value, spec)
    )
    return f"{text:>{width}}"


def floors_table(floors: list[Floor], measured: dict[str, Any] | None = None) -> str:
    """The floors as aligned columns (each as wide as its widest cell: case 14's figures run
    to seven digits); with ``measured`` (case -> bench row) the device time and kernels per
    forward measured, and measured / floor."""
    head = ["case", "GFLOP", "fp16 us", "tf32 us", "min MB", "layer MB", "bytes us"]
    head += ["launch us", "floor us"]
    if measured is not None:
        head += ["GPU us", "kernels", "x floor"]
    rows = []
    for f in floors:
        cells = [
            f.case,
            _fmt(f.flops / 1e9, ".2f", 0),
            _fmt(f.fp16_us, ".1f", 0),
            _fmt(f.tf32_us, ".1f", 0),
            _fmt(f.min_bytes / 1e6, ".1f", 0),
            _fmt(f.layer_bytes / 1e6, ".1f", 0),
            _fmt(f.bytes_us, ".1f", 0),
            _fmt(f.launch_us, ".0f", 0),
            _fmt(f.floor_us, ".1f", 0),
        ]
        if measured is not None:
            row = measured.get(f.case)
            gpu = getattr(row, "gpu_us", None)
            kernels = getattr(row, "kernels", None)
            cells += [
                _fmt(gpu, ".1f", 0),
                _fmt(kernels, ".0f", 0),
                _fmt(gpu / f.floor_us if gpu else None, ".1f", 0),
            ]
        rows.append(cells)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        padded = [c.rjust(w) for c, w in zip(cells, widths, strict=True)]
        return " ".join([cells[0].ljust(widths[0]), *padded[1:]]).rstrip()

    lines = [line(r) for r in [head, *rows]]
    return "\n".join(lines)
