"""Buckets: drafting regimes of batch and sequence length from a table's entries,
verifying them, writing them (schema 2), and serving unseen shapes from them or from a
one-time gate, never from an unverified plan."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

# Modules that bind evaluate_plan at import are imported first, so that the tests that
# patch autotune.evaluate.evaluate_plan never leave a fake bound in them.
import autotune.tools.validate  # noqa: F401
from autotune.core.cases import select_cases, shape_grid
from autotune.core.device import DeviceInfo, detect_device, software_versions
from autotune.core.outcome import Outcome, OutcomeKind, TimingStats
from autotune.core.reference import (
    ReferenceTransformer,
    build_reference,
    check_outputs,
    generate_random_case,
)
from autotune.plan import Plan
from autotune.runtime import DispatchedTransformer, load_table, serving
from autotune.runtime.buckets import find_bucket, nearest_plans, shape_distance
from autotune.ship.buckets import (
    Draft,
    Journal,
    VerifyJob,
    axis_cells,
    draft_buckets,
    verify_draft,
)
from autotune.ship.export import write_entries
from tests.conftest import ROOT

DIMS = (32, 2, 64, 2, True, "float32")  # smoke-1's dims
CPU = detect_device("cpu")
HEADS = {"attention": "sdpa_math", "qkv": "packed"}  # stands for a short-sequence plan
ROWS = {"attention": "sdpa_math", "qkv": "separate"}  # and one for any length
PROVENANCE = {
    "command": "test",
    "commit": "test",
    "device": {"capability": None, "name": "cpu", "type": "cpu"},
    "emulated": False,
    "versions": software_versions(),
}


def _entry(case: str, plan: dict) -> dict:
    return {"admitted": True, "case": case, "plan": plan, "plan_hash": "x", "evidence": {}}


def _short_only(plan: Plan, config, device: DeviceInfo) -> list[str]:
    """Support rule of the test: the 'heads' plan runs only up to S = 256."""
    return ["S > 256"] if plan.qkv == "packed" and config.seq_len > 256 else []


ENTRIES = {
    (1, 128, *DIMS): _entry("a", HEADS),
    (4, 128, *DIMS): _entry("b", HEADS),
    (64, 128, *DIMS): _entry("c", HEADS),
    (64, 32, *DIMS): _entry("d", HEADS),
    (64, 1024, *DIMS): _entry("e", ROWS),
    (8, 8, 16, 2, 16, 1, True, "float32"): _entry("lonely", HEADS),  # one shape: no bucket
}


def test_axis_cells_split_at_geometric_midpoints_within_the_tuned_values() -> None:
    assert axis_cells([64, 1, 4]) == [(1, 2, 1), (3, 16, 4), (17, 64, 64)]
    assert axis_cells([32, 128, 1024]) == [(32, 64, 32), (65, 362, 128), (363, 1024, 1024)]
    assert axis_cells([7]) == [(7, 7, 7)]


def test_drafts_cover_the_tuned_grid_with_supported_plans_nearest_first() -> None:
    drafts = draft_buckets(ENTRIES, CPU, reasons=_short_only)
    assert all(d.dims == DIMS for d in drafts)  # the one-shape group has none
    seqs = (32, 64, 65, 256, 257, 362, 363, 1024)
    covered = {}
    for d in drafts:
        for b in range(d.batch[0], d.batch[1] + 1):
            for s in seqs:
                if d.seq[0] <= s <= d.seq[1]:
                    assert (b, s) not in covered, "buckets overlap"
                    covered[(b, s)] = d
    assert {(b, s) for b in range(1, 65) for s in seqs} == set(covered)
    # A plan goes only where it runs at every corner: the short-only plan's limit (256)
    # cuts the cell of seq 65-362, so it keeps 65-256; longer sequences take the other.
    for (_, s), d in covered.items():
        if s > 256:
            assert all(p.qkv == "separate" for p, _ in d.plans)
    short, long = covered[(1, 32)], covered[(1, 1024)]
    assert short.plans[0][0].qkv == "packed" and short.plans[1][0].qkv == "separate"
    assert (short.batch, short.seq) == ((1, 64), (32, 256))
    assert (long.batch, long.seq) == ((1, 64), (257, 1024)) and len(drafts) == 2
    assert short.points() == [(1, 32), (1, 256), (64, 32), (64, 256), (8, 91)]


def test_a_rebuild_keeps_an_earlier_buckets_plan_where_the_new_entry_cannot_run() -> None:
    """Session 31: case 6's entry changed to a kernel of S <= 128, and the rebuilt buckets
    gave its long-sequence region a farther entry's plan, slower than the one verified
    there before. The earlier bucket's plan now comes right after the nearest entry's, or
    first where that one cannot run; a region no entry's plan reaches keeps it."""
    chunked = {"attention": "sdpa_math", "qkv": "separate", "batch_chunk": 2}
    earlier = [
        {
            "dims": list(DIMS),
            "batch": [1, 64],
            "seq": [32, 1024],
            "plan": chunked,
            "from": "case e",
        },
    ]
    # the long entry's plan now runs only up to S = 256, as the others'
    short_entries = dict(ENTRIES) | {(64, 1024, *DIMS): _entry("e", HEADS)}
    before = draft_buckets(short_entries, CPU, reasons=_short_only)
    assert not [d for d in before if d.seq[1] > 256]
    drafts = draft_buckets(short_entries, CPU, reasons=_short_only, earlier=earlier)
    (long,) = [d for d in drafts if d.seq[1] > 256]
    assert [(p.batch_chunk, where) for p, where in long.plans] == [(2, "case e, an earlier bucket")]
    # where the nearest entry's plan runs it stays first, the earlier plan next; where it
    # does not (S 257-362, nearest to the short plans at S 128), the earlier plan first
    drafts = draft_buckets(ENTRIES, CPU, reasons=_short_only, earlier=earlier)
    firsts = {d.seq: [(p.qkv, p.batch_chunk) for p, _ in d.plans[:2]] for d in drafts}
    assert firsts == {
        (32, 256): [("packed", 0), ("separate", 2)],
        (257, 362): [("separate", 2), ("separate", 0)],
        (363, 1024): [("separate", 0), ("separate", 2)],
    }
    # an earlier bucket of other dims, or elsewhere, changes nothing
    elsewhere = [
        dict(earlier[0], seq=[2000, 4000]),
        dict(earlier[0], dims=[64, 2, 64, 2, True, "float32"]),
    ]
    assert draft_buckets(ENTRIES, CPU, reasons=_short_only, earlier=elsewhere) == draft_buckets(
        ENTRIES, CPU, reasons=_short_only
    )


