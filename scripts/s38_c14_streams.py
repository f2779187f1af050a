"""Case 14's exact route with its batch chunks on one stream against the same chunks spread
over several streams (the plan's `batch_streams` knob: chunk i on stream i % N), timed in one
process, interleaved, after one warm whole-batch forward each. The question: with the
attention at the card's power cap (session 38: SM clocks ~1.6 GHz under SW power cap, 700 W),
does a chunk's LayerNorm/GEMM work overlapping another chunk's attention shorten the forward?

    python3 scripts/s38_c14_streams.py [--streams 1,2,3] [--rounds 3] @docs/plans/PLAN.json

Prints each mode's forwards (s), their median, and whether the outputs equal mode 1's.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from autotune.build import build_candidate
from autotune.core.cases import get_case
from autotune.core.device import detect_device
from autotune.core.reference import build_reference, generate_random_case, official_settings
from autotune.plan import parse_plan


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
    models = {
        n: build_candidate(plan.replace(batch_streams=n), case.config, device, state) for n in modes
    }
    print(f"case 14, {x.shape[0]} sequences, {plan.describe()}; {torch.cuda.get_device_name()}")
    times: dict[int, list[float]] = {n: [] for n in modes}
    first: torch.Tensor | None = None
    with official_settings(), torch.inference_mode():
        for n in modes:  # warm: each mode's first whole-batch forward is not timed
            y = models[n](x, mask)
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
                y = models[n](x, mask)
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
