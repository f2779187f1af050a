"""The reference timed against itself, many times, with whole loops (the official
protocol's) and with interleaved turns: the spread of the ratio each procedure reads.

    python3 scripts/timing_selfcheck.py --cases 1,2,3 --runs 12

Prints one row per case and procedure: runs, median, min, max, standard deviation of the
ratio, and how many runs strayed beyond their own reported noise.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch

from autotune.core.cases import select_cases
from autotune.core.profiles import select_profile
from autotune.core.reference import official_settings
from autotune.judge.gate import CaseBench
from autotune.measure import STUDY_TIMING, measure_paired


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="1,2")
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--gpu", default="auto")
    args = parser.parse_args()
    selection = select_profile(args.gpu)
    cuda = selection.device.type == "cuda"
    print(f"{'case':<6} {'procedure':<22} {'runs':>4} {'median':>7} {'min':>6} {'max':>6} "
          f"{'sd':>6} {'beyond noise':>13}")  # fmt: skip
    for case in select_cases(args.cases):
        bench = CaseBench(case, selection.device)
        x, mask = bench.timing_inputs()

        def forward(ref=bench.reference, x=x, mask=mask):
            return ref(x, mask)

        for label, turn in (("whole loops (official)", 0), ("turns of 4", 4)):
            settings = dataclasses.replace(STUDY_TIMING, cuda_turn=turn)
            stats = []
            with official_settings(), torch.inference_mode():
                for _ in range(args.runs):
                    stats.append(measure_paired(forward, forward, settings, cuda=cuda))
            ratios = [s.speedup for s in stats]
            beyond = sum(abs(s.speedup - 1) > s.noise for s in stats)
            print(
                f"{case.id:<6} {label:<22} {len(ratios):>4} {statistics.median(ratios):>7.3f} "
                f"{min(ratios):>6.3f} {max(ratios):>6.3f} {statistics.pstdev(ratios):>6.3f} "
                f"{beyond:>10}/{len(ratios)}",
                flush=True,
            )
        bench.release()


if __name__ == "__main__":
    main()
