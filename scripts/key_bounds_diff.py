"""How far the key-bounded attention (``key_bounds``) is from the unbounded launch.

Session 39's compiled kernel tests found the two not bit-equal on an H100 (7 tests assert
``torch.equal``); on the CPU interpreter they are. This prints, per shape and precision,
the max abs difference between the two launches and each one's error against the fp32
reference, judged by the project rule. ``--layers``: the same for the two layer-level
equalities of tests/kernels/test_layer.py (mask bounds; the staged residual). Run on a GPU
(TRITON_INTERPRET unset/0):
    python3 scripts/key_bounds_diff.py [--layers]
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


def layers() -> None:
    """The two layer-level equalities the compiled tests hold within a tolerance
    (tests/kernels/test_layer.py): mask bounds on or off (rows, fp16), and the residual
    staged in the output rows or not (rows fp16, heads ieee), on the tests' shapes."""
    from autotune.core.reference import TransformerConfig, build_reference, generate_random_case
    from kernels._tolerance import PROJECT_RULE
    from kernels.block import weights_from_model
    from kernels.layer import Tiling, layer_stack, prepare_layer_weights

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = TransformerConfig(3, 37, 40, 5, 72, 2, causal=True)
    ref = build_reference(cfg)
    print(f"{'what':<34} {'max|a-b|':>10} {'a_err':>10} {'b_err':>10} rule")
    for what, seed, variant, precision, knob in (
        ("mask_bounds, rows, fp16", 2, "rows", "fp16", "mask_bounds"),
        ("stage_residual, rows, fp16", 3, "rows", "fp16", "stage_residual"),
        ("stage_residual, heads, ieee", 3, "heads", "ieee", "stage_residual"),
    ):
        x, mask = generate_random_case(cfg, seed=seed, padding_ratio=0.3)
        if knob == "mask_bounds":
            mask[0, 4] = False  # as the test: a hole inside the first sequence's prefix
        with torch.inference_mode():
            expected = ref(x, mask)
        layer_weights, final = weights_from_model(ref, device=device)
        weights = [prepare_layer_weights(w, precision) for w in layer_weights]
        xd, md = x.to(device), mask.to(device)
        outs = []
        for on in (True, False):
            tiling = Tiling(block_m=16, block_n=16, row_block=16, **{knob: on})
            extra = (
                {}
                if knob == "mask_bounds"
                else {"gemm_precision": precision, "attn_precision": precision}
            )
            outs.append(
                layer_stack(
                    xd,
                    weights,
                    final,
                    num_heads=5,
                    causal=True,
                    key_mask=md,
                    variant=variant,
                    tiling=tiling,
                    **extra,
                ).cpu()
            )
        a, b = outs
        ok = compare(a, expected, PROJECT_RULE).passed and compare(b, expected, PROJECT_RULE).passed
        print(
            f"{what:<34} {(a - b).abs().max().item():>10.3e} "
            f"{(a - expected).abs().max().item():>10.3e} "
            f"{(b - expected).abs().max().item():>10.3e} {'pass' if ok else 'FAIL'}"
        )


if __name__ == "__main__":
    import sys

    layers() if sys.argv[1:] == ["--layers"] else main()
