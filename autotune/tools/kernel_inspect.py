"""`autotune kernels inspect`: the Triton kernels a plan launches for one case (a fused
layer's, or the per-layer path's attention, LayerNorm and GELU epilogue), compiled on this
machine for the GPU profile's architecture (no GPU needed): registers, spills, shared
memory, resident blocks an SM, and SASS instructions by class. The per-layer path's torch
ops (its cuBLAS GEMMs on the device) run on the CPU meanwhile, on the real shapes.

It answers before any device time is spent what session 21's Nsight Compute run had to
measure on the H200 (case 2's heads kernel: 255 registers, 2 blocks an SM by registers,
51,200 B of shared memory; its post rows kernel: 148 registers, 3 blocks an SM). The
numbers are the installed Triton's: to see the device's, install its Triton version into
a folder and put that first on PYTHONPATH (README, "Inspecting kernels without a GPU").
"""

from __future__ import annotations

import json
import types
from collections.abc import Sequence
from typing import Any

import torch

from autotune import backends
from autotune.build import not_supported_reasons
from autotune.core.cases import Case
from autotune.core.device import DeviceInfo
from autotune.core.profiles import GpuProfile
from autotune.core.reference import build_reference, generate_random_case
from autotune.plan import Plan

SEED = 1234
# The per-layer path's torch ops run on the CPU beside the recorded launches: at most this
# much in its largest activation (case 6: 2.0 GiB; case 14: 37 GiB, refused).
PER_LAYER_CPU_BYTES = 4 << 30


def profile_device(profile: GpuProfile) -> DeviceInfo:
    """The CUDA device a GPU profile describes (for the support rules; nothing runs)."""
    if profile.device_type != "cuda" or profile.capability is None:
        raise ValueError(
            f"--gpu {profile.name} is not a CUDA profile with a compute capability; "
            "use h200, h100, a100, rtx4090 or rtx5080"
        )
    return DeviceInfo(
        "cuda", profile.name, profile.capability, profile.memory_bytes, profile.smem_per_block
    )


def parse_compile_options(items: Sequence[str]) -> dict[str, int]:
    """``[KERNEL:]KEY=INT`` items (``maxnreg=168``, ``_attention_fwd_kernel:maxnreg=64``) as
    a dict (a scoped key keeps its ``KERNEL:`` prefix: ``kernels.sass.offline_launches``
    applies it to that kernel alone); the options with known ranges are checked here
    (others by Triton when a kernel compiles)."""
    from kernels._common import MAX_MAXNREG, MIN_MAXNREG
    from kernels._triton import SUPPORTED_NUM_WARPS

    checks = {
        "maxnreg": (lambda v: MIN_MAXNREG <= v <= MAX_MAXNREG, f"{MIN_MAXNREG}..{MAX_MAXNREG}"),
        "num_stages": (lambda v: 1 <= v <= 8, "1..8"),
        "num_warps": (lambda v: v in SUPPORTED_NUM_WARPS, str(SUPPORTED_NUM_WARPS)),
    }
    options = {}
    for item in items:
        scoped, sep, value = item.partition("=")
        kernel, colon, key = scoped.rpartition(":")
        if not sep or not key or not value.isdigit() or (colon and not kernel):
            raise ValueError(
                f"--compile-option {item!r}: write [KERNEL:]KEY=INT, e.g. maxnreg=168 or "
                "_attention_fwd_kernel:num_stages=2"
            )
        if key in checks and not checks[key][0](int(value)):
            raise ValueError(f"--compile-option {item!r}: {key} takes {checks[key][1]}")
        options[scoped] = int(value)
    return options


