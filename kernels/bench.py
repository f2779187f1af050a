"""Attention-only benchmark on a CUDA GPU: floors, torch SDPA backends, the Triton kernel.

    python -m kernels.bench [--shapes 1,8,11,13,14] [--cuda-graph] [--budget-s 180]

For each official case shape (all causal; case 14 is one batch slice) it prints:

- the floor: FLOPs ``2*2*B*H*S*S*hd/2`` (causal half) at ~790 TFLOP/s (fp16/bf16), ~395
  (tf32 dense), ~67 (fp32 FMA), against bytes (q, k, v, out in fp32, once) at ~4.3 TB/s;
- times (median, ``triton.testing.do_bench``, CUDA events) of torch SDPA per eligible
  backend: EFFICIENT with fp32 operands; FLASH and CUDNN with fp16 operands (the fp16
  casts happen outside the timed region, so those rows exclude the casts);
- the Triton kernel in tf32 and fp16 over a small tile grid; the best per precision is
  marked with ``*``.

Every result is checked against the fp32 reference (TF32 off) with the project rule
(atol 2e-3 OR rtol 2e-2 per element) and marked PASS/FAIL. At case 14 the dense
reference cannot run; the check uses 48 query rows (first, last, spread) computed
exactly by ``attention_reference(query_rows=...)``.

Without ``--cuda-graph`` the times include the Python launch overhead (a few us),
which matters for the small shapes; ``--cuda-graph`` times graph replays instead.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from kernels._tolerance import PROJECT_RULE, compare
from kernels._triton import device_limits

PEAK_FLOPS = {"fp16": 790e12, "tf32": 395e12, "fp32": 67e12}
PEAK_BYTES_PER_S = 4.3e12
CHECK_ROWS = 48  # query rows checked when the dense reference is too large
DENSE_REFERENCE_MAX_SCORES = 2**28  # B*H*S*S above this: check a subset of query rows


@dataclass(frozen=True)
class Shape:
    case: int
    batch: int
    seq_len: int
    heads: int
    head_dim: int

    @property
    def label(self) -> str:
        return (
            f"case {self.case}: B{self.batch} S{self.seq_len} H{self.heads} "
            f"hd{self.head_dim} causal"
        )

    @property
    def flops(self) -> float:
        return 2 * 2 * self.batch * self.heads * self.seq_len * self.seq_len * self.head_dim / 2

    @property
    def bytes(self) -> float:
        return 4 * self.batch * self.seq_len * self.heads * self.head_dim * 4

    @property
    def dense_reference_ok(self) -> bool:
        scores = self.batch * self.heads * self.seq_len * self.seq_len
        return scores <= DENSE_REFERENCE_MAX_SCORES


SHAPES = {
    1: Shape(1, 64, 128, 4, 32),
    8: Shape(8, 64, 128, 4, 256),
    11: Shape(11, 64, 128, 16, 8),
    13: Shape(13, 64, 1024, 4, 32),
    14: Shape(14, 1, 100_000, 16, 64),
}


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def __str__(self) -> str:
        return f"bm{self.block_m} bn{self.block_n} w{self.num_warps} s{self.num_stages}"


def candidate_tiles(head_dim: int) -> list[Tile]:
    """A small (block_m, block_n, num_warps, num_stages) grid per head-dim class."""
    if head_dim <= 16:
        grid = [(64, 64, 4, 2), (128, 64, 4, 2), (128, 128, 4, 2), (128, 128, 8, 3)]
    elif head_dim <= 64:
        grid = [(64, 64, 4, 2), (128, 64, 4, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 32, 4, 3)]
    else:
        grid = [(64, 32, 4, 1), (64, 32, 4, 2), (64, 64, 4, 1), (64, 64, 8, 1), (128, 32, 8, 1)]
    return [Tile(*t) for t in grid]


@dataclass
class Row:
    shape: Shape
    method: str
    precision: str
    config: str
    ms: float | None
    check: str
    note: str = ""
    best: bool = False

    def tflops(self) -> str:
        if self.ms is None:
            return "-"
        return f"{self.shape.flops / (self.ms * 1e-3) / 1e12:.1f}"


# --------------------------------------------------------------------------------------
# Inputs, reference, verification, timing
# --------------------------------------------------------------------------------------
def make_qkv(shape: Shape, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as [B, S, H, hd] views of one packed [B, S, 3D] tensor, like the layer."""
    gen = torch.Generator(device=device).manual_seed(1234)
    d_model = shape.heads * shape.head_dim
    qkv = torch.randn(shape.batch, shape.seq_len, 3 * d_model, device=device, generator=gen)
    view = qkv.view(shape.batch, shape.seq_len, 3, shape.heads, shape.head_dim)
    q, k, v = view.unbind(2)
    return q, k, v


def check_rows(shape: Shape, device: str) -> torch.Tensor | None:
    """Query rows the check covers: None (all) when the dense reference fits."""
    if shape.dense_reference_ok:
        return None
    spread = torch.linspace(0, shape.seq_len - 1, CHECK_ROWS - 2).round().long()
    rows = torch.cat([torch.tensor([1, shape.seq_len - 2]), spread]).unique()
    return rows.to(device)


