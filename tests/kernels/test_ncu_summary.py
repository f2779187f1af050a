"""scripts/ncu_summary.py on synthetic Nsight Compute source pages: one page's samples by
reason, opcode and instruction, two pages side by side, and a file that is not a page."""

from __future__ import annotations

import csv
import importlib.util

from tests.conftest import ROOT


def _script():
    spec = importlib.util.spec_from_file_location("ncu_summary", ROOT / "scripts/ncu_summary.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page(path, rows) -> str:
    """A source page as ncu writes it: a kernel line, the header, a row an instruction
    (address, SASS, samples, stall columns; the Not Issued columns ignored)."""
    head = ["Address", "Source", "# Samples", "stall_long_sb", "stall_wait",
            "stall_long_sb (Not Issued)"]  # fmt: skip
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["Kernel Name", "k", ""])
        out.writerow(head)
        for addr, sass, long_sb, wait in rows:
            out.writerow([addr, sass, long_sb + wait, long_sb, wait, 999])
    return str(path)


def test_one_page_and_two_side_by_side(tmp_path, capsys) -> None:
    ncu = _script()
    a = _page(tmp_path / "a.csv", [("0x10", "@!P0 LDG.E.64 R2, [R4]", 30, 0),
                                   ("0x20", "FADD R1, R2, R3", 50, 20)])  # fmt: skip
    b = _page(tmp_path / "b.csv", [("0x10", "LDG.E.64 R2, [R4]", 30, 0),
                                   ("0x20", "FADD R1, R2, R3", 50, 70)])  # fmt: skip
    assert ncu.main([a, "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 SASS instructions, 100 samples" in out
    assert "by reason: long_sb 80.0%, wait 20.0%" in out  # Not Issued columns left out
    assert "by opcode: FADD 70.0%, LDG 30.0%" in out  # guard predicate and modifiers dropped
    assert "FADD R1, R2, R3" in out and "LDG.E" not in out.split("instructions")[-1]
    assert ncu.main([a, "--against", b]) == 0
    out = capsys.readouterr().out
    assert "samples: 100 -> 150 (+50.0%)" in out
    assert "wait                   20       70   +50.0%" in out  # where the extra time went
    assert "FADD                   70      120   +50.0%" in out


def test_a_file_that_is_not_a_page_says_so(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert _script().main([str(bad)]) == 2
    assert "is not an ncu source page" in capsys.readouterr().err
