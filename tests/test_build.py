from __future__ import annotations

import itertools

import pytest
import torch

from autotune.build import (
    MASK_GENERAL,
    MASK_NONE,
    MASK_RIGHT_PADDED,
    build_candidate,
    classify_mask,
    not_supported_reasons,
)
from autotune.core.cases import get_case
from autotune.core.device import DeviceInfo
from autotune.core.outcome import Outcome, OutcomeKind
from autotune.core.reference import ReferenceTransformer, TransformerConfig, check_outputs
from autotune.evaluate import evaluate_plan
from autotune.judge.gate import CaseBench
from autotune.judge.golden import check_vector, load_vector
from autotune.plan import Plan
from tests.conftest import GOLDEN

# Every knob value that runs on the CPU, each combined with the others' variety.
CPU_PLANS = [
    Plan(),
    Plan(attention="sdpa_math", heads="strided"),
    Plan(attention="sdpa_flash", qkv="packed", mask="elide"),
    Plan(attention="sdpa_math", qkv="packed", heads="strided", mask="elide", batch_chunk=1),
    Plan(attention="reference", mask="elide", attn_precision="ieee", gemm_precision="ieee"),
    Plan(attention="sdpa_math", attn_precision="fp16", qkv="packed"),
    Plan(attention="sdpa_flash", attn_precision="fp16", heads="strided", mask="elide"),
    Plan(qkv="packed", gemm_precision="fp16", mask="elide"),
    Plan(attention="sdpa_math", qkv="packed", gemm_precision="fp16", attn_precision="fp16"),
    # the tanh GELU of the GEMM's epilogue (what cuBLASLt computes on CUDA)
    Plan(qkv="packed", gemm_precision="fp16", mask="elide", ffn_act="blas_tanh"),
    Plan(heads="strided", ffn_act="blas_tanh"),
]


# The project's Triton kernels, under the interpreter (small vectors only: it is slow).
TRITON_PLANS = [
    Plan(fused_block=True, attn_block_m=16),
    Plan(
        fused_block=True,
        attn_precision="fp16",
        gemm_precision="fp16",
        attn_block_m=16,
        mask="elide",
        cuda_graph=False,
    ),
    Plan(attention="triton", qkv="packed", mask="elide", attn_block_m=16, attn_block_n=16),
    Plan(
        attention="triton",
        attn_precision="fp16",
        layernorm="triton",
        ffn_act="triton_epilogue",
        attn_block_m=32,
        attn_block_n=16,
    ),
    # fp16 GEMMs with the fused LayerNorm and GELU epilogue: half operands handed along
    Plan(
        attention="sdpa_math",
        attn_precision="fp16",
        gemm_precision="fp16",
        qkv="packed",
        layernorm="triton",
        ffn_act="triton_epilogue",
    ),
    Plan(
        attention="triton",
        attn_precision="ieee",
        layernorm="triton",
        ffn_act="triton_gemm",
        heads="strided",
        attn_block_m=16,
        attn_block_n=32,
    ),
    Plan(attention="triton", fused_layer="heads", attn_block_m=16, attn_block_n=16, row_block=16),
    Plan(
        attention="triton",
        fused_layer="rows",
        attn_precision="fp16",
        gemm_precision="fp16",
        attn_block_m=16,
        attn_block_n=32,
        row_block=16,
    ),
]
SMALL_GOLDEN = [p for p in GOLDEN if "case02" not in p]


@pytest.mark.parametrize(
    ("plan", "path"),
    list(itertools.product(CPU_PLANS, GOLDEN))
    + list(itertools.product(TRITON_PLANS, SMALL_GOLDEN)),
    ids=lambda v: v.hash if isinstance(v, Plan) else v.rsplit("/", 1)[-1],
)
def test_plan_passes_the_rule_on_golden_vectors(plan: Plan, path: str, cpu_device) -> None:
    vector = load_vector(path)

    def subject(config, state_dict):
        return build_candidate(plan, config, cpu_device, state_dict)

    result = check_vector(vector, subject, exact_tolerance=None)
    assert result.passed, result.line()


def test_candidate_keeps_the_reference_state_dict_names(cpu_device) -> None:
    cfg = TransformerConfig(1, 8, 16, 2, 32, 2, True)
    cand = build_candidate(Plan(qkv="packed", gemm_precision="fp16"), cfg, cpu_device)
    assert list(cand.state_dict()) == list(ReferenceTransformer(cfg).state_dict())


def _packed_pair(cpu_device, layers: int, seed: int):
    """A reference and a packed-QKV candidate on its weights, an input, and the
    candidate's output on it."""
    cfg = TransformerConfig(2, 8, 16, 2, 32, layers, True)
    torch.manual_seed(seed)
    ref = ReferenceTransformer(cfg).eval()
    cand = build_candidate(Plan(qkv="packed"), cfg, cpu_device, ref.state_dict())
    x = torch.randn(2, 8, 16)
    with torch.inference_mode():
        before = cand(x)
    return cfg, ref, cand, x, before


def test_derived_weights_follow_a_reloaded_state_dict(cpu_device) -> None:
    cfg, _ref, cand, x, before = _packed_pair(cpu_device, 1, 0)
    torch.manual_seed(1)
    other = ReferenceTransformer(cfg).eval()
    cand.load_state_dict(other.state_dict())
    with torch.inference_mode():
        after = cand(x)
        expected = other(x)
    assert not torch.allclose(before, after)
    assert check_outputs(after, expected).passed


@pytest.mark.parametrize(
    "attn_precision", ["fp16", "fp32"], ids=["fp16_attention", "fp32_attention"]
)
def test_sdpa_hands_fp16_gemms_their_context_without_a_round_trip(
    attn_precision: str, monkeypatch, cpu_device
) -> None:
    """With fp16 GEMMs the PyTorch attention backends return the context in fp16 (the
    output projection's operand type), not through fp32 and back: the same output, bit
    for bit, as with the round trip (session 29; case 14's exact cuDNN route)."""
    from autotune.backends import sdpa

    cfg = TransformerConfig(2, 16, 32, 4, 48, 2, True)
    plan = Plan(attention="sdpa_math", qkv="packed", heads="strided", gemm_precision="fp16",
                attn_precision=attn_precision)  # fmt: skip
    torch.manual_seed(0)
    ref = ReferenceTransformer(cfg).eval()
    cand = build_candidate(plan, cfg, cpu_device, ref.state_dict())
    x = torch.randn(2, 16, 32)
    seen: list[torch.dtype] = []
    attend = sdpa.TorchAttention.attend

    def spy(self, call):  # type: ignore[no-untyped-def]
        out = attend(self, call)
        seen.append(out.dtype)
        return out

    monkeypatch.setattr(sdpa.TorchAttention, "attend", spy)
    with torch.inference_mode():
        direct = cand(x)
    assert seen == [torch.float16, torch.float16]  # one a layer

    def round_trip(self, call):  # type: ignore[no-untyped-def]
        return attend(self, call).float()  # the context before session 29

    monkeypatch.setattr(sdpa.TorchAttention, "attend", round_trip)
    with torch.inference_mode():
        before = cand(x)
    assert torch.equal(direct, before)
    assert check_outputs(direct, ref(x)).passed


