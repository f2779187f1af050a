"""Search efficiency against exhaustive tuning: measure once (resumable), replay samplers."""

from __future__ import annotations

import json
import math

import pytest

from autotune.core.outcome import Outcome, OutcomeKind, TimingStats
from autotune.plan import Plan
from autotune.search.efficiency import Measured, Run, measure_space, replay, summarise_runs
from autotune.search.space import parse_space
from tests.conftest import cli

SPACE = {
    "name": "toy",
    "profiles": ["cpu"],
    "regimes": ["*"],
    "params": [
        {"name": "attention", "values": ["reference", "sdpa_math"]},
        {"name": "qkv", "values": ["separate", "packed"]},
        {"name": "heads", "values": ["contiguous", "strided"]},
        {"name": "mask", "values": ["apply", "elide"]},
    ],
}


def _fake_evaluate(plan: Plan, number: int) -> Outcome:
    """A made-up landscape: one plan is 4x faster, one fails the rule."""
    if plan.attention == "sdpa_math" and plan.mask == "elide" and plan.qkv == "packed":
        if plan.heads == "strided":
            return Outcome(OutcomeKind.WRONG_RESULT, "made up", phase_seconds={"gate": 1.0})
        cand = 0.25
    else:
        cand = 1.0 - 0.01 * (plan.qkv == "packed") - 0.02 * (plan.heads == "strided")
    timing = TimingStats(1.0, cand, 1 / cand, 0.01, 3, 10)
    return Outcome(
        OutcomeKind.PASSED, timing=timing, predicted_memory_bytes=1000, phase_seconds={"t": 2.0}
    )


def test_measurement_resumes_and_replays_find_the_exhaustive_best(tmp_path) -> None:
    space = parse_space(SPACE, "toy")
    cache = tmp_path / "cache.json"
    header = {"profile": "cpu", "case_key": "k", "space_hash": space.content_hash}
    calls: list[str] = []

    def counting(plan: Plan, number: int) -> Outcome:
        calls.append(plan.hash)
        return _fake_evaluate(plan, number)

    measured, complete = measure_space(
        space, counting, cache, header, deadline=0.0, log=lambda _: None
    )
    assert not complete and not calls  # the budget was spent before the first plan
    measured, complete = measure_space(space, counting, cache, header, log=lambda _: None)
    assert complete and len(measured) == len(calls) == 16
    again, _ = measure_space(space, counting, cache, header, log=lambda _: None)
    assert len(calls) == 16 and again == measured  # nothing measured twice
    with pytest.raises(ValueError, match="space_hash"):
        measure_space(space, counting, cache, header | {"space_hash": "x"}, log=print)

    best = min((m for m in measured.values() if m.feasible(None)), key=lambda m: m.latency)
    assert best.latency == 0.25
    runs = [
        replay(space, measured, s, seed, 16, None) for s in ("tpe", "random") for seed in (0, 1)
    ]
    for run in runs:
        assert len(run.best) == 16 and run.best == sorted(run.best, reverse=True)
        assert run.seconds == sorted(run.seconds)  # cumulative, repeats free
        assert run.seconds[-1] <= sum(m.seconds for m in measured.values())
    rows = summarise_runs(runs, best.latency * 1.03, 16, 31.0)
    assert {r["sampler"] for r in rows} == {"tpe", "random"}
    assert all(1 <= r["median trials"] <= 17 for r in rows)
    for run in runs:  # a study counts only trials that measured a new plan
        assert run.measured == sorted(run.measured) and run.measured[-1] <= 16
        assert all(m <= i + 1 for i, m in enumerate(run.measured))
    for r in rows:
        assert r["median trials, repeats free"] <= r["median trials"]
    # The failing plan is never counted as the best, whatever its latency.
    wrong = [m for m in measured.values() if not m.passed]
    assert len(wrong) == 1 and wrong[0].latency > 1


def test_a_seed_that_never_gets_there_counts_as_the_whole_budget() -> None:
    runs = [
        Run("tpe", 0, False, [2.0, 1.5, 1.0], [1, 2, 3]),
        Run("tpe", 1, False, [2.0] * 3, [1] * 3),
    ]
    (row,) = summarise_runs(runs, 1.0, 10, 10.0)
    assert row["reached"] == "1/2" and row["median trials"] == (3 + 4) / 2


def test_warm_start_enqueues_another_case_best_plans_first(tmp_path) -> None:
    from autotune.search.efficiency import warm_plans

    space = parse_space(SPACE, "toy")
    measured, _ = measure_space(
        space,
        _fake_evaluate,
        tmp_path / "c.json",
        {"space_hash": space.content_hash},
        log=lambda _: None,
    )
    other = json.loads((tmp_path / "c.json").read_text())
    plans = warm_plans(other, space, None, 2)
    assert len(plans) == 2 and measured[plans[0].hash].latency == 0.25
    run = replay(space, measured, "tpe", 0, 5, None, enqueue=plans)
    assert run.warm and run.best[0] == 0.25  # the enqueued best comes first


def test_measured_outcome_fields() -> None:
    m = Measured.from_outcome(Plan(), Outcome(OutcomeKind.CRASHED, "boom"), 1.5)
    assert not m.passed and m.latency > 1 and math.isfinite(m.violation) and m.seconds == 1.5


def test_efficiency_cli_end_to_end_on_the_cpu(tmp_path, capsys) -> None:
    space_file = tmp_path / "space.py"
    reduced = dict(SPACE, params=SPACE["params"][:2])  # 4 plans: quick
    space_file.write_text(f"SPACE = {reduced!r}\n")
    cache, out = tmp_path / "cache.json", tmp_path / "out"
    base = (
        f"efficiency --gpu cpu --case smoke-1 --space {space_file} --cache {cache} "
        f"--seeds 2 --samplers tpe,random --out {out}"
    )
    assert cli(base + " --replay") == 2
    assert "measure on the device first" in capsys.readouterr().err
    assert cli(base + " --no-isolation --measure-only") == 0
    assert cli(base + f" --replay --warm-from {cache} --warm-k 1") == 0
    printed = capsys.readouterr().out
    assert "within 3% of the exhaustive best" in printed
    record = json.loads((out / "efficiency.json").read_text())
    assert record["space_size"] == 4 and {r["sampler"] for r in record["rows"]} == {"tpe", "random"}
    assert any(r["warm start"] for r in record["rows"])
    assert (out / "efficiency.png").read_bytes()[:4] == b"\x89PNG"
    assert cli(base.replace("tpe,random", "tpe,annealing")) == 2
    assert "unknown sampler" in capsys.readouterr().err


def test_repeats_are_free_in_the_replay_count() -> None:
    # Trials 2 and 3 repeated plans: the target is reached at trial 4, the third plan.
    run = Run("tpe", 0, False, [2.0, 2.0, 2.0, 1.0], [1, 1, 1, 2], [1, 1, 1, 2])
    assert run.to_within(1.0) == (4, 2) and run.measured_to_within(1.0) == 2
    (row,) = summarise_runs([run], 1.0, 10, 10.0)
    assert row["median trials"] == 4 and row["median trials, repeats free"] == 2


def test_studies_tpe_models_the_best_15_percent_without_a_deprecation_warning() -> None:
    import warnings

    from autotune.search.study import make_sampler, tpe_gamma

    assert [tpe_gamma(n) for n in (0, 10, 100, 1000)] == [1, 2, 16, 25]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # Optuna 4.9+ deprecates gamma
        sampler = make_sampler("tpe", 0)
    assert sampler._gamma is tpe_gamma  # type: ignore[attr-defined]
