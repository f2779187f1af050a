"""Search efficiency against exhaustive tuning: measure once (resumable), replay samplers."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

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

    space, measured = _toy_measured(tmp_path)
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
    before = cache.read_text()
    for bad, why in (
        ("--trial-timeout 0", "--trial-timeout takes seconds above 0, got 0.0"),
        ("--timeout -1", "--timeout takes seconds above 0"),
        ("--trials 0", "--trials must be at least 1"),
        ("--warm-k -2", "--warm-k must be at least 1"),
        ("--samplers tpe,tpe", "give each sampler once"),
        ("--samplers ''", "give each sampler once"),
        ("--replay --measure-only", "give one"),
        (f"--cache {tmp_path}", "is a folder; give a JSON file path"),
        ("--warm-from /no/cache.json", "--warm-from '/no/cache.json' does not exist"),
    ):
        assert cli(base.replace(" --samplers tpe,random", "") + " " + bad) == 2, bad
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1, (bad, err)
    other = base.replace("smoke-1", "smoke-3") + " --replay"
    assert cli(other) == 2
    assert "holds case 'smoke-1''s measurements" in capsys.readouterr().err
    assert cache.read_text() == before  # nothing measured, nothing written
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


def _toy_measured(tmp_path) -> tuple:
    space = parse_space(SPACE, "toy")
    measured, _ = measure_space(
        space,
        _fake_evaluate,
        tmp_path / "c.json",
        {"space_hash": space.content_hash},
        log=lambda _: None,
    )
    return space, measured


def test_a_measured_budget_counts_new_plans_only_and_continues_the_same_study(tmp_path) -> None:
    space, measured = _toy_measured(tmp_path)
    for sampler in ("tpe", "random"):
        run = replay(space, measured, sampler, 0, 0, None, budget_measured=12)
        assert run.measured[-1] == 12 and not run.stopped
        # The 16-plan space repeats plans before 12 are measured: repeats did not count.
        assert len(run.best) > 12 and run.free["repeat"] == run.free_trials > 0
        assert run.free_trials == len(run.best) - 12
        # It ends on the trial that measured the 12th plan, not before nor after.
        assert run.measured[-2] == 11
        # The same study as a trial budget of that length: the budget only moved the end.
        same = replay(space, measured, sampler, 0, len(run.best), None)
        assert same.best == run.best and same.measured == run.measured
        # A trial budget of 12 measures fewer than 12 plans.
        assert replay(space, measured, sampler, 0, 12, None).measured[-1] < 12


def test_forbidden_and_refused_plans_are_free_under_a_measured_budget(tmp_path) -> None:
    space, measured = _toy_measured(tmp_path)
    hashes = sorted(measured)
    forbidden = {h: m for h, m in measured.items() if h != hashes[0]}  # one plan not in it
    refused = dict(forbidden)
    refused[hashes[1]] = dataclasses.replace(refused[hashes[1]], kind="unsupported")
    run = replay(space, refused, "random", 0, 0, None, budget_measured=14)
    assert run.measured[-1] == 14 and not run.stopped
    assert run.free["forbidden"] >= 1 and run.free["unsupported"] == 1
    assert sum(run.free.values()) == run.free_trials


def test_free_trials_in_a_row_stop_a_run_and_the_run_says_why(tmp_path) -> None:
    space, measured = _toy_measured(tmp_path)
    run = replay(space, measured, "tpe", 0, 0, None, budget_measured=16, max_free_streak=3)
    assert run.stopped.startswith("3 free trials in a row") and run.measured[-1] < 16
    assert run.measured[-4] == run.measured[-1] != run.measured[-5]  # the last 3 were free
    # Every plan measured: the run stops instead of spinning on repeats, and says so.
    run = replay(space, measured, "tpe", 0, 0, None, budget_measured=100)
    assert run.measured[-1] == 16 and run.stopped.startswith("every plan of the space")
    # A bound on trials in all stops a run that keeps finding a new plan now and then.
    run = replay(space, measured, "tpe", 0, 0, None, budget_measured=16, max_trials=14)
    assert len(run.best) == 14 and run.measured[-1] < 14
    assert run.stopped == f"14 trials in all, free ones included, after {run.measured[-1]} measured"
    with pytest.raises(ValueError, match="at least 1"):
        replay(space, measured, "tpe", 0, 0, None, budget_measured=0)
    with pytest.raises(ValueError, match="at least 1"):
        replay(space, measured, "tpe", 0, 0, None, budget_measured=5, max_free_streak=0)


def test_stop_at_target_cuts_the_same_run_short_at_its_first_plan_within(tmp_path) -> None:
    space, measured = _toy_measured(tmp_path)
    target = 0.25 * 1.03
    for seed in range(3):
        full = replay(space, measured, "tpe", seed, 0, None, budget_measured=16)
        cut = replay(space, measured, "tpe", seed, 0, None, budget_measured=16, stop_below=target)
        hit = full.measured_to_within(target)
        assert hit is not None and cut.measured_to_within(target) == hit
        assert cut.best[-1] <= target < min(cut.best[:-1], default=math.inf)
        assert cut.best == full.best[: len(cut.best)] and not cut.stopped


def test_measured_budget_summary_counts_misses_as_budget_plus_one_and_free_trials() -> None:
    runs = [  # budget 3 measured trials
        Run("tpe", 0, False, [2.0, 2.0, 1.0, 1.0], [1] * 4, [1, 1, 2, 3], {"repeat": 1}),
        Run("tpe", 1, False, [2.0] * 6, [1] * 6, [1, 2, 2, 2, 2, 2], {"repeat": 4}, "cap"),
    ]
    assert runs[0].best_by_measured(3) == [2.0, 1.0, 1.0]
    assert runs[1].best_by_measured(3) == [2.0, 2.0, 2.0]  # stopped early: last best kept
    (row,) = summarise_runs(runs, 1.0, 10, 10.0, budget_measured=3)
    assert row["reached"] == "1/2" and row["median measured trials"] == (2 + 4) / 2
    assert row["median free trials"] == (1 + 4) / 2 and row["stopped early"] == 1
    assert row["median trials run"] == 5


@pytest.mark.parametrize(
    "flags",
    [
        "--budget-measured 0",
        "--budget-measured -5",
        "--budget-measured 10 --max-free-streak 0",
        "--budget-measured 10 --max-free-streak -1",
        "--max-free-streak 5",
        "--budget-measured 10 --trials 20",
        "--stop-at-target",
        "--max-trials-per-run 100",
        "--budget-measured 10 --max-trials-per-run 9",
    ],
)
def test_a_bad_measured_budget_is_one_line_and_exit_2(tmp_path, capsys, flags) -> None:
    command = (
        f"efficiency --gpu cpu --case smoke-1 --space {tmp_path / 'space.py'} "
        f"--cache {tmp_path / 'cache.json'} --replay --out {tmp_path / 'out'} {flags}"
    )
    assert cli(command) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune efficiency: error: --")
    assert not (tmp_path / "out").exists()


def test_efficiency_cli_replays_with_a_measured_budget(tmp_path, capsys) -> None:
    from autotune.search.study import MAX_FREE_STREAK

    space_file = tmp_path / "space.py"
    reduced = dict(SPACE, params=SPACE["params"][:3])  # 8 plans
    space_file.write_text(f"SPACE = {reduced!r}\n")
    cache, out = tmp_path / "cache.json", tmp_path / "out"
    base = (
        f"efficiency --gpu cpu --case smoke-1 --space {space_file} --cache {cache} "
        f"--seeds 2 --samplers tpe,random --out {out}"
    )
    assert cli(base + " --no-isolation --measure-only") == 0
    capsys.readouterr()
    assert cli(base + " --replay --budget-measured 6 --max-free-streak 4") == 0
    printed = capsys.readouterr().out
    assert "budget 6 measured trials" in printed and "at most 4 free trials in a row" in printed
    record = json.loads((out / "efficiency.json").read_text())
    assert record["measured_budget"] == 6 and record["max_free_streak"] == 4
    assert record["trials_budget"] is None
    for r in record["runs"]:
        assert r["measured"][-1] == 6 or r["stopped"]
        assert len(r["best"]) - r["measured"][-1] == sum(r["free"].values())
        assert r["replay_seconds"] >= 0
    assert all("median free trials" in row for row in record["rows"])
    assert record["stop_at_target"] is False
    assert record["max_trials_per_run"] is None
    assert cli(base + " --replay --budget-measured 6 --stop-at-target --max-trials-per-run 7") == 0
    printed = capsys.readouterr().out
    assert "a run ends at the target" in printed and "at most 7 trials a run" in printed
    record = json.loads((out / "efficiency.json").read_text())
    assert record["stop_at_target"] is True and record["max_free_streak"] == MAX_FREE_STREAK
    assert record["max_trials_per_run"] == 7 and all(len(r["best"]) <= 7 for r in record["runs"])
    best = record["exhaustive_best"]["latency"] * 1.03
    for r in record["runs"]:  # every run ends at its first plan within 3%, or spends 6
        assert r["best"][-1] <= best < min(r["best"][:-1], default=math.inf) or (
            r["best"][-1] > best and (r["measured"][-1] == 6 or r["stopped"])
        )
    assert cli(base + " --replay") == 0  # without it: a trial budget, as before
    record = json.loads((out / "efficiency.json").read_text())
    assert "measured_budget" not in record and "free" not in record["runs"][0]
    assert "median free trials" not in record["rows"][0]
    with pytest.raises(SystemExit):
        cli("efficiency --help")
    assert f"(default {MAX_FREE_STREAK}:" in " ".join(capsys.readouterr().out.split())


def test_report_keeps_each_records_curves_apart(tmp_path: Path) -> None:
    # Two records of one case (say the 200-seed and the 10-seed replays) in two folders:
    # each keeps its own curve image and names its folder in its heading.
    from autotune.tools.report import efficiency_markdown

    paths = []
    for folder in ("case2_tpe200", "case2_measured"):
        (tmp_path / folder).mkdir()
        record = {
            "header": {"profile": "h200", "case": "2", "space": "s.py", "emulated": False},
            "exhaustive_best": {"latency": 0.05},
            "space_size": 152,
            "exhaustive_seconds": 54.0,
            "command": f"autotune efficiency --out {folder}",
            "rows": [{"sampler": "tpe", "median": 16}],
        }
        (tmp_path / folder / "efficiency.json").write_text(json.dumps(record))
        (tmp_path / folder / "efficiency.png").write_bytes(folder.encode())
        paths.append(str(tmp_path / folder / "efficiency.json"))
    out = tmp_path / "report"
    out.mkdir()
    text = "\n".join(efficiency_markdown(paths, out))
    for folder in ("case2_tpe200", "case2_measured"):
        image = out / f"efficiency_h200_2_{folder}.png"
        assert image.read_bytes() == folder.encode()
        assert f"record `{folder}`" in text and f"]({image.name})" in text
