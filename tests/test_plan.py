from __future__ import annotations

import json
import re

import pytest

from autotune.plan import KNOBS, REFERENCE_PLAN, Plan, parse_plan


def test_partial_json_takes_reference_choices_for_the_rest() -> None:
    plan = Plan.from_json('{"attention": "sdpa_math", "qkv": "packed"}')
    assert plan.attention == "sdpa_math" and plan.qkv == "packed"
    assert plan.heads == REFERENCE_PLAN.heads and plan.cuda_graph is False


def test_plan_round_trips_through_json_and_is_hashable() -> None:
    plan = Plan(attention="sdpa_flash", attn_precision="fp16", batch_chunk=4, cuda_graph=True)
    assert Plan.from_json(plan.to_json()) == plan
    assert Plan.from_json(plan.to_json(full=True)) == plan
    assert {plan: 1}[Plan.from_dict(plan.to_dict())] == 1


def test_hash_is_stable_and_ignores_knobs_left_at_the_default() -> None:
    a = Plan.from_json('{"qkv": "packed"}')
    b = Plan.from_json('{"qkv": "packed", "heads": "contiguous"}')
    assert a.hash == b.hash and len(a.hash) == 12
    assert a.hash != REFERENCE_PLAN.hash
    # Pinned: a plan's hash must not drift between versions of the code.
    assert REFERENCE_PLAN.hash == "44136fa355b3"


def test_unknown_knob_is_refused_with_the_nearest_name_and_where_the_list_is() -> None:
    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['tile'\]; run 'autotune knobs'"):
        Plan.from_json('{"tile": 64}')
    with pytest.raises(ValueError, match=r"'atention' \(did you mean 'attention'\?\)"):
        parse_plan("atention=sdpa_flash")


def test_a_retired_knob_at_its_default_reads_as_the_plan_without_it() -> None:
    """studies.db holds session 26's trials with attn_ws=false (the knob was removed after
    them): they read as the same plan, same hash; a retired knob set otherwise is refused."""
    stored = {"attention": "triton", "attn_ws": False, "qkv": "packed"}
    plan = Plan.from_dict(stored)
    assert plan == Plan.from_json('{"attention": "triton", "qkv": "packed"}')
    assert "attn_ws" not in plan.to_dict() and plan.hash == Plan.from_dict(plan.to_dict()).hash
    with pytest.raises(ValueError, match=r"attn_ws=True was removed \(session 26.*drop the key"):
        Plan.from_dict(dict(stored, attn_ws=True))


def test_unknown_value_is_refused_with_the_valid_values() -> None:
    with pytest.raises(ValueError, match='valid values: "reference", "sdpa_math"'):
        Plan.from_json('{"attention": "magic"}')
    with pytest.raises(ValueError, match="integer"):
        Plan.from_json('{"batch_chunk": -1}')
    with pytest.raises(ValueError, match="cuda_graph"):
        Plan.from_json('{"cuda_graph": "yes"}')


def test_parse_plan_accepts_reference_json_and_files(tmp_path) -> None:
    assert parse_plan("reference") == REFERENCE_PLAN
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"mask": "elide"}))
    assert parse_plan(f"@{f}").mask == "elide"
    with pytest.raises(ValueError, match="does not exist"):
        parse_plan("@/nonexistent/plan.json")
    with pytest.raises(ValueError, match="neither JSON nor knob=value pairs; write e"):
        parse_plan("{attention:")
    with pytest.raises(ValueError, match="plan token 'qkv': write knob=value"):
        parse_plan("attention=sdpa_flash qkv")


def test_a_plan_file_that_is_not_a_plan_is_named_not_quoted(tmp_path) -> None:
    """The error named the file's contents; it names the file, and '@' alone names none."""
    f = tmp_path / "bad.json"
    f.write_text("{ not json at all")
    with pytest.raises(ValueError, match=re.escape(f"plan file '{f}' is neither JSON nor")):
        parse_plan(f"@{f}")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match=r"bin\.json' cannot be read"):
        parse_plan(f"@{tmp_path / 'bin.json'}")
    with pytest.raises(ValueError, match="plan '@' names no file"):
        parse_plan("@")


def test_parse_plan_reads_back_the_form_every_command_prints(tmp_path) -> None:
    """``describe`` (what study, export, bench and compare print) parses to the same plan,
    for every value of every knob."""
    checked = 0
    for knob in KNOBS:
        values = knob.int_range if knob.int_range is not None else knob.choices
        for value in values:
            try:
                plan = Plan.from_dict({knob.name: value})
            except ValueError:  # a value its own knob's rules refuse alone
                continue
            assert parse_plan(plan.describe()) == plan, plan.describe()
            checked += 1
    assert checked > 2 * len(KNOBS)
    mixed = Plan.from_dict({"attention": "sdpa_cudnn", "cuda_graph": True, "attn_drop_bits": 2})
    assert parse_plan(mixed.describe()) == mixed
    with pytest.raises(ValueError, match="knob 'attention' has no value 'flash'"):
        parse_plan("attention=flash")
    with pytest.raises(ValueError, match="sets qkv twice"):
        parse_plan("qkv=packed qkv=separate")
    # a retired knob at its default reads as in JSON (dropped); a file may hold either form
    assert parse_plan("attn_ws=False qkv=packed") == Plan(qkv="packed")
    path = tmp_path / "plan.txt"
    path.write_text("attention=sdpa_cudnn qkv=packed\n")
    assert parse_plan(f"@{path}") == Plan(attention="sdpa_cudnn", qkv="packed")


def test_every_knob_default_is_the_plan_default() -> None:
    full = REFERENCE_PLAN.to_dict()
    assert [k.name for k in KNOBS] == list(full)
    for knob in KNOBS:
        assert full[knob.name] == knob.default
