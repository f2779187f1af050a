from __future__ import annotations

import dataclasses
import itertools
import json

import optuna
import pytest

from autotune.core.cases import get_case
from autotune.plan import REFERENCE_PLAN, Plan
from autotune.search.space import available_spaces, builtin_spaces, parse_space, select_space


def _space(**over):
    data = {
        "name": "t",
        "profiles": ["cpu"],
        "regimes": ["*"],
        "params": [
            {
                "name": "attention",
                "variants": [{"attention": "reference"}, {"attention": "sdpa_math"}],
            },
            {"name": "qkv", "values": ["separate", "packed"]},
            {"name": "attn_block_m", "values": [32, 64], "when": {"attention": ["sdpa_math"]}},
        ],
        "restrictions": [{"forbid": {"attention": ["reference"], "qkv": ["packed"]}}],
        "enqueue": [{}],
    }
    data.update(over)
    return parse_space(data, "test")


def test_enumerate_applies_conditions_and_restrictions() -> None:
    plans = list(_space().enumerate())
    # reference x separate (packed forbidden) + sdpa_math x {separate, packed} x {32, 64}
    assert len(plans) == 1 + 4
    assert Plan(attention="reference", qkv="packed") not in plans
    assert all(p.attn_block_m == 64 for p in plans if p.attention == "reference")


def test_sampling_asks_conditional_params_only_when_they_apply() -> None:
    space = _space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(20):
        trial = study.ask()
        plan = space.sample(trial)
        assert ("attn_block_m" in trial.params) == (plan.attention == "sdpa_math")
        study.tell(trial, 0.0)


def test_params_for_round_trips_every_plan_of_the_space() -> None:
    space = _space()
    for plan in space.enumerate():
        fixed = optuna.trial.FixedTrial(space.params_for(plan))
        assert space.sample(fixed) == plan
    with pytest.raises(ValueError, match="outside space"):
        parse_space(
            {
                "name": "x",
                "params": [{"name": "qkv", "values": ["separate"]}],
                "enqueue": [{"qkv": "packed"}],
            },
            "test",
        )


def test_bad_spaces_are_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="unknown knob 'tiles'"):
        _space(params=[{"name": "tiles", "values": [1]}])
    with pytest.raises(ValueError, match="has no value"):
        _space(params=[{"name": "qkv", "values": ["triple"]}])
    with pytest.raises(ValueError, match="unknown fields"):
        _space(colour="red")


def test_hash_changes_with_content_and_builtins_select_by_profile_and_regime() -> None:
    assert _space().content_hash != _space(regimes=["mid"]).content_hash
    spaces = builtin_spaces()
    assert select_space("cpu", get_case("smoke-1"), spaces).name == "cpu"
    assert select_space("h200", get_case("1"), spaces).name == "gpu"
    assert select_space("h200", get_case("6"), spaces).name == "gpu-capacity"
    assert select_space("h200", get_case("14"), spaces).name == "gpu-long"
    for s in spaces:  # the reference is enqueued first, except where it cannot run
        if "infeasible-dense" not in s.regimes:
            assert REFERENCE_PLAN in set(s.enqueue) or s.enqueue[0] == REFERENCE_PLAN


def test_a_user_space_file_overrides_the_builtin(tmp_path) -> None:
    f = tmp_path / "mine.json"
    f.write_text(
        json.dumps(
            {
                "name": "mine",
                "profiles": ["cpu"],
                "regimes": ["*"],
                "params": [{"name": "qkv", "values": ["separate", "packed"]}],
            }
        )
    )
    spaces = available_spaces([str(f)])
    assert select_space("cpu", get_case("smoke-2"), spaces).name == "mine"


@pytest.mark.parametrize("name", [s.name for s in builtin_spaces()])
def test_builtin_spaces_ask_knob_values_and_round_trip_every_plan(name) -> None:
    """Variant parameters are asked knob by knob (``attention``, then e.g.
    ``attn_precision (attention=triton)``): every Optuna parameter value is a knob value,
    and every plan of the space is reached from its parameters."""
    from autotune.plan import KNOBS_BY_NAME

    (space,) = [s for s in builtin_spaces() if s.name == name]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    sampled = []
    for _ in range(40):
        trial = study.ask()
        plan = space.sample(trial)
        for param, value in trial.params.items():
            knob = param.split(" (", 1)[0]
            assert KNOBS_BY_NAME[knob].validate(value) == value, (param, value)
            assert getattr(plan, knob) == value
        study.tell(trial, 0.0)
        sampled.append(plan)
    # The first 20,000 plans of the enumeration (the long space holds millions) and the
    # 40 random ones: each reached again from its parameters.
    plans = list(itertools.islice(space.enumerate(), 20_000))
    for plan in plans + sampled:
        assert space.sample(optuna.trial.FixedTrial(space.params_for(plan))) == plan
    assert len({p.hash for p in plans}) == len(plans)


def test_a_space_larger_than_n_is_told_without_counting_it() -> None:
    space = _space()
    size = space.size()
    assert space.larger_than(size - 1) and not space.larger_than(size)
    (long,) = [s for s in builtin_spaces() if s.name == "gpu-long"]
    assert long.larger_than(100_000)  # answered from the first 100,001 plans


def test_a_plan_matching_no_variant_is_refused() -> None:
    space = _space()
    with pytest.raises(ValueError, match="variant"):
        space.params_for(Plan(attention="sdpa_flash"))


