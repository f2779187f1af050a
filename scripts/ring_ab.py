"""The CUDA graph's output hand-off, old against new, in one process per call: for each case,
the table's plan built twice with the same weights, one captured with the forward copied
into the ring buffer inside the graph (``_CapturedForward.DIRECT_OUTPUT = False``, before
session 22) and one with the fused layers storing into the ring buffer themselves; timed
interleaved (CUDA events around every forward, turns of 4, medians), plus the device copies
and kernels of one steady replay of each (profiler).

    python3 scripts/ring_ab.py --table tables/h200.py --cases 1-13
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import autotune.build as build
from autotune.build import build_candidate
from autotune.core.cases import select_cases
from autotune.core.device import detect_device
from autotune.core.reference import build_reference, check_outputs, generate_random_case
from autotune.measure import TimingSettings, measure_interleaved
from autotune.plan import parse_plan
from autotune.runtime import load_table, serving


def _device_ops(fn) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(copies, kernels) of one call, from the profiler."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    copies = sum(1 for n in names if n.lower().startswith("memcpy"))
    return copies, len(names) - copies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", required=True)
    parser.add_argument("--cases", default="1-13")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    table = load_table(args.table)
    plans = {e["case"]: e["plan"] for e in table.entries.values() if e.get("case")}
    device = detect_device("auto")
    settings = TimingSettings(warmup=20, rounds=args.rounds, reps=args.reps, cuda_turn=4)
    print("case | graph copies old/new | kernels old/new | old us | new us | new/old | rule")
    ratios = []
    for case in select_cases(args.cases):
        if case.id not in plans:
            print(f"{case.id} | no entry in {args.table}")
            continue
        plan = parse_plan(json.dumps(plans[case.id]))
        if not plan.cuda_graph:
            print(f"{case.id} | {plan.describe()}: no CUDA graph, nothing to compare")
            continue
        reference = build_reference(case.config, "cuda")
        x, mask = generate_random_case(case.config, "cuda", seed=1234)
        models = []
        with serving():
            want = reference(x, mask)
            for direct in (False, True):
                model = build_candidate(plan, case.config, device, reference.state_dict())
                build._CapturedForward.DIRECT_OUTPUT = direct
                for _ in range(3):  # capture (staged, then bound to x's addresses)
                    model(x, mask)
                torch.cuda.synchronize()
                models.append(model)
            build._CapturedForward.DIRECT_OUTPUT = True
            fns = [lambda m=m, x=x, mask=mask: m(x, mask) for m in models]
            ops = [_device_ops(fn) for fn in fns]
            passed = all(check_outputs(fn(), want).passed for fn in fns)
            _, results = measure_interleaved(fns, settings, cuda=True)
        old, new = (r[0] * 1000 for r in results)
        ratios.append(new / old)
        print(
            f"{case.id} | {ops[0][0]}/{ops[1][0]} | {ops[0][1]}/{ops[1][1]} | {old:.1f} | "
            f"{new:.1f} | {new / old:.3f} | {'pass' if passed else 'FAIL'}"
        )
        del models, fns, reference
        torch.cuda.empty_cache()
    if ratios:
        print(f"geometric mean new/old: {statistics.geometric_mean(ratios):.3f} over {len(ratios)}")


if __name__ == "__main__":
    main()
