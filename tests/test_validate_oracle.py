"""``autotune validate`` of a shape the dense reference cannot run (case 14): the entry's
plan on the whole batch against the streamed oracle, as the export verified it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import autotune.judge.fullbatch as fullbatch
from autotune.core.profiles import get_profile, select_profile
from autotune.core.reference import ACCURACY_SEEDS
from autotune.judge.fullbatch import RouteRecord
from autotune.runtime import load_table
from autotune.tools import validate as v

TABLE = Path(__file__).resolve().parent.parent / "tables" / "h200.py"


def _case14_entry() -> tuple[tuple, dict]:
    table = load_table(TABLE)
    ((key, entry),) = [(k, e) for k, e in table.entries.items() if e.get("case") == "14"]
    return key, dict(entry)


def _on_a_gpu(monkeypatch, failed: int = 0, error: str = "") -> list:
    """A CUDA selection whose oracle run is replaced by a record with ``failed`` elements
    failed per seed; returns the calls (case, routes, seeds)."""
    calls: list = []

    def fake(case, routes, *, seeds, log=print, **_):  # type: ignore[no-untyped-def]
        calls.append((case, routes, seeds))
        (route,) = routes
        rec = RouteRecord(route.label, route.plan.to_dict(), route.plan.hash, None, error=error)
        for seed in seeds:
            rec.seeds.append(
                {"seed": seed, "wall_s": 0.9, "elements": 100, "failed": failed,
                 "max_abs_err": 1e-3, "budget_share": 0.6, "peak_bytes": 2**30,
                 "guard": [{"path": "polynomial", "spread": 2.0}]}
            )  # fmt: skip
        return [rec]

    monkeypatch.setattr(fullbatch, "verify_full_batch", fake)
    sel = select_profile("cpu")
    gpu = dataclasses.replace(
        sel.device, type="cuda", name="NVIDIA H200", capability=(9, 0), total_memory=141 * 10**9
    )
    return calls, dataclasses.replace(sel, device=gpu, profile=get_profile("h200"))


def test_case14_is_verified_against_the_oracle_on_every_seed(monkeypatch) -> None:
    key, entry = _case14_entry()
    calls, sel = _on_a_gpu(monkeypatch)
    check = v.validate_entry(key, entry, sel, timing=None)  # type: ignore[arg-type]
    ((case, (route,), seeds),) = calls
    assert case.id == "14" and seeds == ACCURACY_SEEDS
    assert route.plan.to_dict() == entry["plan"] | route.plan.to_dict()  # the entry's plan
    assert route.capacity_bytes is None  # the H200 profile on an H200: no cap
    assert check.verdict == v.HOLDS, check.detail
    assert "0 failed of 500 elements over 5 seed(s)" in check.detail
    assert "table said" in check.detail and "no reference time" in check.detail


def test_a_failed_element_makes_it_wrong_and_an_error_cannot_run(monkeypatch) -> None:
    key, entry = _case14_entry()
    _, sel = _on_a_gpu(monkeypatch, failed=3)
    check = v.validate_entry(key, entry, sel, timing=None, oracle_seeds=(1234,))  # type: ignore[arg-type]
    assert check.verdict == v.WRONG and "3 failed of 100" in check.detail
    _, sel = _on_a_gpu(monkeypatch, error="seed 1234: OutOfMemoryError: boom")
    check = v.validate_entry(key, entry, sel, timing=None)  # type: ignore[arg-type]
    assert check.verdict == v.CANNOT_RUN and "OutOfMemoryError" in check.detail


def test_no_oracle_skips_and_the_cpu_says_why_it_cannot(monkeypatch) -> None:
    key, entry = _case14_entry()
    check = v.validate_entry(key, entry, select_profile("cpu"), timing=None, oracle_seeds=None)  # type: ignore[arg-type]
    assert check.verdict == v.SKIPPED and "--no-oracle" in check.detail
    check = v.validate_entry(key, entry, select_profile("cpu"), timing=None)  # type: ignore[arg-type]
    assert check.verdict == v.CANNOT_RUN and "needs a CUDA GPU" in check.detail


@pytest.mark.parametrize(
    ("flags", "seeds"), [("", ACCURACY_SEEDS), ("--quick", ACCURACY_SEEDS[:1])]
)
def test_the_cli_passes_the_oracle_seeds(monkeypatch, flags, seeds) -> None:
    from tests.conftest import cli

    seen: list = []

    def record(key, entry, selection, timing, refused=False, oracle_seeds=ACCURACY_SEEDS):  # type: ignore[no-untyped-def]
        seen.append(oracle_seeds)
        return v.EntryCheck(entry.get("case"), "p", v.SKIPPED, "")

    monkeypatch.setattr(v, "validate_entry", record)
    assert cli(f"validate --table {TABLE} --gpu cpu --cases 14 --allow-reference {flags}") == 0
    assert cli(f"validate --table {TABLE} --gpu cpu --cases 14 --allow-reference --no-oracle") == 0
    assert seen == [seeds, None]


def test_an_emulated_profile_runs_the_oracle_check_under_its_cap(monkeypatch) -> None:
    key, entry = _case14_entry()
    calls, sel = _on_a_gpu(monkeypatch)
    sel = dataclasses.replace(sel, profile=get_profile("rtx5080"), emulated=True)
    check = v.validate_entry(key, entry, sel, timing=None)  # type: ignore[arg-type]
    ((_, (route,), _),) = calls
    assert route.capacity_bytes == get_profile("rtx5080").memory_bytes
    assert check.verdict == v.HOLDS
