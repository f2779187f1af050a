"""Efficiency caches rank plans by their own times once they hold them (session 11)."""

from __future__ import annotations

import dataclasses

from autotune.search.efficiency import Measured, rebased


def _m(h: str, latency: float, cand: float | None, ref: float | None, passed=True) -> dict:
    return dataclasses.asdict(
        Measured(h, {}, "passed" if passed else "wrong_result", passed, latency, 1.0, -1.0, 0,
                 0.1, cand, ref)
    )  # fmt: skip


def test_a_cache_with_absolute_times_ranks_by_them_over_one_reference() -> None:
    # Case 11's pair: 0.204 ms beside a 1.86 ms reference, 0.271 ms beside 3.23 ms.
    plans = {
        "a": _m("a", 0.204 / 1.86, 0.204, 1.86),
        "b": _m("b", 0.271 / 3.23, 0.271, 3.23),
        "c": _m("c", 0.30 / 2.0, 0.30, 2.0),
        "x": _m("x", 1e9, None, None, passed=False),
    }
    out = rebased(plans)
    assert min(out, key=lambda h: out[h].latency) == "a"  # the ratios had "b" first
    assert out["a"].latency == 0.204 / 2.0  # over the median reference
    assert out["x"].latency == 1e9


def test_an_older_cache_keeps_its_ratios() -> None:
    plans = {"a": _m("a", 0.11, None, None), "b": _m("b", 0.08, 0.271, 3.23)}
    out = rebased(plans)
    assert {h: m.latency for h, m in out.items()} == {"a": 0.11, "b": 0.08}