@pytest.mark.parametrize("layernorm", ["torch", "triton"])
def test_the_per_layer_paths_last_layernorm_writes_each_chunks_output_rows(
    layernorm: str, monkeypatch, cpu_device
) -> None:
    """In batch chunks, the per-layer path's final LayerNorm writes each chunk's rows of the
    output itself (the Triton one without storing the sum nothing reads): no copy after it,
    the output equal bit for bit to the unchunked forward's (session 29)."""
    import kernels.layernorm as ln

    cfg = TransformerConfig(4, 12, 32, 4, 48, 2, True)
    plan = Plan(attention="sdpa_math", gemm_precision="fp16", attn_precision="fp16",
                qkv="packed", layernorm=layernorm, ffn_act="torch")  # fmt: skip
    torch.manual_seed(0)
    ref = ReferenceTransformer(cfg).eval()
    whole = build_candidate(plan, cfg, cpu_device, ref.state_dict())
    chunked = build_candidate(plan.replace(batch_chunk=2), cfg, cpu_device, ref.state_dict())
    x = torch.randn(4, 12, 32)
    mask = torch.arange(12)[None] < torch.tensor([12, 9, 12, 5])[:, None]
    calls: list[tuple[bool, bool]] = []
    plain = ln.add_layernorm

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((kwargs.get("out") is not None, kwargs.get("keep_sum", True)))
        return plain(*args, **kwargs)

    monkeypatch.setattr(ln, "add_layernorm", spy)
    copies: list[int] = []
    copy = torch.Tensor.copy_

    def count(self, src, *a, **k):  # type: ignore[no-untyped-def]
        copies.append(src.numel())
        return copy(self, src, *a, **k)

    with torch.inference_mode():
        expected = whole(x, mask)
        calls.clear()
        monkeypatch.setattr(torch.Tensor, "copy_", count)
        got = chunked(x, mask)
        monkeypatch.setattr(torch.Tensor, "copy_", copy)
    assert torch.equal(got, expected)
    assert check_outputs(got, ref(x, mask)).passed
    if layernorm == "triton":  # a chunk: the first LayerNorm, 2 a layer; the last into out
        per_chunk = [(False, True)] * 4 + [(True, False)]
        assert calls == per_chunk * 2
        assert x.numel() // 2 not in copies  # no chunk's output copied after the forward
    else:  # the torch LayerNorm copies its result into the chunk's rows itself
        assert copies.count(x.numel() // 2) == 2


def test_mask_kinds_are_found_on_the_values() -> None:
    assert classify_mask(None) == MASK_NONE
    assert classify_mask(torch.ones(2, 4, dtype=torch.bool)) == MASK_NONE
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert classify_mask(right) == MASK_RIGHT_PADDED
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    assert classify_mask(left) == MASK_GENERAL
    with pytest.raises(ValueError, match="bool"):
        classify_mask(torch.ones(2, 4))


@pytest.mark.parametrize("causal", [True, False])
def test_elided_mask_plan_stays_right_on_a_general_mask(causal: bool, cpu_device) -> None:
    cfg = TransformerConfig(3, 12, 16, 2, 32, 2, causal)
    torch.manual_seed(3)
    ref = ReferenceTransformer(cfg).eval()
    cand = build_candidate(
        Plan(attention="sdpa_math", mask="elide"), cfg, cpu_device, ref.state_dict()
    )
    x = torch.randn(3, 12, 16)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[0, :3] = False  # left padding: not a prefix, so the key mask must be applied
    mask[1, 7:] = False
    with torch.inference_mode():
        report = check_outputs(cand(x, mask), ref(x, mask))
    assert report.passed, report.summary()
    assert "mask=general" in cand.last_route


def test_unsupported_combinations_give_reasons(cpu_device) -> None:
    cfg = TransformerConfig(4, 16, 32, 2, 64, 1, True)
    reasons = not_supported_reasons(
        Plan(attention="sdpa_efficient", cuda_graph=True, batch_chunk=4), cfg, cpu_device
    )
    text = " | ".join(reasons)
    assert "sdpa_efficient needs CUDA" in text
    assert "cuda_graph=true needs CUDA" in text
    h100 = DeviceInfo("cuda", "NVIDIA H100", (9, 0), 80 << 30, 232448, 132)
    gpu_reasons = not_supported_reasons(Plan(attention="sdpa_flash"), cfg, h100)
    assert any("attn_precision fp16 or bf16" in r for r in gpu_reasons)
    turing = DeviceInfo("cuda", "T4", (7, 5), 16 << 30, 65536, 40)
    assert any(
        "sm_80+" in r for r in not_supported_reasons(Plan(gemm_precision="bf16"), cfg, turing)
    )
    assert not_supported_reasons(Plan(compile="reduce-overhead", cuda_graph=True), cfg, h100)


def test_evaluate_reports_unsupported_before_any_work(cpu_device) -> None:
    bench = CaseBench(get_case("smoke-1"), cpu_device)
    outcome = evaluate_plan(bench, Plan(attention="sdpa_efficient"), timing=None)
    assert outcome.kind is OutcomeKind.UNSUPPORTED and "needs CUDA" in outcome.message
    assert "build" not in outcome.phase_seconds


def test_injected_wrong_implementation_is_caught(monkeypatch, cpu_device) -> None:
    monkeypatch.setenv("AUTOTUNE_INJECT_FAULT", "wrong")
    bench = CaseBench(get_case("smoke-1"), cpu_device)
    outcome = evaluate_plan(bench, Plan(), timing=None)
    assert outcome.kind is OutcomeKind.WRONG_RESULT
    assert outcome.report is not None and outcome.report.n_failed > 0
    assert outcome.seeds_checked == 1  # stopped at the first failing seed
    assert outcome.violation > 0


def test_injected_exception_is_an_outcome_not_a_crash(monkeypatch, cpu_device) -> None:
    monkeypatch.setenv("AUTOTUNE_INJECT_FAULT", "raise")
    bench = CaseBench(get_case("smoke-1"), cpu_device)
    outcome = evaluate_plan(bench, Plan(), timing=None)
    assert outcome.kind is OutcomeKind.RUNTIME_ERROR and "injected" in outcome.message


def test_predicted_memory_over_capacity_is_rejected_unrun(cpu_device) -> None:
    bench = CaseBench(get_case("smoke-2"), cpu_device)
    outcome = evaluate_plan(bench, Plan(), timing=None, capacity_bytes=1 << 20)
    assert outcome.kind is OutcomeKind.OUT_OF_MEMORY and "not run" in outcome.message


def test_passing_plan_is_gated_on_all_seeds_and_timed(cpu_device) -> None:
    from autotune.measure import TimingSettings

    bench = CaseBench(get_case("smoke-1"), cpu_device)
    outcome = evaluate_plan(
        bench,
        Plan(attention="sdpa_math", qkv="packed"),
        timing=TimingSettings(warmup=1, rounds=2, reps=3),
    )
    assert outcome.passed, outcome.summary_line()
    assert outcome.seeds_checked == 5 and outcome.padded_seeds_checked == 2
    assert outcome.timing is not None and outcome.timing.rounds == 2
    assert outcome.timing.clock == "perf_counter_ns"
    assert outcome.summary_line().startswith("PASS ")
    assert 0 <= outcome.report.budget_share <= 1


@pytest.mark.parametrize("kind", list(OutcomeKind))
def test_outcomes_round_trip_through_json(kind: OutcomeKind, cpu_device) -> None:
    report = check_outputs(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))
    from autotune.core.outcome import TimingStats

    timing = TimingStats(2.0, 1.0, 2.0, 0.01, 3, 10, (2.0, 2.1, 1.9), (1.0, 1.0, 1.1))
    outcome = Outcome(kind, "msg", report, 5, 2, timing, 123, 456, 789, {"build": 0.1})
    assert Outcome.from_json(outcome.to_json()) == outcome


