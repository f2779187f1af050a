"""Stage by stage, the Gluon post rows kernel (kernels/gluon_rows.py) against PyTorch on
one layer: where it goes wrong, if it does (a CUDA device of compute capability 9.x).

    python3 scripts/gluon_rows_debug.py                    # the default sweep
    python3 scripts/gluon_rows_debug.py --d 64 --rows 1000 --warps 8 --programs 3 --next-qkv

Each configuration runs the QKV rows kernel, then the post rows kernel (the output, and with
``--next-qkv`` the qkv rows);
where they are off, three more times, each storing a stage's rows instead of its output
(``STOP``: 1 x1 = x + ctx Wo^T + bo, 2 LayerNorm2, 3 the FFN's GELU). Per stage it prints
the largest error against PyTorch on the same fp16 operands, how many elements are off by
more than 1e-2, and where the first are (row within its 64-row tile, column): the pattern
says which part is wrong (a tile's later rows: the context copies; every row of some
columns: a weight's layout; everything after the first tile: the persistent loop's
waits). Exit status 1 if any stage is off.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

from kernels._common import GELU_POLY, GELU_POLY_CLAMP
from kernels.gluon_rows import ROW_BLOCK, launch_post_rows_gluon, launch_qkv_rows_gluon

EPS = 1e-5
TOL = 1e-2
DEVICE = "cuda"  # tests/kernels/test_gluon_rows.py checks this script's references on the CPU


def gelu(v: torch.Tensor, poly: bool) -> torch.Tensor:
    if not poly:
        return 0.5 * v * (1.0 + torch.erf(v * 0.7071067811865476))
    m = torch.clamp(v, min=-GELU_POLY_CLAMP)
    c = torch.clamp(m, max=GELU_POLY_CLAMP)
    z = c * (GELU_POLY[0] + c * c * (GELU_POLY[1] + c * c * GELU_POLY[2]))
    return m / (1.0 + torch.exp2(z))


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, EPS)


def half_mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a @ w^T`` on fp16 operands with fp32 sums (what the kernel's wgmma computes)."""
    return a.half().float() @ w.float().t()


def run(d: int, rows: int, warps: int, programs: int, mask: bool, final: bool,
        next_qkv: bool, poly: bool, seed: int, next_norm: bool = False) -> bool:  # fmt: skip
    dev = torch.device(DEVICE)
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dev)

    wo, w1, w2 = (rand(d, d, scale=d**-0.5).half() for _ in range(3))
    wqkv = rand(3 * d, d, scale=d**-0.5).half()
    bo, b1, b2, bqkv = rand(d, scale=0.1), rand(d, scale=0.1), rand(d, scale=0.1), rand(3 * d)
    n2w, n1w, nfw = (1.0 + rand(d, scale=0.2) for _ in range(3))
    n2b, n1b, nfb = (rand(d, scale=0.3) for _ in range(3))
    x = rand(rows, d)
    ctx = rand(rows, d).half()
    valid = torch.rand(rows, generator=g).to(dev) > 0.2
    mask_bytes = valid.to(torch.uint8)

    x1 = x + bo + half_mm(ctx, wo)
    h32 = layernorm(x1, n2w, n2b)
    a32 = gelu(half_mm(h32, w1) + b1, poly)
    y = x1 + b2 + half_mm(a32, w2)
    if mask:
        y = torch.where(valid[:, None], y, 0.0)
    if final:
        y = layernorm(y, nfw, nfb)
        if mask:
            y = torch.where(valid[:, None], y, 0.0)
    qkv_ref = (half_mm(layernorm(y, n1w, n1b), wqkv) + bqkv).half()
    normed_ref = layernorm(y, n1w, n1b).half()

    # The QKV rows kernel (the rows variant's first layer, every layer without the chain).
    qkv_x_ref = (half_mm(layernorm(x, n1w, n1b), wqkv) + bqkv).half()
    qkv_x = torch.full((rows, 3 * d), float("nan"), device=dev, dtype=torch.float16)
    launch_qkv_rows_gluon(x, qkv_x, (n1w, n1b, wqkv, bqkv), rows, d, EPS, num_warps=warps,
                          max_programs=programs)  # fmt: skip
    post = (wo, bo, n2w, n2b, w1, b1, w2, b2, nfw, nfb)
    label = (f"D {d} rows {rows} warps {warps} programs {programs or 'all'} mask {mask:d} "
             f"final {final:d} next_qkv {next_qkv:d} next_norm {next_norm:d} "
             f"gelu {'poly' if poly else 'erf'}")  # fmt: skip
    ok = report(label, "qkv rows", qkv_x.float(), qkv_x_ref.float())
    # The output first; the stages only where it is off (each stage is another compile).
    stages = ((0, "out", y), (1, "x1", x1), (2, "LayerNorm2", h32), (3, "GELU", a32))
    for stop, name, want in stages:
        if stop and ok:
            break
        out = torch.full_like(x, float("nan"))
        qkv = torch.full((rows, 3 * d), float("nan"), device=dev, dtype=torch.float16)
        normed = torch.full((rows, d), float("nan"), device=dev, dtype=torch.float16)
        launch_post_rows_gluon(
            x, ctx, out, mask_bytes, post, qkv, (n1w, n1b, wqkv, bqkv), normed, rows, d, EPS,
            has_key_mask=mask, final_norm=final, gelu_poly=poly, next_qkv=next_qkv,
            next_norm=next_norm, num_warps=warps, stop=stop, max_programs=programs,
        )  # fmt: skip
        if dev.type == "cuda":
            torch.cuda.synchronize()
        checks = [(name, out, want)]
        if stop == 0 and next_qkv:
            checks.append(("qkv", qkv.float(), qkv_ref.float()))
        if stop == 0 and next_norm:
            checks.append(("normed", normed.float(), normed_ref.float()))
        for what, got, ref in checks:
            ok &= report(label, what, got, ref)
    return ok


