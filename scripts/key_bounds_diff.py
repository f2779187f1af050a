"""How far the key-bounded attention (``key_bounds``) is from the unbounded launch.

Session 39's compiled kernel tests found the two not bit-equal on an H100 (7 tests assert
``torch.equal``); on the CPU interpreter they are. This prints, per shape and precision,
the max abs difference between the two launches and each one's error against the fp32
reference, judged by the project rule. Run on a GPU (TRITON_INTERPRET unset/0):
    python3 scripts/key_bounds_diff.py
"""

from __future__ import annotations

import torch

from kernels._tolerance import TOLERANCE_BY_PRECISION, compare
from kernels.attention import attention, attention_reference, key_mask_bounds


def _masks(batch: int, seq_len: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, seq_len, generator=gen) < 0.7
    mask[0] = True
    mask[1, : min(20, seq_len)] = True
    mask[2, max(seq_len - 11, 0) :] = False
    mask[3] = False
    mask[4, 0] = False
    return mask


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(
        f"{'B':>3} {'S':>5} {'H':>3} {'hd':>4} {'causal':>6} {'bm':>3} {'bn':>3} {'prec':>5} "
        f"{'max|plain-bounded|':>19} {'n_diff':>7} {'plain_err':>10} {'bounded_err':>11} rule"
    )
    shapes = [
        (5, 45, 2, 16, 16, 16),
        (5, 45, 2, 16, 32, 16),
        (5, 45, 2, 16, 16, 32),
        (5, 300, 4, 64, 64, 64),
        (5, 1024, 8, 64, 64, 64),
    ]
    for batch, seq_len, heads, hd, bm, bn in shapes:
        gen = torch.Generator().manual_seed(3)
        qkv = torch.randn(batch, seq_len, 3 * heads * hd, generator=gen)
        q, k, v = (t.to(device) for t in qkv.view(batch, seq_len, 3, heads, hd).unbind(2))
        mask = _masks(batch, seq_len, seed=4).to(device)
        for causal in (True, False):
            ref = attention_reference(q.cpu(), k.cpu(), v.cpu(), causal=causal, key_mask=mask.cpu())
            ok = ref.isfinite()
            for precision in ("ieee", "tf32"):
                kw = dict(causal=causal, key_mask=mask, block_m=bm, block_n=bn, precision=precision)
                plain = attention(q, k, v, **kw)
                bounded = attention(q, k, v, key_bounds=key_mask_bounds(mask), **kw)
                diff = (plain - bounded).abs()
                rule = TOLERANCE_BY_PRECISION[precision]
                cp = compare(plain.cpu()[ok], ref[ok], rule)
                cb = compare(bounded.cpu()[ok], ref[ok], rule)
                pe = (plain.cpu()[ok] - ref[ok]).abs().max().item()
                be = (bounded.cpu()[ok] - ref[ok]).abs().max().item()
                print(
                    f"{batch:>3} {seq_len:>5} {heads:>3} {hd:>4} {causal!s:>6} {bm:>3} {bn:>3} "
                    f"{precision:>5} {diff.max().item():>19.3e} {int((diff > 0).sum()):>7} "
                    f"{pe:>10.3e} {be:>11.3e} {'pass' if cp.passed and cb.passed else 'FAIL'}"
                )


if __name__ == "__main__":
    main()