def test_support_limits_cut_cells_where_a_plan_stops() -> None:
    assert axis_cells([32, 128, 1024], cuts=(256,)) == [
        (32, 64, 32),
        (65, 256, 128),
        (257, 362, 257),
        (363, 1024, 1024),
    ]


def _outcome(passed: bool = True, speedup: float = 3.0) -> Outcome:
    timing = TimingStats(
        ref_median_ms=3.0,
        cand_median_ms=3.0 / speedup,
        speedup=speedup,
        noise=0.05,
        rounds=3,
        reps=30,
        clock="test",
    )
    kind = OutcomeKind.PASSED if passed else OutcomeKind.WRONG_RESULT
    return Outcome(
        kind, "" if passed else "2 elements over budget", timing=timing if passed else None
    )


def test_verify_takes_the_first_plan_that_passes_and_wins_at_every_point(monkeypatch) -> None:
    draft = Draft(
        DIMS,
        (1, 4),
        (16, 32),
        ((Plan.from_dict(HEADS), "case a"), (Plan.from_dict(ROWS), "case e")),
    )
    calls = []

    def fake(bench, plan, **kw):
        calls.append((plan.qkv, bench.config.batch_size, bench.config.seq_len))
        if plan.qkv == "packed" and bench.config.seq_len == 32 and bench.config.batch_size == 4:
            return _outcome(passed=False)
        return _outcome()

    monkeypatch.setattr("autotune.evaluate.evaluate_plan", fake)
    bucket, notes = verify_draft(VerifyJob(draft, "cpu", False))
    assert bucket is not None and bucket["plan"] == Plan.from_dict(ROWS).to_dict(full=False)
    assert [(p["batch"], p["seq"]) for p in bucket["evidence"]["points"]] == draft.points()
    assert len(notes) == 1 and "at batch 4 seq 32" in notes[0] and "case a" in notes[0]
    assert ("packed", 4, 32) in calls and calls[-1][0] == "separate"


def test_verify_refuses_a_plan_that_does_not_beat_the_reference_beyond_noise(monkeypatch) -> None:
    draft = Draft(DIMS, (1, 4), (16, 32), ((Plan.from_dict(HEADS), "case a"),))
    monkeypatch.setattr("autotune.evaluate.evaluate_plan", lambda *a, **k: _outcome(speedup=1.02))
    bucket, notes = verify_draft(VerifyJob(draft, "cpu", False))
    assert bucket is None and "does not beat the reference" in notes[0]


def _rebuilt_draft() -> Draft:
    """A rectangle whose nearest entry's plan changed; the earlier bucket's comes next."""
    return Draft(
        DIMS,
        (1, 4),
        (16, 32),
        ((Plan.from_dict(HEADS), "case a"), (Plan.from_dict(ROWS), "case e, an earlier bucket")),
    )


@pytest.mark.parametrize(("new", "kept"), [(3.1, "separate"), (3.5, "packed")])
def test_a_rebuild_keeps_the_earlier_bucket_unless_the_new_plan_beats_it(
    monkeypatch, new: float, kept: str
) -> None:
    # The new plan passes and beats the reference at every point; the earlier bucket's
    # plan (speedup 3.0) is measured at the same points and stays unless the new one is
    # faster than it beyond the noise (5%).
    calls = []

    def fake(bench, plan, **kw):
        calls.append(plan.qkv)
        return _outcome(speedup=new if plan.qkv == "packed" else 3.0)

    monkeypatch.setattr("autotune.evaluate.evaluate_plan", fake)
    draft = _rebuilt_draft()
    bucket, notes = verify_draft(VerifyJob(draft, "cpu", False))
    n = len(draft.points())
    assert calls == ["packed"] * n + ["separate"] * n
    assert bucket is not None and Plan.from_dict(bucket["plan"]).qkv == kept
    assert len(bucket["evidence"]["points"]) == n
    if kept == "separate":
        assert bucket["from"] == "case e, an earlier bucket"
        assert (
            len(notes) == 1
            and notes[0].startswith("slower: ")
            and "the earlier plan stays" in notes[0]
        )
    else:
        assert bucket["from"] == "case a" and len(notes) == 1
        assert notes[0].startswith("replaces: ") and "the new plan takes it" in notes[0]
        assert "1.17x the speed of the plan of case e, an earlier bucket" in notes[0]


@pytest.mark.parametrize("cells", [True, False])
def test_a_rebuild_splits_a_rectangle_where_each_plan_is_faster_somewhere(
    monkeypatch, cells: bool
) -> None:
    # The new plan runs 2x the earlier one's speed at the longer sequences and half of it
    # at seq 16 (session 36's batch 1132 x seq 32): a merged rectangle goes back to its
    # cells; a single cell takes the faster on the geometric mean.
    def fake(bench, plan, **kw):
        if plan.qkv == "separate":
            return _outcome(speedup=4.0)
        return _outcome(speedup=2.0 if bench.config.seq_len == 16 else 8.0)

    monkeypatch.setattr("autotune.evaluate.evaluate_plan", fake)
    d = _rebuilt_draft()
    parts = (Draft(d.dims, d.batch, (16, 20), d.plans), Draft(d.dims, d.batch, (21, 32), d.plans))
    draft = Draft(d.dims, d.batch, d.seq, d.plans, parts if cells else ())
    bucket, notes = verify_draft(VerifyJob(draft, "cpu", False))
    assert len(notes) == 1 and "slower at 1x16" in notes[0]
    if cells:
        assert bucket is None and notes[0].startswith("split: ")
    else:  # taken, and the line says where it is slower than the earlier plan
        assert bucket is not None and bucket["from"] == "case a"
        assert notes[0].startswith("replaces: ")