def test_the_fused_block_refuses_mixed_operand_precisions(cpu_device) -> None:
    cfg = TransformerConfig(2, 16, 32, 2, 48, 1, True)
    reasons = not_supported_reasons(Plan(fused_block=True, gemm_precision="fp16"), cfg, cpu_device)
    assert any("one operand precision" in r for r in reasons)


def test_fused_layers_refuse_what_they_do_not_run(cpu_device) -> None:
    """A fused layer runs whole layers with its own Triton attention, on the whole batch:
    the fused block beside it, another attention, torch.compile or batch chunks are
    refused with the knob named; the per-layer path is what fused_layer=none picks."""
    from autotune import backends

    cfg = TransformerConfig(2, 16, 32, 2, 48, 1, True)
    layer = Plan(attention="triton", fused_layer="heads", attn_block_m=16, attn_block_n=16)
    assert not_supported_reasons(layer, cfg, cpu_device) == []
    assert backends.layer_backend(layer).value == "heads"
    assert not backends.layer_backend(Plan()).fused
    assert not layer.reads_mask_on_host
    for change, words in (
        ({"fused_block": True}, "both run whole layers"),
        ({"attention": "sdpa_math"}, "set attention=triton"),
        ({"batch_chunk": 1}, "batch_chunk=1"),
    ):
        reasons = not_supported_reasons(layer.replace(**change), cfg, cpu_device)
        assert any(words in r for r in reasons), (change, reasons)
    long = TransformerConfig(1, 300, 32, 2, 48, 1, True)
    reasons = not_supported_reasons(layer, long, cpu_device)
    assert any("use fused_layer=rows" in r for r in reasons), reasons
    assert not_supported_reasons(layer.replace(fused_layer="rows"), long, cpu_device) == []
    bounded = layer.replace(fused_layer="rows", mask_bounds=True)
    assert not_supported_reasons(bounded, long, cpu_device) == []
    for other in ({"fused_layer": "heads"}, {"fused_layer": "none", "attention": "sdpa_math"}):
        reasons = not_supported_reasons(bounded.replace(**other), cfg, cpu_device)
        assert any("mask_bounds=True applies to" in r for r in reasons), (other, reasons)
    # The per-layer Triton attention takes the bounds too.
    per_layer = bounded.replace(fused_layer="none")
    assert not_supported_reasons(per_layer, cfg, cpu_device) == []
    # row_stage: the post-attention rows kernel of heads and rows only.
    assert not_supported_reasons(layer.replace(row_stage=True), cfg, cpu_device) == []
    assert not_supported_reasons(bounded.replace(row_stage=True), long, cpu_device) == []
    for other in ({"fused_layer": "seq"}, {"fused_layer": "none"}):
        reasons = not_supported_reasons(layer.replace(row_stage=True, **other), cfg, cpu_device)
        assert any("row_stage=True applies to" in r for r in reasons), (other, reasons)
    # row_attn_post: the attention and post rows of fused_layer=rows in one kernel.
    assert not_supported_reasons(bounded.replace(row_attn_post=True), long, cpu_device) == []
    for other in ({"fused_layer": "heads"}, {"fused_layer": "seq"}, {"fused_layer": "none"}):
        reasons = not_supported_reasons(layer.replace(row_attn_post=True, **other), cfg, cpu_device)
        assert any("row_attn_post=True fuses" in r for r in reasons), (other, reasons)
    # row_next_qkv: the post rows of fused_layer=rows (three launches) write the next qkv.
    chained = bounded.replace(row_next_qkv=True)
    assert not_supported_reasons(chained, long, cpu_device) == []
    for other in (
        {"fused_layer": "heads"},
        {"fused_layer": "seq"},
        {"fused_layer": "none"},
        {"row_attn_post": True},
    ):
        reasons = not_supported_reasons(chained.replace(**other), long, cpu_device)
        assert any("row_next_qkv=True chains" in r for r in reasons), (other, reasons)
    # row_next_norm: the post rows of fused_layer=heads write the next LayerNorm1 rows, and
    # the plan's tiling carries it to the kernels.
    normed = layer.replace(row_next_norm=True)
    assert normed.fused_layer == "heads"
    assert not_supported_reasons(normed, cfg, cpu_device) == []
    from autotune.backends.layer import tiling as plan_tiling

    assert plan_tiling(normed).next_norm and not plan_tiling(layer).next_norm
    for other in ({"fused_layer": "rows"}, {"fused_layer": "seq"}, {"fused_layer": "none"}):
        reasons = not_supported_reasons(normed.replace(**other), long, cpu_device)
        assert any("row_next_norm=True chains" in r for r in reasons), (other, reasons)
    # pdl: heads and rows (without row_attn_post), compiled on CUDA sm_90+ only; the
    # interpreter (this CPU) has no grid dependency control.
    import dataclasses

    hopper = dataclasses.replace(cpu_device, type="cuda", capability=(9, 0))
    ampere = dataclasses.replace(cpu_device, type="cuda", capability=(8, 0))
    for plan in (layer.replace(pdl=True), chained.replace(pdl=True)):
        shape = long if plan.fused_layer == "rows" else cfg
        assert not_supported_reasons(plan, shape, hopper) == [], plan
        (why,) = not_supported_reasons(plan, shape, ampere)
        assert "needs compute capability 9.0 or newer; this GPU is sm_80" in why
        assert any("needs a CUDA GPU" in r for r in not_supported_reasons(plan, shape, cpu_device))
    for other, words in (
        ({"fused_layer": "seq"}, "pdl=True applies to fused_layer=heads or rows"),
        ({"fused_layer": "rows", "row_attn_post": True}, "without row_attn_post"),
        ({"fused_layer": "none"}, "pdl=True launches the kernels of fused_layer=heads or rows"),
    ):
        reasons = not_supported_reasons(layer.replace(pdl=True, **other), cfg, hopper)
        assert any(words in r for r in reasons), (other, reasons)
    # row_maxnreg: the row kernels of heads and rows only.
    assert not_supported_reasons(layer.replace(row_maxnreg=128), cfg, hopper) == []
    capped = layer.replace(row_maxnreg=128, fused_layer="none")
    assert any("row_maxnreg=128 caps the registers of the row kernels" in r
               for r in not_supported_reasons(capped, cfg, hopper))  # fmt: skip
    for other in ({"fused_layer": "seq"}, {"fused_layer": "rows", "row_attn_post": True}):
        capped = layer.replace(row_maxnreg=128, **other)
        assert any("without row_attn_post; got" in r
                   for r in not_supported_reasons(capped, cfg, hopper)), other  # fmt: skip
    # row_fold_residual: the post rows kernel of heads and rows only.
    for plan in (layer.replace(row_fold_residual=True), chained.replace(row_fold_residual=True)):
        shape = long if plan.fused_layer == "rows" else cfg
        assert not_supported_reasons(plan, shape, hopper) == [], plan
    folded = layer.replace(row_fold_residual=True, fused_layer="none")
    assert any("row_fold_residual=True applies to the post-attention rows kernel" in r
               for r in not_supported_reasons(folded, cfg, hopper))  # fmt: skip
    for other in ({"fused_layer": "seq"}, {"fused_layer": "rows", "row_attn_post": True}):
        folded = layer.replace(row_fold_residual=True, **other)
        assert any("row_fold_residual=True applies" in r and "without row_attn_post" in r
                   for r in not_supported_reasons(folded, cfg, hopper)), other  # fmt: skip
    # attn_maxnreg: the flash attention kernel (per layer, or in rows without attn_post).
    per_layer_triton = Plan(attention="triton", attn_maxnreg=96)
    for plan in (per_layer_triton, chained.replace(attn_maxnreg=96)):
        shape = long if plan.fused_layer == "rows" else cfg
        assert not_supported_reasons(plan, shape, hopper) == [], plan
    for plan, words in (
        (Plan(attention="sdpa_math", attn_maxnreg=96), "attn_maxnreg=96 caps the registers"),
        (layer.replace(attn_maxnreg=96), "got fused_layer=heads"),
        (chained.replace(attn_maxnreg=96, row_attn_post=True, row_next_qkv=False),
         "row_attn_post=True"),
        (Plan(attention="triton", fused_block=True, attn_maxnreg=96),
         "fused_block runs the attention inside its own kernel"),
    ):  # fmt: skip
        reasons = not_supported_reasons(plan, cfg, hopper)
        assert any(words in r for r in reasons), (plan, reasons)
    # row_qkv_stages: the QKV rows kernel's stages (fused_layer=rows only).
    assert not_supported_reasons(chained.replace(row_qkv_stages=2), long, hopper) == []
    for plan, words in (
        (layer.replace(row_qkv_stages=2), "got fused_layer=heads"),
        (Plan(attention="triton", row_qkv_stages=1), "got fused_layer=none"),
        (Plan(attention="triton", fused_block=True, row_qkv_stages=2), "fused_block runs"),
    ):
        reasons = not_supported_reasons(plan, cfg, hopper)
        assert any("row_qkv_stages=" in r and words in r for r in reasons), (plan, reasons)
    # attn_head_chunk: the one-tile form of the per-layer Triton attention (S <= 256).
    one_tile = Plan(attention="triton", attn_block_m=16, attn_head_chunk=16)
    assert not_supported_reasons(one_tile, cfg, hopper) == []
    # ... and in rows (without row_attn_post), where S <= 256
    assert not_supported_reasons(chained.replace(attn_head_chunk=16), cfg, hopper) == []
    wide = one_tile.replace(attn_head_chunk=32)  # runs (one chunk); a search skips it
    assert not_supported_reasons(wide, cfg, hopper) == []
    assert not_supported_reasons(wide, cfg, hopper, prune=True) == [
        "head_chunk=32 > padded head dim 16"
    ]
    for plan, shape, words in (
        (one_tile.replace(attention="sdpa_math"), cfg, "attn_head_chunk=16 picks the one-tile"),
        (layer.replace(attn_head_chunk=16), cfg, "got fused_layer=heads"),
        (chained.replace(attn_head_chunk=16), long, "seq_len=300 is over 256"),
        (chained.replace(attn_head_chunk=16, row_attn_post=True, row_next_qkv=False), cfg,
         "row_attn_post=True"),
        (Plan(attention="triton", fused_block=True, attn_head_chunk=16), cfg,
         "fused_block runs the attention inside its own kernel"),
        (one_tile, long, "seq_len=300 is over 256; use head_chunk=0"),
    ):  # fmt: skip
        reasons = not_supported_reasons(plan, shape, hopper)
        assert any(words in r for r in reasons), (plan, reasons)
    # pdl_trigger=end: the trigger after each kernel's last store; it needs pdl.
    assert not_supported_reasons(layer.replace(pdl=True, pdl_trigger="end"), cfg, hopper) == []
    for fused in ("heads", "rows", "seq", "none"):
        plan = layer.replace(pdl_trigger="end", fused_layer=fused)
        reasons = not_supported_reasons(plan, cfg, hopper)
        assert any("pdl_trigger=end places the launch trigger of pdl=True" in r
                   for r in reasons), (fused, reasons)  # fmt: skip
    # row_ffn_block: the fused layers only; a search skips the value that gives the
    # default's FFN columns (d_model 32, ffn 48: the default is 64, padded 64).
    assert not_supported_reasons(layer.replace(row_ffn_block=16), cfg, cpu_device) == []
    unfused = Plan(attention="triton", row_ffn_block=16)
    assert any("row_ffn_block=16 applies to" in r for r in
               not_supported_reasons(unfused, cfg, cpu_device))  # fmt: skip
    same = layer.replace(row_ffn_block=64)
    assert not_supported_reasons(same, cfg, cpu_device) == []
    assert any("the same kernel as ffn_block=0" in r for r in
               not_supported_reasons(same, cfg, cpu_device, prune=True))  # fmt: skip


