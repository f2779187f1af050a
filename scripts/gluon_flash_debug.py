"""The Gluon flash attention (kernels/gluon_flash.py) against PyTorch over a sweep of its
settings: which ones go wrong, if any, and where (a CUDA device of compute capability 9.x).

    python3 scripts/gluon_flash_debug.py            # the default sweep
    python3 scripts/gluon_flash_debug.py --seq 300 --head-dim 64 --block-n 128 --stages 4

Per configuration (keys a step, buffers, warps, mask, causal) it prints the largest error
against the reference on the same fp16 q, k, v, how many elements are off by more than
1e-2, and where: the query blocks (64 rows a warpgroup) and the key-block step those rows
end on, so the pattern names the part (every block past the first: the copies' rings or
the pipelined product; the last block only: its wait; the diagonal: the masked loop; the
second warpgroup's rows: 8 warps; an empty sequence not 0: the guards). Exit status 1 if
any configuration is off.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

from kernels.attention import attention, attention_reference, key_mask_bounds

TOL = 1e-2


def mask_for(kind: str, batch: int, seq: int) -> torch.Tensor | None:
    """None, right padding (the last sequence empty; passed with its key bounds), or holes
    (every third key of the first sequence; no bounds: every block compares)."""
    if kind == "none":
        return None
    pos = torch.arange(seq)
    if kind == "bounds":
        lengths = torch.linspace(seq, seq // 3, batch).long()
        lengths[-1] = 0
        return pos[None, :] < lengths[:, None]
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[0, ::3] = False
    return mask


def run(batch: int, seq: int, heads: int, hd: int, block_n: int, stages: int, warps: int,
        kind: str, causal: bool, seed: int) -> bool:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, seq, 3, heads, hd, generator=gen).half()
    q, k, v = qkv.cuda().unbind(2)
    mask = mask_for(kind, batch, seq)
    mask_d = None if mask is None else mask.cuda()
    bounds = key_mask_bounds(mask_d) if kind == "bounds" else None
    out = torch.full((batch, seq, heads, hd), float("nan"), device="cuda", dtype=torch.float16)
    attention(q, k, v, causal=causal, key_mask=mask_d, key_bounds=bounds, out=out,
              precision="fp16", block_n=block_n, num_stages=stages, num_warps=warps,
              gluon=True)  # fmt: skip
    ref = attention_reference(*(t.float() for t in qkv.unbind(2)), causal=causal, key_mask=mask)
    ref = torch.nan_to_num(ref, nan=0.0)
    err = (out.float().cpu() - ref).abs()
    err = torch.where(torch.isfinite(err), err, torch.full_like(err, float("inf")))
    off = err > TOL
    name = (f"B{batch} S{seq} H{heads} hd{hd} keys {block_n} buffers {stages} warps {warps} "
            f"{kind}{' causal' if causal else ''}")  # fmt: skip
    if not off.any():
        print(f"ok   {name}: max error {err.max().item():.2e}")
        return True
    rows = off.any(dim=(2, 3))  # [B, S]
    block_m = 64 * (warps // 4)
    where = []
    for b in range(batch):
        bad = rows[b].nonzero().flatten()
        if bad.numel():
            blocks = sorted({int(r) // block_m for r in bad})
            halves = sorted({int(r) % block_m // 64 for r in bad})
            steps = sorted({int(r) // block_n for r in bad})
            where.append(f"seq {b}: {bad.numel()} rows, query blocks {blocks[:8]}, "
                         f"warpgroups {halves}, last key steps {steps[:8]}")  # fmt: skip
    print(f"OFF  {name}: max error {err.max().item():.2e}, {int(off.sum())} elements off")
    for line in where:
        print(f"     {line}")
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=3)
    parser.add_argument("--seq", type=int, nargs="*", default=[1024, 77])
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, nargs="*", default=[32])
    parser.add_argument("--block-n", type=int, nargs="*", default=[64, 128])
    parser.add_argument("--stages", type=int, nargs="*", default=[3])
    parser.add_argument("--warps", type=int, nargs="*", default=[4, 8])
    parser.add_argument("--mask", nargs="*", default=["bounds", "holes", "none"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("gluon_flash_debug.py: needs a CUDA device of compute capability 9.x")
    ok = True
    for seq, hd, bn, st, w, kind in itertools.product(
        args.seq, args.head_dim, args.block_n, args.stages, args.warps, args.mask
    ):
        for causal in (True, False):
            ok &= run(args.batch, seq, args.heads, hd, bn, st, w, kind, causal, args.seed)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
