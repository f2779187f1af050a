"""The Gluon post rows kernel (kernels.gluon_rows, Tiling.gluon_post, plan knob row_gluon):
its support rules everywhere; its numerics against the Triton post rows and the reference
on a CUDA device of compute capability 9.x (``KERNELS_TEST_DEVICE=cuda``); its compiled
resources offline in tests/kernels/test_sass.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kernels import gluon_rows
from kernels._tolerance import PROJECT_RULE, compare
from kernels.layer import Tiling, not_supported_reasons
from tests.kernels.test_layer import run_stack

GLUON = Tiling(block_m=16, block_n=16, row_block=16, gluon_post=True)


def _reasons(tiling: Tiling = GLUON, **changes) -> list[str]:
    args = dict(
        variant="rows",
        seq_len=128,
        d_model=128,
        num_heads=4,
        ffn_dim=128,
        tiling=tiling,
        gemm_precision="fp16",
        attn_precision="fp16",
        device_type="cuda",
        capability=(9, 0),
        smem_bytes=232448,
    )
    args.update(changes)
    return not_supported_reasons(**args)


def test_the_shapes_and_settings_it_takes_and_why_not() -> None:
    ok = gluon_rows.gluon_problems(128, 128, "fp16", 4, True)
    assert ok == [] or ok == [gluon_rows.GLUON_ERROR]
    cases = {
        (96, 96, "fp16", 4, False): "d_model 96 is not one of (32, 64, 128)",
        (128, 256, "fp16", 4, False): "ffn_dim 256 differs from d_model 128",
        (64, 64, "bf16", 4, False): "gemm_precision 'bf16' is not 'fp16'",
        (64, 64, "fp16", 2, False): "2 row warps: wgmma takes 4 (one warpgroup) or 8",
    }
    for args, why in cases.items():
        assert any(why in r for r in gluon_rows.gluon_problems(*args)), args
    # Offline (Triton 3.6, sm_90): 114,688 B at 4 warps, 217,088 B with the next QKV at 8.
    assert gluon_rows.gluon_shared_bytes(128, False, 4) == 114_688
    assert gluon_rows.gluon_shared_bytes(128, True, 8) == 217_088
    assert gluon_rows.gluon_shared_bytes(128, True, 8) <= gluon_rows.SMEM_LIMIT


def test_support_rules_name_the_kernel_it_replaces_and_the_way_out() -> None:
    if gluon_rows.GLUON_ERROR:
        pytest.skip(gluon_rows.GLUON_ERROR)
    assert _reasons() == []
    assert _reasons(Tiling(gluon_post=True, next_qkv=True, row_warps=8)) == []
    assert _reasons(Tiling(gluon_post=True, next_norm=True), variant="heads") == []
    seq = _reasons(variant="seq", seq_len=64)
    assert any("gluon_post replaces the post-rows kernel of variants 'heads' and 'rows'" in r
               for r in seq)  # fmt: skip
    post = _reasons(Tiling(gluon_post=True, attn_post=True))
    assert any("without attn_post" in r for r in post)
    for knob in ("stage_residual", "fold_residual"):
        why = _reasons(Tiling(gluon_post=True, **{knob: True}))
        assert any(f"{knob} configures the Triton row kernels" in r for r in why), knob
    # session 29: the Gluon kernels wait for their predecessor after their weights' copies
    assert _reasons(Tiling(gluon_post=True, pdl=True)) == []
    assert _reasons(Tiling(gluon_post=True, pdl=True, pdl_trigger="end")) == []
    assert any("ffn_block configures" in r for r in _reasons(Tiling(gluon_post=True, ffn_block=32)))
    assert any("d_model 256" in r for r in _reasons(d_model=256, ffn_dim=256, num_heads=8))
    # q, k, v stored in the qkv buffer's dtype (a review: fp32 ones were rounded to fp16)
    assert _reasons(Tiling(gluon_post=True, next_qkv=True), attn_precision="ieee") == []
    for knob, value in (("qkv_stages", 2), ("row_maxnreg", 128)):
        why = _reasons(Tiling(gluon_post=True, **{knob: value}))
        assert any(f"{knob} configures the Triton row kernels" in r for r in why), knob
    assert any("compute capability 9.x" in r for r in _reasons(device_type="cpu", capability=None))
    assert any("built for Hopper" in r for r in _reasons(capability=(10, 0)))


def test_the_launcher_refuses_the_interpreter_and_the_cpu(device: str) -> None:
    if device == "cuda":
        pytest.skip("the refusal is for the interpreter / CPU")
    with pytest.raises(
        ValueError, match=r"gluon_post \(the Gluon post-rows kernel\) runs compiled on a CUDA GPU"
    ):
        run_stack(variant="rows", precision="fp16", mask_kind="none", causal=True,
                  shape=(2, 16, 64, 4, 64, 2), tiling=GLUON, device=device)  # fmt: skip


def test_the_plan_knob_is_refused_off_rows_and_forbidden_with_the_triton_knobs() -> None:
    from autotune.build import not_supported_reasons as plan_reasons
    from autotune.core.device import DeviceInfo
    from autotune.core.reference import TransformerConfig
    from autotune.plan import Plan
    from search_spaces.gpu import SPACE

    seq = Plan.from_dict({"attention": "triton", "fused_layer": "seq", "row_gluon": True})
    heads = Plan.from_dict({"attention": "triton", "fused_layer": "heads", "row_gluon": True})

    h200 = DeviceInfo(type="cuda", name="H200", capability=(9, 0), total_memory=141 << 30)
    config = TransformerConfig(8, 128, 128, 4, 128, 2)
    assert any("row_gluon=True replaces" in r for r in plan_reasons(seq, config, h200))
    assert not any("row_gluon" in r for r in plan_reasons(heads, config, h200))
    forbidden = {
        knob
        for rule in SPACE["restrictions"]
        if "forbid" in rule and "row_gluon" in rule["forbid"]
        for knob in rule["forbid"]
        if knob != "row_gluon"
    }
    assert forbidden == {
        "row_attn_post", "row_stage", "row_fold_residual", "row_ffn_block", "row_qkv_stages",
        "row_block",
    }  # fmt: skip


SHAPES = [
    # (B, S, D, H, F, layers), mask, causal, warps, chain (rows: next qkv; heads: next norm)
    ((3, 37, 64, 4, 64, 2), "holes", True, 4, False),
    ((3, 37, 64, 4, 64, 3), "right-padded", False, 4, True),
    ((2, 45, 128, 4, 128, 2), "none", True, 8, True),
    ((2, 45, 128, 4, 128, 2), "holes", True, 4, False),
    ((4, 33, 32, 2, 32, 2), "right-padded", True, 4, True),
    # 19,200 rows: 300 tiles over at most 264 programs (several tiles a program)
    ((300, 64, 128, 4, 128, 2), "right-padded", True, 4, False),
    ((300, 64, 128, 4, 128, 2), "holes", False, 8, True),
]


@pytest.mark.parametrize("variant", ["rows", "heads"])
@pytest.mark.parametrize(("shape", "mask_kind", "causal", "warps", "chain"), SHAPES)
def test_gluon_post_rows_matches_the_triton_kernel_and_the_rule(
    variant, shape, mask_kind, causal, warps, chain, device
) -> None:
    """On Hopper: the stack with the Gluon post rows within the rule of the reference and
    close to the stack with the Triton post rows (fp16 operands both; sums in another
    order), x never written."""
    if device != "cuda":
        pytest.skip("Gluon runs compiled on a CUDA device only (KERNELS_TEST_DEVICE=cuda)")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon post rows is built for sm_90")
    if variant == "heads" and shape[0] * shape[1] > 4096:
        pytest.skip("the heads form recomputes K/V a query block: the long shapes are rows'")
    kwargs = dict(variant=variant, precision="fp16", mask_kind=mask_kind, causal=causal,
                  shape=shape, device=device, random_norms=True)  # fmt: skip
    chained = {"next_qkv": chain} if variant == "rows" else {"next_norm": chain}
    common = dict(block_m=32, block_n=32, row_block=64, row_warps=warps, **chained)
    triton_out, reference, _ = run_stack(**kwargs, tiling=Tiling(**common))
    gluon_out, _, x_change = run_stack(**kwargs, tiling=Tiling(**common, gluon_post=True))
    assert torch.isfinite(gluon_out).all()
    report = compare(gluon_out, reference, PROJECT_RULE)
    assert report.passed, report
    # Both round the same fp16 operands; a last-place difference of an fp32 sum (wgmma's
    # order against the Triton kernel's chunks) can flip one rounding, whose error the
    # rest of the stack carries (the Triton kernel against a reordered copy of itself,
    # test_layer's fold test: 1e-3 over two layers). A wrong stage is off by 0.1-1.
    torch.testing.assert_close(gluon_out, triton_out, rtol=1e-2, atol=1e-2)
    assert torch.count_nonzero(x_change) == 0


@pytest.mark.parametrize("trigger", ["start", "end"])
@pytest.mark.parametrize("chain", [False, True])
def test_programmatic_dependent_launch_changes_no_bit(chain: bool, trigger: str, device) -> None:
    """The rows stack with the Gluon row kernels launched with pdl (session 29: each copies
    its weights before it waits for its predecessor): the same bits as without."""
    if device != "cuda" or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("Gluon runs compiled on a CUDA sm_90 device only (KERNELS_TEST_DEVICE=cuda)")
    kwargs = dict(variant="rows", precision="fp16", mask_kind="holes", causal=True,
                  shape=(300, 64, 128, 4, 128, 3), device=device, random_norms=True)  # fmt: skip
    common = dict(block_m=32, block_n=32, row_block=64, row_warps=8, next_qkv=chain,
                  gluon_post=True)  # fmt: skip
    plain, reference, _ = run_stack(**kwargs, tiling=Tiling(**common))
    pdl, _, _ = run_stack(**kwargs, tiling=Tiling(**common, pdl=True, pdl_trigger=trigger))
    assert compare(pdl, reference, PROJECT_RULE).passed
    assert torch.equal(pdl, plain)


def test_the_persistent_grid_counts_the_compiled_kernels_programs_an_sm() -> None:
    """The launcher's programs an SM, from the compiled kernel: Triton 3.6's ``warmup``
    returns a kernel whose register count exists only once its binary is loaded
    (``_init_handles``); a review found the first device launch would have raised there."""

    class Compiled:  # as Triton 3.6's CompiledKernel before and after loading
        def __init__(self, registers: int, shared: int) -> None:
            self._registers = registers
            self.metadata = type("Meta", (), {"shared": shared})()

        def _init_handles(self) -> None:
            self.n_regs = self._registers

    gluon_rows._PROGRAMS.clear()
    case6 = gluon_rows._programs_per_sm(("t", 6), lambda: Compiled(253, 114_688), 4)
    chained = gluon_rows._programs_per_sm(("t", 1), lambda: Compiled(194, 217_088), 8)
    assert (case6, chained) == (2, 1)
    # cached per configuration: not compiled again
    assert gluon_rows._programs_per_sm(("t", 6), lambda: 1 / 0, 4) == 2
    gluon_rows._PROGRAMS.clear()


def _debug_script():
    import importlib.util

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location(
        "gluon_debug", ROOT / "scripts/gluon_rows_debug.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("broken", [False, True])
def test_the_debug_scripts_references_agree_with_the_triton_post_rows(
    broken: bool, device: str, monkeypatch
) -> None:
    """scripts/gluon_rows_debug.py's PyTorch stages are what the next device session trusts
    to find a fault in the Gluon kernel: its output and qkv references hold against the
    project's Triton post rows and QKV rows kernels (the interpreter, standing in for the
    Gluon launches), and a kernel that drops the output projection's bias is reported
    off."""
    if device != "cpu":
        pytest.skip("the stand-in runs under the interpreter")
    import triton

    from kernels import layer
    from kernels._common import gdc_mode

    script = _debug_script()
    script.DEVICE = "cpu"

    def stand_in(x, ctx, out, mask, post, qkv, qkv_w, normed, rows, d, eps, **kw):  # type: ignore[no-untyped-def]
        assert kw["stop"] == 0 or broken  # the stages run only where the output is off
        post = (post[0], post[1] * (0.0 if broken else 1.0), *post[2:])
        layer._post_rows_kernel[(triton.cdiv(rows, 16),)](
            x, ctx, out, mask, *post, qkv, *qkv_w, normed, rows, d, d, eps,
            HAS_KEY_MASK=kw["has_key_mask"], FINAL_NORM=kw["final_norm"], BLOCK_R=16,
            BLOCK_D=d, BLOCK_K=min(d, 32), BLOCK_F=min(d, 32), PRECISION="fp16",
            EMULATE_BF16_DOT=True, STAGE_RESIDUAL=False, GELU_POLY=kw["gelu_poly"],
            NEXT_QKV=kw["next_qkv"], BLOCK_N=min(d, 64), USE_GDC=gdc_mode(False, "start"),
            FOLD_RESIDUAL=False, NEXT_NORM=kw["next_norm"], PRELOAD=False,
        )  # fmt: skip

    def qkv_stand_in(x, qkv, qkv_w, rows, d, eps, **kw):  # type: ignore[no-untyped-def]
        layer._qkv_rows_kernel[(triton.cdiv(rows, 16),)](
            x, qkv, *qkv_w, rows, d, eps, BLOCK_R=16, BLOCK_D=d, BLOCK_N=min(d, 64),
            PRECISION="fp16", EMULATE_BF16_DOT=True, USE_GDC=gdc_mode(False, "start"),
        )  # fmt: skip

    monkeypatch.setattr(script, "launch_post_rows_gluon", stand_in)
    monkeypatch.setattr(script, "launch_qkv_rows_gluon", qkv_stand_in)
    for mask, final, chained, norms in ((True, False, True, False), (False, True, False, False),
                                        (True, False, False, True)):  # fmt: skip
        ok = script.run(32, 40, 4, 0, mask, final, chained, True, 0, norms)
        assert ok is (not broken), (mask, final, chained, norms)