def test_the_gpu_space_is_sync_free_and_compiles_only_library_attention() -> None:
    from autotune.build import GRAPHED_COMPILE_MODES

    (space,) = [s for s in builtin_spaces() if s.name == "gpu"]
    # Every plan, but with the kernels' own tile and register knobs at their defaults: they
    # touch nothing checked here, and with them the space has millions of plans (8 minutes
    # to walk on a CI core). The knobs kept decide the execution, masks and tiles below.
    tile_knobs = {
        "attn_head_chunk", "attn_block_n", "attn_warps", "attn_stages", "row_block",
        "row_warps", "row_ffn_block", "ffn_gelu", "row_fold_residual", "row_qkv_stages",
        "attn_maxnreg", "pdl_trigger",
    }  # fmt: skip
    assert tile_knobs < {p.name for p in space.params}
    reduced = dataclasses.replace(
        space, params=tuple(p for p in space.params if p.name not in tile_knobs)
    )
    plans = list(reduced.enumerate())
    assert not any(p.reads_mask_on_host for p in plans)  # export would not ship them
    compiled = [p for p in plans if p.compile != "none"]
    assert {p.compile for p in compiled} == {"default", "reduce-overhead"}
    assert {p.attention for p in compiled} == {
        "sdpa_auto",
        "sdpa_efficient",
        "sdpa_flash",
        "sdpa_cudnn",
    }
    assert not any(p.cuda_graph for p in compiled if p.compile in GRAPHED_COMPILE_MODES)
    assert not any(p.uses_triton for p in compiled)
    for plan in space.enqueue:  # every prior is a plan of the space, as written
        assert space.sample(optuna.trial.FixedTrial(space.params_for(plan))) == plan
    # no 128-row tile of the fused heads layer or fused block (they miscompile on CUDA);
    # mask bounds only for the rows variant
    assert not any(
        p.attn_block_m == 128 and (p.fused_layer == "heads" or p.fused_block) for p in plans
    )
    assert {p.fused_layer for p in plans if p.mask_bounds} == {"rows"}
    assert any(p.fused_layer == "rows" and p.attn_block_m == 128 for p in plans)
    # 16-row query tiles only in the fused heads layer (session 37: case 2's winner)
    assert {(p.fused_layer, p.fused_block) for p in plans if p.attn_block_m == 16} == {
        ("heads", False)
    }


def test_plans_the_device_refuses_cost_no_trial(tmp_path) -> None:
    """A plan the support rules refuse on this case and device is recorded (the sampler
    learns) but not run and not counted: the study still measures --n-trials plans."""
    from autotune.core.cases import get_case
    from autotune.core.profiles import select_profile
    from autotune.search import trials
    from autotune.search.space import parse_space
    from autotune.search.study import run_case_study

    space = parse_space(
        {
            "name": "refused",
            "profiles": ["cpu"],
            "regimes": ["*"],
            "params": [
                {"name": "attention", "values": ["reference", "sdpa_math"]},
                {"name": "cuda_graph", "values": [False, True]},  # needs CUDA: refused here
            ],
            "enqueue": [{"cuda_graph": True}, {"attention": "sdpa_math", "cuda_graph": True}],
        },
        "test",
    )
    summary = run_case_study(
        select_profile("cpu"),
        get_case("smoke-1"),
        space,
        storage=f"sqlite:///{tmp_path / 's.db'}",
        n_trials=2,
        isolate=False,
    )
    study = optuna.load_study(study_name=summary.name, storage=f"sqlite:///{tmp_path / 's.db'}")
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    refused = [t for t in done if trials.UNSUPPORTED_HERE in t.user_attrs]
    assert len(refused) >= 2 and all(t.user_attrs[trials.PLAN]["cuda_graph"] for t in refused)
    assert all("needs CUDA" in t.user_attrs[trials.OUTCOME]["message"] for t in refused)
    assert trials.completed_trials(study) == 2  # the two graph-free plans, both measured
    assert {
        t.user_attrs[trials.PLAN].get("cuda_graph", False) for t in done if trials.counts(t)
    } == {False}


def test_the_long_space_rounds_operands_only_before_exact_half_attention() -> None:
    """Case 14's exact route with graded rounding (session 55: 2.986 s against 3.080 at 2
    bits everywhere, 0 failed on the 5 seeds, H100) is a searched knob set and an enqueued
    plan the rules admit at case 14; no plan rounds operands the rules would refuse for
    precision or attention (free trials)."""
    from autotune.backends.precision import drop_bits_reasons

    (long,) = [s for s in builtin_spaces() if s.name == "gpu-long"]
    case14 = get_case("14").config
    graded = [p for p in long.enqueue if p.attn_drop_bits_late]
    assert [(p.attention, p.attn_drop_bits_late, p.attn_drop_late_from) for p in graded] == [
        ("sdpa_cudnn", 7, 8192),  # session 56: 2.927 s, worst 0.635 on the 5 seeds (H100)
        ("sdpa_cudnn", 6, 8192),
    ]
    assert all(drop_bits_reasons(p, case14) == [] for p in graded)
    rounded = [
        p
        for p in itertools.islice(long.enumerate(), 200_000)
        if p.attn_drop_bits or p.attn_drop_bits_late
    ]
    assert rounded and {p.attention for p in rounded} <= {"sdpa_cudnn", "sdpa_flash", "triton"}
    assert {(p.attn_drop_bits, p.attn_drop_bits_late) for p in rounded} == {(2, 0), (0, 6), (0, 7)}
    assert all(drop_bits_reasons(p, case14) == [] for p in rounded)
