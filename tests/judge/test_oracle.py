"""The streamed exact oracle agrees with the dense reference far inside the rule."""

from __future__ import annotations

import pytest
import torch

from autotune.core.reference import (
    ReferenceTransformer,
    TransformerConfig,
    check_outputs,
    generate_random_case,
    official_settings,
)
from autotune.judge.golden import check_vector, load_vector
from autotune.judge.oracle import StreamedOracle, streamed_attention
from tests.conftest import GOLDEN


@pytest.mark.parametrize("chunks", [(7, 5), (16, 16), (1024, 4096)])
@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.rsplit("/", 1)[-1])
def test_oracle_reproduces_every_golden_vector_within_1e5(path, chunks) -> None:
    def subject(config, state_dict):
        model = StreamedOracle(config, query_chunk=chunks[0], key_chunk=chunks[1])
        model.load_state_dict(state_dict)
        return model.eval()

    result = check_vector(load_vector(path), subject)
    assert result.passed and result.max_abs_err <= 1e-5, result.line()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mask_kind", ["none", "right", "left"])
def test_oracle_matches_the_dense_reference_on_odd_shapes_and_masks(causal, mask_kind) -> None:
    cfg = TransformerConfig(3, 37, 24, 3, 40, 2, causal)
    torch.manual_seed(5)
    ref = ReferenceTransformer(cfg).eval()
    oracle = StreamedOracle(cfg, batch_chunk=2, query_chunk=6, key_chunk=11)
    oracle.load_state_dict(ref.state_dict())
    x, mask = generate_random_case(
        cfg, "cpu", torch.float32, 9, 0.4 if mask_kind != "none" else 0.0
    )
    if mask_kind == "left":
        mask = mask.flip(1)
        x = x.masked_fill(~mask[..., None], 0.0)
    with official_settings(), torch.inference_mode():
        report = check_outputs(oracle(x, mask), ref(x, mask))
    assert report.passed
    assert report.max_abs_err <= 1e-5 and report.budget_share < 0.01


def test_attention_working_set_is_bounded_by_the_chunks(monkeypatch) -> None:
    biggest = [0]
    real_baddbmm, real_bmm = torch.Tensor.baddbmm_, torch.bmm

    def spy(real):
        def wrapped(*args, **kwargs):
            out = real(*args, **kwargs)
            biggest[0] = max(biggest[0], out.numel())
            return out

        return wrapped

    monkeypatch.setattr(torch.Tensor, "baddbmm_", spy(real_baddbmm))
    monkeypatch.setattr(torch, "bmm", spy(real_bmm))
    b, h, s, hd, qc, kc = 1, 2, 300, 8, 32, 64
    q, k, v = (torch.randn(b, h, s, hd) for _ in range(3))
    out = streamed_attention(
        q, k, v, causal=True, key_mask=None, scale=hd**-0.5, query_chunk=qc, key_chunk=kc
    )
    assert 0 < biggest[0] <= b * h * qc * max(kc, hd) < b * h * s * s
    monkeypatch.undo()
    dense = (
        torch.softmax(
            (q @ k.transpose(-2, -1) * hd**-0.5).masked_fill(
                torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf")
            ),
            -1,
        )
        @ v
    )
    assert torch.allclose(out, dense, atol=1e-6, rtol=1e-5)


def test_bad_chunk_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="query_chunk must be at least 1"):
        StreamedOracle(TransformerConfig(1, 4, 8, 2, 8, 1, True), query_chunk=0)


def test_a_case_the_dense_reference_cannot_run_is_judged_by_the_oracle_on_a_subset(
    cpu_device, monkeypatch
) -> None:
    from autotune.core.cases import OFFICIAL_CASES, parse_custom
    from autotune.core.outcome import OutcomeKind
    from autotune.evaluate import evaluate_plan
    from autotune.judge.gate import CaseBench, dense_reference_fits
    from autotune.measure import TimingSettings
    from autotune.plan import Plan

    assert not dense_reference_fits(OFFICIAL_CASES[13], cpu_device)  # case 14
    assert dense_reference_fits(OFFICIAL_CASES[0], cpu_device)
    case = parse_custom("3,40,32,2,48,2,causal")
    bench = CaseBench(case, cpu_device, reference="oracle", oracle_batch=2)
    assert bench.reference_kind == "oracle" and "first 2 of 3" in bench.describe()
    x, _ = bench.timing_inputs()
    assert x.shape[0] == 2
    fast = TimingSettings(warmup=1, rounds=2, reps=2)
    ok = evaluate_plan(bench, Plan(attention="sdpa_math", qkv="packed"), timing=fast)
    assert ok.passed and ok.report.budget_share < 0.05
    monkeypatch.setenv("AUTOTUNE_INJECT_FAULT", "wrong")
    bad = evaluate_plan(bench, Plan(attention="sdpa_math"), timing=None)
    assert bad.kind is OutcomeKind.WRONG_RESULT
