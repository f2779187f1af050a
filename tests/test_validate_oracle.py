"""``autotune validate`` of a shape the dense reference cannot run (case 14): the entry's
plan on the whole batch against the streamed oracle, as the export verified it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

import pytest

import autotune.judge.fullbatch as fullbatch
from autotune.core.outcome import Outcome, OutcomeKind, TimingStats
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


class _Bench:
    """Stands for the batch-subset bench a held entry is timed on (no device here)."""

    made: ClassVar[list[str]] = []

    def __init__(self, case, device) -> None:  # type: ignore[no-untyped-def]
        _Bench.made.append(case.id)

    def release(self) -> None:
        pass


def _timed(kind: OutcomeKind = OutcomeKind.PASSED) -> Outcome:
    stats = TimingStats(1220.0, 29.7, 41.1, 0.002, 3, 49) if kind is OutcomeKind.PASSED else None
    return Outcome(kind, timing=stats, seeds_checked=5, padded_seeds_checked=5)


def _on_a_gpu(monkeypatch, failed: int = 0, error: str = "", subset: Outcome | None = None):
    """A CUDA selection whose oracle run is replaced by a record with ``failed`` elements
    failed per seed, and whose timing on the oracle's batch subset gives ``subset`` (by
    default a pass at 41.1x); returns the calls (case, routes, seeds) and the selection."""
    calls: list = []
    _Bench.made = []
    monkeypatch.setattr(v, "CaseBench", _Bench)
    monkeypatch.setattr(v, "evaluate_plan", lambda *a, **k: subset or _timed())

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
    assert "table said" in check.detail and "no dense reference time" in check.detail
    # held on the 5 seeds: timed as the export timed it, on the oracle's batch subset
    assert _Bench.made == ["14"] and check.outcome is not None
    assert "against the streamed oracle on the bench's batch subset" in check.detail
    assert check.full_batch is not None and check.full_batch["failed"] == 0
    assert check.full_batch["source"] == "verified by validate"


def test_a_held_oracle_entry_is_re_issued_with_this_devices_whole_batch_evidence(
    monkeypatch, tmp_path
) -> None:
    """Before, validate --out wrote case 14 as the reference ('no reference time here'),
    and the dense reference cannot run that shape: a table validated on another GPU lost
    its case-14 plan."""
    key, entry = _case14_entry()
    _, sel = _on_a_gpu(monkeypatch)
    table = load_table(TABLE)
    check = v.validate_entry(key, entry, sel, timing=None)  # type: ignore[arg-type]
    result = v.Validation([check], [], [])
    out = tmp_path / "here.py"
    v.write_verified_table(table, result, sel, out, "autotune validate (test)")
    new = load_table(out).entries[key]
    assert new["admitted"] and new["plan"] == entry["plan"]
    ev = new["evidence"]
    assert ev["speedup"] == pytest.approx(41.1) and ev["correctness_seeds"] == 5
    assert ev["full_batch"]["source"] == "verified by validate"
    assert ev["full_batch"]["seeds"] == list(ACCURACY_SEEDS)


def test_an_oracle_entry_is_not_re_issued_untimed_or_wrong_on_the_subset(monkeypatch) -> None:
    key, entry = _case14_entry()
    _, sel = _on_a_gpu(monkeypatch)  # --quick: one seed, so not timed and not re-issued
    check = v.validate_entry(key, entry, sel, timing=None, oracle_seeds=ACCURACY_SEEDS[:1])  # type: ignore[arg-type]
    assert check.verdict == v.HOLDS and check.outcome is None and _Bench.made == []
    _, sel = _on_a_gpu(monkeypatch, subset=_timed(OutcomeKind.WRONG_RESULT))
    check = v.validate_entry(key, entry, sel, timing=None)  # type: ignore[arg-type]
    assert check.verdict == v.WRONG and "batch subset" in check.detail
    _, sel = _on_a_gpu(monkeypatch, subset=_timed(OutcomeKind.OUT_OF_MEMORY))
    check = v.validate_entry(key, entry, sel, timing=None)  # type: ignore[arg-type]
    assert check.verdict == v.CANNOT_RUN and check.outcome is None  # exit 1 unless allowed
    assert "batch subset" in check.detail
    slow = Outcome(OutcomeKind.PASSED, timing=TimingStats(30.0, 29.7, 1.01, 0.05, 3, 49))
    _, sel = _on_a_gpu(monkeypatch, subset=slow)  # within the noise of the oracle's time
    check = v.validate_entry(key, entry, sel, timing=None)  # type: ignore[arg-type]
    assert check.verdict == v.NO_LONGER_WINS and check.outcome is None

    def no_room(case, device):  # type: ignore[no-untyped-def]
        raise RuntimeError("CUDA out of memory. Tried to allocate 40.00 GiB\nmore")

    _, sel = _on_a_gpu(monkeypatch)
    monkeypatch.setattr(v, "CaseBench", no_room)
    check = v.validate_entry(key, entry, sel, timing=None)  # type: ignore[arg-type]
    assert check.verdict == v.CANNOT_RUN
    assert check.detail.endswith("RuntimeError: CUDA out of memory. Tried to allocate 40.00 GiB")


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
