"""Stage by stage, the Gluon heads attention (kernels/gluon_heads.py) against PyTorch on one
layer's attention: where it goes wrong, if it does (a CUDA device of compute capability 9.x).

    python3 scripts/gluon_heads_debug.py                   # the default sweep
    python3 scripts/gluon_heads_debug.py --batch 300 --seq 128 --heads 4 --group 2 --programs 3

Each configuration runs the kernel (the context); where it is off, three more times, each
storing a stage instead of the context in the head's columns (``STOP``: 1 q, 2 k, 3 v, the
head's projections with their bias, rounded to fp16). Per stage it prints the largest error
against PyTorch on the same fp16 operands, how many elements are off by more than 1e-2, and
where the first are (sequence, row, column): the pattern says which part is wrong (right q,
k, v and a wrong context: the scores, the mask or the softmax; some heads' columns: the
weight copies or the group's offsets; every sequence after a program's first: the
persistent loop's copies or buffers; rows past 64: the second warpgroup). Exit status 1 if
any stage is off.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

from kernels.gluon_heads import gluon_heads_problems, launch_heads_attention_gluon

EPS = 1e-5
TOL = 1e-2
DEVICE = "cuda"  # tests/kernels/test_gluon_heads.py checks this script's references on the CPU


def references(
    x: torch.Tensor, normed: torch.Tensor | None, n1w: torch.Tensor, n1b: torch.Tensor,
    wqkv: torch.Tensor, bqkv: torch.Tensor, valid: torch.Tensor | None, heads: int,
    causal: bool,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """What the kernel computes, on its fp16 operands with fp32 sums: the LayerNorm1 rows
    (``normed``, or x's), q, k, v (fp16 with their bias), and the context ``[B, S, D]``."""
    b, s, d = x.shape
    rows = normed if normed is not None else torch.nn.functional.layer_norm(x, (d,), n1w, n1b, EPS)
    qkv = (rows.half().float() @ wqkv.float().t() + bqkv).half().float()
    q, k, v = qkv.split(d, dim=-1)
    hd = d // heads
    qh, kh, vh = (t.view(b, s, heads, hd).transpose(1, 2) for t in (q, k, v))
    scores = (qh @ kh.transpose(-1, -2)) * hd**-0.5
    allowed = torch.ones(s, s, dtype=torch.bool, device=x.device)
    if causal:
        allowed = allowed.tril()
    allowed = allowed[None, None].expand(b, 1, s, s)
    if valid is not None:
        allowed = allowed & valid[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    p = torch.nan_to_num(scores.softmax(-1), nan=0.0)  # a row with no valid key: 0
    ctx = (p @ vh).transpose(1, 2).reshape(b, s, d)
    return {"context": ctx, "q": q, "k": k, "v": v}


def run(batch: int, seq: int, d: int, heads: int, group: int, warps: int, programs: int,
        normed_rows: bool, mask: bool, causal: bool, seed: int) -> bool:  # fmt: skip
    problems = gluon_heads_problems(
        seq_len=seq, d_model=d, num_heads=heads, heads=group, gemm_precision="fp16",
        attn_precision="fp16", num_warps=warps,
    )  # fmt: skip
    if problems:  # a configuration the kernel does not take: say so, do not launch it
        print(f"B {batch} S {seq} D {d} H {heads} group {group} warps {warps}: not run: "
              + "; ".join(problems), flush=True)  # fmt: skip
        return True
    dev = torch.device(DEVICE)
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dev)

    x = rand(batch, seq, d)
    n1w, n1b = 1.0 + rand(d, scale=0.2), rand(d, scale=0.3)
    wqkv = rand(3 * d, d, scale=d**-0.5).half()
    bqkv = rand(3 * d, scale=0.1)
    normed = torch.nn.functional.layer_norm(x, (d,), n1w, n1b, EPS).half() if normed_rows else None
    valid = None
    if mask:
        valid = torch.rand(batch, seq, generator=g).to(dev) > 0.25
        valid[:, 0] = True
    refs = references(x, normed, n1w, n1b, wqkv, bqkv, valid, heads, causal)
    label = (f"B {batch} S {seq} D {d} H {heads} group {group} warps {warps} programs "
             f"{programs or 'all'} normed {normed_rows:d} mask {mask:d} "
             f"causal {causal:d}")  # fmt: skip
    ok = True
    for stop, name in enumerate(("context", "q", "k", "v")):
        if stop and ok:
            break  # the stages only where the context is off (each stage is another compile)
        ctx = torch.full((batch, seq, d), float("nan"), device=dev, dtype=torch.float16)
        launch_heads_attention_gluon(
            x, normed, ctx, None if valid is None else valid.to(torch.uint8), (n1w, n1b), wqkv,
            bqkv, num_heads=heads, heads=group, causal=causal, eps=EPS, num_warps=warps,
            max_programs=programs, stop=stop,
        )  # fmt: skip
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ok &= report(label, name, ctx.float(), refs[name])
    return ok


def report(label: str, what: str, got: torch.Tensor, ref: torch.Tensor) -> bool:
    err = (got - ref).abs()
    err = torch.where(torch.isnan(got), torch.full_like(err, float("inf")), err)
    bad = err > TOL * (1.0 + ref.abs())
    n = int(bad.sum())
    line = f"{label} | {what:8s} max err {float(err.max()):.3e}  off {n} of {err.numel()}"
    if n:
        seqs, rows, cols = bad.nonzero(as_tuple=True)
        first = [(int(a), int(r), int(c)) for a, r, c in zip(seqs[:6], rows[:6], cols[:6],
                                                              strict=True)]  # fmt: skip
        line += (f"  first (seq, row, col): {first}"
                 f"  seqs {sorted({int(a) for a in seqs[:4000]})[:8]}"
                 f"  rows {sorted({int(r) for r in rows[:4000]})[:12]}"
                 f"  cols {sorted({int(c) for c in cols[:4000]})[:12]}")  # fmt: skip
    print(line, flush=True)
    return n == 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=0, help="sequences (0: sweep 3 and 300)")
    p.add_argument("--seq", type=int, default=0, help="tokens a sequence (0: sweep)")
    p.add_argument("--d", type=int, default=128, help="d_model (32, 64, 128)")
    p.add_argument("--heads", type=int, default=0, help="0: sweep 4 (of 32) and 16 (of 8)")
    p.add_argument("--group", type=int, default=0, help="heads a program (0: fewest and all)")
    p.add_argument("--warps", type=int, default=0, help="4 or 8 (0: as the sequence needs)")
    p.add_argument("--programs", type=int, default=-1, help="a group's programs (0: all)")
    p.add_argument("--x", action="store_true", help="normalise x in the kernel (first layer)")
    p.add_argument("--mask", action="store_true")
    p.add_argument("--noncausal", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("gluon_heads_debug: needs a CUDA device of compute capability 9.x", file=sys.stderr)
        return 2
    sweep = a.seq == 0
    batches = [a.batch] if a.batch else [3, 300]
    seqs = [a.seq] if a.seq else [45, 128]
    heads = [a.heads] if a.heads else [4, 16]
    programs = [a.programs] if a.programs >= 0 else [0, 2]
    ok = True
    for h, b, s, n in itertools.product(heads, batches, seqs, programs):
        fewest = 2 if a.d // h == 8 else 1  # heads of 8 go in pairs
        groups = [a.group] if a.group else sorted({fewest, h})
        warps = a.warps or (4 if s <= 64 else 8)
        for grp in groups:
            ok &= sweep_flags(a, sweep, b, s, h, grp, warps, n)
    print("all stages within 1e-2" if ok else "SOME STAGES OFF (see above)")
    return 0 if ok else 1


def sweep_flags(a: argparse.Namespace, sweep: bool, b: int, s: int, h: int, grp: int,
                warps: int, n: int) -> bool:  # fmt: skip
    """The configuration with the command line's flags, or (the sweep) with normed rows and
    x, masks, causal and not."""
    ok = True
    flags = [(not a.x, a.mask, not a.noncausal)]
    if sweep and not (a.x or a.mask or a.noncausal):  # flags given: those, in every shape
        flags = [(True, False, True), (False, True, True), (True, True, False)]
    for normed_rows, mask, causal in flags:
        ok &= run(b, s, a.d, h, grp, warps, n, normed_rows, mask, causal, a.seed)
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
