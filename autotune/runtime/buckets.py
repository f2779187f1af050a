"""Buckets of a dispatch table: regimes of batch size and sequence length that one
verified plan serves, for shapes the table has no entry for.

A bucket (schema 2, written by ``autotune export --buckets``, see
``autotune.ship.buckets``) is a mapping::

    {"dims": [d_model, heads, ffn, layers, causal, dtype],
     "batch": [lo, hi], "seq": [lo, hi],          # inclusive ranges
     "plan": {...}, "plan_hash": "...", "from": "case 2",
     "evidence": {"points": [{"batch": b, "seq": s, "worst_budget_share": w,
                              "speedup": x, ...}, ...], ...}}

Its plan passed the correctness gate and beat the reference at the range's corners and
inside; the plan's support rules are checked again per shape at run time. Imports the
standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

Key = tuple[Any, ...]  # (batch, seq, d_model, heads, ffn, layers, causal, dtype)


def dims_of(key: Key) -> tuple[Any, ...]:
    """What a bucket must match exactly: everything in a case key but batch and seq."""
    return tuple(key[2:])


def covers(bucket: Mapping[str, Any], key: Key) -> bool:
    (blo, bhi), (slo, shi) = bucket["batch"], bucket["seq"]
    return tuple(bucket["dims"]) == dims_of(key) and blo <= key[0] <= bhi and slo <= key[1] <= shi


def find_bucket(buckets: Sequence[Mapping[str, Any]], key: Key) -> Mapping[str, Any] | None:
    """The bucket whose range holds this shape (buckets of one table never overlap)."""
    return next((b for b in buckets if covers(b, key)), None)


def shape_distance(a: tuple[int, int], b: tuple[int, int]) -> float:
    """How far two (batch, seq) shapes are apart: log-ratios summed (a batch of 48 is as
    near 64 as 36 is), sequence length weighted double (it changes the kernels' work
    per row, batch only the grid)."""
    return abs(math.log(a[0] / b[0])) + 2 * abs(math.log(a[1] / b[1]))


def _range_distance(point: tuple[int, int], bucket: Mapping[str, Any]) -> float:
    (blo, bhi), (slo, shi) = bucket["batch"], bucket["seq"]
    nearest = (min(max(point[0], blo), bhi), min(max(point[1], slo), shi))
    return shape_distance(point, nearest)


def nearest_plans(
    entries: Mapping[Key, Mapping[str, Any]],
    buckets: Sequence[Mapping[str, Any]],
    key: Key,
) -> list[tuple[dict[str, Any], str]]:
    """Plans of the same dims, nearest first (a bucket by its range, an entry by its
    shape), each once: what a one-time gate on an unseen shape tries."""
    point = (key[0], key[1])
    found: list[tuple[float, str, dict[str, Any]]] = []
    for b in buckets:
        if tuple(b["dims"]) == dims_of(key):
            found.append((_range_distance(point, b), span(b), dict(b["plan"])))
    for k, e in entries.items():
        if e.get("admitted") and dims_of(k) == dims_of(key):
            where = f"case {e.get('case')}"
            found.append((shape_distance(point, (k[0], k[1])), where, dict(e["plan"])))
    found.sort(key=lambda f: (f[0], f[1]))
    out: list[tuple[dict[str, Any], str]] = []
    for _, where, plan in found:
        if all(plan != p for p, _ in out):
            out.append((plan, where))
    return out


def span(bucket: Mapping[str, Any]) -> str:
    (blo, bhi), (slo, shi) = bucket["batch"], bucket["seq"]
    return f"bucket batch {blo}-{bhi} x seq {slo}-{shi}"


def describe(bucket: Mapping[str, Any]) -> str:
    points = len(bucket.get("evidence", {}).get("points", []))
    return f"{span(bucket)} (plan of {bucket.get('from', '?')}, verified at {points} shapes)"
