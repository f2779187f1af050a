"""The Gluon flash attention (kernels.gluon_flash, ``attention(..., gluon=True)``,
Tiling.gluon_flash, plan knob attn_gluon_flash): its support rules everywhere; its numerics
against the reference and the Triton kernel on a CUDA device of compute capability 9.x
(``KERNELS_TEST_DEVICE=cuda``); its compiled resources offline in tests/kernels/test_sass.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from autotune.backends.triton_attention import gluon_flash_reasons
from autotune.core.device import DeviceInfo
from autotune.core.reference import TransformerConfig
from autotune.plan import Plan
from kernels import gluon_flash
from kernels._tolerance import PROJECT_RULE, compare
from kernels.attention import attention, attention_reference, gluon_reasons, key_mask_bounds
from kernels.layer import Tiling
from tests.kernels.test_gluon_rows import _reasons as layer_reasons
from tests.kernels.test_layer import run_stack


def _problems(**changes) -> list[str]:
    args = dict(head_dim=32, block_n=64, num_warps=4, num_stages=3, precision="fp16")
    args.update(changes)
    return [p for p in gluon_reasons(**args) if p != gluon_flash.GLUON_ERROR]


def test_the_settings_it_takes_and_why_not() -> None:
    assert _problems() == []
    assert _problems(head_dim=64, block_n=128, num_warps=8, num_stages=4) == []
    assert _problems(head_dim=128, block_n=64, num_stages=3) == []  # 114,944 B
    cases = {
        "head_dim 8 is not one of (16, 32, 64, 128)": dict(head_dim=8),
        "head_dim 48 is not one of": dict(head_dim=48),
        "attn_block_n 32 is not one of (64, 128)": dict(block_n=32),
        "attn_stages 2 is not one of (3, 4)": dict(num_stages=2),
        "2 attention warps: wgmma takes 4": dict(num_warps=2),
        "attn_precision 'tf32': the Gluon flash attention takes fp16": dict(precision="tf32"),
        "key_lengths: pass the key mask": dict(key_lengths=True),
        "head_chunk=64 picks the Triton one-tile form": dict(head_chunk=64),
        # head dim 128, 128 keys a step, 8 warps, 4 stages: 2 x (128 + 2 x 4 x 128) x 128 + 512
        "295424 bytes of shared memory a program (the limit is 232448)": dict(
            head_dim=128, block_n=128, num_warps=8, num_stages=4
        ),
    }
    for why, changes in cases.items():
        assert any(why in p for p in _problems(**changes)), (why, _problems(**changes))


def test_shared_memory_is_the_query_tile_the_buffers_and_a_row() -> None:
    """The compiled kernels' shared bytes (offline, Triton 3.6 and 3.9; test_sass checks
    case 13's): the conversion of the context to 16-byte stores reuses the query tile."""
    assert gluon_flash.gluon_flash_shared_bytes(32, 64, 3, 4) == 28_672 + 256
    assert gluon_flash.gluon_flash_shared_bytes(32, 128, 3, 4) == 53_248 + 256
    assert gluon_flash.gluon_flash_shared_bytes(32, 128, 3, 8) == 57_344 + 512
    assert gluon_flash.gluon_flash_shared_bytes(128, 64, 3, 4) == 114_688 + 256


def test_refused_off_hopper_with_the_way_out() -> None:
    q = torch.zeros(1, 64, 2, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match="maxnreg"):
        attention(q, q, q, causal=True, out=torch.empty_like(q), precision="fp16", gluon=True,
                  num_stages=3, maxnreg=7)  # fmt: skip
    with pytest.raises(ValueError, match=r"gluon=True .* runs compiled on a CUDA GPU"):
        attention(q, q, q, causal=True, out=torch.empty_like(q), precision="fp16", gluon=True,
                  num_stages=3)  # fmt: skip