def _masks(b: int, s: int) -> dict[str, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(5)
    holes = torch.rand(b, s, generator=gen) < 0.7
    holes[:, 0] = True
    lengths = torch.tensor([s, s - 3][:b])
    return {
        "none": None,
        "all-true": torch.ones(b, s, dtype=torch.bool),
        "right-padded": torch.arange(s)[None, :] < lengths[:, None],
        "left-padded": torch.arange(s)[None, :] >= (s - lengths)[:, None],
        "holes": holes,
    }


DEVICE_MASK_PLANS = {
    "triton-attention": Plan(attention="triton", mask="elide", attn_block_m=16, attn_block_n=16),
    "triton-attention-bounds": Plan(
        attention="triton", mask="elide", attn_block_m=16, attn_block_n=16, mask_bounds=True
    ),
    "fused-block": Plan(fused_block=True, mask="elide", attn_block_m=16),
    "fused-layer-heads": Plan(
        attention="triton", fused_layer="heads", attn_block_m=16, attn_block_n=16, row_block=16
    ),
    "fused-layer-rows": Plan(
        attention="triton", fused_layer="rows", attn_block_m=16, attn_block_n=16, row_block=16
    ),
}


@pytest.mark.parametrize("plan_name", list(DEVICE_MASK_PLANS))
@pytest.mark.parametrize("causal", [True, False])
def test_plans_that_apply_the_mask_on_the_device_never_read_it_on_the_host(
    plan_name, causal, cpu_device, monkeypatch
) -> None:
    """The Triton attention and the fused layers apply any key mask on the device: no call
    classifies the mask (one host sync each), and every kind of mask (none, all-true,
    right- and left-padded, holes) gives the reference's output."""
    import autotune.build as build

    def refuse(mask):
        raise AssertionError("classify_mask called: a host sync per call")

    monkeypatch.setattr(build, "classify_mask", refuse)
    cfg = TransformerConfig(2, 19, 32, 2, 48, 2, causal)
    torch.manual_seed(3)
    ref = ReferenceTransformer(cfg).eval()
    cand = build_candidate(DEVICE_MASK_PLANS[plan_name], cfg, cpu_device, ref.state_dict())
    x = torch.randn(2, 19, 32)
    for name, mask in _masks(2, 19).items():
        xm = x if mask is None else x.masked_fill(~mask[..., None], 0.0)
        with torch.inference_mode():
            report = check_outputs(cand(xm, mask), ref(xm, mask))
        assert report.passed, f"{name}: {report.summary()}"


def _count_layer_weights(monkeypatch) -> list[int]:
    """A list that grows by one for each per-layer set of derived weights made."""
    import autotune.build as build

    made: list[int] = []
    original = build._LayerWeights.__init__

    def counting(self, layer, plan):
        made.append(1)
        original(self, layer, plan)

    monkeypatch.setattr(build._LayerWeights, "__init__", counting)
    return made


def test_parameters_are_read_once_per_version_and_an_in_place_edit_remakes_them(
    cpu_device, monkeypatch
) -> None:
    made = _count_layer_weights(monkeypatch)
    cfg = TransformerConfig(2, 8, 16, 2, 32, 2, True)
    torch.manual_seed(0)
    ref = ReferenceTransformer(cfg).eval()
    cand = build_candidate(Plan(qkv="packed"), cfg, cpu_device, ref.state_dict())
    x = torch.randn(2, 8, 16)
    with torch.inference_mode():
        for _ in range(3):
            cand(x)
    assert len(made) == 2  # two layers, once: the steady state reads no parameters
    with torch.no_grad():
        cand.layers[0].norm1.weight.mul_(0.5)  # read where it is: nothing to remake
    with torch.inference_mode():
        ref.load_state_dict(cand.state_dict())
        assert check_outputs(cand(x), ref(x)).passed
    assert len(made) == 2
    opt = torch.optim.SGD(cand.parameters(), lr=0.5)
    bias = cand.layers[0].attention.q_proj.bias  # in the packed copy
    bias.grad = torch.ones_like(bias)
    opt.step()  # an optimizer step edits in place: its hook says so
    with torch.inference_mode():
        ref.load_state_dict(cand.state_dict())
        assert check_outputs(cand(x), ref(x)).passed
        cand(x)
    assert len(made) == 4  # remade once, not per call
    torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1).step()  # not ours
    with torch.no_grad():
        cand.layers[1].attention.v_proj.bias.mul_(0.5)  # by hand: refresh() says so
    cand.refresh()
    with torch.inference_mode():
        ref.load_state_dict(cand.state_dict())
        assert check_outputs(cand(x), ref(x)).passed
    assert len(made) == 6
    cand.load_state_dict(ReferenceTransformer(cfg).state_dict())
    with torch.inference_mode():
        cand(x)
    assert len(made) == 8  # load_state_dict bumps the version itself