def test_a_rebuild_takes_the_new_plan_where_the_earlier_one_fails(monkeypatch) -> None:
    def fake(bench, plan, **kw):
        return _outcome(passed=plan.qkv == "packed")

    monkeypatch.setattr("autotune.evaluate.evaluate_plan", fake)
    bucket, notes = verify_draft(VerifyJob(_rebuilt_draft(), "cpu", False))
    assert bucket is not None and bucket["from"] == "case a"
    assert len(notes) == 1 and notes[0].startswith("wrong: ") and "earlier bucket" in notes[0]


def test_a_rebuild_verifies_the_earlier_bucket_once_where_it_comes_first(monkeypatch) -> None:
    calls = []

    def fake(bench, plan, **kw):
        calls.append(plan.qkv)
        return _outcome()

    monkeypatch.setattr("autotune.evaluate.evaluate_plan", fake)
    d = _rebuilt_draft()
    draft = Draft(d.dims, d.batch, d.seq, tuple(reversed(d.plans)))
    bucket, notes = verify_draft(VerifyJob(draft, "cpu", False))
    assert bucket is not None and bucket["from"] == "case e, an earlier bucket" and not notes
    assert calls == ["separate"] * len(draft.points())


def _bucket(plan: dict, batch=(1, 8), seq=(8, 32)) -> dict:
    return {
        "dims": list(DIMS),
        "batch": list(batch),
        "seq": list(seq),
        "plan": plan,
        "plan_hash": Plan.from_dict(plan).hash,
        "from": "case a",
        "evidence": {"points": [{"batch": 1, "seq": 8}], "failed_elements": 0},
    }


def _table(
    tmp_path: Path, buckets: list[dict], entries: dict | None = None, profile: str = "cpu"
) -> Path:
    path = tmp_path / f"{profile}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_entries(path, profile, PROVENANCE, entries if entries is not None else {}, buckets)
    return path


def test_schema_2_tables_round_trip_and_an_edited_bucket_fails_the_hash(tmp_path) -> None:
    path = _table(tmp_path, [_bucket(HEADS)])
    table = load_table(path)
    assert table.usable and table.schema == 2 and len(table.buckets) == 1
    path.write_text(path.read_text().replace("'batch': [1, 8]", "'batch': [1, 9]"))
    assert any("content hash mismatch" in p for p in load_table(path).problems)
    # Schema-1 tables (no BUCKETS) still load and verify.
    assert load_table(ROOT / "tables" / "h200.py").problems == ()


def test_an_unseen_shape_inside_a_bucket_is_served_by_its_plan(tmp_path) -> None:
    path = _table(tmp_path, [_bucket(HEADS)])
    config = select_cases("smoke-1")[0].config
    ref = build_reference(config, "cpu")
    model = DispatchedTransformer(config, table=path)
    model.load_state_dict(ref.state_dict())
    x, mask = generate_random_case(
        shape_grid("5 x 24", select_cases("smoke-1"))[0].config, "cpu", seed=3, padding_ratio=0.3
    )
    with serving():
        route = model.explain(x, mask)
        assert route.plan == Plan.from_dict(HEADS) and "bucket batch 1-8 x seq 8-32" in str(route)
        assert check_outputs(model(x, mask), ref(x, mask)).passed
        outside = torch.zeros(9, 24, 32)
        route = model.explain(outside, None)
        assert route.plan is None and "no bucket holds batch 9 x seq 24" in str(route)
        assert "gate_unseen=True) would gate the nearest plan" in str(route)


def test_a_bucket_plan_unsupported_at_the_shape_is_not_served(tmp_path) -> None:
    plan = {
        "attention": "triton",
        "fused_layer": "heads",
        "attn_precision": "fp16",
        "gemm_precision": "fp16",
    }
    path = _table(tmp_path, [_bucket(plan, seq=(8, 512))])
    model = DispatchedTransformer(select_cases("smoke-1")[0].config, table=path)
    with serving():
        route = model.explain(torch.zeros(2, 300, 32), None)
    assert route.plan is None and "its plan is unsupported here" in str(route)


def test_the_one_time_gate_serves_a_passing_plan_reports_it_and_caches_it(tmp_path) -> None:
    path = _table(tmp_path, [_bucket(HEADS)])
    cache = tmp_path / "gates.json"
    config = select_cases("smoke-1")[0].config
    ref = build_reference(config, "cpu")
    x, mask = generate_random_case(
        shape_grid("12 x 40", select_cases("smoke-1"))[0].config, "cpu", seed=5, padding_ratio=0.3
    )

    def fresh() -> DispatchedTransformer:
        m = DispatchedTransformer(config, table=path, gate_unseen=True, gate_cache=cache)
        m.load_state_dict(ref.state_dict())
        return m

    model = fresh()
    with serving():
        assert "a one-time gate checks the plan of bucket batch 1-8" in str(model.explain(x, mask))
        with pytest.warns(UserWarning, match=r"one-time gate of plan \w+ passed") as caught:
            y = model(x, mask)
        assert {w.filename for w in caught if "one-time gate" in str(w.message)} == {__file__}
        assert check_outputs(y, ref(x, mask)).passed
        assert model.last_route.plan == Plan.from_dict(HEADS)
        assert "gate on first use" in str(model.last_route) and "passed" in str(model.last_route)
        [(_key, (passed, detail))] = json.loads(cache.read_text()).items()
        assert passed and "5 padded" in detail
        again = fresh()  # another process: the verdict comes from the cache, no gate runs
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again(x, mask)
        assert again.last_route.plan == Plan.from_dict(HEADS)