def inspect_plan(
    case: Case, plan: Plan, profile: GpuProfile, overrides: dict[str, int] | None = None
) -> list[Any]:
    """The ``kernels.sass.KernelStats`` of every kernel one forward of ``plan`` launches on
    ``case``, compiled for ``profile``'s architecture (with ``overrides`` of the compile
    options, if any). ValueError (with the fix) for a plan under torch.compile or one
    that the support rules refuse there."""
    from kernels import _triton

    if _triton.interpreter_enabled():
        raise ValueError(
            "TRITON_INTERPRET is on: the interpreter compiles nothing; run with "
            "TRITON_INTERPRET=0 (the kernels compile for the profile's GPU, none is needed)"
        )
    from kernels import layer, sass

    if _triton.is_interpreted(layer._post_rows_kernel):
        raise ValueError(
            "the kernels were imported under TRITON_INTERPRET=1 in this process; start a new "
            "process with TRITON_INTERPRET=0"
        )
    family = backends.layer_backend(plan)
    if plan.compile != "none":
        raise ValueError(
            f"plan {plan.describe()!r} runs under torch.compile, whose kernels Inductor "
            "generates; inspect covers the project's Triton kernels: set compile none"
        )
    device = profile_device(profile)
    reasons = not_supported_reasons(plan, case.config, device)
    if reasons:
        raise ValueError(
            f"plan {plan.describe()!r} cannot run on case {case.id} on {profile.name}: "
            + "; ".join(reasons)
        )
    per_layer = not getattr(family, "fused", False)
    c = case.config
    big = c.batch_size * c.seq_len * max(c.d_model * 3, c.ffn_dim) * 4
    if per_layer and big > PER_LAYER_CPU_BYTES:
        raise ValueError(
            f"case {case.id}'s per-layer forward holds {big / 2**30:.1f} GiB activations, "
            f"over the {PER_LAYER_CPU_BYTES / 2**30:.0f} GiB inspect runs on the CPU: "
            "inspect a smaller case of the same d_model and head dim"
        )
    for knob in ("batch_chunk", "query_chunk", "host_io"):
        if getattr(plan, knob):
            raise ValueError(
                f"{knob}={getattr(plan, knob)} streams the forward in pieces, which inspect "
                f"does not reproduce: set {knob} to its default for the kernels' facts"
            )
    x, mask = generate_random_case(case.config, "cpu", seed=SEED)
    capability = profile.capability
    assert capability is not None
    arch = capability[0] * 10 + capability[1]
    if per_layer:
        from autotune.build import MASK_GENERAL, MASK_NONE, CandidateTransformer

        # The module stays on the CPU (the support rules saw the profile's device); the
        # forward's core, without the CUDA graph a plan may capture it in: the same launches.
        candidate = CandidateTransformer(case.config, plan, device).eval()
        kind = MASK_NONE if mask is None else MASK_GENERAL
        with torch.no_grad(), sass.offline_launches(arch, overrides) as stats:
            candidate._forward_core(x, mask, kind, candidate.prepared_weights())
        if not stats:
            raise ValueError(
                f"plan {plan.describe()!r} launches none of the project's Triton kernels on "
                f"case {case.id} (its kernels are PyTorch's and the libraries'): nothing to "
                "inspect; give a plan with attention=triton, a Triton layernorm or a fused layer"
            )
        return stats
    reference = build_reference(case.config, "cpu")
    model = types.SimpleNamespace(
        layers=reference.layers, final_norm=reference.final_norm, plan=plan
    )
    prepared = family.prepare(model)
    with sass.offline_launches(arch, overrides) as stats:
        family.forward(prepared, x, mask, plan, case.config)
    return stats


def format_stats(
    case: Case, plan: Plan, stats: Sequence[Any], overrides: dict[str, int] | None = None
) -> list[str]:
    """A header line and one line per kernel."""
    from kernels.sass import SASS_CLASSES

    classes = [*SASS_CLASSES, "other"]
    arch = stats[0].arch if stats else 0
    version = stats[0].triton_version if stats else "?"
    lines = [
        f"== case {case.id}: {plan.describe()}  (sm_{arch}, triton {version}"
        + "".join(f", {k}={v}" for k, v in (overrides or {}).items())
        + ")",
        f"   {'kernel':<26} {'launches':>8} {'blocks':>6} {'warps':>5} {'regs':>4} "
        f"{'stack':>5} {'smem B':>7} {'blocks/SM (by)':>15} {'SASS':>5}  "
        + " ".join(f"{c:>7}" for c in classes),
    ]
    for s in stats:
        occ = s.occupancy
        by = min(("warps", "registers", "shared"), key=lambda k: occ[k])
        lines.append(
            f"   {s.name[:26]:<26} {s.launches:>8} {s.programs:>6} {s.num_warps:>5} "
            f"{s.registers:>4} {s.stack:>5} {s.shared:>7} {occ['blocks']:>5} ({by:>8}) "
            f"{sum(s.sass.values()):>5}  " + " ".join(f"{s.sass[c]:>7}" for c in classes)
        )
    return lines


def to_json(
    case: Case, plan: Plan, stats: Sequence[Any], overrides: dict[str, int] | None = None
) -> str:
    record = {
        "case": case.id,
        "plan": plan.to_dict(),
        "compile_options": overrides or {},
        "kernels": [s.as_dict() for s in stats],
    }
    return json.dumps(record, indent=1)
