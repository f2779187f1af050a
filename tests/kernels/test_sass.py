"""`autotune kernels inspect` and kernels.sass: a plan's kernels compiled for sm_90 on the
CPU (no GPU), their resources and SASS counted. The compile runs in a child process with
TRITON_INTERPRET=0: this test session imported the kernels under the interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.sass import blocks_per_sm, classify, sass_opcodes

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
# Case 2's shipped plan of table version 43 (4 row warps).
HEADS = {
    "attention": "triton",
    "fused_layer": "heads",
    "attn_block_m": 32,
    "attn_block_n": 128,
    "attn_stages": 1,
    "attn_precision": "fp16",
    "gemm_precision": "fp16",
    "row_block": 16,
    "cuda_graph": True,
}

SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/              @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0030*/               @P1 HMMA.16816.F32 R8, R12, R16, R8 ;
        /*0040*/                   HGMMA.64x64x16.F32 R24, gdesc[UR4], R24 ;
        /*0050*/              @UP0 FFMA R3, R4, R5, R3 ;
        /*0060*/                   MUFU.EX2 R6, R6 ;
        /*0070*/                   SHFL.BFLY PT, R7, R6, 0x1, 0x1f ;
        /*0080*/                   STL [R1], R9 ;
        /*0090*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00a0*/                   EXIT ;
"""


def test_sass_opcodes_and_classes() -> None:
    ops = sass_opcodes(SASS)
    expected = ["LDC", "S2R", "LDG", "HMMA", "HGMMA", "FFMA", "MUFU", "SHFL", "STL", "BAR"]
    assert ops == [*expected, "EXIT"]
    counts = classify(ops)
    assert counts["mma"] == 2 and counts["global"] == 1 and counts["fp32"] == 1
    assert counts["sfu"] == 1 and counts["shuffle"] == 1 and counts["local"] == 1
    assert counts["sync"] == 1 and counts["other"] == 3  # LDC, S2R, EXIT
    assert sum(counts.values()) == len(ops)


def test_blocks_per_sm_matches_nsight_compute_on_the_h200() -> None:
    # docs/logs/s21/ncu_c2_*.txt: Block Limit Registers 2 and Shared Mem 4 (heads kernel,
    # 255 registers, 51.2 KB); 18.75% theoretical occupancy (3 blocks) for the post rows.
    heads = blocks_per_sm(90, 4, 255, 51200)
    assert (heads["registers"], heads["shared"], heads["blocks"]) == (2, 4, 2)
    assert blocks_per_sm(90, 4, 148, 71680)["blocks"] == 3
    assert blocks_per_sm(90, 8, 64, 0)["blocks"] == 4  # 64 x 32 x 8 registers a block
    by_warps = blocks_per_sm(90, 8, 16, 0)  # registers allow 16 blocks, warps 64 / 8
    assert (by_warps["registers"], by_warps["blocks"]) == (16, 8)
    assert blocks_per_sm(90, 4, 33, 0)["registers"] == 12  # 33 x 32 -> 1,280 a warp
    # 1 KiB reserved a block: 233,472 / 77,824 would be 3
    assert blocks_per_sm(90, 4, 32, 77824)["shared"] == 2


def test_offline_launches_restores_triton_even_when_the_block_raises() -> None:
    from triton.runtime.jit import JITFunction

    from kernels import _triton
    from kernels.sass import offline_launches

    run = JITFunction.run
    with pytest.raises(RuntimeError, match="inside"), offline_launches(90):
        assert _triton.OFFLINE_ARCH == 90 and JITFunction.run is not run
        raise RuntimeError("inside")
    assert JITFunction.run is run and _triton.OFFLINE_ARCH is None


