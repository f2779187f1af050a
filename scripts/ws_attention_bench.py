"""The warp-specialised Triton attention against cuDNN and the flash form at case 14's slice.

    python3 scripts/ws_attention_bench.py [--batch 4] [--seq 100000] [--rounds 7] [--budget 240]

One process, every variant on the same fp16 q, k, v (strided views of one packed [B, S, 3D]
projection, as the per-layer path hands them over; causal; heads 16 of 64): cuDNN's SDPA
(what case 14's exact route runs), the flash form at the long space's tiles (128/64, 8
warps, 3 stages), and the warp-specialised form (``warp_specialize=True``) at each tile it
takes. First each output is checked against ``attention_reference`` on 64 query rows of the
first sequence (fp32, the project's fp16 tolerance) and against cuDNN's output; then the
variants are timed in interleaved rounds (CUDA events, a call each a round, the order turned
each round), and the table gives each one's median, its TFLOP/s (causal: 2 B H S^2 hd
products' FLOPs) and its ratio to cuDNN. A variant that fails the check is not timed.

Case 14's exact route is 3.151 s a forward with cuDNN (2.93 s of it in 64 slices of
attention); it needs the attention about 5% faster than cuDNN to run under 3 s
(``docs/kernels_h200.md``, session 25).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels._tolerance import TOLERANCE_BY_PRECISION, compare
from kernels.attention import attention, attention_reference

# (rows a program, keys a step, stages): 128 rows is 64 a consumer warpgroup, 256 is 128
# (FlashAttention-3's); offline (Triton 3.6, sm_90) all 168 registers, no spills, 58-115 KB.
WS_TILES = [(128, 64, 2), (128, 64, 3), (128, 128, 2), (256, 64, 2), (256, 64, 3), (256, 32, 3)]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], dev: str) -> float:
    """Milliseconds of one call: CUDA events on the GPU, the wall clock on the CPU."""
    if dev != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4, help="sequences a call (the route's chunk)")
    ap.add_argument("--seq", type=int, default=100_000)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for the timing rounds")
    ap.add_argument(
        "--device", default="cuda", help="cpu: a dry run under TRITON_INTERPRET=1 (SDPA's math)"
    )
    args = ap.parse_args()
    dev = args.device
    b, s, h, hd = args.batch, args.seq, args.heads, args.head_dim
    d = h * hd
    gen = torch.Generator(device=dev).manual_seed(14)
    qkv = torch.randn(b, s, 3 * d, device=dev, dtype=torch.float16, generator=gen)
    q, k, v = qkv.view(b, s, 3, h, hd).unbind(2)
    out = torch.empty(b, s, d, device=dev, dtype=torch.float16)
    backend = SDPBackend.CUDNN_ATTENTION if dev == "cuda" else SDPBackend.MATH

    def cudnn() -> torch.Tensor:
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
        return o.transpose(1, 2)

    def triton(bm: int, bn: int, warps: int, stages: int, ws: bool):
        def run() -> torch.Tensor:
            attention(q, k, v, causal=True, out=out.view(b, s, h, hd), block_m=bm, block_n=bn,
                      num_warps=warps, num_stages=stages, precision="fp16",
                      warp_specialize=ws)  # fmt: skip
            return out.view(b, s, h, hd)

        return run

    variants = {"cudnn": cudnn, "flash 128/64 w8 s3": triton(128, 64, 8, 3, False)}
    for bm, bn, st in WS_TILES:
        variants[f"ws {bm}/{bn} s{st}"] = triton(bm, bn, 4, st, True)

    rows = torch.randint(0, s, (64,), generator=torch.Generator().manual_seed(1))
    rows[0] = s - 1
    ref = attention_reference(
        q[:1].float(), k[:1].float(), v[:1].float(), causal=True, query_rows=rows.to(dev)
    )
    try:
        base = cudnn()[:1, rows.to(dev)].float()
    except Exception as exc:  # no cuDNN attention here: the Triton variants alone
        print(f"cudnn FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        del variants["cudnn"]
        base = ref
    ok: dict[str, bool] = {}
    for name, fn in variants.items():
        try:
            got = fn()[:1, rows.to(dev)].float()
            sync()
        except Exception as exc:  # a compile or launch failure: report, time the rest
            print(f"{name:22s} FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            ok[name] = False
            continue
        check = compare(got, ref, TOLERANCE_BY_PRECISION["fp16"])
        gap = float((got - base).abs().max())
        ok[name] = check.passed
        print(f"{name:22s} {'PASS' if check.passed else 'FAIL'} {check.detail}; vs cudnn {gap:.2e}")

    names = [n for n in variants if ok[n]]
    times: dict[str, list[float]] = {n: [] for n in names}
    for n in names:  # warm-up: compile and autotune nothing more after this
        variants[n]()
    sync()
    start = time.monotonic()
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            times[n].append(timed(variants[n], dev))
        if time.monotonic() - start > args.budget:
            print(f"(stopped after {r + 1} rounds: {args.budget:.0f} s budget)")
            break
    flops = 2.0 * b * h * s * s * hd
    base_ms = statistics.median(times["cudnn"]) if "cudnn" in times else float("nan")
    print(f"\nB {b} S {s} H {h} hd {hd}, causal, fp16; median of {len(times[names[0]])} calls")
    print(f"{'variant':22s} {'ms':>9s} {'TFLOP/s':>8s} {'x cudnn':>8s} {'spread':>7s}")
    for n in names:
        med = statistics.median(times[n])
        spread = (max(times[n]) - min(times[n])) / med
        print(f"{n:22s} {med:9.2f} {flops / med / 1e9:8.1f} {base_ms / med:8.3f} {spread:7.1%}")


if __name__ == "__main__":
    main()
