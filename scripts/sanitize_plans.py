"""Plans run eagerly (no CUDA graphs) on one shape with a padded and a general mask, for
``compute-sanitizer --tool memcheck``: an out-of-bounds access in any kernel is reported
with the kernel's name. Each plan is built, run twice, checked against the reference
(on the first mask) and released before the next one.

    compute-sanitizer --error-exitcode 9 python3 scripts/sanitize_plans.py \
        --shape 16,128,128,4,128,4 PLAN_JSON [PLAN_JSON ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from autotune.build import build_candidate
from autotune.core.cases import parse_custom
from autotune.core.device import detect_device
from autotune.core.reference import (
    build_reference,
    check_outputs,
    generate_random_case,
    official_settings,
)
from autotune.plan import parse_plan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True, help="B,S,d_model,heads,FFN,layers")
    parser.add_argument("--no-reference", action="store_true", help="skip the comparison")
    parser.add_argument("plans", nargs="+")
    args = parser.parse_args()
    config = parse_custom(args.shape).config
    device = detect_device("auto")  # CUDA on the GPU machine
    where = device.torch_device
    ref = build_reference(config, where).eval()
    x, padded = generate_random_case(config, where, seed=3, padding_ratio=0.3)
    general = torch.rand(padded.shape, device=where) > 0.2
    general[:, 0] = True
    want = None
    with official_settings(), torch.inference_mode():
        if not args.no_reference:
            want = ref(x, padded)
        for text in args.plans:
            plan = dataclasses.replace(parse_plan(text), cuda_graph=False)
            cand = build_candidate(plan, config, device, ref.state_dict())
            got = cand(x, padded)
            cand(x, general)
            if where.type == "cuda":
                torch.cuda.synchronize()
            verdict = check_outputs(got, want).summary() if want is not None else "ran"
            print(f"{plan.describe()}: {verdict}", flush=True)
            del cand, got
            if where.type == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