def test_layer_rules_name_the_kernel_it_replaces() -> None:
    flash = Tiling(block_m=64, block_n=64, num_warps=4, num_stages=3, gluon_flash=True)
    assert layer_reasons(flash, seq_len=1024) == []
    heads = layer_reasons(flash, variant="heads")
    assert any("gluon_flash replaces the flash attention kernel of variant 'rows'" in r
               for r in heads)  # fmt: skip
    post = layer_reasons(Tiling(block_m=32, block_n=64, num_stages=3, gluon_flash=True,
                                attn_post=True))  # fmt: skip
    assert any("without attn_post; got variant='rows', attn_post=True" in r for r in post)
    narrow = layer_reasons(Tiling(block_n=32, num_stages=3, gluon_flash=True))
    assert any("gluon_flash: attn_block_n 32 is not one of (64, 128)" in r for r in narrow)
    bf16 = layer_reasons(flash, gemm_precision="bf16", attn_precision="bf16")
    assert any("gluon_flash: attn_precision 'bf16'" in r for r in bf16)
    assert any("set gemm_precision=fp16 (got bf16)" in r for r in bf16)
    cpu = layer_reasons(flash, device_type="cpu", capability=None)
    assert any("gluon_flash runs on a CUDA device of compute capability 9.x" in r for r in cpu)
    ampere = layer_reasons(flash, capability=(8, 0))
    assert any("gluon_flash is built for Hopper" in r for r in ampere)


def test_plan_rules_per_layer() -> None:
    config = TransformerConfig(batch_size=2, seq_len=1024, d_model=128, num_heads=4, ffn_dim=128,
                               num_layers=2, causal=True)  # fmt: skip
    h200 = DeviceInfo(type="cuda", name="H200", capability=(9, 0), smem_per_block=232448)
    plan = Plan(attention="triton", attn_gluon_flash=True, attn_precision="fp16",
                gemm_precision="fp16", attn_stages=3)  # fmt: skip
    assert [r for r in gluon_flash_reasons(plan, config, h200) if "Gluon" not in r] == []
    fp32 = Plan(attention="triton", attn_gluon_flash=True, attn_precision="fp16", attn_stages=3)
    assert any("set gemm_precision=fp16 (got fp32)" in r
               for r in gluon_flash_reasons(fp32, config, h200))  # fmt: skip
    cpu = DeviceInfo(type="cpu", name="cpu")
    assert any("attn_gluon_flash runs on a CUDA device" in r
               for r in gluon_flash_reasons(plan, config, cpu))  # fmt: skip


# --------------------------------------------------------------------------------------
# On Hopper
# --------------------------------------------------------------------------------------
def _hopper(device: str) -> None:
    if device != "cuda" or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("Gluon runs compiled on a CUDA sm_90 device only (KERNELS_TEST_DEVICE=cuda)")


