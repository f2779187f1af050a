"""Case 14's exact route with its batch chunks on one stream against the same chunks spread
over several streams (independent sequences: chunk i on stream i % N), timed in one
process, interleaved, after one warm whole-batch forward each. The question: with the
attention at the card's power cap (session 38: SM clocks ~1.6 GHz under SW power cap, 700 W),
does a chunk's LayerNorm/GEMM work overlapping another chunk's attention shorten the forward?

    python3 scripts/s38_c14_streams.py [--streams 1,2,3] [--rounds 3] @docs/plans/PLAN.json

Prints each mode's forwards (s), their median, and whether the outputs equal mode 1's.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from autotune.build import MASK_NONE, build_candidate, classify_mask
from autotune.core.cases import get_case
from autotune.core.device import detect_device
from autotune.core.reference import build_reference, generate_random_case, official_settings
from autotune.plan import parse_plan


def spread(model: Any, x: torch.Tensor, mask: torch.Tensor, streams: list[Any]) -> torch.Tensor:
    """The model's chunked forward with chunk i issued on ``streams[i % len(streams)]``."""
    kind = classify_mask(mask)
    weights = model.prepared_weights()
    chunk = model.plan.batch_chunk
    out = torch.empty_like(x)
    home = torch.cuda.current_stream()
    for s in streams:
        s.wait_stream(home)
    for i, start in enumerate(range(0, x.shape[0], chunk)):
        sl = slice(start, start + chunk)
        with torch.cuda.stream(streams[i % len(streams)]):
            m = mask[sl] if kind != MASK_NONE else None
            model._into(out[sl], x[sl], m, kind, weights)
    for s in streams:
        home.wait_stream(s)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("plan")
    args = parser.parse_args()
    modes = [int(n) for n in args.streams.split(",")]
    case = get_case("14")
    device = detect_device("auto")
    state = build_reference(case.config, "cuda").state_dict()
    x, mask = generate_random_case(case.config, "cuda", seed=1234)
    if args.batch:
        x, mask = x[: args.batch].contiguous(), mask[: args.batch].contiguous()
    plan = parse_plan(args.plan)
    model = build_candidate(plan, case.config, device, state)
    print(f"case 14, {x.shape[0]} sequences, {plan.describe()}; {torch.cuda.get_device_name()}")
    streams = {n: [torch.cuda.Stream() for _ in range(n)] for n in modes}
    times: dict[int, list[float]] = {n: [] for n in modes}
    first: torch.Tensor | None = None
    with official_settings(), torch.inference_mode():
        for n in modes:  # warm: each mode's first whole-batch forward is not timed
            y = spread(model, x, mask, streams[n])
            torch.cuda.synchronize()
            if first is None:
                first = y
            else:
                print(f"   {n} streams: output equal to 1 stream's: {torch.equal(first, y)}")
            del y
        del first
        for _ in range(args.rounds):
            for n in modes:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                start.record()
                y = spread(model, x, mask, streams[n])
                end.record()
                torch.cuda.synchronize()
                times[n].append(start.elapsed_time(end) / 1e3)
                del y
        peak = torch.cuda.max_memory_allocated() / 2**30
    for n in modes:
        t = times[n]
        print(
            f"   {n} stream(s): median {statistics.median(t):.4f} s  "
            f"({', '.join(f'{v:.4f}' for v in t)})"
        )
    print(f"   peak {peak:.2f} GiB")


if __name__ == "__main__":
    main()
