"""Case 14's attention (4 sequences of 100,000 tokens, 16 heads of 64, causal, fp16 operands
as strided views of one packed [B, S, 3, H, D] projection) through every cuDNN execution
plan the cuDNN frontend (`nvidia-cudnn-frontend`, carried as a wheel) can build: the
heuristics' ranked plans (modes A, B and FALLBACK) and, for each engine that serves the
graph, one plan per value of each of its knobs. Each plan is checked against PyTorch's own
cuDNN SDPA output (max abs difference) and timed for about `--seconds` of sustained
back-to-back calls (so under the card's power cap, as in the whole forward), interleaved
with PyTorch's SDPA in rounds, one process. Prints ms a call (median of the later half of
each stretch), TFLOP/s counting the causal half, and the ratio to PyTorch's SDPA.

    python3 scripts/cudnn_attention_plans.py [--batch 4] [--seconds 3] [--rounds 2]
        [--max-plans 24] [--build-s 120]

The question it answers (issue 18, docs/case14.md "Session 38"): does cuDNN hold an
engine configuration for this shape that spends less energy a FLOP than the one
PyTorch's heuristics pick (session 38: 449-451 TFLOP/s under the 700 W cap)? The exact
route needs about 2.3% less time a forward on the H200.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections import defaultdict
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

S, H, D = 100_000, 16, 64


def backend_version(cudnn: Any) -> str:
    try:
        return str(cudnn.backend_version())
    except Exception as exc:  # the frontend found no libcudnn of its own
        return f"unknown ({exc})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=S)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-plans", type=int, default=24, help="plans timed at most")
    parser.add_argument("--build-s", type=float, default=120.0, help="seconds for building plans")
    args = parser.parse_args()

    import cudnn  # the frontend wheel; imported here so --help works without it

    B, seq = args.batch, args.seq
    print(
        f"{torch.cuda.get_device_name()}: B={B} S={seq} H={H} D={D} causal fp16; "
        f"torch cuDNN {torch.backends.cudnn.version()}, frontend {cudnn.__version__}, "
        f"backend {backend_version(cudnn)}"
    )
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(B, seq, 3, H, D, generator=gen, device="cuda", dtype=torch.float16)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, S, D] views
    out = torch.empty(B, seq, H, D, device="cuda", dtype=torch.float16).transpose(1, 2)
    flops = 4 * B * H * seq * seq * D / 2

    with torch.inference_mode(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()

    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)

    def new_graph() -> tuple[Any, dict[Any, torch.Tensor]]:
        g = cudnn.pygraph(
            io_data_type=cudnn.data_type.HALF,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )
        tq, tk, tv = (
            g.tensor(
                name=n, dim=list(t.shape), stride=list(t.stride()), data_type=cudnn.data_type.HALF
            )
            for n, t in zip("qkv", (q, k, v), strict=True)
        )
        o, _ = g.sdpa(
            tq, tk, tv, name="sdpa", generate_stats=False, attn_scale=D**-0.5, use_causal_mask=True
        )
        o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride()))
        o.set_data_type(cudnn.data_type.HALF)
        g.validate()
        g.build_operation_graph()
        return g, {tq: q, tk: k, tv: v, o: out}

    # Every plan is (label, graph, index in that graph, tensors).
    plans: list[tuple[str, Any, int, dict[Any, torch.Tensor]]] = []
    seen: set[str] = set()
    t0 = time.perf_counter()
    base_knobs: dict[int, dict[Any, int]] = {}
    lowered: Any = None
    for mode in ("A", "B", "FALLBACK"):
        try:
            g, pack = new_graph()
            g.create_execution_plans([getattr(cudnn.heur_mode, mode)])
            g.check_support()
            count = g.get_execution_plan_count()
        except Exception as exc:  # a probe: say what failed, go on
            print(f"heur_mode.{mode}: no plans ({type(exc).__name__}: {str(exc)[:200]})")
            continue
        lowered = lowered or g  # a graph the backend has planned: it answers knob queries
        print(f"heur_mode.{mode}: {count} plans")
        for i in range(count):
            try:
                name = g.get_plan_name_at_index(i)
                eid, knobs = g.get_engine_and_knobs_at_index(i)
                base_knobs.setdefault(int(eid), dict(knobs))
            except Exception as exc:
                print(f"  [{i}] unnamed ({type(exc).__name__}: {str(exc)[:120]})")
                continue
            label = f"{mode}[{i}] {name}"
            if name in seen:
                print(f"  {label}: same plan as one above")
                continue
            try:
                g.build_plan_at_index(i)
            except Exception as exc:
                print(f"  {label}: build failed ({type(exc).__name__}: {str(exc)[:160]})")
                continue
            seen.add(name)
            print(f"  {label}: engine {eid}, knobs {knobs}")
            plans.append((label, g, i, pack))

    # Each engine's knobs, one value changed at a time from the heuristics' first plan.
    for eid in sorted(base_knobs):
        try:
            knobs = lowered.get_knobs_for_engine(eid)
        except Exception as exc:
            print(f"engine {eid}: knobs unknown ({type(exc).__name__}: {str(exc)[:160]})")
            continue
        axes = []
        for kb in knobs:
            values = list(range(kb.min_value, kb.max_value + 1, max(1, kb.stride)))
            print(
                f"engine {eid}: knob {kb.type} values {kb.min_value}..{kb.max_value} "
                f"stride {kb.stride}"
            )
            if 1 < len(values) <= 64:
                axes.append((kb.type, values))
        # Every combination where there are few; else one knob changed at a time from the
        # heuristics' own setting for this engine.
        size = 1
        for _, vals in axes:
            size *= len(vals)
        if size <= args.max_plans:
            settings = [
                dict(c) for c in itertools.product(*[[(t, x) for x in vals] for t, vals in axes])
            ]
        else:
            base = base_knobs.get(eid, {})
            settings = [{**base, t: x} for t, vals in axes for x in vals]
        for setting in settings:
            if len(plans) >= args.max_plans or time.perf_counter() - t0 > args.build_s:
                print("plan budget spent: no more knob settings built")
                break
            try:
                g, pack = new_graph()
                g.create_execution_plan(eid, setting)
                g.check_support()
                idx = g.get_execution_plan_count() - 1
                name = g.get_plan_name_at_index(idx)
                if name in seen:
                    continue
                g.build_plan_at_index(idx)
            except Exception as exc:
                print(
                    f"  engine {eid} {setting}: not built ({type(exc).__name__}: {str(exc)[:100]})"
                )
                continue
            seen.add(name)
            print(f"  engine {eid} {setting}: {name}")
            plans.append((f"engine {eid} {setting} {name}", g, idx, pack))
    print(f"{len(plans)} plans built in {time.perf_counter() - t0:.1f} s")

    workspace = torch.empty(
        max([g.get_workspace_size_plan_at_index(i) for _, g, i, _ in plans] + [1]),
        device="cuda",
        dtype=torch.uint8,
    )

    def run_plan(g: Any, i: int, pack: dict[Any, torch.Tensor]) -> None:
        g.execute_plan_at_index(pack, workspace, i, handle=handle)

    # Each plan against PyTorch's output; a plan whose output is off is not timed.
    timed: list[tuple[str, Any]] = [("torch sdpa cudnn", None)]
    for label, g, i, pack in plans:
        out.zero_()
        try:
            run_plan(g, i, pack)
            torch.cuda.synchronize()
        except Exception as exc:
            print(f"{label}: run failed ({type(exc).__name__}: {str(exc)[:160]})")
            continue
        diff = (out.float() - ref.float()).abs().max().item()
        ok = diff <= 2e-3
        print(f"{label}: max |plan - torch| {diff:.2e} {'ok' if ok else 'DIFFERS: not timed'}")
        if ok:
            timed.append((label, (g, i, pack)))

    times: dict[str, list[float]] = defaultdict(list)
    with torch.inference_mode(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(args.rounds):
            for label, plan in timed:
                spent = 0.0
                while spent < args.seconds:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                    start.record()
                    if plan is None:
                        F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    else:
                        run_plan(*plan)
                    end.record()
                    end.synchronize()
                    ms = start.elapsed_time(end)
                    times[label].append(ms)
                    spent += ms / 1e3
    base = statistics.median(times["torch sdpa cudnn"][len(times["torch sdpa cudnn"]) // 2 :])
    rows = []
    for label, _ in timed:
        t = times[label]
        med = statistics.median(t[len(t) // 2 :])  # the later half: under the cap
        rows.append((med, label, t[0], len(t)))
    print(f"{'ms/call':>8} {'TFLOP/s':>7} {'vs torch':>8} {'calls':>5}  plan")
    for med, label, _first, n in sorted(rows):
        print(f"{med:8.2f} {flops / med / 1e9:7.0f} {base / med:8.3f} {n:5d}  {label[:110]}")


if __name__ == "__main__":
    main()