def report(label: str, what: str, got: torch.Tensor, ref: torch.Tensor) -> bool:
    err = (got - ref).abs()
    err = torch.where(torch.isnan(got), torch.full_like(err, float("inf")), err)
    bad = err > TOL * (1.0 + ref.abs())
    n = int(bad.sum())
    line = f"{label} | {what:10s} max err {float(err.max()):.3e}  off {n} of {err.numel()}"
    if n:
        rows, cols = bad.nonzero(as_tuple=True)
        tiles = sorted({int(r) // ROW_BLOCK for r in rows[:2000]})
        first = [(int(r) % ROW_BLOCK, int(c)) for r, c in zip(rows[:6], cols[:6], strict=True)]
        line += (f"  first (tile-row, col): {first}"
                 f"  tiles {tiles[:8]}{'...' if len(tiles) > 8 else ''}"
                 f"  cols {sorted({int(c) for c in cols[:2000]})[:12]}")  # fmt: skip
    print(line, flush=True)
    return n == 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=0, help="d_model = ffn_dim (32, 64, 128; 0: sweep)")
    p.add_argument("--rows", type=int, default=0, help="tokens (0: sweep 1000 and 19,200)")
    p.add_argument("--warps", type=int, default=0, help="4 or 8 (0: both)")
    p.add_argument("--programs", type=int, default=-1, help="at most this many (0: all)")
    p.add_argument("--mask", action="store_true")
    p.add_argument("--final", action="store_true")
    p.add_argument("--next-qkv", action="store_true")
    p.add_argument("--next-norm", action="store_true", help="the heads variant's normed rows")
    p.add_argument("--erf", action="store_true", help="the erf GELU (default: the poly form)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("gluon_rows_debug: needs a CUDA device of compute capability 9.x", file=sys.stderr)
        return 2
    sweep = a.d == 0
    ds = [a.d] if a.d else [128, 64]
    rows = [a.rows] if a.rows else [1000, 300 * ROW_BLOCK]
    warps = [a.warps] if a.warps else [4, 8]
    programs = [a.programs] if a.programs >= 0 else [0, 3]
    ok = True
    for d, r, w, n in itertools.product(ds, rows, warps, programs):
        flags = [(a.mask, a.final, a.next_qkv, a.next_norm)]
        if sweep:  # every flag once on, both chains included
            flags = [(False, False, False, False), (True, True, False, False),
                     (True, False, True, False), (False, False, False, True)]  # fmt: skip
        for mask, final, chained, norms in flags:
            ok &= run(d, r, w, n, mask, final, chained, not a.erf, a.seed, norms)
    print("all stages within 1e-2" if ok else "SOME STAGES OFF (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
