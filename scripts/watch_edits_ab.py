"""What does watching the parameters for in-place edits cost a call? Each case's shipped
plan (from --table) built twice on the same weights, ``watch_edits`` on and off, timed in
one process in interleaved rounds: the host time a call takes to return (a loop of calls
with no synchronisation, the queue kept short of full) and the forward's time by CUDA
events (a loop of back-to-back calls, synchronised after it), medians over the rounds.

    python3 scripts/watch_edits_ab.py --table tables/h200.py --cases 2,3,4,7,12 [--rounds 7]

Off a CUDA device (a check of the script): ``--plan '{"qkv": "packed"}' --cases smoke-1``
times the CPU forward the same way (perf_counter for both columns).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from autotune.build import build_candidate
from autotune.core.cases import select_cases
from autotune.core.device import detect_device
from autotune.core.reference import build_reference, generate_random_case
from autotune.plan import Plan
from autotune.runtime import load_table, serving


def timed(cand: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor, calls: int) -> tuple:
    """(host us a call, forward us a call) over ``calls`` calls each."""
    cuda = x.is_cuda
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        cand(x, mask)
    host = (time.perf_counter() - t0) / calls * 1e6
    if not cuda:
        return host, host
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        cand(x, mask)
    end.record()
    end.synchronize()
    return host, start.elapsed_time(end) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", help="the table whose entries give each case's plan")
    ap.add_argument("--plan", help="one plan (JSON) for every case instead")
    ap.add_argument("--cases", default="2,3,4,7,12")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    device = detect_device("cuda" if torch.cuda.is_available() else "cpu")
    table = load_table(args.table) if args.table else None
    print(f"device {device.name}; torch {torch.__version__}; {args.rounds} rounds of "
          f"{args.calls} calls a side, interleaved; medians")  # fmt: skip
    print(f"{'case':>6} {'watched':>7} {'host on':>8} {'host off':>8} {'d host':>7} "
          f"{'fwd on':>8} {'fwd off':>8} {'d fwd':>7}   (us a call)")  # fmt: skip
    for case in select_cases(args.cases):
        if args.plan:
            plan = Plan.from_dict(json.loads(args.plan))
        else:
            assert table is not None, "give --table or --plan"
            entry = table.entries.get(case.key.as_tuple())
            if not entry or not entry.get("admitted"):
                print(f"{case.id:>6} no admitted entry")
                continue
            plan = Plan.from_dict(entry["plan"])
        torch.manual_seed(1234)
        ref = build_reference(case.config, device.type)
        sides = {}
        for watch in (True, False):
            cand = build_candidate(plan, case.config, device, ref.state_dict())
            cand.watch_edits = watch
            sides[watch] = cand
        x, mask = generate_random_case(case.config, device.type, seed=1234 + 100000)
        rows: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        with serving():
            for cand in sides.values():
                timed(cand, x, mask, 20)  # warm-up: capture, compile
            for r in range(args.rounds):
                for watch in (True, False) if r % 2 == 0 else (False, True):
                    rows[watch].append(timed(sides[watch], x, mask, args.calls))
        med = {w: [statistics.median(v[i] for v in rows[w]) for i in (0, 1)] for w in rows}
        watched = len(sides[True]._watched)
        print(
            f"{case.id:>6} {watched:>7} {med[True][0]:>8.2f} {med[False][0]:>8.2f} "
            f"{med[True][0] - med[False][0]:>+7.2f} {med[True][1]:>8.2f} {med[False][1]:>8.2f} "
            f"{med[True][1] - med[False][1]:>+7.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
