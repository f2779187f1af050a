"""Does case 14's attention run faster under the power cap when its fp16 operands carry
fewer mantissa bits? The exact route is set by the energy its attention spends (700 W cap,
SW power cap throughout: docs/case14.md, session 38), and a tensor core's switching power
depends on how many operand bits flip. This times cuDNN's causal SDPA on q, k, v (strided
views of one packed [B, S, 3, H, D] fp16 projection, as the route has them) rounded to
nearest with the lowest K of fp16's 10 mantissa bits cleared, for K in --drop, each for
--seconds of back-to-back calls in --rounds interleaved rounds (the later half of each
stretch is under the cap), with the SM clock and board power sampled by nvidia-smi.

    python3 scripts/operand_bits_power.py [--drop 0,1,2,3,10] [--seconds 3] [--rounds 2]

Prints per K: the later-half median ms a call, its ratio to K=0's, the mean SM clock and
power over its stretches, and how far its output lies from K=0's (max abs, and max abs over
max |out|). K=10 keeps only sign and exponent: a bound on what the lever can give, not a
candidate. Whether a K holds the project's rule is the whole route's question
(`autotune long`), not this script's.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels.mantissa import round_mantissa_

B, S, H, D = 4, 100_000, 16, 64


def sample_clocks(path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            "nvidia-smi",
            "--query-gpu=timestamp,clocks.sm,power.draw",
            "--format=csv,noheader,nounits",
            "-lms",
            "100",
        ],
        stdout=path.open("w"),
        stderr=subprocess.DEVNULL,
    )


def read_clocks(path: Path) -> list[tuple[float, float, float]]:
    rows = []
    for row in csv.reader(path.read_text().splitlines()):
        try:
            stamp = time.mktime(time.strptime(row[0].strip()[:19], "%Y/%m/%d %H:%M:%S"))
            frac = float("0." + row[0].strip()[20:]) if len(row[0].strip()) > 20 else 0.0
            rows.append((stamp + frac, float(row[1]), float(row[2])))
        except (ValueError, IndexError):
            continue
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drop", default="0,1,2,3,10")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    drops = [int(k) for k in args.drop.split(",")]
    if 0 not in drops:
        drops.insert(0, 0)
    flops = 4 * B * H * S * S * D / 2
    print(f"{torch.cuda.get_device_name()}: B={B} S={S} H={H} D={D} causal fp16, cuDNN SDPA")
    gen = torch.Generator(device="cuda").manual_seed(0)
    base = torch.randn(B, S, 3, H, D, generator=gen, device="cuda", dtype=torch.float16)
    packed = {k: round_mantissa_(base.clone(), k) for k in drops}  # attn_drop_bits' kernel
    del base
    times: dict[int, list[float]] = defaultdict(list)
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    outs: dict[int, torch.Tensor] = {}
    log = Path(tempfile.mkdtemp()) / "clocks.csv"
    sampler = sample_clocks(log)
    try:
        with torch.inference_mode(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for k in drops:  # warm, and each output once
                q, kk, v = (packed[k][:, :, i].transpose(1, 2) for i in range(3))
                outs[k] = F.scaled_dot_product_attention(q, kk, v, is_causal=True)
            torch.cuda.synchronize()
            for _ in range(args.rounds):
                for k in drops:
                    q, kk, v = (packed[k][:, :, i].transpose(1, 2) for i in range(3))
                    spent, t0, tail0 = 0.0, time.time(), 0.0
                    while spent < args.seconds:
                        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                        start.record()
                        F.scaled_dot_product_attention(q, kk, v, is_causal=True)
                        end.record()
                        end.synchronize()
                        ms = start.elapsed_time(end)
                        times[k].append(ms)
                        spent += ms / 1e3
                        if not tail0 and spent >= args.seconds / 2:
                            tail0 = time.time()
                    spans[k].append((tail0 or t0, time.time()))
    finally:
        time.sleep(0.3)
        sampler.terminate()
        sampler.wait()
    clocks = read_clocks(log)
    ref = outs[0].float()
    peak = ref.abs().max().item()
    med0 = statistics.median(times[0][len(times[0]) // 2 :])
    print(
        f"{'drop':>4} {'ms a call':>9} {'vs 0':>6} {'TFLOP/s':>7} {'SM MHz':>6} {'W':>5} "
        f"{'calls':>5} {'max |d|':>9} {'rel':>8}"
    )
    for k in drops:
        t = times[k]
        med = statistics.median(t[len(t) // 2 :])
        inside = [c for c in clocks if any(a <= c[0] <= b for a, b in spans[k])]
        mhz = statistics.fmean(c[1] for c in inside) if inside else float("nan")
        watts = statistics.fmean(c[2] for c in inside) if inside else float("nan")
        diff = (outs[k].float() - ref).abs().max().item()
        print(
            f"{k:>4} {med:9.2f} {med0 / med:6.3f} {flops / med / 1e9:7.0f} {mhz:6.0f} "
            f"{watts:5.0f} {len(t):>5} {diff:9.2e} {diff / peak:8.1e}"
        )
    print(f"clock samples: {len(clocks)} (nvidia-smi every 100 ms)")


if __name__ == "__main__":
    main()
