"""Whether an attention operand precision can hold the rule at case 14's dims: the
reference model against the same model with fp16 GEMMs and the attention's operands in
each precision, on a shorter sequence the CPU can run (the dense reference is exact here).

    python3 scripts/attn_precision_probe.py --seq 4096 --seeds 2 --precisions fp16 bf16
    python3 scripts/attn_precision_probe.py --seq 4096 --precisions fp16 --drop-bits 0 1 2 3

``--drop-bits``: the half q, k, v also rounded with their lowest N mantissa bits cleared
(the plan knob ``attn_drop_bits``), one row per N. ``--late-bits`` and ``--late-from``: the
rows at positions from P on rounded with L bits cleared instead (``attn_drop_bits_late``,
``attn_drop_late_from``), one row per (N, L, P); the worst share is then also given for the
rows before P and from P on.

    python3 scripts/attn_precision_probe.py --seq 8192 --seeds 2 --precisions fp16 \
        --drop-bits 2 --late-bits 6 7 --late-from 1024 4096

Prints a row per (seed, precision): pass/fail under the rule, max abs error and the worst
share of the allowance (1.0 = at the rule's edge). Longer sequences average more keys into
each context row; the shortest one that fails is enough to rule a precision out.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from autotune.build import build_candidate
from autotune.core.device import detect_device
from autotune.core.reference import (
    TransformerConfig,
    build_reference,
    generate_random_case,
    official_settings,
)
from autotune.plan import Plan
from kernels._tolerance import PROJECT_RULE, compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--precisions", nargs="+", default=["fp16", "bf16"])
    parser.add_argument("--drop-bits", type=int, nargs="+", default=[0])
    parser.add_argument("--late-bits", type=int, nargs="+", default=[0])
    parser.add_argument("--late-from", type=int, nargs="+", default=[0])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    config = TransformerConfig(1, args.seq, 1024, 16, 1024, 2, True)  # case 14's dims
    device = detect_device(args.device)
    reference = build_reference(config, device.type)
    graded = [(late, at) for late in args.late_bits for at in args.late_from if late]
    graded = graded or [(0, 0)]
    print(
        f"{'seed':>5} {'attn':>5} {'drop':>4} {'late':>4} {'from':>6} {'rule':>5} {'max abs':>9} "
        f"{'worst':>6} {'before':>6} {'on':>6} {'s':>5}"
    )
    for seed in range(1234, 1234 + args.seeds):
        x, mask = generate_random_case(config, device.type, seed=seed)
        with official_settings(), torch.inference_mode():
            want = reference(x, mask)
            runs = itertools.product(args.precisions, args.drop_bits, graded)
            for precision, drop, (late, at) in runs:
                knobs = {"attn_drop_bits": drop, "gemm_precision": precision} if drop else {}
                if late:
                    knobs |= {
                        "attn_drop_bits_late": late,
                        "attn_drop_late_from": at,
                        "gemm_precision": precision,
                    }
                plan = Plan.from_dict(
                    {
                        "attention": "sdpa_math" if device.type == "cpu" else "sdpa_cudnn",
                        "attn_precision": precision,
                        "gemm_precision": "fp16",
                        "qkv": "packed",
                        "heads": "strided",
                        # rounding needs the GEMMs to hand over q, k, v in the same precision
                        **knobs,
                    }
                )
                model = build_candidate(plan, config, device, reference.state_dict())
                start = time.perf_counter()
                got = model(x, mask)
                seconds = time.perf_counter() - start
                err = (got.float() - want.float()).abs()
                allowance = torch.maximum(
                    torch.full_like(err, PROJECT_RULE.atol), PROJECT_RULE.rtol * want.abs()
                )
                passed = compare(got, want, PROJECT_RULE).passed
                share = (err / allowance)[0]  # [S, D]: one sequence
                before, on = (
                    (f"{share[:at].max().item():6.3f}", f"{share[at:].max().item():6.3f}")
                    if late
                    else ("-", "-")
                )
                print(
                    f"{seed:>5} {precision:>5} {drop:>4} {late:>4} {at:>6} "
                    f"{'pass' if passed else 'FAIL':>5} {err.max().item():9.2e} "
                    f"{share.max().item():6.3f} {before:>6} {on:>6} {seconds:5.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