def test_an_in_place_edit_is_served_with_the_new_weights_and_refresh_gates_again(
    tmp_path,
) -> None:
    path = _table(tmp_path, [_bucket(HEADS)])
    config = select_cases("smoke-1")[0].config
    ref = build_reference(config, "cpu")
    x, mask = generate_random_case(
        shape_grid("12 x 40", select_cases("smoke-1"))[0].config, "cpu", seed=5, padding_ratio=0.3
    )
    model = DispatchedTransformer(config, table=path, gate_unseen=True, watch_edits=True)
    model.load_state_dict(ref.state_dict())
    with serving(), pytest.warns(UserWarning, match=r"one-time gate of plan \w+ passed"):
        model(x, mask)
    with torch.no_grad():  # packed into the plan's QKV copy; no refresh()
        model.layers[0].attention.k_proj.weight.mul_(1.5)
    ref.load_state_dict(model.state_dict())
    with serving(), warnings.catch_warnings():
        warnings.simplefilter("error")  # the verdict is kept: no gate runs
        y = model(x, mask)  # the plan's derived weights remade before this call ran
        assert model.last_route.plan == Plan.from_dict(HEADS)
        assert check_outputs(y, ref(x, mask)).passed
    model.refresh()
    with serving(), pytest.warns(UserWarning, match=r"one-time gate of plan \w+ passed"):
        model(x, mask)  # refresh(): gated again on the weights of now


