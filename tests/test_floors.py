"""``autotune floors``: the counts by hand on a small shape, the table, bad input."""

from __future__ import annotations

import pytest

from autotune.core.cases import get_case, parse_custom
from autotune.tools.floors import CEILINGS, floor_of, floors_table, forward_flops, weight_bytes
from tests.conftest import cli


def test_flops_and_bytes_match_a_count_by_hand() -> None:
    case = parse_custom("2,4,8,2,16,3,causal")  # B2 S4 D8 H2 (hd 4) FFN16 L3
    tokens = 8
    proj = 2 * tokens * 8 * 8 * 4
    ffn = 2 * tokens * 8 * 16 * 2
    attn = 2 * 2 * 2 * 2 * (4 * 4 / 2) * 4  # 2 products x mul-add x B x H x S^2/2 x hd
    assert forward_flops(case.config) == 3 * (proj + ffn + attn)
    assert weight_bytes(case.config) == 3 * ((4 * 64 + 2 * 128) * 2 + (32 + 16 + 8 + 32) * 4) + 64
    f = floor_of(case, CEILINGS["h200"], launches_per_layer=2)
    stream = tokens * 8 * 4
    assert f.launches == 6 and f.min_bytes == 2 * stream + weight_bytes(case.config) + tokens
    assert f.layer_bytes == 12 * stream + weight_bytes(case.config) + 6 * tokens
    assert f.floor_us == pytest.approx(max(f.fp16_us, f.bytes_us) + 6 * 2.5)


def test_noncausal_attention_counts_every_pair() -> None:
    causal = get_case("2").config
    full = parse_custom("1,128,128,4,128,4,noncausal").config
    attn_half = 2 * 2 * 1 * 4 * 128 * 128 / 2 * 32 * 4
    assert forward_flops(full) - forward_flops(causal) == pytest.approx(attn_half)


def test_the_table_sets_measured_device_time_beside_the_floor() -> None:
    class Row:
        gpu_us = 100.0
        kernels = 33.0

    f = floor_of(get_case("2"), CEILINGS["h200"])
    text = floors_table([f], {"2": Row()})
    assert "x floor" in text.splitlines()[0]
    assert text.splitlines()[1].split()[-3:] == ["100.0", "33", f"{100.0 / f.floor_us:.1f}"]


def test_floors_cli_prints_and_refuses_bad_input(capsys) -> None:
    assert cli("floors --cases 2,13") == 0
    out = capsys.readouterr().out
    assert "790 TFLOP/s" in out and out.count("\n") == 4
    assert cli("floors --gpu rtx5080") == 2
    assert "no measured ceilings for profile 'rtx5080'" in capsys.readouterr().err
    assert (
        cli(
            "floors --gpu rtx5080 --fp16-tflops 200 --tf32-tflops 100 --tb-per-s 0.96 "
            "--launch-us 3 --cases 2"
        )
        == 0
    )
    assert cli("floors --launches-per-layer 0") == 2