def test_a_replaced_parameter_or_submodule_is_read_on_the_next_call(cpu_device) -> None:
    """Plans hold their modules' parameter objects (and copies): a parameter or submodule
    replaced in one of those modules is seen without refresh() or watch_edits."""
    cfg, ref, cand, x, before = _packed_pair(cpu_device, 2, 4)
    norm = cand.layers[0].norm1  # read where it is
    norm.weight = torch.nn.Parameter(norm.weight.detach() * 2.0)
    q = cand.layers[1].attention.q_proj  # in the packed copy
    q.bias = torch.nn.Parameter(q.bias.detach() + 0.5)
    other = ReferenceTransformer(cfg).eval()
    cand.layers[1].ffn_out = other.layers[1].ffn_out  # a submodule replaced
    with torch.inference_mode():
        ref.load_state_dict(cand.state_dict())
        after = cand(x)
        assert not torch.equal(after, before)
        assert check_outputs(after, ref(x)).passed


def test_a_graph_is_never_captured_on_weights_another_thread_replaced(
    cpu_device, monkeypatch
) -> None:
    """A call that read the weights just before another thread saw an edit and remade
    them captures its graph on the new ones (a capture on the old ones would serve on)."""
    import autotune.build as build

    class Capture:  # the CPU's stand-in for a CUDA graph: replay runs what was captured
        def __init__(self, fn, x, mask):
            self.fn = fn

        def replay(self, x, mask):
            return self.fn(x, mask)

    monkeypatch.setattr(build, "_CapturedForward", Capture)
    cfg = TransformerConfig(2, 8, 16, 2, 32, 2, True)
    ref = ReferenceTransformer(cfg).eval()
    cand = build_candidate(Plan(qkv="packed"), cfg, cpu_device, ref.state_dict())
    cand.watch_edits = True
    x = torch.randn(2, 8, 16)
    with torch.inference_mode():
        old = cand.prepared_weights()  # one thread's call has read the weights
        with torch.no_grad():
            cand.layers[0].attention.k_proj.weight.mul_(1.5)
        cand.prepared_weights()  # another's sees the edit and remakes them
        cand._graph_forward(x, None, "none", old)  # the first reaches the capture
        ref.load_state_dict(cand.state_dict())
        for _ in range(2):
            y = cand._graph_forward(x, None, "none", cand.prepared_weights())
            assert check_outputs(y, ref(x)).passed


