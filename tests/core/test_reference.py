from __future__ import annotations

import math

import pytest
import torch

from autotune.core.cases import OFFICIAL_CASES, SMOKE_CASES, get_case, parse_custom, select_cases
from autotune.core.reference import (
    ReferenceTransformer,
    TransformerConfig,
    check_outputs,
    generate_random_case,
    official_settings,
)
from autotune.judge.golden import check_vector, load_vector, run_conformance
from tests.conftest import GOLDEN


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.rsplit("/", 1)[-1])
def test_every_golden_vector_reproduces_inputs_exactly_and_output_within_1e5(path: str) -> None:
    vector = load_vector(path)
    result = check_vector(vector)
    assert result.passed, result.line()
    assert result.max_abs_err <= 1e-5


def test_conformance_prints_a_line_per_vector_and_the_totals(golden_paths: list[str]) -> None:
    lines: list[str] = []
    passed, failed = run_conformance(golden_paths, emit=lines.append)
    assert (passed, failed) == (len(golden_paths), 0)
    assert lines[-1] == f"{len(golden_paths)} passed, 0 failed"
    assert all(" PASS " in line for line in lines[:-1])


def test_conformance_fails_a_vector_whose_output_was_tampered(tmp_path, golden_paths) -> None:
    data = torch.load(golden_paths[0], weights_only=True)
    data["output"] = data["output"] + 1e-3
    bad = tmp_path / "bad.pt"
    torch.save(data, bad)
    lines: list[str] = []
    passed, failed = run_conformance([str(bad)], emit=lines.append)
    assert (passed, failed) == (0, 1)
    assert "FAIL" in lines[0]


def test_rule_is_an_or_of_two_absolute_tests_not_isclose() -> None:
    ref = torch.tensor([1.0])
    # isclose would pass (err 0.021 <= 0.002 + 0.02*1), the OR rule fails: 0.021 > both.
    cand = torch.tensor([1.021])
    assert torch.isclose(cand, ref, rtol=0.02, atol=0.002).all()
    report = check_outputs(cand, ref)
    assert not report.passed and report.n_failed == 1
    assert report.budget_share == pytest.approx(0.021 / 0.02, rel=1e-4)


def test_rule_passes_on_the_relative_branch_where_the_absolute_one_fails() -> None:
    ref = torch.tensor([10.0, 0.0])
    cand = torch.tensor([10.15, 0.0015])  # 0.15 <= 0.2 (relative); 0.0015 <= 0.002 (absolute)
    report = check_outputs(cand, ref)
    assert report.passed
    assert report.max_abs_err == pytest.approx(0.15, rel=1e-4)
    assert report.budget_share == pytest.approx(0.75, rel=1e-3)


def test_rule_fails_nan_and_inf_even_when_both_sides_agree() -> None:
    ref = torch.tensor([1.0, float("inf"), 2.0])
    cand = torch.tensor([1.0, float("inf"), float("nan")])
    report = check_outputs(cand, ref)
    assert not report.passed
    assert report.n_failed == 2 and report.n_nonfinite == 2
    assert math.isinf(report.budget_share)


def test_rule_reports_worst_index_and_counts() -> None:
    ref = torch.zeros(2, 3)
    cand = ref.clone()
    cand[1, 2] = 0.01
    cand[0, 1] = 0.003
    report = check_outputs(cand, ref)
    assert report.n_failed == 2 and report.worst_index == (1, 2)
    assert report.budget_share == pytest.approx(5.0, rel=1e-4)
    assert report.violation == pytest.approx(4.0, rel=1e-4)


def test_rule_raises_on_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="shape mismatch"):
        check_outputs(torch.zeros(2, 3), torch.zeros(3, 2))


def test_report_round_trips_through_json_with_infinities() -> None:
    report = check_outputs(torch.tensor([float("nan")]), torch.tensor([1.0]))
    from autotune.core.reference import CorrectnessReport

    back = CorrectnessReport.from_json(report.to_json())
    assert back == report or (math.isinf(back.budget_share) and back.n_failed == 1)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"seq_len": -1}, "seq_len"),
        ({"num_heads": 3}, "d_model"),
        ({"ffn_dim": 2.5}, "ffn_dim"),
        ({"num_layers": True}, "num_layers"),
        ({"causal": "yes"}, "causal"),
    ],
)
def test_config_validation_names_the_field(kwargs, field) -> None:
    base = dict(batch_size=2, seq_len=8, d_model=32, num_heads=4, ffn_dim=64, num_layers=1)
    base.update(kwargs)
    with pytest.raises(ValueError, match=field):
        TransformerConfig(**base)


