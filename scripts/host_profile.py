"""Where a warm dispatched call spends its host time: cProfile over many calls of the
table's dispatcher on one case (a synchronisation every 50 calls keeps the launch queue
short), the top functions by own time.

    python3 scripts/host_profile.py --table tables/h200.py --case 2 --calls 2000
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from autotune.core.cases import get_case
from autotune.core.device import detect_device
from autotune.judge.gate import CaseBench
from autotune.runtime import DispatchedTransformer, serving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="tables/h200.py")
    parser.add_argument("--case", default="2")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    case = get_case(args.case)
    device = detect_device("auto")
    bench = CaseBench(case, device)
    model = DispatchedTransformer(case.config, table=args.table)
    model.load_state_dict(bench.state_dict)
    model = model.to(device.torch_device).eval()
    x, mask = bench.timing_inputs()
    cuda = device.type == "cuda"
    with serving():
        for _ in range(20):
            model(x, mask)
        print(model.last_route)

        def calls(n: int) -> float:
            t0 = time.perf_counter()
            for i in range(n):
                model(x, mask)
                if cuda and i % 50 == 49:
                    torch.cuda.synchronize()
            if cuda:
                torch.cuda.synchronize()
            return (time.perf_counter() - t0) / n * 1e6

        print(f"wall per call, unprofiled (sync every 50): {calls(args.calls):.1f} us")
        profiler = cProfile.Profile()
        profiler.enable()
        calls(args.calls)
        profiler.disable()
    stats = pstats.Stats(profiler).sort_stats("tottime")
    stats.print_stats(args.top)


if __name__ == "__main__":
    main()
