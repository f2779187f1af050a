"""Case 14's attention alone (4 sequences of 100,000 tokens, 16 heads of 64, causal, fp16)
through PyTorch's SDPA backends and operand layouts, each timed for about 3 s of sustained
calls (so under the card's power cap, as in the whole forward), interleaved, one process:
which kernel each picks (profiler), ms a call, and TFLOP/s counting the causal half.

    python3 scripts/s38_sdpa_layouts.py [--seconds 3] [--rounds 2]

Layouts: "packed" = q, k, v strided views of one [B, S, 3, H, D] projection output (the
exact route's `heads=strided`), "bshd" = separate [B, S, H, D] tensors viewed as [B, H, S,
D], "bhsd" = contiguous [B, H, S, D].
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

B, S, H, D = 4, 100_000, 16, 64


def operands(layout: str, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float16)

    if layout == "packed":
        qkv = randn(B, S, 3, H, D)
        return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3))
    if layout == "bshd":
        return tuple(randn(B, S, H, D).transpose(1, 2) for _ in range(3))
    return tuple(randn(B, H, S, D) for _ in range(3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layouts", default="packed,bshd,bhsd")
    parser.add_argument("--backends", default="cudnn,flash")
    args = parser.parse_args()
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    gen = torch.Generator(device="cuda").manual_seed(0)
    flops = 4 * B * H * S * S * D / 2
    print(f"{torch.cuda.get_device_name()}: B={B} S={S} H={H} D={D} causal fp16")
    combos = [(b, lay) for b in args.backends.split(",") for lay in args.layouts.split(",")]
    ops = {lay: operands(lay, gen) for lay in args.layouts.split(",")}
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    kernels: dict[tuple[str, str], str] = {}
    with torch.inference_mode():
        for backend, lay in combos:  # warm, and the kernel each picks
            q, k, v = ops[lay]
            with sdpa_kernel(backends[backend]):
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    torch.cuda.synchronize()
            spent_by: dict[str, float] = defaultdict(float)
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    spent_by[e.name] += e.device_time
            kernels[(backend, lay)] = max(spent_by, key=spent_by.__getitem__)[:100]
        for _ in range(args.rounds):
            for backend, lay in combos:
                q, k, v = ops[lay]
                with sdpa_kernel(backends[backend]):
                    spent = 0.0
                    while spent < args.seconds:
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                        start.record()
                        F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        end.record()
                        end.synchronize()
                        ms = start.elapsed_time(end)
                        times[(backend, lay)].append(ms)
                        spent += ms / 1e3
    for combo in combos:
        t = times[combo]
        tail = t[len(t) // 2 :]  # the later half: under the cap
        med = statistics.median(tail)
        print(
            f"{combo[0]:6s} {combo[1]:7s} first {t[0]:7.2f} ms, later-half median {med:7.2f} ms "
            f"({flops / med / 1e9:5.0f} TFLOP/s), {len(t)} calls  {kernels[combo]}"
        )


if __name__ == "__main__":
    main()