def test_a_fused_layer_plan_holds_one_copy_of_the_weights_and_remakes_it_after_a_step(
    cpu_device, monkeypatch
) -> None:
    """The fused layers read their own packed, cast copies: the per-layer path's copies
    (fp16 matrices, packed QKV) are never made for them, and an optimizer step over a
    copied parameter still remakes the fused copies."""
    made = _count_layer_weights(monkeypatch)
    cfg = TransformerConfig(2, 8, 16, 2, 32, 2, True)
    torch.manual_seed(2)
    ref = ReferenceTransformer(cfg).eval()
    plan = DEVICE_MASK_PLANS["fused-layer-rows"].replace(gemm_precision="fp16")
    cand = build_candidate(plan, cfg, cpu_device, ref.state_dict())
    x = torch.randn(2, 8, 16)
    with torch.inference_mode():
        assert check_outputs(cand(x), ref(x)).passed
    assert made == [] and cand.prepared_weights() == []
    opt = torch.optim.SGD(cand.parameters(), lr=0.5)
    weight = cand.layers[1].ffn_in.weight  # in the fused layers' fp16 copy
    weight.grad = torch.full_like(weight, 0.05)
    opt.step()
    with torch.inference_mode():
        ref.load_state_dict(cand.state_dict())
        assert check_outputs(cand(x), ref(x)).passed
    assert made == []


def test_an_edit_by_hand_is_seen_by_refresh_or_by_watching_the_counters(cpu_device) -> None:
    cfg = TransformerConfig(2, 8, 16, 2, 32, 2, True)
    ref = ReferenceTransformer(cfg).eval()
    frozen = build_candidate(Plan(qkv="packed"), cfg, cpu_device, ref.state_dict())
    watching = build_candidate(Plan(qkv="packed"), cfg, cpu_device, ref.state_dict())
    watching.watch_edits = True
    x = torch.randn(2, 8, 16)
    with torch.inference_mode():
        before = frozen(x)
        watching(x)
        for cand in (frozen, watching):
            with torch.no_grad():
                cand.layers[0].attention.q_proj.weight.mul_(2.0)
        assert torch.equal(frozen(x), before)  # the default: not seen until refresh()
        frozen.refresh()
        ref.load_state_dict(frozen.state_dict())
        assert check_outputs(frozen(x), ref(x)).passed
        assert check_outputs(watching(x), ref(x)).passed  # its counters saw the edit


def test_per_layer_triton_attention_with_mask_bounds_takes_them_per_layer(
    cpu_device, monkeypatch
) -> None:
    """mask_bounds on the per-layer Triton attention: every layer's attention launch gets
    the bounds of the call's own mask (one small launch a layer), none without a mask, and
    the output is the one without bounds."""
    import kernels.attention as flash

    made: list[torch.Tensor] = []
    original = flash.key_mask_bounds

    def spy(mask, out=None):
        made.append(mask)
        return original(mask, out)

    monkeypatch.setattr(flash, "key_mask_bounds", spy)
    cfg = TransformerConfig(2, 19, 32, 2, 48, 2, True)
    torch.manual_seed(4)
    ref = ReferenceTransformer(cfg).eval()
    plain = DEVICE_MASK_PLANS["triton-attention"]
    bounded = build_candidate(plain.replace(mask_bounds=True), cfg, cpu_device, ref.state_dict())
    unbounded = build_candidate(plain, cfg, cpu_device, ref.state_dict())
    x = torch.randn(2, 19, 32)
    mask = _masks(2, 19)["right-padded"]
    xm = x.masked_fill(~mask[..., None], 0.0)
    with torch.inference_mode():
        got = bounded(xm, mask)
        assert len(made) == cfg.num_layers and all(m is mask for m in made)
        torch.testing.assert_close(got, unbounded(xm, mask), rtol=0, atol=1e-6)
        assert len(made) == cfg.num_layers  # the plan without bounds computed none
        bounded(x)
    assert len(made) == cfg.num_layers  # no mask: no bounds


@pytest.mark.parametrize("mask_kind", ["none", "right-padded"])
def test_half_operands_handed_along_give_the_values_of_cast_kernels(
    mask_kind: str, cpu_device, monkeypatch
) -> None:
    """fp16 GEMMs with the fused add + LayerNorm and the GELU epilogue: the GEMMs' half
    outputs go into those kernels and they write the next GEMM's half operand, instead of
    a cast to fp32 after every GEMM and back before the next. Each value is rounded to
    half once either way, so the output is bit for bit the one with the casts."""
    from autotune.backends.norm import TritonNorm

    config = TransformerConfig(2, 12, 32, 2, 48, 2, True)
    reference = ReferenceTransformer(config).eval()
    plan = Plan(
        attention="sdpa_math",
        attn_precision="fp16",
        gemm_precision="fp16",
        qkv="packed",
        layernorm="triton",
        ffn_act="triton_epilogue",
    )
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 12, 32, generator=gen)
    mask = None
    if mask_kind == "right-padded":
        mask = torch.arange(12)[None, :] < torch.tensor([[12], [7]])
        x = x.masked_fill(~mask[..., None], 0.0)
    halves: list[torch.dtype] = []
    real = TritonNorm.add_norm

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        halves.append(kwargs.get("out_dtype", args[6] if len(args) > 6 else torch.float32))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TritonNorm, "add_norm", spy)
    with torch.inference_mode():
        handed = build_candidate(plan, config, cpu_device, reference.state_dict())(x, mask)
        monkeypatch.setattr(TritonNorm, "half_io", False)
        cast = build_candidate(plan, config, cpu_device, reference.state_dict())(x, mask)
        expected = reference(x, mask)
    # with the hand-off every LayerNorm (the first one too) but the final one writes fp16
    assert halves[:5] == [torch.float16] * 4 + [torch.float32]
    assert torch.equal(handed, cast)
    assert handed.dtype == torch.float32
    assert check_outputs(handed, expected).passed