def test_compile_options_scoped_to_one_kernel() -> None:
    from autotune.tools.kernel_inspect import parse_compile_options
    from kernels.sass import kernel_overrides

    options = parse_compile_options(["maxnreg=128", "_attention_fwd_kernel:maxnreg=80"])
    assert options == {"maxnreg": 128, "_attention_fwd_kernel:maxnreg": 80}
    assert kernel_overrides(options, "_attention_fwd_kernel") == {"maxnreg": 80}
    assert kernel_overrides(options, "_post_rows_kernel") == {"maxnreg": 128}
    assert kernel_overrides({"_qkv_rows_kernel:num_stages": 1}, "_post_rows_kernel") == {}
    assert kernel_overrides(None, "_post_rows_kernel") == {}
    for bad, message in (
        (":maxnreg=80", "write \\[KERNEL:\\]KEY=INT"),
        ("_attention_fwd_kernel:maxnreg=300", "takes 24..255"),
        ("_attention_fwd_kernel:maxnreg", "write \\[KERNEL:\\]KEY=INT"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_compile_options([bad])


def test_kernel_profile_launch_options_reach_the_named_kernel_only() -> None:
    """scripts/kernel_profile.py's --compile-option: every Triton launch inside the block
    gets its kernel's options (what the device profile times), and Triton is restored."""
    import importlib.util

    from triton.runtime.jit import JITFunction

    spec = importlib.util.spec_from_file_location(
        "kernel_profile", ROOT / "scripts/kernel_profile.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    seen: list[tuple[str, dict]] = []
    saved = JITFunction.run

    def record(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((self.fn.__name__, {k: kwargs[k] for k in ("maxnreg",) if k in kwargs}))

    def _attention_fwd_kernel(x):  # type: ignore[no-untyped-def]  # stand-ins, never run
        pass

    def _post_rows_kernel(x):  # type: ignore[no-untyped-def]
        pass

    # Compiled-kernel objects (this session imported the project's under the interpreter).
    attn, post = JITFunction(_attention_fwd_kernel), JITFunction(_post_rows_kernel)
    JITFunction.run = record  # type: ignore[method-assign]
    try:
        with module.launch_options({"_attention_fwd_kernel:maxnreg": 80}):
            attn.run(1, grid=(1,), warmup=False)
            post.run(1, grid=(1,), warmup=False)
        attn.run(1, grid=(1,), warmup=False)
    finally:
        JITFunction.run = saved  # type: ignore[method-assign]
    assert seen == [
        ("_attention_fwd_kernel", {"maxnreg": 80}),
        ("_post_rows_kernel", {}),
        ("_attention_fwd_kernel", {}),
    ]
    # A kernel name that no launch had (a typo) ends the profile with one line.
    JITFunction.run = record  # type: ignore[method-assign]
    try:
        with (
            pytest.raises(SystemExit, match="_attention_kernel: no such kernel was launched"),
            module.launch_options({"_attention_kernel:maxnreg": 80}),
        ):
            post.run(1, grid=(1,), warmup=False)
    finally:
        JITFunction.run = saved  # type: ignore[method-assign]


def _inspect(*args: str, interpret: str = "0") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TRITON_INTERPRET=interpret, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "autotune", "kernels", "inspect", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )


def _needs_compiler() -> None:
    import triton

    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (bin_dir / "ptxas").exists() or not (bin_dir / "cuobjdump").exists():
        pytest.skip(f"this triton has no bundled ptxas/cuobjdump in {bin_dir}")


def test_inspect_compiles_case_2s_heads_plan_for_sm_90(tmp_path: Path) -> None:
    _needs_compiler()
    out = tmp_path / "inspect.json"
    done = _inspect("--cases", "2", "--plan", json.dumps(HEADS), "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "_heads_attention_kernel" in done.stdout and "(sm_90, triton " in done.stdout
    (record,) = json.loads(out.read_text())
    kernels = {k["name"]: k for k in record["kernels"] if k["name"] == "_heads_attention_kernel"}
    heads = kernels["_heads_attention_kernel"]
    # 4 layers; a program per (query block of 32, head) of the one sequence: 4 x 4.
    assert heads["launches"] == 4 and heads["programs"] == 16
    assert heads["num_warps"] == 4 and 0 < heads["registers"] <= 255
    assert heads["shared"] > 0 and heads["sass"]["mma"] > 0
    post = [k for k in record["kernels"] if k["name"] == "_post_rows_kernel"]
    # The last layer's post rows carry the final LayerNorm: a second compiled kernel.
    assert sum(k["launches"] for k in post) == 4 and len(post) == 2
    assert all(k["programs"] == 8 for k in post)  # 128 rows, 16 a program


def test_inspect_compile_option_caps_registers(tmp_path: Path) -> None:
    _needs_compiler()
    out = tmp_path / "capped.json"
    done = _inspect(
        "--cases", "2", "--plan", json.dumps(HEADS), "--compile-option", "maxnreg=128",
        "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "maxnreg=128)" in done.stdout
    (record,) = json.loads(out.read_text())
    assert record["compile_options"] == {"maxnreg": 128}
    assert all(k["registers"] <= 128 for k in record["kernels"])
    heads = next(k for k in record["kernels"] if k["name"] == "_heads_attention_kernel")
    # Uncapped it holds 240-255 registers (Triton 3.6-3.9): capped at 128, it spills.
    assert heads["stack"] > 0 and heads["sass"]["local"] > 0


def test_the_plans_row_maxnreg_reaches_the_row_kernels_only(tmp_path: Path) -> None:
    _needs_compiler()
    out = tmp_path / "knob.json"
    done = _inspect(
        "--cases", "2", "--plan", json.dumps(dict(HEADS, row_maxnreg=128)), "--json", str(out)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = json.loads(out.read_text())
    post = [k["registers"] for k in record["kernels"] if k["name"] == "_post_rows_kernel"]
    heads = [k["registers"] for k in record["kernels"] if k["name"] == "_heads_attention_kernel"]
    assert len(post) == 2 and max(post) <= 128
    assert heads[0] > 128  # the attention kernel is not capped


def test_the_plans_row_fold_residual_reaches_the_post_rows_kernel_only(tmp_path: Path) -> None:
    """row_fold_residual starts the output projection at x + bo: the post rows kernel's code
    changes (the residual's load moves before the projection's loop), the attention's not."""
    _needs_compiler()
    sass = {}
    for fold in (False, True):
        out = tmp_path / f"fold{fold}.json"
        plan = dict(HEADS, row_fold_residual=fold)
        done = _inspect("--cases", "2", "--plan", json.dumps(plan), "--json", str(out))
        assert done.returncode == 0, done.stderr[-2000:]
        (record,) = json.loads(out.read_text())
        for k in record["kernels"]:
            sass.setdefault((k["name"], fold), []).append(k["sass"])
    assert sass["_post_rows_kernel", True] != sass["_post_rows_kernel", False]
    assert sass["_heads_attention_kernel", True] == sass["_heads_attention_kernel", False]


def test_the_plans_row_next_norm_drops_the_layernorm_from_layers_2_on(tmp_path: Path) -> None:
    """row_next_norm: layers 2-4's heads attention loads LayerNorm1 rows the post rows wrote,
    a second compiled heads kernel with far less FP32 and shuffle code than the first
    layer's (Triton 3.6 at case 2: 2,284 -> 474 FP32, 440 -> 40 shuffles); the post rows of
    layers 1-3 gain the LayerNorm and its store."""
    _needs_compiler()
    out = tmp_path / "norm.json"
    plan = dict(HEADS, row_next_norm=True)
    done = _inspect("--cases", "2", "--plan", json.dumps(plan), "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = json.loads(out.read_text())
    heads = [k for k in record["kernels"] if k["name"] == "_heads_attention_kernel"]
    assert sorted(k["launches"] for k in heads) == [1, 3]
    first = next(k for k in heads if k["launches"] == 1)
    normed = next(k for k in heads if k["launches"] == 3)
    assert normed["sass"]["fp32"] < first["sass"]["fp32"] / 2
    assert normed["sass"]["shuffle"] < first["sass"]["shuffle"] / 2
    post = [k for k in record["kernels"] if k["name"] == "_post_rows_kernel"]
    assert sorted(k["launches"] for k in post) == [1, 3]  # layers 1-3 write; the last norms


def test_the_plans_attn_maxnreg_caps_the_flash_attention_only(tmp_path: Path) -> None:
    """Case 1's rows plan: its flash attention holds 111 registers (Triton 3.6); capped at
    80 it holds at most 80, and the row kernels keep theirs."""
    _needs_compiler()
    rows = {
        "attention": "triton",
        "fused_layer": "rows",
        "attn_precision": "fp16",
        "gemm_precision": "fp16",
        "row_block": 64,
        "row_ffn_block": 32,
        "row_stage": True,
    }
    regs = {}
    for cap in (0, 80):
        out = tmp_path / f"attn{cap}.json"
        plan = json.dumps(dict(rows, attn_maxnreg=cap))
        done = _inspect("--cases", "1", "--plan", plan, "--json", str(out))
        assert done.returncode == 0, done.stderr[-2000:]
        (record,) = json.loads(out.read_text())
        for k in record["kernels"]:
            regs.setdefault((k["name"], cap), []).append(k["registers"])
    assert min(regs["_attention_fwd_kernel", 0]) > 80
    assert max(regs["_attention_fwd_kernel", 80]) <= 80
    for name in ("_qkv_rows_kernel", "_post_rows_kernel"):
        assert regs[name, 0] == regs[name, 80], name


def test_row_maxnreg_caps_the_qkv_rows_kernel_too(tmp_path: Path) -> None:
    """A rows plan at 128-row tiles with 4 row warps, compiled for case 1: uncapped its qkv
    rows (188 registers with Triton 3.9; 105 at 64-row tiles since the packed QKV loop) and
    post rows hold over 128 registers."""
    _needs_compiler()
    rows = {
        "attention": "triton",
        "fused_layer": "rows",
        "attn_precision": "fp16",
        "gemm_precision": "fp16",
        "row_block": 128,
        "row_ffn_block": 32,
        "row_stage": True,
        "cuda_graph": True,
    }
    regs = {}
    for cap in (0, 128):
        out = tmp_path / f"rows{cap}.json"
        done = _inspect(
            "--cases", "1", "--plan", json.dumps(dict(rows, row_maxnreg=cap)), "--json", str(out)
        )
        assert done.returncode == 0, done.stderr[-2000:]
        (record,) = json.loads(out.read_text())
        for k in record["kernels"]:
            regs.setdefault((k["name"], cap), []).append(k["registers"])
    for name in ("_qkv_rows_kernel", "_post_rows_kernel"):
        assert min(regs[name, 0]) > 128 and max(regs[name, 128]) <= 128, (name, regs)
    assert regs["_attention_fwd_kernel", 0] == regs["_attention_fwd_kernel", 128]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--plan", '{"attention": "sdpa_auto", "compile": "default"}'],
            "Inductor generates; inspect covers the project's Triton kernels: set compile none",
        ),
        (["--plan", json.dumps(HEADS), "--compile-option", "maxnreg"], "write [KERNEL:]KEY=INT"),
        (["--plan", json.dumps(HEADS), "--compile-option", "regs=1"], "unknown to this Triton"),
        (["--plan", json.dumps(HEADS), "--compile-option", "maxnreg=300"], "takes 24..255"),
        (["--plan", json.dumps(HEADS), "--compile-option", "maxnreg=32"], "does not compile"),
        (
            ["--plan", json.dumps(HEADS), "--compile-option", "_attn_kernel:maxnreg=128"],
            "_attn_kernel: no such kernel was launched; launched: _heads_attention_kernel",
        ),
        (["--plan", json.dumps(dict(HEADS, attn_block_m=128))], "use attn_block_m <= 64"),
        (["--gpu", "cpu", "--plan", json.dumps(HEADS)], "--gpu cpu is not a CUDA profile"),
        (
            ["--plan", '{"attention": "triton", "batch_chunk": 1}'],
            "batch_chunk=1 streams the forward in pieces, which inspect does not reproduce",
        ),
        ([], "give at least one --plan or --table"),
    ],
)
def test_inspect_refuses_bad_input_with_exit_2(args: list[str], message: str) -> None:
    done = _inspect("--cases", "2", *args)
    assert done.returncode == 2, (done.returncode, done.stderr[-1000:])
    assert message in done.stderr


def test_inspect_compiles_the_per_layer_path_and_the_one_tile_attention(tmp_path: Path) -> None:
    """Case 2's per-layer plan (Triton attention, LayerNorm, GELU epilogue; its GEMMs run
    on the CPU meanwhile): the flash attention, or with attn_head_chunk the one-tile form,
    4 launches of one program per (query block, head); the other kernels unchanged."""
    _needs_compiler()
    plan = {
        "attention": "triton",
        "attn_precision": "fp16",
        "gemm_precision": "fp16",
        "layernorm": "triton",
        "ffn_act": "triton_epilogue",
        "attn_block_m": 32,
        "attn_block_n": 32,
        "cuda_graph": True,
    }
    names = {}
    for chunk in (0, 32):
        out = tmp_path / f"layer{chunk}.json"
        done = _inspect("--cases", "2", "--plan", json.dumps(dict(plan, attn_head_chunk=chunk)),
                        "--json", str(out))  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        (record,) = json.loads(out.read_text())
        names[chunk] = {k["name"]: k for k in record["kernels"]}
    attention = {0: "_attention_fwd_kernel", 32: "_attention_keys_kernel"}
    for chunk, name in attention.items():
        assert attention[32 - chunk] not in names[chunk]
        kernel = names[chunk][name]
        # 128 queries in blocks of 32, 4 heads, one sequence
        assert kernel["launches"] == 4 and kernel["programs"] == 16 and kernel["sass"]["mma"] > 0
        assert kernel["stack"] == 0
    others = {n: k["sass"] for n, k in names[0].items() if n != attention[0]}
    assert others == {n: k["sass"] for n, k in names[32].items() if n != attention[32]}
    assert {"_add_layernorm_kernel", "_bias_gelu_kernel"} <= set(others)


def test_the_plans_row_qkv_stages_reach_the_qkv_rows_kernel_only(tmp_path: Path) -> None:
    """Case 6's rows plan: its QKV rows kernel at 2 stages holds less shared memory than at
    Triton's default 3 (Triton 3.6: 73.7 -> 57.3 KB, 3 -> 4 blocks an SM); the post rows
    and attention kernels compile as before."""
    _needs_compiler()
    rows = {
        "attention": "triton",
        "fused_layer": "rows",
        "attn_precision": "fp16",
        "gemm_precision": "fp16",
        "row_block": 64,
        "row_ffn_block": 32,
        "row_stage": True,
    }
    shared, sass = {}, {}
    for stages in (0, 2):
        out = tmp_path / f"qkv{stages}.json"
        plan = json.dumps(dict(rows, row_qkv_stages=stages))
        done = _inspect("--cases", "6", "--plan", plan, "--json", str(out))
        assert done.returncode == 0, done.stderr[-2000:]
        (record,) = json.loads(out.read_text())
        for k in record["kernels"]:
            shared[k["name"], stages] = k["shared"]
            sass[k["name"], stages] = k["sass"]
    assert shared["_qkv_rows_kernel", 2] < shared["_qkv_rows_kernel", 0]
    for name in ("_post_rows_kernel", "_attention_fwd_kernel"):
        assert sass[name, 0] == sass[name, 2], name


def test_inspect_refuses_a_per_layer_forward_too_big_for_the_cpu() -> None:
    done = _inspect("--cases", "14", "--plan", '{"attention": "triton", "attn_precision": "fp16"}')
    assert done.returncode == 2, (done.returncode, done.stderr[-1000:])
    assert "case 14's per-layer forward holds 36.6 GiB activations, over the 4 GiB" in done.stderr


def test_inspect_refuses_the_interpreter() -> None:
    done = _inspect("--cases", "2", "--plan", json.dumps(HEADS), interpret="1")
    assert done.returncode == 2
    assert "run with TRITON_INTERPRET=0" in done.stderr


def test_inspect_compile_option_of_one_kernel(tmp_path: Path) -> None:
    """``--compile-option _heads_attention_kernel:maxnreg=128``: that kernel capped (it
    holds 240-255 registers uncapped), the post rows kernels compiled as without it."""
    _needs_compiler()
    out = tmp_path / "one.json"
    done = _inspect(
        "--cases", "2", "--plan", json.dumps(HEADS),
        "--compile-option", "_heads_attention_kernel:maxnreg=128", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "_heads_attention_kernel:maxnreg=128)" in done.stdout
    (record,) = json.loads(out.read_text())
    regs = {}
    for k in record["kernels"]:
        regs.setdefault(k["name"], []).append(k["registers"])
    assert max(regs["_heads_attention_kernel"]) <= 128
    assert max(regs["_post_rows_kernel"]) > 128  # 148 uncapped (Triton 3.6)


@pytest.mark.parametrize(
    ("case", "plan_file", "warps", "programs"),
    [
        # case 1: 8,192 rows, 128 tiles of 64; the chained form holds six weights, 1 an SM
        ("1", "c1_gluon_w8.json", 8, 128),
        # case 6: 1.28M rows, 20,000 tiles; 2 programs an SM by shared memory, x 132 SMs
        ("6", "c6_gluon_w4.json", 4, 264),
    ],
)
def test_inspect_compiles_the_gluon_post_rows_for_sm_90(
    case: str, plan_file: str, warps: int, programs: int, tmp_path: Path
) -> None:
    """Session 28's Gluon post rows and QKV rows (kernels.gluon_rows) compiled offline:
    they replace the Triton row kernels in every layer, persistent (a program per resident
    slot, not a tile), their shared memory as kernels.gluon_rows counts it (the weights
    resident), one wgmma instruction group per GEMM, no spills."""
    _needs_compiler()
    from kernels.gluon_rows import gluon_shared_bytes, qkv_shared_bytes

    plan = json.loads((ROOT / "docs/plans/s28" / plan_file).read_text())
    out = tmp_path / "gluon.json"
    done = _inspect("--cases", case, "--plan", json.dumps(plan), "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = json.loads(out.read_text())
    names = {k["name"] for k in record["kernels"]}
    assert "_post_rows_kernel" not in names and "_qkv_rows_kernel" not in names
    (qkv,) = [k for k in record["kernels"] if k["name"] == "_qkv_rows_gluon_kernel"]
    chained = plan.get("row_next_qkv", False)
    assert qkv["launches"] == (1 if chained else 4)  # the first layer, or every layer
    assert qkv["shared"] == qkv_shared_bytes(128, warps) and qkv["stack"] == 0
    assert qkv["sass"]["mma"] == 8 * 3
    gluon = [k for k in record["kernels"] if k["name"] == "_post_rows_gluon_kernel"]
    assert sum(k["launches"] for k in gluon) == 4 and len(gluon) == 2  # the last: final norm
    for k, next_qkv in zip(gluon, (chained, False), strict=True):
        assert k["num_warps"] == warps and k["programs"] == programs
        assert k["shared"] == gluon_shared_bytes(128, next_qkv, warps)
        # 64 x 128 x 128 a GEMM: 8 wgmma of K 16 each warpgroup, Wo / W1 / W2 (+ q, k, v)
        assert k["sass"]["mma"] == 8 * (6 if next_qkv else 3)
        assert k["stack"] == 0, k


@pytest.mark.parametrize(
    ("case", "plan_file", "heads", "programs"),
    [
        # case 6: 10,000 sequences, one group of 4 heads: 1 program an SM by shared memory
        ("6", "c6_heads_gluon4.json", 4, 132),
        # case 2: one sequence, 4 groups of one head: a program each
        ("2", "c2_heads_gluon1.json", 1, 4),
    ],
)
def test_inspect_compiles_the_gluon_heads_attention_for_sm_90(
    case: str, plan_file: str, heads: int, programs: int, tmp_path: Path
) -> None:
    """Session 29's Gluon heads attention (kernels.gluon_heads) compiled offline: it
    replaces the Triton heads kernel in every layer (normalising its rows itself in the
    first, loading the post rows' LayerNorm1 rows after), persistent over sequences, its
    shared memory as kernels.gluon_heads counts it (the group's weights resident, two k, v
    buffers), five wgmma groups a head (q, k, v, the scores, the context), no spills."""
    _needs_compiler()
    from kernels.gluon_heads import gluon_heads_shared_bytes

    plan = json.loads((ROOT / "docs/plans/s29" / plan_file).read_text())
    out = tmp_path / "heads.json"
    done = _inspect("--cases", case, "--plan", json.dumps(plan), "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = json.loads(out.read_text())
    names = {k["name"] for k in record["kernels"]}
    assert "_heads_attention_kernel" not in names and "_post_rows_kernel" not in names
    attention = [k for k in record["kernels"] if k["name"] == "_heads_attention_gluon_kernel"]
    assert [k["launches"] for k in attention] == [1, 3]  # normalising itself, then loading
    for k in attention:
        assert k["num_warps"] == 8 and k["programs"] == programs and k["stack"] == 0, k
        assert k["shared"] == gluon_heads_shared_bytes(128, 32, heads, 8)
        # 2 warpgroups of 64 rows: q, k, v 8 wgmma each (K 128) and one for each bias (K 16),
        # scores 2 (K 32), context 8; twice: a sequence masked by position, one with holes
        # (session 31)
        assert k["sass"]["mma"] == 2 * (3 * 9 + 2 + 8)


@pytest.mark.parametrize(
    ("plan_file", "block_n", "registers_max"),
    [("c13_gluon_flash.json", 64, 168), ("c13_gluon_flash_bn128.json", 128, 255)],
)
def test_inspect_compiles_the_gluon_flash_attention_for_sm_90(
    plan_file: str, block_n: int, registers_max: int, tmp_path: Path
) -> None:
    """Session 34's Gluon flash attention (kernels.gluon_flash) compiled offline on case
    13's rows plan: it replaces the Triton flash attention in every layer, one program a
    (query block of 64, head, sequence), its shared memory as kernels.gluon_flash counts it
    (the query tile, 3 key and value buffers, the pinning row), no spills; the wgmma: the
    first block's scores, each loop's scores and p @ v (two loops: the blocks seen in full,
    then the masked ones), the last block's p @ v, each 64 rows by K 16."""
    _needs_compiler()
    from kernels.gluon_flash import gluon_flash_shared_bytes

    plan = json.loads((ROOT / "docs/plans/s34" / plan_file).read_text())
    # uncapped: the entry's cap of 128 registers compiles without spills under the device's
    # Triton 3.6 (128 registers, 4 programs an SM) and spills 32 B under Triton 3.9
    plan["attn_maxnreg"] = 0
    out = tmp_path / "flash.json"
    done = _inspect("--cases", "13", "--plan", json.dumps(plan), "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = json.loads(out.read_text())
    names = {k["name"] for k in record["kernels"]}
    assert "_attention_fwd_kernel" not in names
    (flash,) = [k for k in record["kernels"] if k["name"] == "_flash_gluon_kernel"]
    assert flash["launches"] == 4 and flash["programs"] == 64 * 4 * (1024 // 64)
    assert flash["shared"] == gluon_flash_shared_bytes(32, block_n, 3, 4)
    assert flash["stack"] == 0 and flash["registers"] <= registers_max, flash
    scores, context = 32 // 16, block_n // 16
    assert flash["sass"]["mma"] == 3 * scores + 3 * context


# Compiles the three Gluon kernels offline with programmatic dependent launch and prints,
# per kernel, the order of its copies, loads, stores and grid dependency instructions (PTX).
_GDC_ORDER = r"""
import json, sys, torch, triton
from kernels import gluon_heads as gh, gluon_rows as gr
from kernels.sass import offline_launches
mode = int(sys.argv[1])
ptx = {}
compile_ = triton.compile
def spy(*args, **kwargs):
    compiled = compile_(*args, **kwargs)
    ptx[compiled.metadata.name] = compiled.asm["ptx"]
    return compiled
triton.compile = spy
B, S, D, H = 1, 128, 128, 4
x = torch.zeros(B * S, D)
half = lambda *shape: torch.zeros(*shape, dtype=torch.float16)
qkv_w = (torch.zeros(D), torch.zeros(D), half(3 * D, D), torch.zeros(3 * D))
post = tuple(half(D, D) if i in (0, 4, 6) else torch.zeros(D) for i in range(10))
with offline_launches(90):
    gh.launch_heads_attention_gluon(x.view(B, S, D), half(B, S, D), half(B, S, D), None,
        qkv_w[:2], qkv_w[2], qkv_w[3], num_heads=H, heads=1, causal=True, eps=1e-5,
        num_warps=8, use_gdc=mode)
    gr.launch_post_rows_gluon(x, half(B * S, D), x, x, post, x, qkv_w, half(B * S, D), B * S,
        D, 1e-5, has_key_mask=False, final_norm=False, gelu_poly=True, next_qkv=False,
        next_norm=True, num_warps=8, use_gdc=mode)
    gr.launch_qkv_rows_gluon(x, half(B * S, 3 * D), qkv_w, B * S, D, 1e-5, num_warps=8,
        use_gdc=mode)
"""

# The end of _GDC_ORDER and _WEIGHTS_FIRST_ORDER: per compiled kernel, its copies, global
# loads and stores and grid dependency instructions in PTX order (a predicate dropped), as JSON.
_PTX_ORDER = r"""
keep = ("cp.async.cg", "cp.async.ca", "griddepcontrol", "st.global", "ld.global")
out = {}
for name, text in ptx.items():
    ops = []
    for line in text.splitlines():
        words = line.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words and words[0].startswith(keep):
            ops.append(words[0].rstrip(";"))
    out[name] = ops
print(json.dumps(out))
"""


@pytest.mark.parametrize("mode", [1, 2], ids=["trigger_start", "trigger_end"])
def test_gluon_kernels_copy_their_weights_before_the_grid_dependency_wait(mode: int) -> None:
    """With pdl the Gluon kernels issue their weights' copies (nothing writes the weights)
    before ``griddepcontrol.wait``, and every load and store of an activation after it, so a
    kernel launched early prefetches its weights while the previous one runs; the next
    kernel is let go right after the wait (``start``) or after the last store (``end``).
    Read from the PTX that Triton compiles for sm_90 (per thread, 16-byte copies: the heads
    attention's weights of one head of 32 are 24 KiB over 256 threads, 6 copies; the post
    rows' Wo, W1, W2 and the QKV rows' three blocks 96 KiB, 24); the heads attention reads
    its q, k, v biases into shared memory before the wait too (one load each a thread)."""
    _needs_compiler()
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", _GDC_ORDER + _PTX_ORDER, str(mode)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    ops = json.loads(done.stdout.splitlines()[-1])
    copy = ["cp.async.cg.shared.global"]
    weights = {
        "_heads_attention_gluon_kernel": ["ld.global.b32"] * 3 + copy * 6,
        "_post_rows_gluon_kernel": copy * 24,
        "_qkv_rows_gluon_kernel": copy * 24,
    }
    assert set(ops) == set(weights)
    for name, seq in ops.items():
        assert seq.count("griddepcontrol.wait") == 1, name
        assert seq.count("griddepcontrol.launch_dependents") == 1, name
        wait = seq.index("griddepcontrol.wait")
        before = seq[:wait]
        assert before == weights[name], (name, before)
        launch = seq.index("griddepcontrol.launch_dependents")
        if mode == 1:
            assert launch == wait + 1, name
        else:
            stores = [i for i, op in enumerate(seq) if op.startswith("st.global")]
            assert stores and launch > max(stores), name


# Compiles case 2's Triton heads kernels offline with weights_first and pdl and prints, per
# compiled kernel, the order of its global loads, stores and grid dependency instructions.
_WEIGHTS_FIRST_ORDER = r"""
import json, sys, torch, triton
from autotune.core.reference import ReferenceTransformer, TransformerConfig
from kernels.block import weights_from_model
from kernels.layer import Tiling, layer_stack, prepare_layer_weights
from kernels.sass import offline_launches
ptx = {}
compile_ = triton.compile
def spy(*args, **kwargs):
    compiled = compile_(*args, **kwargs)
    ptx[f"{compiled.metadata.name}:{len(ptx)}"] = compiled.asm["ptx"]
    return compiled
triton.compile = spy
B, S, D, H, F, L = 1, 128, 128, 4, 128, 2
model = ReferenceTransformer(TransformerConfig(B, S, D, H, F, L, True)).eval()
layers, final = weights_from_model(model)
tiling = Tiling(block_m=32, block_n=128, num_stages=1, row_block=16, row_warps=8,
    fold_residual=True, next_norm=True, gelu_poly=True, pdl=True, pdl_trigger=sys.argv[1],
    weights_first=True)
with offline_launches(90), torch.inference_mode():
    layer_stack(torch.zeros(B, S, D), [prepare_layer_weights(w, "fp16") for w in layers], final,
        num_heads=H, causal=True, key_mask=None, variant="heads", tiling=tiling,
        gemm_precision="fp16", attn_precision="fp16")
"""


@pytest.mark.parametrize("trigger", ["start", "end"])
def test_weights_first_loads_the_weights_before_the_grid_dependency_wait(trigger: str) -> None:
    """weights_first with pdl: case 2's Triton heads attention and post rows kernels load
    their weight tiles (nothing writes them) before ``griddepcontrol.wait`` and every
    activation after it; read from the PTX Triton compiles for sm_90. Per thread, 16-byte
    loads: the head's q, k, v tiles (3 x 128 x 32 fp16) over 128 threads, 12; Wo, W1 and W2
    (3 x 128 x 128 fp16) over 256, 24. The next kernel is let go right after the wait
    (``start``) or after the last store (``end``)."""
    _needs_compiler()
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", _WEIGHTS_FIRST_ORDER + _PTX_ORDER, trigger],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    ops = json.loads(done.stdout.splitlines()[-1])
    weights = {"_heads_attention_kernel": 12, "_post_rows_kernel": 24}
    assert sorted(name.split(":")[0] for name in ops) == sorted(2 * list(weights))
    for name, seq in ops.items():
        assert seq.count("griddepcontrol.wait") == 1, name
        assert seq.count("griddepcontrol.launch_dependents") == 1, name
        wait = seq.index("griddepcontrol.wait")
        assert seq[:wait] == ["ld.global.v4.b32"] * weights[name.split(":")[0]], name
        launch = seq.index("griddepcontrol.launch_dependents")
        stores = [i for i, op in enumerate(seq) if op.startswith("st.global")]
        assert stores and min(stores) > wait, name
        assert launch == wait + 1 if trigger == "start" else launch > max(stores), name


def test_the_plans_one_launch_is_one_kernel_of_16_programs_at_case_2(tmp_path: Path) -> None:
    """one_launch: case 2's whole forward one launch of 16 programs (4 heads x 4 query
    blocks, one a multiprocessor) at max(attn_warps, row_warps) = 8 warps, where the two
    launches a layer are 8 kernels."""
    _needs_compiler()
    out = tmp_path / "one.json"
    plan = dict(HEADS, row_next_norm=True, row_warps=8, one_launch=True)
    done = _inspect("--cases", "2", "--plan", json.dumps(plan), "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = json.loads(out.read_text())
    (kernel,) = record["kernels"]
    assert kernel["name"] == "_stack_kernel" and kernel["launches"] == 1
    assert kernel["programs"] == 16 and kernel["num_warps"] == 8
