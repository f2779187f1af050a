"""Warm starts from a table file: the likeliest winners are measured first."""

from __future__ import annotations

from pathlib import Path

from autotune.core.cases import get_case, parse_custom
from autotune.plan import Plan
from autotune.runtime import load_table
from autotune.search.study import warm_start_plans

TABLE = str(Path(__file__).resolve().parents[2] / "tables" / "h200.py")


def _entry_plan(key: tuple) -> Plan:
    return Plan.from_dict(load_table(TABLE).entries[key]["plan"])


def test_a_table_warm_start_puts_the_entry_of_the_same_shape_first() -> None:
    for case_id in ("3", "13", "8"):
        key = get_case(case_id).key.as_tuple()
        plans = warm_start_plans([TABLE], None, "rtx5080", near=key)
        assert plans[0][0] == _entry_plan(key), case_id
        assert all(src == f"table {TABLE}" for _, src in plans)


def test_a_table_warm_start_orders_the_same_dims_by_shape_then_other_dims() -> None:
    near = parse_custom("3,100,128,4,128,4,causal").key.as_tuple()  # not in the table
    table = load_table(TABLE)
    plans = [p for p, _ in warm_start_plans([TABLE], None, "rtx5080", near=near)]
    nearest = _entry_plan(get_case("3").key.as_tuple())  # batch 4, seq 128: the nearest
    assert plans[0] == nearest
    same_dims = {
        Plan.from_dict(e["plan"])
        for k, e in table.entries.items()
        if k[2:] == near[2:] and e.get("admitted")
    }
    first = plans[: len(same_dims)]
    assert set(first) <= same_dims  # every plan of these dims before any other dims' plan
    unordered = [p for p, _ in warm_start_plans([TABLE], None, "rtx5080")]
    assert sorted(map(str, unordered)) == sorted(map(str, plans))  # the same plans