@contextlib.contextmanager
def exact_fp32_matmul() -> Iterator[None]:
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor | None
) -> torch.Tensor:
    from kernels.attention import attention_reference

    with exact_fp32_matmul():
        return attention_reference(q, k, v, causal=True, query_rows=rows)


def verify(out_bshd: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor | None) -> str:
    selected = out_bshd if rows is None else out_bshd.index_select(1, rows)
    comparison = compare(selected, ref, PROJECT_RULE)
    status = "PASS" if comparison.passed else "FAIL"
    return f"{status} (max err {comparison.max_abs_err:.2g})"


def time_ms(fn: Callable[[], object], cuda_graph: bool) -> float:
    import triton.testing

    if cuda_graph:
        return float(triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def describe_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text[:200]


# --------------------------------------------------------------------------------------
# Methods
# --------------------------------------------------------------------------------------
def bench_sdpa(
    shape: Shape,
    qkv: tuple[torch.Tensor, ...],
    ref: torch.Tensor,
    rows: torch.Tensor | None,
    cuda_graph: bool,
) -> list[Row]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    q32, k32, v32 = (t.transpose(1, 2) for t in qkv)  # [B, H, S, hd] views
    plans = [
        ("sdpa EFFICIENT", SDPBackend.EFFICIENT_ATTENTION, torch.float32, "fp32", ""),
        ("sdpa FLASH", SDPBackend.FLASH_ATTENTION, torch.float16, "fp16", "casts untimed"),
        ("sdpa CUDNN", SDPBackend.CUDNN_ATTENTION, torch.float16, "fp16", "casts untimed"),
    ]
    results = []
    for method, backend, dtype, precision, note in plans:
        q, k, v = (t.to(dtype) for t in (q32, k32, v32))

        def run(
            q: torch.Tensor = q,
            k: torch.Tensor = k,
            v: torch.Tensor = v,
            backend: SDPBackend = backend,
        ) -> torch.Tensor:
            with sdpa_kernel(backend):
                return scaled_dot_product_attention(q, k, v, is_causal=True)

        try:
            out = run()
            check = verify(out.transpose(1, 2).float(), ref, rows)
            ms = time_ms(run, cuda_graph)
            results.append(Row(shape, method, precision, "-", ms, check, note))
        except Exception as exc:  # ineligible backend or OOM: report and go on
            results.append(Row(shape, method, precision, "-", None, "n/a", describe_error(exc)))
        del q, k, v
        if q32.is_cuda:
            torch.cuda.empty_cache()
    return results


def bench_triton(
    shape: Shape,
    qkv: tuple[torch.Tensor, ...],
    ref: torch.Tensor,
    rows: torch.Tensor | None,
    precision: str,
    cuda_graph: bool,
    deadline: float,
    method: str = "triton",
) -> list[Row]:
    from kernels.attention import attention, not_supported_reasons

    q, k, v = qkv
    capability, smem = device_limits(q.device)
    out = torch.empty(q.shape, device=q.device)
    results = []
    for tile in candidate_tiles(shape.head_dim):
        reasons = not_supported_reasons(
            head_dim=shape.head_dim,
            seq_len=shape.seq_len,
            block_m=tile.block_m,
            block_n=tile.block_n,
            num_warps=tile.num_warps,
            num_stages=tile.num_stages,
            precision=precision,
            device_type=q.device.type,
            capability=capability,
            smem_bytes=smem,
        )
        if reasons:
            results.append(
                Row(
                    shape,
                    method,
                    precision,
                    str(tile),
                    None,
                    "n/a",
                    "unsupported: " + "; ".join(reasons),
                )
            )
            continue
        if time.monotonic() > deadline:
            results.append(
                Row(shape, method, precision, str(tile), None, "n/a", "skipped: time budget spent")
            )
            continue

        def run(tile: Tile = tile) -> torch.Tensor:
            return attention(
                q,
                k,
                v,
                causal=True,
                out=out,
                precision=precision,
                block_m=tile.block_m,
                block_n=tile.block_n,
                num_warps=tile.num_warps,
                num_stages=tile.num_stages,
            )

        try:
            out.fill_(float("nan"))
            check = verify(run(), ref, rows)
            ms = time_ms(run, cuda_graph)
            results.append(Row(shape, method, precision, str(tile), ms, check))
        except Exception as exc:  # compile failure (e.g. OutOfResources) is a result
            results.append(
                Row(shape, method, precision, str(tile), None, "n/a", describe_error(exc))
            )
    timed = [r for r in results if r.ms is not None and r.check.startswith("PASS")]
    if timed:
        min(timed, key=lambda r: r.ms).best = True
    return results


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------
def floor_lines(shape: Shape) -> list[str]:
    memory_ms = shape.bytes / PEAK_BYTES_PER_S * 1e3
    lines = [
        f"{shape.label}: {shape.flops / 1e9:.1f} GFLOP, {shape.bytes / 1e6:.1f} MB "
        f"-> bandwidth floor {memory_ms:.4f} ms"
    ]
    for precision, peak in PEAK_FLOPS.items():
        compute_ms = shape.flops / peak * 1e3
        lines.append(
            f"  floor {precision:>4}: {max(compute_ms, memory_ms):.4f} ms "
            f"(compute {compute_ms:.4f} ms at {peak / 1e12:.0f} TFLOP/s)"
        )
    return lines


def floor_ms(shape: Shape, precision: str) -> float:
    peak = PEAK_FLOPS["fp16" if precision in ("fp16", "bf16") else precision]
    return max(shape.flops / peak, shape.bytes / PEAK_BYTES_PER_S) * 1e3


def format_row(row: Row) -> str:
    ms = "-" if row.ms is None else f"{row.ms:.4f}"
    of_floor = "-"
    if row.ms is not None:
        of_floor = f"{floor_ms(row.shape, row.precision) / row.ms * 100:.0f}%"
    mark = "*" if row.best else " "
    return (
        f"{row.shape.case:>4} {mark}{row.method:<15} {row.precision:<5} {row.config:<20} "
        f"{ms:>10} {row.tflops():>8} {of_floor:>6}  {row.check:<22} {row.note}"
    )


def table_header() -> str:
    return (
        f"{'case':>4}  {'method':<15} {'prec':<5} {'config':<20} {'ms':>10} "
        f"{'TFLOP/s':>8} {'floor%':>6}  {'check':<22} note"
    )


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m kernels.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--shapes",
        default="1,8,11,13,14",
        help=f"comma-separated official case numbers from {sorted(SHAPES)}",
    )
    parser.add_argument(
        "--precisions",
        default="tf32,fp16",
        help="Triton operand precisions to try (ieee, tf32, tf32x3, fp16, bf16)",
    )
    parser.add_argument(
        "--cuda-graph", action="store_true", help="time CUDA graph replays (no launch overhead)"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=180.0,
        help="seconds for the whole run, shared equally by the shapes; a shape stops trying "
        "new Triton tiles when its share is spent",
    )
    args = parser.parse_args(argv)
    try:
        args.cases = [int(c) for c in args.shapes.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--shapes={args.shapes!r} must be comma-separated integers")
    unknown = [c for c in args.cases if c not in SHAPES]
    if unknown:
        parser.error(f"--shapes has unknown cases {unknown}; choose from {sorted(SHAPES)}")
    args.precision_list = [p.strip() for p in args.precisions.split(",") if p.strip()]
    return args


def bench_shape(
    shape: Shape, args: argparse.Namespace, deadline: float, device: str = "cuda"
) -> list[Row]:
    for line in floor_lines(shape):
        print(line, flush=True)
    qkv = make_qkv(shape, device)
    rows = check_rows(shape, device)
    ref = reference(*qkv, rows)
    results = bench_sdpa(shape, qkv, ref, rows, args.cuda_graph)
    for index, precision in enumerate(args.precision_list):
        now = time.monotonic()
        share = max(0.0, deadline - now) / (len(args.precision_list) - index)
        split = 0.5 if precision == "fp16" else 1.0
        results += bench_triton(
            shape, qkv, ref, rows, precision, args.cuda_graph, now + split * share
        )
        if precision == "fp16":
            # The same kernel fed fp16 q/k/v (casts untimed, as for SDPA's fp16 rows):
            # what a plan gets when the QKV GEMM already runs in fp16.
            half = tuple(t.half() for t in qkv)
            results += bench_triton(
                shape,
                half,
                ref,
                rows,
                precision,
                args.cuda_graph,
                now + share,
                method="triton fp16-in",
            )
            del half
    for row in results:
        print(format_row(row), flush=True)
    del qkv, ref
    if device == "cuda":
        torch.cuda.empty_cache()
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "kernels.bench needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr
        )
        return 2
    start = time.monotonic()
    deadline = start + args.budget_s
    props = torch.cuda.get_device_properties(0)
    print(
        f"device: {props.name} (sm_{props.major}{props.minor}), torch {torch.__version__}, "
        f"timing: {'CUDA graph replay' if args.cuda_graph else 'do_bench median (eager)'}"
    )
    all_rows: list[Row] = []
    for index, case in enumerate(args.cases):
        # Each remaining shape gets an equal share of the remaining tile-search budget.
        now = time.monotonic()
        shape_deadline = now + max(0.0, deadline - now) / (len(args.cases) - index)
        print(f"\n== {SHAPES[case].label}", flush=True)
        print(table_header())
        all_rows += bench_shape(SHAPES[case], args, shape_deadline)
    print("\n== summary (best Triton tile per precision marked *; floor% = floor / time)")
    print(table_header())
    for row in all_rows:
        if not row.method.startswith("triton") or row.best:
            print(format_row(row))
    failed = [r for r in all_rows if r.check.startswith("FAIL")]
    print(f"\n{len(failed)} FAIL, total {time.monotonic() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