def test_the_first_layernorm_goes_through_the_norm_backend(cpu_device, monkeypatch) -> None:
    """With the Triton LayerNorm and fp16 GEMMs the first LayerNorm writes the QKV GEMM's
    half operand itself (no torch LayerNorm and cast kernel before the first GEMM)."""
    from autotune.backends.norm import TritonNorm

    calls: list[tuple[bool, torch.dtype]] = []
    real = TritonNorm.add_norm

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = kwargs.get("out_dtype", args[6] if len(args) > 6 else torch.float32)
        calls.append((args[1] is None, out))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TritonNorm, "add_norm", spy)
    cfg = TransformerConfig(2, 8, 16, 2, 32, 2, True)
    plan = Plan(
        attention="sdpa_math",
        attn_precision="fp16",
        gemm_precision="fp16",
        qkv="packed",
        layernorm="triton",
        ffn_act="triton_epilogue",
    )
    model = build_candidate(plan, cfg, cpu_device)
    with torch.inference_mode():
        model(torch.randn(2, 8, 16), torch.ones(2, 8, dtype=torch.bool))
    # first norm, then two per layer; only the first has no residual to add
    assert calls[0] == (True, torch.float16)
    assert len(calls) == 1 + 2 * cfg.num_layers and not any(none for none, _ in calls[1:])


@pytest.mark.parametrize(
    "plan",
    [
        DEVICE_MASK_PLANS["fused-layer-rows"],
        DEVICE_MASK_PLANS["fused-block"],
        DEVICE_MASK_PLANS["fused-block"].replace(batch_chunk=1),
        Plan(attention="sdpa_math", qkv="packed"),
    ],
    ids=["rows", "block", "block-chunked", "per-layer"],
)
def test_the_forward_lands_in_a_given_output_buffer(plan: Plan, cpu_device, monkeypatch) -> None:
    """What a captured graph's ring buffer gets (``_chunked(..., out)``): the forward in
    that buffer, the same bits as without it; the fused families are handed the buffer
    (their kernels store there: no copy after), the per-layer path copies its result in."""
    cfg = TransformerConfig(2, 19, 32, 2, 48, 2, True)
    torch.manual_seed(4)
    ref = ReferenceTransformer(cfg).eval()
    cand = build_candidate(plan, cfg, cpu_device, ref.state_dict())
    x = torch.randn(2, 19, 32)
    mask = torch.ones(2, 19, dtype=torch.bool)
    mask[1, 15:] = False
    x = x.masked_fill(~mask[..., None], 0.0)
    weights = cand.prepared_weights()
    backend = cand._layer_backend
    handed: list[int] = []
    forward = type(backend).forward

    def spy(self, prepared, x, mask, plan, config, out=None):  # type: ignore[no-untyped-def]
        y = forward(self, prepared, x, mask, plan, config, out=out)
        handed.append(-1 if out is None else int(y.data_ptr() == out.data_ptr()))
        return y

    monkeypatch.setattr(type(backend), "forward", spy)
    with torch.inference_mode():
        want = cand._chunked(x, mask, MASK_GENERAL, weights)
        handed.clear()
        buf = torch.full_like(x, float("nan"))
        got = cand._chunked(x, mask, MASK_GENERAL, weights, buf)
    assert got is buf
    assert torch.equal(buf, want)
    chunks = 2 if plan.batch_chunk else 1
    # each chunk's forward stored into the buffer's own rows
    assert handed == ([1] * chunks if backend.fused else []), handed


def test_batch_streams_rules(cpu_device) -> None:
    cfg = TransformerConfig(8, 16, 32, 2, 64, 1, True)
    h100 = DeviceInfo("cuda", "NVIDIA H100", (9, 0), 80 << 30, 232448, 132)
    streamed = Plan(attention="sdpa_cudnn", attn_precision="fp16", batch_chunk=2, batch_streams=2)
    assert not_supported_reasons(streamed, cfg, h100) == []
    assert any("needs CUDA streams" in r for r in not_supported_reasons(streamed, cfg, cpu_device))
    whole = streamed.replace(batch_chunk=0)
    assert any("set batch_chunk > 0" in r for r in not_supported_reasons(whole, cfg, h100))
    for other in ({"cuda_graph": True}, {"host_io": True}, {"compile": "default"}):
        reasons = not_supported_reasons(streamed.replace(**other), cfg, h100)
        assert any("runs the eager chunked forward" in r for r in reasons), other
    # the default leaves every existing plan's hash and description as they were
    assert "batch_streams" not in Plan(batch_chunk=2).describe()
    with pytest.raises(ValueError, match="batch_streams"):
        Plan.from_dict({"batch_streams": 0})


def test_batch_streams_counts_each_chunk_in_flight_in_the_peak() -> None:
    from autotune.measure import predict_peak_bytes

    cfg = TransformerConfig(8, 1024, 256, 4, 1024, 2, True)
    one = predict_peak_bytes(Plan(batch_chunk=2), cfg)
    two = predict_peak_bytes(Plan(batch_chunk=2, batch_streams=2), cfg)
    four = predict_peak_bytes(Plan(batch_chunk=2, batch_streams=4), cfg)
    whole = predict_peak_bytes(Plan(batch_chunk=2, batch_streams=8), cfg)  # 4 chunks only
    per_chunk = two - one
    assert per_chunk > 0
    assert four - one == 3 * per_chunk
    assert whole == four


