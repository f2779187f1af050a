"""`autotune compare`: plans side by side on a case in one process (CPU, a smoke case)."""

from __future__ import annotations

import json

from autotune.cli.main import main


def test_compare_prints_and_records_each_plan_beside_the_reference(tmp_path, capsys) -> None:
    """The reference's row, then each plan's: gated, timed interleaved, its ratio to the
    first plan; the JSON holds the same rows. Host time a call is measured on CUDA only
    (None here); a plan the CLI cannot parse is bad input (exit 2, one line)."""
    out = tmp_path / "rows.json"
    plan = '{"qkv": "packed"}'
    code = main(
        ["compare", "--gpu", "cpu", "--cases", "smoke-1", "--plan", plan, "--plan", plan,
         "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("| case | plan | kernels/forward | median us | host us/call |")
    assert printed[1].startswith("|---|---|") and printed[2].startswith("| smoke-1 | reference |")
    rows = json.loads(out.read_text())
    assert [r["plan"] for r in rows] == ["reference", "qkv=packed", "qkv=packed"]
    ref, first, second = rows
    assert ref["speedup"] == 1.0 and ref["median_us"] > 0
    assert first["passed"] and second["passed"]
    assert first["vs_first"] == 1.0 and second["vs_first"] > 0
    assert first["plan_hash"] == second["plan_hash"]
    assert first["host_us"] is None and second["host_us"] is None  # CPU: not measured
    assert main(["compare", "--gpu", "cpu", "--cases", "smoke-1", "--plan", '{"qkv": "x"}']) == 2
    assert "knob 'qkv' has no value 'x'" in capsys.readouterr().err
