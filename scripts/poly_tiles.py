"""Case 14's polynomial kernels under other tiles, warps and the stats-first kernel 2: device
time per kernel, registers and spills, and the error against float64, in one process.

    python3 scripts/poly_tiles.py [--seq 100000] [--batch 1] [--until SECONDS] [NAME ...]

q, k, v are layer 0's packed fp16 projections of LayerNorm1 of case 14's official input
(seed 1234 + 100000, the first ``--batch`` sequences), as the table's plan hands them to
the kernels. Each configuration (NAME from CONFIGS; default all, in order) runs
``polynomial_attention`` with the plan's settings (chunk 256, exact prefix 2048, fp16,
row-normalised weights) and its own tiles: ``--reps`` profiled calls after 2 warm ones,
microseconds per call of each kernel (prefix = ``_prefix_state_kernel``, output =
``_output_kernel``; the exact prefix's attention is the same in all), then the
configuration's compiled kernels' registers and spills, then its largest difference from
the first configuration over rows >= 2048 and its error against the float64 reference on
the first ``--check-rows`` rows (rows >= 2048 only). Stops starting configurations after
``--until`` seconds. CUDA only.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections import defaultdict
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from autotune.core.cases import get_case
from autotune.core.reference import build_reference, generate_random_case, official_settings
from kernels import polynomial as poly

EXACT_PREFIX = 2048
CHUNK = 256
CONFIGS: dict[str, dict[str, Any]] = {
    "shipped": {},
    "out8w": {"output_warps": 8},
    "stats_first": {"stats_first": True},
    "stats_first_out8w": {"stats_first": True, "output_warps": 8},
    "bn128": {"block_n": 128},
    "bn32": {"block_n": 32},
    "stats_first_bm128_out8w": {"stats_first": True, "block_m": 128, "output_warps": 8},
    "stages3": {"num_stages": 3},
    "bn128_w8": {"block_n": 128, "num_warps": 8},
    "stats_first_bn32": {"stats_first": True, "block_n": 32},
    "bm32": {"block_m": 32},
    "stats_first_ft16": {"stats_first": True, "feature_tile": 16},
    "stats_first_ft4": {"stats_first": True, "feature_tile": 4},
    "stats_first_bn32_stages3": {"stats_first": True, "block_n": 32, "num_stages": 3},
    # The output kernel's fastest (session 13) with kernel 1 as one flat loop (3 or 4 stages
    # there: num_stages is kernel 1's when kernel 2 has its own).
    "out_best": {"stats_first": True, "output_block_n": 32, "output_stages": 3},
    "out_best_flat": {
        "stats_first": True,
        "output_block_n": 32,
        "output_stages": 3,
        "prefix_flat": True,
    },
    "out_best_flat_s3": {
        "stats_first": True,
        "output_block_n": 32,
        "output_stages": 3,
        "prefix_flat": True,
        "num_stages": 3,
    },
    "out_best_flat_s4": {
        "stats_first": True,
        "output_block_n": 32,
        "output_stages": 3,
        "prefix_flat": True,
        "num_stages": 4,
    },
    "stats_first_bm128_bn32_out8w": {
        "stats_first": True,
        "block_m": 128,
        "block_n": 32,
        "output_warps": 8,
    },
}


def _qkv(batch: int, seq: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    c = get_case("14").config
    reference = build_reference(c, device)
    # Only the sequences and rows measured (the case's generator at this batch and length).
    small = dataclasses.replace(c, batch_size=batch, seq_len=seq)
    x, _mask = generate_random_case(small, device, seed=1234 + 100000)
    layer = reference.layers[0]
    with torch.inference_mode():
        h = layer.norm1(x)
        attn = layer.attention
        w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        b = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        qkv = torch.nn.functional.linear(h, w, b).half()  # the plan's fp16 hand-off
    shape = (batch, seq, c.num_heads, c.head_dim)
    q, k, v = qkv.split(c.d_model, dim=-1)
    return q.view(shape), k.view(shape), v.view(shape)


def _compiled() -> set[tuple[str, str, int, int, int, int]]:
    """(kernel, key, warps, stages, regs, spills) of every compiled polynomial kernel."""
    found = set()
    for name in ("_prefix_state_kernel", "_output_kernel"):
        fn = getattr(poly, name)
        for entry in getattr(fn, "device_caches", {}).values():
            for key, compiled in entry[0].items():
                meta = compiled.metadata
                try:
                    regs, spills = compiled.n_regs, compiled.n_spills
                except Exception:  # another Triton version: no register counts
                    regs = spills = -1
                found.add((name, str(key), meta.num_warps, meta.num_stages, regs, spills))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--check-rows", type=int, default=4096)
    parser.add_argument("--until", type=float, default=1e9, help="seconds")
    parser.add_argument("--device", default="cuda", help="cpu: a TRITON_INTERPRET=1 smoke run")
    parser.add_argument("names", nargs="*", default=list(CONFIGS))
    args = parser.parse_args()
    start = time.monotonic()
    unknown = [n for n in args.names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration {unknown}; choose from {', '.join(CONFIGS)}")
    q, k, v = _qkv(args.batch, args.seq, args.device)
    n = min(args.check_rows, args.seq)
    exact = poly.polynomial_reference(
        q[:, :n], k[:, :n], v[:, :n], causal=True, exact_prefix=EXACT_PREFIX, row_norm=True
    )[:, EXACT_PREFIX:]
    print(
        f"B {args.batch} S {args.seq} H {q.shape[2]} hd {q.shape[3]}: chunk {CHUNK}, exact "
        f"prefix {EXACT_PREFIX}, fp16, row_norm; us per call; diff vs the first row and "
        f"error vs float64 (rows {EXACT_PREFIX}-{n}) over rows >= {EXACT_PREFIX}",
        flush=True,
    )
    print(f"{'config':26s} {'prefix':>9s} {'output':>9s} {'all':>9s}  diff      err64", flush=True)
    first = None
    seen = _compiled()
    cuda = args.device == "cuda"
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for name in args.names:
        if time.monotonic() - start > args.until:
            print(f"stopped before {name}: --until {args.until:g} s reached", flush=True)
            break
        try:
            kwargs = {"block_m": 64, "block_n": 64, "num_warps": 4} | CONFIGS[name]
            out = torch.empty(q.shape, device=args.device, dtype=torch.float32)

            def call(
                rows: int | None = None, o: torch.Tensor = out, kw: dict[str, Any] = kwargs
            ) -> torch.Tensor:
                qs, ks, vs = (t if rows is None else t[:, :rows] for t in (q, k, v))
                target = o if rows is None else torch.empty_like(qs, dtype=torch.float32)
                return poly.polynomial_attention(
                    qs, ks, vs, causal=True, out=target, chunk=CHUNK, exact_prefix=EXACT_PREFIX,
                    precision="fp16", row_norm=True, **kw,
                )  # fmt: skip

            with official_settings(), torch.inference_mode():
                for _ in range(2):
                    call()
                sync()
                with profile(activities=activities) as prof:
                    for _ in range(args.reps):
                        call()
                    sync()
                short = call(n)[:, EXACT_PREFIX:]
            times: dict[str, float] = defaultdict(float)
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    times[event.name] += event.device_time / args.reps
            pre = sum(t for name_, t in times.items() if "prefix_state" in name_)
            outk = sum(t for name_, t in times.items() if "output_kernel" in name_)
            tail = out[:, EXACT_PREFIX:]
            diff = 0.0 if first is None else float((tail - first).abs().max())
            first = tail.clone() if first is None else first
            err = float((short.double() - exact).abs().max())
            print(
                f"{name:26s} {pre:9.0f} {outk:9.0f} {sum(times.values()):9.0f}  "
                f"{diff:.2e}  {err:.2e}",
                flush=True,
            )
            now = _compiled()
            for kernel, _key, warps, stages, regs, spills in sorted(now - seen):
                print(f"    {kernel:22s} warps {warps} stages {stages} regs {regs} spills {spills}")
            seen = now
        except Exception as exc:  # a configuration that does not compile or run
            print(f"{name:26s} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)


if __name__ == "__main__":
    main()