def test_an_unreadable_gate_cache_warns_at_the_callers_line_and_is_rewritten(tmp_path) -> None:
    path = _table(tmp_path, [_bucket(HEADS)])
    cache = tmp_path / "gates.json"
    cache.write_text("{not json")
    config = select_cases("smoke-1")[0].config
    ref = build_reference(config, "cpu")
    x, mask = generate_random_case(
        shape_grid("12 x 40", select_cases("smoke-1"))[0].config, "cpu", seed=5, padding_ratio=0.3
    )
    with pytest.warns(UserWarning, match="unreadable.*gating again") as built:
        model = DispatchedTransformer(config, table=path, gate_unseen=True, gate_cache=cache)
    assert {w.filename for w in built} == {__file__}
    model.load_state_dict(ref.state_dict())
    cache.write_text("[]")  # spoiled again between construction and the first call
    with serving(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model(x, mask)
    (rewritten,) = [w for w in seen if "unreadable" in str(w.message)]
    assert "rewritten with this process's verdicts" in str(rewritten.message)
    assert rewritten.filename == __file__
    [(_key, (passed, _detail))] = json.loads(cache.read_text()).items()
    assert passed


def test_a_gate_cache_that_cannot_be_a_file_is_refused_at_construction(
    tmp_path, monkeypatch
) -> None:
    """A folder, or a path in a folder that does not exist: one line at construction, not a
    warning naming a temporary file at the first gate. A write that fails later names the
    cache and the cause, and the verdict still serves."""
    path = _table(tmp_path, [_bucket(HEADS)])
    config = select_cases("smoke-1")[0].config
    for cache, says in ((tmp_path, "is a folder"), (tmp_path / "no" / "g.json", "does not exist")):
        with pytest.raises(ValueError, match=f"gate_cache .* {says}; give a JSON file's path"):
            DispatchedTransformer(config, table=path, gate_unseen=True, gate_cache=cache)
    cache = tmp_path / "gates.json"
    model = DispatchedTransformer(config, table=path, gate_unseen=True, gate_cache=cache)
    model.load_state_dict(build_reference(config, "cpu").state_dict())

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / ".gates.json.x1.tmp"))

    monkeypatch.setattr("autotune.core.files.write_atomic", full)
    x, mask = generate_random_case(
        shape_grid("12 x 40", select_cases("smoke-1"))[0].config, "cpu", seed=5
    )
    with serving(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model(x, mask)
    texts = [str(w.message) for w in seen]
    assert f"gate cache {cache} not written (No space left on device)" in " ".join(texts)
    assert not any(".tmp" in t for t in texts)
    assert model.last_route.plan == Plan.from_dict(HEADS)


def test_a_plan_failing_the_gate_is_never_served(tmp_path, monkeypatch) -> None:
    path = _table(tmp_path, [_bucket(HEADS)])
    config = select_cases("smoke-1")[0].config
    model = DispatchedTransformer(config, table=path, gate_unseen=True)
    monkeypatch.setattr(
        "autotune.build.CandidateTransformer.forward", lambda self, x, m=None: torch.zeros_like(x)
    )
    x, mask = generate_random_case(
        shape_grid("12 x 40", select_cases("smoke-1"))[0].config, "cpu", seed=5
    )
    with serving():
        with pytest.warns(UserWarning, match="FAILED"):
            y = model(x, mask)
        assert model.last_route.plan is None
        assert "one-time gate of the plan of bucket" in str(model.last_route)
        assert check_outputs(y, ReferenceTransformer.forward(model, x, mask)).passed


def test_nearest_plans_order_buckets_and_entries_by_distance() -> None:
    entries = {(64, 128, *DIMS): _entry("c", ROWS)}
    near = nearest_plans(entries, [_bucket(HEADS)], (10, 40, *DIMS))
    assert [where for _, where in near] == ["bucket batch 1-8 x seq 8-32", "case c"]
    assert shape_distance((48, 128), (64, 128)) < shape_distance((48, 128), (48, 256))
    assert find_bucket([_bucket(HEADS)], (9, 8, *DIMS)) is None


def test_export_and_buckets_commands_check_their_input(tmp_path, capsys) -> None:
    from autotune.cli.main import main

    path = _table(tmp_path, [], profile="h200")
    assert main(["buckets", "--table", str(path), "--gpu", "cpu"]) == 2
    assert "is a table for profile 'h200', not 'cpu'; pass --gpu h200" in capsys.readouterr().err
    assert main(["buckets", "--table", str(tmp_path / "none.py"), "--gpu", "cpu"]) == 2
    assert "does not exist" in capsys.readouterr().err
    # the table it would rewrite, or the file at --out, is checked before any verification
    cpu = _table(tmp_path / "cpu", [])
    cpu.write_text(cpu.read_text() + "# canary fleet\n")
    assert main(["buckets", "--table", str(cpu), "--gpu", "cpu"]) == 2
    assert "was edited by hand" in capsys.readouterr().err
    mine = tmp_path / "mine.py"
    mine.write_text("print('mine')\n")
    assert main(["buckets", "--table", str(cpu), "--gpu", "cpu", "--out", str(mine)]) == 2
    assert "is not an autotune table" in capsys.readouterr().err
    assert mine.read_text() == "print('mine')\n" and cpu.read_text().endswith("fleet\n")
    # unseen appends to its own CSV only: a file with another header is left as it was
    foreign = tmp_path / "bench.csv"
    foreign.write_text("case,verdict,table_hash\n2,PASS,abc\n")
    cpu.write_text(cpu.read_text().replace("# canary fleet\n", ""))
    argv = ["unseen", "--table", str(cpu), "--gpu", "cpu", "--count", "1", "--csv", str(foreign)]
    assert main(argv) == 2
    assert "is not a CSV that 'autotune unseen --csv' writes" in capsys.readouterr().err
    assert foreign.read_text() == "case,verdict,table_hash\n2,PASS,abc\n"
    # unseen serves the table here too: another profile's table, or no shapes, is bad input
    assert main(["unseen", "--table", str(path), "--gpu", "cpu", "--count", "2"]) == 2
    assert "is a table for profile 'h200', not 'cpu'; pass --gpu h200" in capsys.readouterr().err
    assert main(["unseen", "--table", str(path), "--gpu", "h200", "--count", "0"]) == 2
    assert "--count 0: give the number of shapes to draw, 1 or more" in capsys.readouterr().err
    assert main(["study", "--gpu", "cpu", "--cases", "2", "--shapes", "0-4 x 8"]) == 2
    assert "numbers >= 1" in capsys.readouterr().err


def test_buckets_command_verifies_on_the_cpu_and_keeps_the_entries(tmp_path, monkeypatch) -> None:
    """The command end to end on the CPU, the measurement faked (a CPU cannot promise a
    speedup): every draft verified, the entries unchanged, a new version written."""
    from autotune.cli.main import main

    entries = {k: v for k, v in ENTRIES.items() if k[2:] == DIMS}
    path = _table(tmp_path, [], entries)
    before = load_table(path)
    monkeypatch.setattr("autotune.evaluate.evaluate_plan", lambda *a, **k: _outcome())
    monkeypatch.setattr("autotune.core.isolate.call_isolated", lambda fn, job: (fn(job), ""))
    assert main(["buckets", "--table", str(path), "--gpu", "cpu"]) == 0
    after = load_table(path)
    assert after.version == before.version + 1 and dict(after.entries) == dict(before.entries)
    assert len(after.buckets) == len(draft_buckets(entries, CPU)) > 0
    assert "buckets" in after.provenance and after.usable
    assert after.provenance["buckets"]["device"] == "cpu"  # as export names it: kept later
    path.write_text(path.read_text() + "# a note\n")  # refused without --fresh (above)
    assert main(["buckets", "--table", str(path), "--gpu", "cpu", "--fresh"]) == 0
    assert "# a note" not in path.read_text() and load_table(path).usable


def test_a_buckets_run_cut_short_resumes_from_its_journal(tmp_path, monkeypatch) -> None:
    """Killed after its first verification (a device call's time limit), the command
    leaves that verification in the journal and writes no table; run again, it verifies
    only the rest, writes the same buckets as an uncut run and removes the journal. A line
    from another commit is verified again, and a torn last line is skipped."""
    from autotune.cli.main import main
    from autotune.ship.export import buckets_journal_path

    entries = {k: v for k, v in ENTRIES.items() if k[2:] == DIMS}
    path = _table(tmp_path, [], entries)
    drafts = draft_buckets(entries, CPU)
    assert len(drafts) >= 2
    calls: list[object] = []

    def evaluate(*a, **k):
        calls.append(a[0].case.config)
        return _outcome()

    class Cut(Exception):
        pass

    def isolated(fn, job):
        if len(done) == 1:  # the second rectangle: the call's time runs out
            raise Cut
        done.append(job)
        return fn(job), ""

    done: list[object] = []
    monkeypatch.setattr("autotune.evaluate.evaluate_plan", evaluate)
    monkeypatch.setattr("autotune.core.isolate.call_isolated", isolated)
    out = tmp_path / "out.py"
    with pytest.raises(Cut):
        main(["buckets", "--table", str(path), "--gpu", "cpu", "--out", str(out)])
    journal = buckets_journal_path(out)
    assert not out.exists() and len(journal.read_text().splitlines()) == 1
    first = len(calls)
    with journal.open("a") as fh:
        fh.write('{"stamp": {"commit": "other"}, "key": {}, "result": {}}\n{"stamp": {"pro')
    monkeypatch.setattr("autotune.core.isolate.call_isolated", lambda fn, job: (fn(job), ""))
    assert main(["buckets", "--table", str(path), "--gpu", "cpu", "--out", str(out)]) == 0
    resumed = load_table(out).buckets
    assert len(calls) - first == sum(len(d.points()) for d in drafts[1:])  # not the first
    assert not journal.exists()
    uncut = tmp_path / "uncut.py"
    assert main(["buckets", "--table", str(path), "--gpu", "cpu", "--out", str(uncut)]) == 0
    assert list(resumed) == list(load_table(uncut).buckets)
    journal.write_text(json.dumps({"stamp": {"commit": "other"}, "key": {}, "result": {}}) + "\n")
    stale = Journal(journal, {"commit": "this"})
    assert stale.stale == 1 and not stale.done


def test_a_buckets_run_cut_after_writing_its_table_is_finished_without_a_new_version(
    tmp_path, monkeypatch
) -> None:
    """Cut between writing the table and clearing the journal, the same command again
    takes every verification from the journal and writes the same table under the same
    version (into another path and in place), then removes the journal."""
    from autotune.cli.main import main
    from autotune.ship.buckets import Journal as JournalClass
    from autotune.ship.export import buckets_journal_path

    entries = {k: v for k, v in ENTRIES.items() if k[2:] == DIMS}
    path = _table(tmp_path, [], entries)
    calls: list[object] = []

    def evaluate(*a, **k):
        calls.append(a)
        return _outcome()

    class Cut(Exception):
        pass

    def cut(self, *a, **k):
        raise Cut

    finish = JournalClass.finish
    monkeypatch.setattr("autotune.evaluate.evaluate_plan", evaluate)
    monkeypatch.setattr("autotune.core.isolate.call_isolated", lambda fn, job: (fn(job), ""))
    out = tmp_path / "out.py"
    for command, written in (
        (["buckets", "--table", str(path), "--gpu", "cpu", "--out", str(out)], out),
        (["buckets", "--table", str(path), "--gpu", "cpu"], path),
    ):
        monkeypatch.setattr(JournalClass, "finish", cut)
        with pytest.raises(Cut):
            main(command)
        first = load_table(written)
        assert buckets_journal_path(written).exists() and first.buckets
        monkeypatch.setattr(JournalClass, "finish", finish)
        measured = len(calls)
        assert main(command) == 0
        again = load_table(written)
        assert len(calls) == measured  # nothing verified twice
        assert again.version == first.version and again.content_hash == first.content_hash
        assert not buckets_journal_path(written).exists()


def test_a_table_bucketed_into_another_path_follows_that_path_in_number(
    tmp_path, monkeypatch
) -> None:
    """A campaign's table promoted over the shipped one (``buckets --table campaign.py
    --out tables/h200.py``) takes the next version of the shipped table, not of its own."""
    from autotune.cli.main import main

    entries = {k: v for k, v in ENTRIES.items() if k[2:] == DIMS}
    campaign = _table(tmp_path / "campaign", [], entries)  # version 1
    shipped = tmp_path / "shipped.py"
    for i in range(3):  # versions 1-3, each with other content
        write_entries(shipped, "cpu", {**PROVENANCE, "n": i}, {}, [])
    assert load_table(shipped).version == 3 and load_table(campaign).version == 1
    monkeypatch.setattr("autotune.evaluate.evaluate_plan", lambda *a, **k: _outcome())
    monkeypatch.setattr("autotune.core.isolate.call_isolated", lambda fn, job: (fn(job), ""))
    assert main(["buckets", "--table", str(campaign), "--gpu", "cpu", "--out", str(shipped)]) == 0
    after = load_table(shipped)
    assert after.version == 4 and dict(after.entries) == dict(load_table(campaign).entries)
    assert load_table(campaign).version == 1  # the source is left as it was


@pytest.mark.parametrize(
    ("outcome", "verdict", "code"),
    [
        (_outcome(), "holds", 0),
        (_outcome(passed=False), "WRONG", 1),
        (_outcome(speedup=1.0), "no longer wins", 0),
    ],
)
def test_validate_checks_every_bucket_again(
    tmp_path, monkeypatch, capsys, outcome, verdict, code
) -> None:
    from autotune.cli.main import main

    path = _table(tmp_path, [_bucket(HEADS)])
    monkeypatch.setattr("autotune.evaluate.evaluate_plan", lambda *a, **k: outcome)
    monkeypatch.setattr("autotune.core.isolate.call_isolated", lambda fn, job: (fn(job), ""))
    out = tmp_path / "here.py"
    assert (
        main(["validate", "--table", str(path), "--gpu", "cpu", "--quick", "--out", str(out)])
        == code
    )
    text = capsys.readouterr().out
    assert f"bucket d_model 32, 2 heads, FFN 64, 2 layers: batch 1-8 x seq 8-32: {verdict}" in text
    assert len(load_table(out).buckets) == (1 if verdict == "holds" else 0)


def test_unseen_draws_shapes_outside_the_table_and_summarises_honestly() -> None:
    from autotune.tools.unseen import draw_shapes, summary

    base = select_cases("smoke-1")[0]
    table_keys = {(b, s, *DIMS) for b in range(1, 5) for s in range(8, 20)}
    shapes = draw_shapes(base, 20, (1, 8), (8, 64), 0, table_keys)
    assert len(set(shapes)) == 20 and not {(b, s, *DIMS) for b, s in shapes} & table_keys
    assert shapes == draw_shapes(base, 20, (1, 8), (8, 64), 0, table_keys)  # seeded
    with pytest.raises(ValueError, match="only 3 shapes in batch 1-2 x seq 8-9"):
        draw_shapes(base, 4, (1, 2), (8, 9), 0, {(1, 8, *DIMS)})
    rows = [
        {
            "served": "yes",
            "speedup": 4.0,
            "failed_elements": 0,
            "vs_tuned": 0.9,
            "sync_free": "yes",
        },
        {"served": "yes", "speedup": 1.0, "failed_elements": 0, "vs_tuned": "", "sync_free": "no"},
        {"served": "no", "speedup": 1.0, "failed_elements": 3, "vs_tuned": 0.5, "sync_free": ""},
    ]
    line = summary(rows)
    assert "2 of 3 unseen shapes (67%) served" in line and "geometric mean 2.00x" in line
    assert "3 failed elements" in line and "median 0.70x" in line
    assert "1 served shapes synchronise per call" in line
    # Nothing served: the reference timed against itself is noise, said so; a shape that
    # errored has no time (no key in a run, "" read back from its CSV) and is counted.
    left = [
        {"served": "error", "failed_elements": 0},
        {"served": "no", "speedup": "", "failed_elements": 0},
        {"served": "no", "speedup": "1.02", "failed_elements": 0},
    ]
    assert "no speedups: 1 shape(s) errored, the rest ran on the reference (timed against " \
        "itself: 1.02x, the noise)" in summary(left)  # fmt: skip


def test_a_refused_table_never_gates(tmp_path) -> None:
    path = _table(tmp_path, [_bucket(HEADS)])
    path.write_text(path.read_text().replace("'commit': 'test'", "'commit': 'edited'"))
    model = DispatchedTransformer(select_cases("smoke-1")[0].config, table=path, gate_unseen=True)
    x = torch.randn(12, 40, 32)
    with serving(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model(x, None)
    assert model.last_route.plan is None and "table refused" in str(model.last_route)
    assert not any("one-time gate" in str(w.message) for w in seen)
    (refused,) = [w for w in seen if "refused, the reference serves" in str(w.message)]
    assert refused.filename == __file__  # the caller's line


def test_new_weights_are_gated_again(tmp_path) -> None:
    path = _table(tmp_path, [_bucket(HEADS)])
    config = select_cases("smoke-1")[0].config
    model = DispatchedTransformer(config, table=path, gate_unseen=True)
    x = torch.randn(12, 40, 32)
    with serving():
        with pytest.warns(UserWarning, match="passed"):
            model(x, None)
        model(x, None)  # the verdict holds: no gate
        model.load_state_dict(build_reference(config, "cpu").state_dict())  # other weights
        with pytest.warns(UserWarning, match="passed"):
            model(x, None)


def test_no_bucket_near_a_shape_where_the_reference_kept_its_entry() -> None:
    entries = dict(ENTRIES)
    entries[(4, 128, *DIMS)] = {"admitted": False, "case": "b", "plan": {}, "evidence": {}}
    entries[(64, 32, *DIMS)] = _entry("d", dict(HEADS, compile="default"))
    drafts = draft_buckets(entries, CPU, reasons=_short_only)
    for d in drafts:
        assert not d.batch[0] <= 4 <= d.batch[1] or not d.seq[0] <= 128 <= d.seq[1]
        assert all(p.compile == "none" for p, _ in d.plans)
    assert any(d.batch[0] <= 1 <= d.batch[1] and d.seq[0] <= 128 <= d.seq[1] for d in drafts)


def test_export_keeps_buckets_verified_on_this_stack() -> None:
    from types import SimpleNamespace

    from autotune.ship.export import kept_buckets

    made = {"device": "cpu", "versions": {"torch": "2.13.0", "triton": "3.9.0"}}
    other = (8, 8, 16, 2, 16, 1, True, "float32")
    old = SimpleNamespace(
        buckets=[_bucket(HEADS), dict(_bucket(ROWS), dims=list(other))],
        entries={(1, 8, *DIMS): _entry("a", HEADS), (8, 8, *other[2:]): _entry("x", ROWS)},
        provenance={"buckets": made},
    )
    here = {"device": {"name": "cpu"}, "versions": {"torch": "2.13.1", "triton": "3.9.0"}}
    lines: list[str] = []
    same = dict(old.entries)
    prov = dict(here)
    assert len(kept_buckets(old, same, prov, lines.append)) == 2 and prov["buckets"] == made
    # A plan changed in DIMS: its bucket is still verified, so it stays, with a note.
    changed = dict(same) | {(1, 8, *DIMS): _entry("a", ROWS)}
    assert kept_buckets(old, changed, dict(here), lines.append) == old.buckets
    assert lines[-2].startswith("1 bucket(s) are of dims whose entries changed plan: kept")
    # An entry the reference serves now (its plan failed re-verification): its dims'
    # buckets go.
    demoted = dict(same) | {(1, 8, *DIMS): dict(_entry("a", HEADS), admitted=False)}
    assert [b["dims"] for b in kept_buckets(old, demoted, dict(here), lines.append)] == [
        list(other)
    ]
    assert "served by the reference now" in lines[-2]
    newer = {"device": {"name": "cpu"}, "versions": {"torch": "2.14.0", "triton": "3.9.0"}}
    assert kept_buckets(old, same, newer, lines.append) == []
    assert "rebuild them with --buckets" in lines[-1]


def test_captured_forwards_are_dropped_least_recently_used_first(monkeypatch) -> None:
    import autotune.build as build

    class Fake:
        def __init__(self, fn, x, mask) -> None:
            self.shape = tuple(x.shape)

        def replay(self, x, mask):
            return x

    monkeypatch.setattr(build, "_CapturedForward", Fake)
    cand = build.CandidateTransformer(select_cases("smoke-1")[0].config, Plan(), CPU)
    monkeypatch.setattr(cand, "MAX_GRAPH_SHAPES", 2)
    a, b, c = torch.zeros(1, 4, 32), torch.zeros(2, 4, 32), torch.zeros(3, 4, 32)
    for x in (a, b, a, c):
        cand._graph_forward(x, None, "none", [])
    assert [g.shape for g in cand._graphs.values()] == [(1, 4, 32), (3, 4, 32)]


def test_cells_the_reference_cannot_verify_whole_are_cut_to_what_it_can(monkeypatch) -> None:
    import autotune.ship.buckets as sb

    monkeypatch.setattr(sb, "_fits", lambda dims, b, s, device: b * s <= 64 * 300)
    drafts = draft_buckets(ENTRIES, CPU, reasons=_short_only)
    assert all(d.batch[1] * d.seq[1] <= 64 * 300 for d in drafts)
    long = next(d for d in drafts if d.seq[1] == 1024)
    assert long.batch == (1, 18)


def test_a_rectangle_no_plan_holds_across_is_verified_cell_by_cell(monkeypatch) -> None:
    from autotune.ship.buckets import build_buckets

    def fake(bench, plan, **kw):  # every plan fails at batch 64 seq 256: only that corner
        big = bench.config.batch_size == 64 and bench.config.seq_len == 256
        return _outcome(passed=not big)

    monkeypatch.setattr("autotune.evaluate.evaluate_plan", fake)
    monkeypatch.setattr(
        "autotune.ship.buckets.draft_buckets",
        lambda entries, device, earlier=(): draft_buckets(
            entries, device, reasons=_short_only, earlier=earlier
        ),
    )
    lines: list[str] = []
    buckets = build_buckets(ENTRIES, "cpu", False, CPU, isolate=False, emit=lines.append)
    spans = {(tuple(b["batch"]), tuple(b["seq"])) for b in buckets}
    assert ((1, 64), (32, 256)) not in spans  # the merged rectangle failed at its corner
    assert ((1, 2), (32, 64)) in spans and ((3, 16), (65, 256)) in spans  # its cells hold
    assert not any(b["batch"][1] == 64 and b["seq"][1] == 256 for b in buckets)
    assert any("cells next" in line for line in lines)


def test_report_shows_buckets_and_the_unseen_shapes_of_this_table(tmp_path) -> None:
    from autotune.tools.report import write_report
    from autotune.tools.unseen import append_row

    table = load_table(_table(tmp_path, [_bucket(HEADS)]))
    csv_path = tmp_path / "unseen.csv"
    for b, s, served, speedup in ((2, 20, "yes", 3.0), (12, 40, "no", 1.0)):
        append_row(csv_path, {"batch": b, "seq": s, "served": served, "speedup": speedup,
                              "failed_elements": 0, "table_hash": table.content_hash})  # fmt: skip
    append_row(csv_path, {"batch": 3, "seq": 9, "served": "yes", "speedup": 9.0,
                          "failed_elements": 5, "table_hash": "another table"})  # fmt: skip
    path = write_report(profile="cpu", studies=[], table=table, bench_csv=None,
                        out_dir=tmp_path / "rep", command="test", unseen_csv=csv_path)  # fmt: skip
    text = path.read_text()
    assert "## Buckets (shapes without an entry)" in text and "| 1-8 " in text
    assert "1 of 2 unseen shapes (50%) served" in text and "0 failed elements" in text
    assert (tmp_path / "rep" / "unseen.png").stat().st_size > 0


def test_a_report_cut_short_leaves_the_old_report_and_figures_together(
    tmp_path, monkeypatch
) -> None:
    import errno

    from autotune.tools import report
    from autotune.tools.unseen import append_row

    table = load_table(_table(tmp_path, [_bucket(HEADS)]))
    csv_path = tmp_path / "unseen.csv"
    row = {"served": "yes", "speedup": 3.0, "failed_elements": 0, "table_hash": table.content_hash}
    append_row(csv_path, {"batch": 2, "seq": 20, **row})
    rep = tmp_path / "rep"
    kwargs = dict(profile="cpu", studies=[], table=table, bench_csv=None, out_dir=rep,
                  command="test", unseen_csv=csv_path)  # fmt: skip
    report.write_report(**kwargs)
    before = {p.name: p.read_bytes() for p in rep.iterdir()}
    append_row(csv_path, {"batch": 12, "seq": 40, **row})  # a new figure, a new page

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(report, "write_atomic", full)  # report.md, written last, fails
    with pytest.raises(OSError):
        report.write_report(**kwargs)
    assert {p.name: p.read_bytes() for p in rep.iterdir()} == before  # no new figure either
    monkeypatch.undo()
    report.write_report(**kwargs)
    after = {p.name: p.read_bytes() for p in rep.iterdir()}
    assert after.keys() == before.keys() and after["unseen.png"] != before["unseen.png"]


def test_a_rectangle_whose_process_died_is_tried_cell_by_cell(monkeypatch) -> None:
    from autotune.ship.buckets import build_buckets

    monkeypatch.setattr("autotune.evaluate.evaluate_plan", lambda *a, **k: _outcome())
    monkeypatch.setattr(
        "autotune.ship.buckets.draft_buckets",
        lambda entries, device, earlier=(): draft_buckets(
            entries, device, reasons=_short_only, earlier=earlier
        ),
    )

    def isolated(fn, job):  # a merged rectangle's child dies (a device fault)
        return (None, "exit code -11") if job.draft.cells else (fn(job), "")

    monkeypatch.setattr("autotune.core.isolate.call_isolated", isolated)
    buckets = build_buckets(ENTRIES, "cpu", False, CPU, emit=lambda line: None)
    spans = {(tuple(b["batch"]), tuple(b["seq"])) for b in buckets}
    assert ((1, 2), (32, 64)) in spans and ((1, 64), (32, 256)) not in spans
    assert all(b["batch"][0] != b["batch"][1] or b["seq"][0] != b["seq"][1] for b in buckets)


def test_unseen_records_what_served_each_shape_with_and_without_the_gate(tmp_path) -> None:
    from autotune.tools.unseen import run_unseen

    path = _table(tmp_path, [_bucket(HEADS, batch=(1, 4), seq=(8, 64))])
    base = select_cases("smoke-1")[0]
    common = dict(count=3, batch=(1, 6), seq=(8, 64), seed=0, storage_url=None, isolate=False)
    plain = run_unseen(str(path), base, "cpu", False, csv_path=None, **common, emit=print)
    gated = run_unseen(str(path), base, "cpu", False, csv_path=tmp_path / "g.csv",
                       gate_unseen=True, **common, emit=print)  # fmt: skip
    outside = [i for i, r in enumerate(plain) if r["served"] == "no"]
    assert outside, "the draw has a shape outside the bucket"
    for i in outside:
        assert "gate on first use" in gated[i]["source"] and gated[i]["served"] == "yes"
    assert all(r["failed_elements"] == 0 for r in plain + gated)
    assert len(load_table(path).buckets) == 1  # the table is never written


def test_buckets_write_nothing_over_a_table_that_changed_while_they_were_verified(
    tmp_path, monkeypatch, capsys
) -> None:
    """The table (default --out) was read as the run began and rewritten at its end: an
    export that wrote it meanwhile lost its entries."""
    from autotune.cli.main import main

    entries = {k: v for k, v in ENTRIES.items() if k[2:] == DIMS}
    path = _table(tmp_path, [], entries)
    monkeypatch.setattr("autotune.evaluate.evaluate_plan", lambda *a, **k: _outcome())
    monkeypatch.setattr("autotune.core.isolate.call_isolated", lambda fn, job: (fn(job), ""))
    newer = path.read_text().replace("# Generated", "# Generated again", 1)
    import autotune.ship.buckets as buckets_mod

    real = buckets_mod.build_buckets

    def build(*args, **kwargs):  # type: ignore[no-untyped-def]
        path.write_text(newer)  # another run writes the table meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(buckets_mod, "build_buckets", build)
    assert main(["buckets", "--table", str(path), "--gpu", "cpu"]) == 2
    assert f"--out {path} changed while buckets ran" in capsys.readouterr().err
    assert path.read_text() == newer
