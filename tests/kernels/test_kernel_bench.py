"""kernels.bench logic on a tiny shape under the interpreter (timing stubbed out)."""

from __future__ import annotations

import argparse

import pytest

pytest.importorskip("triton")

from kernels import bench


@pytest.mark.parametrize("dense_reference", [True, False], ids=["dense", "row-subset"])
def test_bench_shape_verifies_every_method_and_marks_the_best_tile(
    device: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    dense_reference: bool,
) -> None:
    if device != "cpu":
        pytest.skip("the real benchmark covers the GPU")
    monkeypatch.setattr(bench, "DENSE_REFERENCE_MAX_SCORES", 2**30 if dense_reference else 1)
    timings = iter(range(1, 1000))
    monkeypatch.setattr(bench, "time_ms", lambda fn, cuda_graph: float(next(timings)))
    monkeypatch.setattr(
        bench,
        "candidate_tiles",
        lambda head_dim: [
            bench.Tile(16, 16, 4, 2),
            bench.Tile(32, 16, 4, 1),
            bench.Tile(128, 16, 4, 1),
        ],
    )
    shape = bench.Shape(case=99, batch=1, seq_len=40, heads=2, head_dim=16)
    args = argparse.Namespace(cuda_graph=False, precision_list=["tf32", "fp16"])

    rows = bench.bench_shape(shape, args, deadline=float("inf"), device="cpu")

    triton_rows = [r for r in rows if r.method == "triton"]
    assert [r.check.split()[0] for r in triton_rows] == ["PASS", "PASS", "n/a"] * 2
    assert "BLOCK_M=128 > padded seq len 64" in triton_rows[2].note
    assert [r.config for r in triton_rows if r.best] == ["bm16 bn16 w4 s2"] * 2
    assert {r.method for r in rows} >= {"sdpa EFFICIENT", "sdpa FLASH", "sdpa CUDNN"}
    assert not any(r.check.startswith("FAIL") for r in rows)
    assert "floor fp16" in capsys.readouterr().out


def test_check_rows_cover_first_and_last_queries_when_dense_is_too_large() -> None:
    rows = bench.check_rows(bench.SHAPES[14], "cpu")
    assert rows is not None
    assert {0, 1, 99_998, 99_999} <= set(rows.tolist())
    assert len(rows) <= bench.CHECK_ROWS
    assert bench.check_rows(bench.SHAPES[1], "cpu") is None


def test_floor_uses_the_larger_of_compute_and_bandwidth() -> None:
    case14 = bench.SHAPES[14]
    assert bench.floor_ms(case14, "fp16") == pytest.approx(20.48e12 / 790e12 * 1e3)
    case1 = bench.SHAPES[1]
    assert bench.floor_ms(case1, "tf32") == pytest.approx(case1.bytes / 4.3e12 * 1e3)


def test_unknown_case_is_rejected_by_the_cli() -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--shapes", "1,2"])
