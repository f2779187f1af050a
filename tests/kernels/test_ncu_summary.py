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


def test_producers_name_what_a_scoreboard_stall_waits_for(tmp_path, capsys) -> None:
    """--producers: a read of a loaded register waits for its load (a pair's second half
    too); an overwrite of a register that a load still reads as its address waits for that
    load; a fixed-latency writer in between ends the search for that register."""
    ncu = _script()
    page = _page(tmp_path / "p.csv", [
        ("0x10", "LDG.E.64 R24, desc[UR4][R2.64]", 0, 0),
        ("0x20", "@!P5 LDG.E.64 R40, desc[UR4][R30.64+0x20]", 0, 0),
        ("0x30", "FADD R8, R25, R1", 60, 0),  # waits for 0x10 (R25 of the pair)
        ("0x40", "MUFU.RCP R30, R9", 50, 0),  # overwrites 0x20's address
        ("0x50", "IMAD.MOV.U32 R1, RZ, RZ, R7", 0, 0),
        ("0x60", "FMUL R11, R1, R24", 40, 0),  # R1 fixed latency: only 0x10's R24 is named
    ])  # fmt: skip
    assert ncu.main([page, "--producers", "--top", "3"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    at = {s.split()[3]: n for n, s in enumerate(lines) if s.strip()[:1].isdigit()}
    assert "waits on 0: LDG.E.64 R24" in lines[at["FADD"] + 1] and "(writes R25)" in out
    assert "waits on 1: @!P5 LDG.E.64 R40" in lines[at["MUFU.RCP"] + 1]
    assert "(reads R30, overwritten here)" in lines[at["MUFU.RCP"] + 1]
    assert "(writes R24)" in lines[at["FMUL"] + 1] and "R1)" not in lines[at["FMUL"] + 1]
    assert ncu.main([page, "--top", "3"]) == 0  # without the flag: no such lines
    assert "waits on" not in capsys.readouterr().out


def test_operands_read_widths_from_the_opcode() -> None:
    ops = _script().operands
    assert ops("STG.E.128 desc[UR50][R40.64], R32") == (
        "STG.E.128",
        set(),
        {40, 41, 32, 33, 34, 35},
    )
    assert ops("HGMMA.64x32x16.F32 R24, R80, gdesc[UR12], RZ, !UPT, gsb0")[1] == set(range(24, 40))
    assert ops("ISETP.NE.AND P0, PT, R8, RZ, PT") == ("ISETP.NE.AND", set(), {8})