def test_attn_drop_bits_rules(cpu_device) -> None:
    cfg = TransformerConfig(2, 16, 32, 2, 64, 1, True)
    half = Plan(attention="sdpa_math", attn_precision="fp16", gemm_precision="fp16", qkv="packed")
    assert not_supported_reasons(half.replace(attn_drop_bits=2), cfg, cpu_device) == []
    assert not_supported_reasons(half.replace(attn_drop_bits=9), cfg, cpu_device) == []
    cases = {
        "both to fp16 or both to bf16": half.replace(gemm_precision="fp32", attn_drop_bits=1),
        "clear at most 6": half.replace(
            attn_precision="bf16", gemm_precision="bf16", attn_drop_bits=7
        ),
        "set compile none": half.replace(attn_drop_bits=1, compile="default"),
        "set fused_layer none": half.replace(attn_drop_bits=1, fused_layer="heads"),
    }
    for why, plan in cases.items():
        reasons = not_supported_reasons(plan, cfg, cpu_device)
        assert any(why in r for r in reasons), (why, reasons)
    # the default leaves every existing plan's hash and description as they were
    assert half.replace(attn_drop_bits=0).hash == half.hash
    assert "attn_drop_bits" not in half.describe()
    with pytest.raises(ValueError, match="attn_drop_bits"):
        Plan.from_dict({"attn_drop_bits": 10})


def test_attn_drop_bits_late_rules(cpu_device) -> None:
    cfg = TransformerConfig(2, 16, 32, 2, 64, 1, True)
    half = Plan(attention="sdpa_math", attn_precision="fp16", gemm_precision="fp16", qkv="packed")
    graded = half.replace(attn_drop_bits=2, attn_drop_bits_late=6, attn_drop_late_from=8)
    assert not_supported_reasons(graded, cfg, cpu_device) == []
    assert not_supported_reasons(graded.replace(attn_drop_bits=0), cfg, cpu_device) == []
    cases = {
        "does nothing with attn_drop_bits_late=0": half.replace(attn_drop_late_from=8),
        "is not above attn_drop_bits=2": graded.replace(attn_drop_bits_late=2),
        "set attn_drop_bits=6 instead": graded.replace(attn_drop_late_from=0),
        "both to fp16 or both to bf16": graded.replace(gemm_precision="fp32"),
        "attn_drop_bits_late=7: bf16 has 7 mantissa bits": graded.replace(
            attn_precision="bf16", gemm_precision="bf16", attn_drop_bits_late=7
        ),
        "set compile none": graded.replace(compile="default"),
        "set fused_layer none": graded.replace(fused_layer="heads"),
        "at or past the case's 16 tokens": graded.replace(attn_drop_late_from=16),
    }
    for why, plan in cases.items():
        reasons = not_supported_reasons(plan, cfg, cpu_device)
        assert any(why in r for r in reasons), (why, reasons)
    bidirectional = TransformerConfig(2, 16, 32, 2, 64, 1, False)
    reasons = not_supported_reasons(graded, bidirectional, cpu_device)
    assert any("the case is not causal" in r for r in reasons), reasons
    assert not_supported_reasons(half.replace(attn_drop_bits=2), bidirectional, cpu_device) == []
    assert half.replace(attn_drop_bits_late=0, attn_drop_late_from=0).hash == half.hash
    assert graded.hash != graded.replace(attn_drop_late_from=9).hash
    with pytest.raises(ValueError, match="attn_drop_bits_late"):
        Plan.from_dict({"attn_drop_bits_late": 10})


@pytest.mark.parametrize("qkv", ["packed", "separate"])
def test_attn_drop_bits_rounds_what_the_attention_sees(cpu_device, qkv: str) -> None:
    """The forward with q, k, v rounded: within the rule on a short case, not the fp16
    forward's bits, and exactly the fp16 forward with its q, k, v rounded by hand."""
    from kernels.mantissa import round_mantissa_reference

    cfg = TransformerConfig(2, 24, 32, 2, 64, 2, True)
    ref = ReferenceTransformer(cfg).eval()
    x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(3))
    plan = Plan(attention="sdpa_math", attn_precision="fp16", gemm_precision="fp16", qkv=qkv)
    plain = build_candidate(plan, cfg, cpu_device, ref.state_dict())
    rounded = build_candidate(plan.replace(attn_drop_bits=3), cfg, cpu_device, ref.state_dict())
    seen: list[torch.Tensor] = []
    backend = type(rounded._attention_backend)

    def spy(self, call):  # what the attention is handed, per layer
        seen.append(torch.cat([call.q, call.k, call.v], dim=-1).clone())
        return attend(self, call)

    attend = backend.attend
    with torch.inference_mode():
        want = ref(x)
        got_plain = plain(x)
        backend.attend = spy
        try:
            got = rounded(x)
        finally:
            backend.attend = attend
    assert check_outputs(got, want).passed
    assert not torch.equal(got, got_plain)
    assert len(seen) == cfg.num_layers
    for t in seen:
        assert t.dtype == torch.float16
        assert torch.equal(round_mantissa_reference(t, 3).view(torch.int16), t.view(torch.int16))


@pytest.mark.parametrize("qkv", ["packed", "separate"])
def test_attn_drop_bits_late_rounds_by_position(cpu_device, qkv: str) -> None:
    """Graded: every layer's q, k, v hold 1 bit cleared before position 9 and 5 from it
    on (a second rounding changes none of their bits). Not held to the rule: 5 bits at
    position 9 of 24 tokens is coarser than any late row of case 14 sees."""
    from kernels.mantissa import round_mantissa_graded_reference

    cfg = TransformerConfig(2, 24, 32, 2, 64, 2, True)
    ref = ReferenceTransformer(cfg).eval()
    x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(4))
    base = Plan(attention="sdpa_math", attn_precision="fp16", gemm_precision="fp16", qkv=qkv)
    plan = base.replace(attn_drop_bits=1, attn_drop_bits_late=5, attn_drop_late_from=9)
    model = build_candidate(plan, cfg, cpu_device, ref.state_dict())
    seen: list[torch.Tensor] = []
    backend = type(model._attention_backend)
    attend = backend.attend

    def spy(self, call):
        seen.append(torch.cat([call.q, call.k, call.v], dim=-1).clone())
        return attend(self, call)

    with torch.inference_mode():
        want = ref(x)
        backend.attend = spy
        try:
            got = model(x)
        finally:
            backend.attend = attend
    assert torch.isfinite(got).all() and got.shape == want.shape
    assert len(seen) == cfg.num_layers
    for t in seen:
        again = round_mantissa_graded_reference(t, 1, 5, 9)
        assert torch.equal(again.view(torch.int16), t.view(torch.int16))
        late_low = t[:, 9:].view(torch.int16).to(torch.int32) & 0x1F
        early_low = t[:, :9].view(torch.int16).to(torch.int32) & 0x1F
        assert not late_low.any()
        assert early_low.any()  # the early rows keep four of those bits
