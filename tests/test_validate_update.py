"""``autotune validate --out TABLE --update``: how each entry of this device's table fares
when another table's entries are validated into it (write_verified_table's update)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.core.outcome import Outcome, OutcomeKind, TimingStats
from autotune.core.profiles import select_profile
from autotune.plan import Plan
from autotune.runtime import load_table
from autotune.ship.export import table_provenance, write_entries
from autotune.tools import validate as v

SEL = select_profile("cpu")
PACKED = {"attention": "sdpa_math", "qkv": "packed"}
SEPARATE = {"attention": "sdpa_math", "qkv": "separate"}
DIMS = (32, 2, 64, 2, True, "float32")
OTHER_DIMS = (16, 2, 16, 1, True, "float32")


def _key(batch: int, dims: tuple = DIMS) -> tuple:
    return (batch, 16, *dims)


def _entry(case: str, plan: dict, admitted: bool = True) -> dict:
    return {
        "admitted": admitted,
        "case": case,
        "plan": plan if admitted else {},
        "plan_hash": Plan.from_dict(plan if admitted else {}).hash,
        "evidence": {"reason": f"the table's own {case}"},
    }


def _table(path: Path, entries: dict, buckets: list | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_entries(path, "cpu", table_provenance(SEL, f"made for {path.name}"), entries, buckets)
    return path


def _check(case: str, batch: int, plan: dict, verdict: str) -> v.EntryCheck:
    held = verdict in (v.HOLDS, v.VERIFIED_HERE)
    outcome = (
        Outcome(
            OutcomeKind.PASSED,
            timing=TimingStats(3.0, 1.0, 3.0, 0.01, 5, 49),
            seeds_checked=5,
            padded_seeds_checked=5,
        )
        if held
        else None
    )
    return v.EntryCheck(
        case, str(plan), verdict, "(test)", outcome, _key(batch), _entry(case, plan)
    )


BUCKET = {
    "dims": list(OTHER_DIMS),
    "batch": [1, 8],
    "seq": [8, 32],
    "plan": SEPARATE,
    "plan_hash": Plan.from_dict(SEPARATE).hash,
    "from": "case d",
    "evidence": {"points": [{"batch": 1, "seq": 8}], "failed_elements": 0},
}


@pytest.fixture
def tables(tmp_path):
    target = _table(
        tmp_path / "here" / "cpu.py",
        {
            _key(1): _entry("a", PACKED),  # replaced: the validated plan holds here
            _key(2): _entry("b", SEPARATE),  # its own plan WRONG here: the reference serves
            _key(3): _entry("c", PACKED),  # the validated plan no longer wins: kept
            _key(4): _entry("x", SEPARATE, admitted=False),  # the validated plan cannot run
            _key(1, OTHER_DIMS): _entry("d", SEPARATE),  # not validated: untouched
        },
        [BUCKET],
    )
    source = _table(tmp_path / "there" / "cpu.py", {})
    return load_table(source), target


def test_each_entry_of_the_table_fares_by_its_own_rule(tables) -> None:
    source, target = tables
    before = load_table(target)
    checks = [
        _check("a", 1, SEPARATE, v.HOLDS),
        _check("b", 2, SEPARATE, v.WRONG),
        _check("c", 3, SEPARATE, v.NO_LONGER_WINS),
        _check("x", 4, PACKED, v.CANNOT_RUN),
        _check("e", 5, PACKED, v.HOLDS),  # the table has no entry: added
        _check("f", 6, PACKED, v.WRONG),  # nor here: added as the reference
        v.EntryCheck("14", "p", v.SKIPPED, "--no-oracle"),  # no key: nothing changes
    ]
    lines: list[str] = []
    done = v.write_verified_table(
        source, v.Validation(checks, [], []), SEL, target, "test", update=before, emit=lines.append
    )
    assert (done.replaced, done.added, done.added_reference) == (1, 1, 1)
    assert (done.demoted, done.held_own, done.untouched) == (1, 2, 1)
    assert done.path == target and done.version == before.version + 1
    after = load_table(target)
    assert after.usable
    e = after.entries
    assert e[_key(1)]["plan_hash"] == Plan.from_dict(SEPARATE).hash and e[_key(1)]["admitted"]
    assert not e[_key(2)]["admitted"] and "WRONG" in e[_key(2)]["evidence"]["reason"]
    assert e[_key(3)] == before.entries[_key(3)] and e[_key(4)] == before.entries[_key(4)]
    assert e[_key(1, OTHER_DIMS)] == before.entries[_key(1, OTHER_DIMS)]
    assert e[_key(5)]["admitted"] and not e[_key(6)]["admitted"]
    assert list(after.buckets) == [BUCKET]  # its dims' entry untouched: kept
    assert after.provenance["updated_from"]["provenance"] == dict(before.provenance)
    assert after.provenance["command"] == "test"


def test_an_update_that_changes_no_entry_writes_nothing(tables) -> None:
    source, target = tables
    text = target.read_text()
    checks = [_check("c", 3, SEPARATE, v.NO_LONGER_WINS), v.EntryCheck("14", "p", v.SKIPPED, "")]
    update = load_table(target)
    done = v.write_verified_table(source, v.Validation(checks, [], []), SEL, target, "t", update)
    assert done.path is None and done.held_own == 1 and done.untouched == 4
    assert target.read_text() == text


def test_a_table_changed_while_the_validation_ran_is_not_overwritten(tables) -> None:
    source, target = tables
    update = load_table(target)
    _table(target, {_key(9): _entry("new", PACKED)})  # an export wrote it meanwhile
    text = target.read_text()
    checks = [_check("a", 1, SEPARATE, v.HOLDS)]
    with pytest.raises(ValueError, match="changed while this validation ran"):
        v.write_verified_table(source, v.Validation(checks, [], []), SEL, target, "t", update)
    assert target.read_text() == text


def test_updated_from_keeps_one_step_of_history_whichever_form_the_older_step_has() -> None:
    """The old table's own updated_from is cut to path, version, hash and command, both
    from the full form (with the provenance) and from the cut one tables/h100.py v3 has."""
    from types import SimpleNamespace

    from autotune.ship.export import updated_from

    step = {"table": "t.py", "version": 2, "content_hash": "h2", "command": "autotune export"}
    full = step | {"command": None, "provenance": {"command": "autotune export", "x": 1}}
    for older in (step, full):
        table = SimpleNamespace(
            source="t.py",
            version=3,
            content_hash="h3",
            provenance={"command": "autotune validate", "updated_from": older},
        )
        got = updated_from(table)  # type: ignore[arg-type]
        assert got["version"] == 3 and got["provenance"]["command"] == "autotune validate"
        assert got["provenance"]["updated_from"] == step, older
