"""Where a plan's device time goes: the profiler's kernels of warm forwards, per kernel
name, microseconds and launches per forward, and the total beside the case's floor. Three
totals a forward: the kernels' sum, their busy time (the union of their spans: with pdl a
kernel's wait overlaps the kernel before it), and the wall time of the forwards issued
back to back (CUDA events; wall minus busy is the device idle between kernels).

    python3 scripts/kernel_profile.py --case 13 PLAN_JSON [PLAN_JSON ...]
    python3 scripts/kernel_profile.py --case 14 --batch 4 --warmup 1 --forwards 1 @PLAN.json
    python3 scripts/kernel_profile.py --case 6 --compile-option _attention_fwd_kernel:maxnreg=80 P

``--compile-option [KERNEL:]KEY=INT`` launches the kernels (or the one named) with that
compile option (what a launcher change would pass: ``maxnreg``, ``num_stages``), to time a
change before making it (``autotune kernels inspect`` takes the same to count its
registers offline).

``--batch`` profiles the first sequences of the batch (a plan without a CUDA graph; the
floor is scaled to them): case 14's whole batch is 1.4 s a forward.
"""

from __future__ import annotations

import argparse
import contextlib
from collections import defaultdict
from collections.abc import Iterator

import torch
from torch.profiler import ProfilerActivity, profile

from autotune.build import build_candidate
from autotune.core.cases import get_case
from autotune.core.device import detect_device
from autotune.core.reference import build_reference, generate_random_case, official_settings
from autotune.plan import parse_plan
from autotune.tools.bench import busy_us
from autotune.tools.floors import CEILINGS, floor_of


@contextlib.contextmanager
def launch_options(overrides: dict[str, int]) -> Iterator[None]:
    """Within the block every Triton launch passes ``overrides``' options for its kernel
    (``kernels.sass.kernel_overrides``: plain keys for all, ``KERNEL:KEY`` for one)."""
    from triton.runtime import jit

    from kernels.sass import kernel_overrides, unmatched_kernels

    saved = jit.JITFunction.run
    launched: set[str] = set()

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        launched.add(self.fn.__name__)
        kwargs.update(kernel_overrides(overrides, self.fn.__name__))
        return saved(self, *args, **kwargs)

    jit.JITFunction.run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        jit.JITFunction.run = saved  # type: ignore[method-assign]
    if why := unmatched_kernels(overrides, launched):
        raise SystemExit(f"kernel_profile.py: {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("--forwards", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=0, help="first sequences only (0: all)")
    parser.add_argument("--compile-option", action="append", default=[],
                        metavar="[KERNEL:]KEY=INT")  # fmt: skip
    parser.add_argument("plans", nargs="+")
    args = parser.parse_args()
    from autotune.tools.kernel_inspect import parse_compile_options

    overrides = parse_compile_options(args.compile_option)
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
        try:  # one plan that cannot build or run costs its own profile, not the rest
            model = build_candidate(plan, case.config, device, reference.state_dict())
            with official_settings(), torch.inference_mode(), launch_options(overrides):
                for _ in range(args.warmup):
                    model(x, mask)
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    start.record()
                    for _ in range(args.forwards):
                        model(x, mask)
                    end.record()
                    torch.cuda.synchronize()
                wall = start.elapsed_time(end) * 1e3 / args.forwards
        except Exception as exc:  # a device fault still ends the process
            line = str(exc).splitlines()[0][:300] if str(exc) else ""
            print(f"== case {args.case}: {plan.describe()}: FAILED {type(exc).__name__}: {line}")
            continue
        times: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        device_events = [
            e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
        ]
        for event in device_events:
            times[event.name] += event.device_time / args.forwards
            counts[event.name] += 1
        total = sum(times.values())
        busy = busy_us(device_events) / args.forwards
        launches = sum(counts.values()) / args.forwards
        floor_us = floor.floor_us * share
        batch = f" (first {x.shape[0]} sequences)" if args.batch else ""
        options = "".join(f" [{k}={v}]" for k, v in overrides.items())
        print(f"== case {args.case}{batch}: {plan.describe()}{options}")
        print(
            f"   device {total:.1f} us/forward in {launches:.0f} kernels, busy {busy:.1f} us "
            f"(overlapping kernels once: pdl), wall {wall:.1f} us (events, forwards back to "
            f"back); floor {floor_us:.1f} us ({busy / floor_us:.1f}x)"
        )
        for name, t in sorted(times.items(), key=lambda kv: -kv[1])[:12]:
            print(f"   {t:9.1f} us  {counts[name] / args.forwards:4.0f}x  {name[:90]}")


if __name__ == "__main__":
    main()