def test_registry_has_the_fourteen_official_shapes_exactly() -> None:
    expected = [
        (64, 128, 128, 4, 128, 4),
        (1, 128, 128, 4, 128, 4),
        (4, 128, 128, 4, 128, 4),
        (16, 128, 128, 4, 128, 4),
        (128, 128, 128, 4, 128, 4),
        (10000, 128, 128, 4, 128, 4),
        (64, 128, 32, 4, 32, 4),
        (64, 128, 1024, 4, 1024, 4),
        (64, 128, 128, 1, 128, 4),
        (64, 128, 128, 2, 128, 4),
        (64, 128, 128, 16, 128, 4),
        (64, 32, 128, 4, 128, 4),
        (64, 1024, 128, 4, 128, 4),
        (32, 100000, 1024, 16, 1024, 2),
    ]
    got = [
        (
            c.config.batch_size,
            c.config.seq_len,
            c.config.d_model,
            c.config.num_heads,
            c.config.ffn_dim,
            c.config.num_layers,
        )
        for c in OFFICIAL_CASES
    ]
    assert got == expected
    assert [c.id for c in OFFICIAL_CASES] == [str(i) for i in range(1, 15)]
    assert all(c.config.causal and c.dtype == "float32" and c.regime for c in OFFICIAL_CASES)
    assert get_case("11").config.head_dim == 8


def test_smoke_cases_cover_the_regimes() -> None:
    regimes = {c.regime for c in SMOKE_CASES}
    assert {
        "launch-bound",
        "long-sequence",
        "tiny-head",
        "projection-bound",
        "padded-batch",
    } <= regimes
    assert any(c.padding_ratio > 0 for c in SMOKE_CASES)


def test_custom_case_from_string() -> None:
    case = parse_custom("8,256,128,4,512,2,causal")
    assert case.config == TransformerConfig(8, 256, 128, 4, 512, 2, True)
    assert parse_custom("2,16,32,2,64,1,noncausal").config.causal is False
    assert get_case(case.id) == case
    assert [c.id for c in select_cases("1-3,smoke-2")] == ["1", "2", "3", "smoke-2"]
    # Six case ids are six cases (this read as a shape once and failed a device run).
    assert [c.id for c in select_cases("1,5,6,9,10,11")] == ["1", "5", "6", "9", "10", "11"]
    assert select_cases("1,8,8,2,8,2,causal")[0].config == TransformerConfig(1, 8, 8, 2, 8, 2, True)
    assert select_cases("8,256,128,4,512,2")[0].config.seq_len == 256
    with pytest.raises(ValueError, match="unknown case"):
        get_case("15")
    with pytest.raises(ValueError, match="num_heads"):
        parse_custom("8,256,100,3,512,2")


def test_case_ids_mix_with_custom_shapes_and_a_range_stops_at_the_cases() -> None:
    """'3;SHAPE' read '3' as a shape ("cannot read case '3'"); '1-99999999' built 10^8 ids
    and then named case '15' as unknown."""
    mixed = select_cases("3;1,14,64,4,128,2,causal;smoke-2")
    assert [c.id for c in mixed][::2] == ["3", "smoke-2"]
    assert mixed[1].config == TransformerConfig(1, 14, 64, 4, 128, 2, True)
    # Across ';' six numbers are a shape, as they always were, even when all are case ids.
    assert [c.config.seq_len for c in select_cases("2,8,4,2,8,1;1,14,64,4,128,2")] == [8, 14]
    for spec in ("1-99999999", "0-3"):
        with pytest.raises(ValueError, match=f"case range '{spec}' runs past the cases"):
            select_cases(spec)


def test_generator_right_pads_and_zeroes_padded_rows() -> None:
    cfg = TransformerConfig(6, 20, 8, 2, 16, 1, True)
    x, mask = generate_random_case(cfg, "cpu", torch.float32, seed=5, padding_ratio=0.5)
    lengths = mask.sum(1)
    assert (lengths >= 10).all() and (lengths <= 20).all()
    assert torch.equal(mask, torch.arange(20)[None] < lengths[:, None])
    assert (x[~mask] == 0).all() and (x[mask] != 0).all()
    _x0, m0 = generate_random_case(cfg, "cpu", torch.float32, seed=5, padding_ratio=0.0)
    assert m0.all() and m0.dtype == torch.bool


def test_official_settings_set_and_restore_flags() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    before = torch.get_float32_matmul_precision()
    with official_settings():
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == before
    assert torch.backends.cuda.matmul.allow_tf32 is False


def test_reference_has_the_official_parameter_names() -> None:
    model = ReferenceTransformer(TransformerConfig(1, 4, 8, 2, 16, 2, True))
    names = set(model.state_dict())
    for i in range(2):
        for part in (
            "norm1",
            "norm2",
            "ffn_in",
            "ffn_out",
            "attention.q_proj",
            "attention.k_proj",
            "attention.v_proj",
            "attention.out_proj",
        ):
            assert {f"layers.{i}.{part}.weight", f"layers.{i}.{part}.bias"} <= names
    assert {"final_norm.weight", "final_norm.bias"} <= names
    assert len(names) == 2 * 16 + 2
