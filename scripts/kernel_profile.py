"""Where a plan's device time goes: the profiler's kernels of warm forwards, per kernel
name, microseconds and launches per forward, and the total beside the case's floor.

    python3 scripts/kernel_profile.py --case 13 PLAN_JSON [PLAN_JSON ...]
    python3 scripts/kernel_profile.py --case 14 --batch 4 --warmup 1 --forwards 1 @PLAN.json

``--batch`` profiles the first sequences of the batch (a plan without a CUDA graph; the
floor is scaled to them): case 14's whole batch is 1.4 s a forward.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from autotune.build import build_candidate
from autotune.core.cases import get_case
from autotune.core.device import detect_device
from autotune.core.reference import build_reference, generate_random_case, official_settings
from autotune.plan import parse_plan
from autotune.tools.floors import CEILINGS, floor_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("--forwards", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=0, help="first sequences only (0: all)")
    parser.add_argument("plans", nargs="+")
    args = parser.parse_args()
    case = get_case(args.case)
    device = detect_device("auto")
    floor = floor_of(case, CEILINGS["h200"])
    reference = build_reference(case.config, "cuda")
    x, mask = generate_random_case(case.config, "cuda", seed=1234 + 100000)
    share = 1.0
    if args.batch:
        x, mask = x[: args.batch].contiguous(), mask[: args.batch].contiguous()
        share = x.shape[0] / case.config.batch_size
    for text in args.plans:
        plan = parse_plan(text)
        model = build_candidate(plan, case.config, device, reference.state_dict())
        with official_settings(), torch.inference_mode():
            for _ in range(args.warmup):
                model(x, mask)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.forwards):
                    model(x, mask)
                torch.cuda.synchronize()
        times: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                times[event.name] += event.device_time / args.forwards
                counts[event.name] += 1
        total = sum(times.values())
        launches = sum(counts.values()) / args.forwards
        floor_us = floor.floor_us * share
        batch = f" (first {x.shape[0]} sequences)" if args.batch else ""
        print(f"== case {args.case}{batch}: {plan.describe()}")
        print(
            f"   device {total:.1f} us/forward in {launches:.0f} kernels; floor "
            f"{floor_us:.1f} us ({total / floor_us:.1f}x)"
        )
        for name, t in sorted(times.items(), key=lambda kv: -kv[1])[:12]:
            print(f"   {t:9.1f} us  {counts[name] / args.forwards:4.0f}x  {name[:90]}")


if __name__ == "__main__":
    main()
