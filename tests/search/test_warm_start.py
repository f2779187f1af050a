"""Warm starts from a table file: the likeliest winners are measured first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def test_a_plan_file_warm_start_comes_first_in_the_order_given(tmp_path) -> None:
    plan = {"attention": "triton", "attn_precision": "fp16", "cuda_graph": True,
            "fused_layer": "rows", "gemm_precision": "fp16", "row_block": 64,
            "mask_bounds": True}  # fmt: skip
    f = tmp_path / "p.json"
    f.write_text(json.dumps(plan))
    key = get_case("13").key.as_tuple()
    plans = warm_start_plans([f"@{f}", TABLE], None, "h200", near=key)
    assert plans[0] == (Plan.from_dict(plan), f"plan {f}")
    assert plans[1][0] == _entry_plan(key)
    with pytest.raises(ValueError, match="does not exist"):
        warm_start_plans([f"@{tmp_path / 'nope.json'}"], None, "h200")


def test_a_resumed_study_measures_a_new_warm_start_plan_once() -> None:
    import optuna

    from autotune.search.space import builtin_spaces, select_space
    from autotune.search.study import enqueue_defaults

    space = select_space("cpu", get_case("smoke-1"), builtin_spaces())
    study = optuna.create_study(directions=["minimize", "minimize"])

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        trial.set_user_attr("plan_hash", space.sample(trial).hash)
        return 1.0, 1.0

    assert enqueue_defaults(study, space, "tpe") >= 1  # the reference and the defaults
    study.optimize(objective, n_trials=len(study.trials))
    measured = {t.user_attrs["plan_hash"] for t in study.trials}
    fresh = next(p for p in space.enumerate() if p.hash not in measured)
    old = next(p for p in space.enumerate() if p.hash in measured)
    # A rerun's warm start is queued (a measured plan is not); the defaults are not again.
    assert enqueue_defaults(study, space, "tpe", [(old, "plan a"), (fresh, "plan b")]) == 1
    assert enqueue_defaults(study, space, "tpe", [(fresh, "plan b")]) == 0  # queued already
    study.optimize(objective, n_trials=1)
    last = study.trials[-1]
    assert last.user_attrs["plan_hash"] == fresh.hash and last.user_attrs["warm_start"] == "plan b"
    assert enqueue_defaults(study, space, "tpe", [(fresh, "plan b")]) == 0  # measured
    # A queued warm-start plan pruned before it was measured is queued again on a rerun.
    other = next(p for p in space.enumerate() if p.hash not in measured | {fresh.hash})
    assert enqueue_defaults(study, space, "tpe", [(other, "plan c")]) == 1
    study.optimize(lambda t: (_ for _ in ()).throw(optuna.TrialPruned()), n_trials=1)
    assert study.trials[-1].state == optuna.trial.TrialState.PRUNED
    assert enqueue_defaults(study, space, "tpe", [(other, "plan c")]) == 1


def test_a_full_study_still_measures_the_plans_named_by_file(tmp_path) -> None:
    """A rerun with --warm-start @PLAN.json on a study that has its --n-trials already
    measures the named plans (session 37: case 2's overlays sat queued behind a full
    study, and the export chose among the old trials)."""
    import optuna

    from autotune.core.profiles import select_profile
    from autotune.search import trials
    from autotune.search.space import parse_space
    from autotune.search.study import run_case_study

    space = parse_space(
        {
            "name": "named",
            "profiles": ["cpu"],
            "regimes": ["*"],
            "params": [
                {"name": "attention", "values": ["reference", "sdpa_math"]},
                {"name": "qkv", "values": ["separate", "packed"]},
            ],
        },
        "test",
    )
    storage = f"sqlite:///{tmp_path / 's.db'}"
    run = dict(storage=storage, n_trials=1, isolate=False)
    case = get_case("smoke-1")
    first = run_case_study(select_profile("cpu"), case, space, **run)
    study = optuna.load_study(study_name=first.name, storage=storage)
    measured = {t.user_attrs[trials.PLAN_HASH] for t in study.get_trials(deepcopy=False)}
    fresh = [p for p in space.enumerate() if p.hash not in measured][:2]
    named = [(p, f"plan p{i}.json") for i, p in enumerate(fresh)]
    again = run_case_study(select_profile("cpu"), case, space, warm=named, **run)
    assert again.new_trials == 2 and trials.completed_trials(study) == 3
    hashes = {t.user_attrs[trials.PLAN_HASH] for t in study.get_trials(deepcopy=False)}
    assert {p.hash for p in fresh} <= hashes
    # Plans from a table or a study seed a study; they do not extend a full one.
    rest = [p for p in space.enumerate() if p.hash not in hashes][:1]
    last = run_case_study(select_profile("cpu"), case, space, warm=[(rest[0], "table t")], **run)
    assert last.new_trials == 0


def test_a_named_plan_outside_the_space_is_reported_not_dropped_silently(capsys) -> None:
    import optuna

    from autotune.search.space import builtin_spaces, select_space
    from autotune.search.study import enqueue_defaults

    space = select_space("cpu", get_case("smoke-1"), builtin_spaces())
    study = optuna.create_study(directions=["minimize", "minimize"])
    outside = Plan.from_dict({"attention": "triton", "fused_layer": "heads"})  # GPU only
    assert enqueue_defaults(study, space, "tpe", [(outside, "plan x.json")]) >= 1
    err = capsys.readouterr().err
    assert "--warm-start x.json: outside the space" in err and "not measured" in err


def test_a_table_warm_start_says_how_many_of_its_plans_lie_outside_the_space(capsys) -> None:
    """A table's plans outside the space (an anchor export shipped, GPU-only plans on the
    CPU) are not measured; the run says how many, once per table."""
    import optuna

    from autotune.search.space import builtin_spaces, select_space
    from autotune.search.study import enqueue_defaults

    space = select_space("cpu", get_case("smoke-1"), builtin_spaces())
    study = optuna.create_study(directions=["minimize", "minimize"])
    plans = [
        (Plan.from_dict({"attention": "sdpa_auto"}), "table t.py"),  # an anchor's plan
        (Plan.from_dict({"attention": "triton", "fused_layer": "heads"}), "table t.py"),
        (Plan.from_dict({"qkv": "packed"}), "table t.py"),
    ]
    enqueue_defaults(study, space, "tpe", plans)
    err = capsys.readouterr().err
    assert "--warm-start t.py: 2 of its 3 plans lie outside the space 'cpu', not measured" in err
