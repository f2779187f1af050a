"""Registers, spills and shared memory of every project Triton kernel a plan compiles: the
first question when a kernel runs far from its byte and FLOP floors (register pressure).

    python3 scripts/kernel_regs.py --case 6 PLAN_JSON

Builds the plan on the case, runs two forwards (compiling every kernel it launches), then
reads each compiled variant from the JIT caches of ``kernels.*``. CUDA only.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import torch

import kernels
from autotune.build import build_candidate
from autotune.core.cases import get_case
from autotune.core.device import detect_device
from autotune.core.reference import build_reference, generate_random_case, official_settings
from autotune.plan import parse_plan


def _jit_functions() -> list[tuple[str, object]]:
    from triton.runtime.jit import JITFunction

    found = []
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"kernels.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, JITFunction) and value.__module__ == module.__name__:
                found.append((f"{info.name}.{name}", value))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("plan")
    parser.add_argument("--batch", type=int, default=0, help="first sequences only (0: all)")
    args = parser.parse_args()
    case = get_case(args.case)
    plan = parse_plan(args.plan)
    device = detect_device("auto")
    reference = build_reference(case.config, "cuda")
    x, mask = generate_random_case(case.config, "cuda", seed=1234 + 100000)
    if args.batch:  # a plan without a CUDA graph: case 14's one chunk compiles every kernel
        x, mask = x[: args.batch].contiguous(), mask[: args.batch].contiguous()
    model = build_candidate(plan, case.config, device, reference.state_dict())
    with official_settings(), torch.inference_mode():
        for _ in range(2):
            model(x, mask)
        torch.cuda.synchronize()
    print(f"== case {args.case}: {plan.describe()}")
    head = ("kernel", "warps", "stages", "regs", "spills", "smem B")
    print("   " + f"{head[0]:40s} " + " ".join(f"{h:>6s}" for h in head[1:]))
    for name, fn in _jit_functions():
        for entry in getattr(fn, "device_caches", {}).values():
            for compiled in entry[0].values():
                meta = getattr(compiled, "metadata", None)
                try:
                    regs, spills = compiled.n_regs, compiled.n_spills
                except Exception:  # another Triton version: report what exists
                    regs = spills = "?"
                print(
                    f"   {name:40s} {getattr(meta, 'num_warps', '?')!s:>6s} "
                    f"{getattr(meta, 'num_stages', '?')!s:>6s} {regs!s:>6s} {spills!s:>6s} "
                    f"{getattr(meta, 'shared', '?')!s:>6s}"
                )


if __name__ == "__main__":
    main()