def _mask(kind: str, batch: int, seq_len: int) -> torch.Tensor | None:
    """None, right padding (lengths from full down to a third, and with 3 sequences or more
    the last one empty: its key bounds end at 0), or holes (every third key of the even
    sequences masked, and the last sequence with no valid key at all)."""
    if kind == "none":
        return None
    pos = torch.arange(seq_len)
    if kind == "padded":
        lengths = torch.linspace(seq_len, seq_len // 3, batch).long()
        if batch >= 3:
            lengths[-1] = 0
        return pos[None, :] < lengths[:, None]
    mask = torch.ones(batch, seq_len, dtype=torch.bool)
    mask[0::2, ::3] = False
    mask[-1] = False
    return mask


SHAPES = [
    # (batch, seq_len, heads, head_dim), mask, causal, block_n, stages, warps
    ((3, 1024, 4, 32), "padded", True, 64, 3, 4),  # case 13's shape, bounds
    ((3, 1024, 4, 32), "padded", True, 128, 3, 4),
    ((2, 1024, 4, 32), "holes", True, 64, 4, 8),
    ((2, 300, 2, 64), "holes", False, 128, 4, 8),
    ((3, 77, 2, 16), "none", False, 64, 3, 4),  # two key blocks, the second ragged
    ((2, 513, 1, 128), "padded", True, 64, 3, 4),
    ((2, 200, 4, 32), "none", True, 128, 4, 4),
]


@pytest.mark.parametrize(("shape", "mask_kind", "causal", "block_n", "stages", "warps"), SHAPES)
def test_matches_the_reference_and_the_triton_kernel(
    shape, mask_kind, causal, block_n, stages, warps, device
) -> None:
    """Within the rule of the reference (fp32 from the same fp16 q, k, v) and close to the
    Triton kernel's fp16 form (the same arithmetic; the probabilities' rounding follows
    the running maximum, which another key block size moves); rows with no valid key 0."""
    _hopper(device)
    batch, seq_len, heads, hd = shape
    gen = torch.Generator().manual_seed(7)
    qkv = torch.randn(batch, seq_len, 3, heads, hd, generator=gen).half().to(device)
    q, k, v = qkv.unbind(2)  # strided views of the packed buffer, as the layer passes them
    mask = _mask(mask_kind, batch, seq_len)
    mask_d = None if mask is None else mask.to(device)
    bounds = key_mask_bounds(mask_d) if mask_kind == "padded" else None
    kwargs = dict(causal=causal, key_mask=mask_d, key_bounds=bounds, precision="fp16")
    out = torch.empty(batch, seq_len, heads, hd, device=device, dtype=torch.float16)
    attention(q, k, v, out=out, block_n=block_n, num_stages=stages, num_warps=warps,
              gluon=True, **kwargs)  # fmt: skip
    triton_out = torch.empty_like(out)
    attention(q, k, v, out=triton_out, block_m=64, block_n=64, **kwargs)
    reference = attention_reference(q.float().cpu(), k.float().cpu(), v.float().cpu(),
                                    causal=causal, key_mask=mask)  # fmt: skip
    reference = torch.nan_to_num(reference, nan=0.0)  # no valid key: the kernels give 0
    assert torch.isfinite(out).all()
    report = compare(out.float().cpu(), reference, PROJECT_RULE)
    assert report.passed, report
    torch.testing.assert_close(out, triton_out, rtol=5e-3, atol=5e-3)
    if mask_kind == "holes" or (mask_kind == "padded" and batch >= 3):
        assert torch.count_nonzero(out[-1]) == 0  # no valid key: 0


def test_keys_past_the_bounds_are_never_read(device) -> None:
    """NaN in k and v past each sequence's last valid key: the same output as without."""
    _hopper(device)
    batch, seq_len, heads, hd = 3, 700, 2, 32
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(batch, seq_len, 3, heads, hd, generator=gen).half().to(device)
    mask = _mask("padded", batch, seq_len).to(device)
    bounds = key_mask_bounds(mask)
    poisoned = qkv.clone()
    for b in range(batch):
        end = int(bounds[b, 1])
        poisoned[b, end:, 1:] = float("nan")  # k and v of the padding
    outs = []
    for buf in (qkv, poisoned):
        q, k, v = buf.unbind(2)
        out = torch.empty(batch, seq_len, heads, hd, device=device, dtype=torch.float16)
        attention(q, k, v, causal=True, key_mask=mask, key_bounds=bounds, out=out,
                  precision="fp16", block_n=64, num_stages=3, gluon=True)  # fmt: skip
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


def test_programmatic_dependent_launch_changes_no_bit(device) -> None:
    _hopper(device)
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(2, 400, 3, 4, 32, generator=gen).half().to(device)
    q, k, v = qkv.unbind(2)
    outs = []
    for pdl in (False, True):
        out = torch.empty(2, 400, 4, 32, device=device, dtype=torch.float16)
        attention(q, k, v, causal=True, out=out, precision="fp16", block_n=128, num_stages=3,
                  gluon=True, pdl=pdl, pdl_trigger="end" if pdl else "start")  # fmt: skip
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize(("mask_kind", "chain"), [("right-padded", True), ("holes", False)])
def test_the_rows_stack_with_it_stays_within_the_rule(mask_kind, chain, device) -> None:
    """The rows stack (case 13's form: the chained QKV, key bounds) with the Gluon flash
    attention: within the rule of the reference and close to the stack with the Triton
    flash attention, x never written."""
    _hopper(device)
    kwargs = dict(variant="rows", precision="fp16", mask_kind=mask_kind, causal=True,
                  shape=(4, 1024, 128, 4, 128, 2), device=device, random_norms=True)  # fmt: skip
    common = dict(block_m=64, block_n=64, num_warps=4, num_stages=3, row_block=64,
                  next_qkv=chain, mask_bounds=mask_kind == "right-padded")  # fmt: skip
    triton_out, reference, _ = run_stack(**kwargs, tiling=Tiling(**common))
    gluon_out, _, x_change = run_stack(**kwargs, tiling=Tiling(**common, gluon_flash=True))
    assert torch.isfinite(gluon_out).all()
    report = compare(gluon_out, reference, PROJECT_RULE)
    assert report.passed, report
    torch.testing.assert_close(gluon_out, triton_out, rtol=1e-2, atol=1e-2)
    assert torch.count_nonzero(x_change) == 0
