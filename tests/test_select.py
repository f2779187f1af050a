"""Winner selection against the anchors, with the measurements given (no timing here)."""

from __future__ import annotations

import dataclasses
import re

import optuna
import pytest

from autotune.core.cases import get_case
from autotune.core.device import detect_device
from autotune.core.outcome import Outcome, OutcomeKind, TimingStats
from autotune.core.profiles import select_profile
from autotune.judge.gate import CaseBench
from autotune.plan import ANCHORS, Plan
from autotune.ship import select
from autotune.ship.select import Incumbent, select_winner

FINALIST = Plan(attention="sdpa_math", heads="strided")


def _passed(speedup: float) -> Outcome:
    stats = TimingStats(1.0, 1.0 / speedup, speedup, 0.001, 3, 100)
    return Outcome(OutcomeKind.PASSED, timing=stats, seeds_checked=5)


def _select(
    monkeypatch,
    speedups: dict[Plan, float],
    device=None,
    incumbent=None,
    anchors=("sdpa", "sdpa+reduce-overhead"),
):
    seen: list[Plan] = []

    def fake_evaluate_many(bench, plans, **_):
        seen.extend(plans)
        return [_passed(speedups.get(p, 1.0)) for p in plans]

    monkeypatch.setattr(select, "evaluate_many", fake_evaluate_many)
    case = get_case("smoke-1")
    bench = CaseBench(case, detect_device("cpu"))
    bench.device = device or bench.device  # the rules read its type; nothing runs
    study = optuna.create_study(study_name="s", directions=["minimize"])
    winner = select_winner(
        study,
        select_profile("cpu"),
        bench,
        incumbent=incumbent,
        anchors=anchors,
    )
    return winner, seen


def test_an_anchor_faster_than_every_finalist_ships(monkeypatch) -> None:
    inc = Incumbent(FINALIST, "s", 3)
    winner, seen = _select(monkeypatch, {FINALIST: 2.0, ANCHORS["sdpa"]: 2.5}, incumbent=inc)
    assert seen == [FINALIST, ANCHORS["sdpa"]]  # reduce-overhead cannot run on the CPU
    assert winner.plan == ANCHORS["sdpa"] and winner.admitted
    assert "anchor sdpa measured faster" in winner.reason
    notes = {n.get("anchor", "finalist"): n for n in winner.finalists}
    assert "needs CUDA" in notes["sdpa+reduce-overhead"]["dropped"]


def test_a_finalist_faster_than_the_anchors_ships(monkeypatch) -> None:
    inc = Incumbent(FINALIST, "s", 3)
    winner, _ = _select(monkeypatch, {FINALIST: 2.0, ANCHORS["sdpa"]: 1.5}, incumbent=inc)
    assert winner.plan == FINALIST


@pytest.mark.parametrize("cuda", [False, True])
def test_a_plan_that_reads_the_mask_on_the_host_is_not_shipped_on_cuda(monkeypatch, cuda) -> None:
    import dataclasses

    syncing = Plan(attention="sdpa_math", mask="elide")
    assert syncing.reads_mask_on_host and not FINALIST.reads_mask_on_host
    device = detect_device("cpu")
    if cuda:  # only the device type matters to the rule; nothing runs
        device = dataclasses.replace(device, type="cuda")
    inc = Incumbent(syncing, "s", 3)
    winner, seen = _select(
        monkeypatch, {syncing: 3.0, ANCHORS["sdpa"]: 1.5}, device=device, incumbent=inc
    )
    if cuda:
        assert syncing not in seen and winner.plan != syncing
        (note,) = [n for n in winner.finalists if n.get("incumbent")]
        assert "reads the mask on the host" in note["dropped"]
    else:
        assert winner.plan == syncing


def test_where_the_oracle_judges_a_host_read_per_call_is_shipped_on_cuda(monkeypatch) -> None:
    import dataclasses

    syncing = Plan(attention="sdpa_math", mask="elide")
    device = dataclasses.replace(detect_device("cpu"), type="cuda")
    real_init = CaseBench.__init__

    def oracle_bench(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.reference_kind = "oracle"  # as for case 14: a forward of seconds, never graphed

    monkeypatch.setattr(CaseBench, "__init__", oracle_bench)
    winner, seen = _select(
        monkeypatch, {syncing: 3.0}, device=device, incumbent=Incumbent(syncing, "s", 3)
    )
    assert syncing in seen and winner.plan == syncing
    assert not any("dropped" in n for n in winner.finalists if n.get("incumbent"))


def test_a_case_whose_every_finalist_syncs_says_so(monkeypatch) -> None:
    import dataclasses

    syncing = Plan(attention="sdpa_math", mask="elide")
    device = dataclasses.replace(detect_device("cpu"), type="cuda")
    monkeypatch.setattr(select, "finalists", lambda *a, **k: [])
    inc = Incumbent(syncing, "s", 3)
    winner, seen = _select(monkeypatch, {}, device=device, incumbent=inc, anchors=())
    assert seen == []
    assert not winner.admitted and "every finalist reads the mask on the host" in winner.reason


def test_finalists_are_the_fastest_by_absolute_time_against_one_study_reference() -> None:
    """Case 11 in session 11: a plan timed at 0.204 ms beside a 1.86 ms reference and one at
    0.271 ms beside 3.23 ms (the reference's time swings between processes). Latency is
    each candidate over the study's first reference time, and the finalists are the fastest
    by their own time; a slower plan with less memory takes no finalist's place."""
    from autotune.search import trials

    fast = Plan(attention="sdpa_math", qkv="packed")
    slower = Plan(attention="sdpa_math", heads="strided")
    lean = Plan(attention="sdpa_efficient")
    specs = [(fast, 0.204, 1.86, 33.05), (slower, 0.271, 3.23, 33.04), (lean, 0.51, 1.9, 25.0)]
    study = optuna.create_study(directions=["minimize", "minimize"])

    def objective(trial: optuna.Trial) -> list[float]:
        plan, cand, ref, mib = specs[trial.number]
        stats = TimingStats(ref, cand, ref / cand, 0.01, 3, 100)
        outcome = Outcome(
            OutcomeKind.PASSED, timing=stats, seeds_checked=5, peak_memory_bytes=int(mib * 2**20)
        )
        reference_ms = trials.study_reference_ms(study, outcome)
        return trials.record_outcome(trial, plan, outcome, 2**40, reference_ms)

    study.optimize(objective, n_trials=3)
    assert study.user_attrs[trials.REFERENCE_MS] == 1.86
    assert [round(t.values[0], 6) for t in study.trials] == [
        round(ms / 1.86, 6) for ms in (0.204, 0.271, 0.51)
    ]
    assert [trials.trial_plan(t) for t in select.finalists(study, k=2)] == [fast, slower]
    # Under a memory cap only the lean plan fits: the cap picks along the front.
    capped = select.finalists(study, k=2, max_memory=30 * 2**20)
    assert [trials.trial_plan(t) for t in capped] == [lean]


def test_a_host_bound_finalist_loses_to_a_graph_a_little_slower(monkeypatch) -> None:
    """Session 19, case 8: a compile=default plan 1.6% faster by its median in the export's
    process, but with its host busy for most of it (HOST_HEADROOM x its host time is past
    the graph-captured plan's median), ran 1.8x slower in a process with a slower host.
    The graph ships; the evidence keeps both host times and says why."""
    from autotune.core.outcome import HOST_HEADROOM

    host_bound = Plan(attention="sdpa_cudnn", compile="default")
    graphed = Plan(attention="sdpa_efficient", heads="strided", cuda_graph=True)
    measured = {host_bound: (1.206, 1.0), graphed: (1.226, 0.036)}
    assert HOST_HEADROOM * 1.0 > 1.226

    def fake_evaluate_many(bench, plans, **_):
        out = []
        for p in plans:
            ms, host = measured[p]
            stats = TimingStats(3.2, ms, 3.2 / ms, 0.005, 3, 100)
            out.append(
                Outcome(OutcomeKind.PASSED, timing=stats, seeds_checked=5, host_ms_per_call=host)
            )
        return out

    def pick(found: list[Plan], incumbent: Plan | None = None):
        monkeypatch.setattr(select, "finalists", lambda *a, **k: [_frozen(p) for p in found])
        inc = Incumbent(incumbent, "s", 1) if incumbent else None
        return select_winner(study, select_profile("cpu"), bench, incumbent=inc, anchors=())

    monkeypatch.setattr(select, "evaluate_many", fake_evaluate_many)
    bench = CaseBench(get_case("smoke-1"), detect_device("cpu"))
    study = optuna.create_study(study_name="s", directions=["minimize"])
    assert pick([host_bound]).plan == host_bound  # alone, it ships: nothing to prefer
    # Both finalists: the graph wins, and the reason names the lower median passed over.
    winner = pick([host_bound, graphed])
    assert winner.plan == graphed and winner.admitted
    assert "host 2x slower" in winner.reason and "1.0000 ms of host time" in winner.reason
    notes = {n["plan"]: n for n in winner.finalists}
    assert notes[host_bound.describe()]["host_ms"] == 1.0
    assert notes[graphed.describe()]["host_ms"] == 0.036
    # Against a host-bound incumbent the graph replaces it (beyond the noise, robustly).
    winner = pick([graphed], incumbent=host_bound)
    assert winner.plan == graphed and "replaces the incumbent" in winner.reason
    assert "faster with the host 2x slower (the incumbent had the lower median" in winner.reason
    # Host times are measured once each, outside the rounds: the speedup noises hold them.
    assert "(the larger speedup noise (a plan paced by its host), or 2%)" in winner.reason
    # With its host time unknown (the CPU; older records) the median decides, as before.
    measured[host_bound] = (1.206, None)
    assert pick([host_bound, graphed]).plan == host_bound


def test_a_challenger_is_held_to_the_noise_of_its_ratio_to_the_incumbent(monkeypatch) -> None:
    """Session 23's export of case 1: the reference swung 15% between rounds, so the
    challenger, the incumbent and the anchor each read 14.6-14.7% of speedup noise, and an
    8.2% faster challenger was kept out. Timed in the same rounds, their ratio is steady:
    it replaces the incumbent. A challenger whose lead changes from round to round does
    not; with fewer than three rounds the speedup noises decide, as before."""
    from autotune.measure import pair_noise, paired_stats

    ref = (2.385, [2.05, 2.385, 2.74])  # about 15% either way
    rounds = {
        "incumbent": (0.10757, [0.1081, 0.10757, 0.1072]),
        "steady": (0.09938, [0.0997, 0.09938, 0.0990]),
        "erratic": (0.09938, [0.0890, 0.09938, 0.1120]),
    }
    stats = {k: paired_stats(ref, v, 100, True) for k, v in rounds.items()}
    assert stats["steady"].noise > 0.12 and stats["incumbent"].noise > 0.12
    assert pair_noise(stats["steady"], stats["incumbent"]) < 0.01
    assert pair_noise(stats["erratic"], stats["incumbent"]) > 0.09
    bare = {k: dataclasses.replace(v, cand_round_medians=()) for k, v in stats.items()}
    assert pair_noise(bare["steady"], bare["incumbent"]) == max(
        bare["steady"].noise, bare["incumbent"].noise
    )
    incumbent = Plan(attention="sdpa_math", heads="strided")
    challenger = Plan(attention="sdpa_math", qkv="packed")

    def pick(which: dict[str, TimingStats], name: str):
        measured = {incumbent: which["incumbent"], challenger: which[name]}

        def fake_evaluate_many(bench, plans, **_):
            return [Outcome(OutcomeKind.PASSED, timing=measured[p], seeds_checked=5) for p in plans]

        monkeypatch.setattr(select, "evaluate_many", fake_evaluate_many)
        monkeypatch.setattr(select, "finalists", lambda *a, **k: [_frozen(challenger)])
        bench = CaseBench(get_case("smoke-1"), detect_device("cpu"))
        study = optuna.create_study(study_name="s", directions=["minimize"])
        inc = Incumbent(incumbent, "s", 1)
        return select_winner(study, select_profile("cpu"), bench, incumbent=inc, anchors=())

    won = pick(stats, "steady")
    assert won.plan == challenger and "replaces the incumbent: 8.2% faster" in won.reason
    assert "(2x that of the two's ratio round by round, or 2%)" in won.reason
    kept = pick(stats, "erratic")
    assert kept.plan == incumbent and "incumbent kept" in kept.reason
    assert pick(bare, "steady").plan == incumbent  # 14.7% noise, as the old records read


def _frozen(plan: Plan) -> optuna.trial.FrozenTrial:
    from autotune.search import trials

    return optuna.trial.create_trial(
        values=[0.5, 1.0], user_attrs={trials.PLAN: plan.to_dict(), trials.PLAN_HASH: plan.hash}
    )


def test_finalists_rank_host_bound_trials_by_the_time_a_slower_host_would_take() -> None:
    """A trial's recorded host time per call (CUDA) places it by ``robust_ms``: the plan
    with the lower median but HOST_HEADROOM x its host time past the other's median comes
    second; a trial without a host time keeps its median."""
    from autotune.core.outcome import robust_ms
    from autotune.search import trials

    host_bound = Plan(attention="sdpa_cudnn", compile="default")
    graphed = Plan(attention="sdpa_efficient", heads="strided", cuda_graph=True)
    unknown = Plan(attention="sdpa_math", qkv="packed")
    specs = [(host_bound, 1.206, 1.0), (graphed, 1.226, 0.036), (unknown, 1.5, None)]
    study = optuna.create_study(directions=["minimize", "minimize"])

    def objective(trial: optuna.Trial) -> list[float]:
        plan, cand, host = specs[trial.number]
        stats = TimingStats(3.2, cand, 3.2 / cand, 0.01, 3, 100)
        outcome = Outcome(OutcomeKind.PASSED, timing=stats, seeds_checked=5, host_ms_per_call=host)
        assert Outcome.from_json(outcome.to_json()) == outcome  # the host time is recorded
        return trials.record_outcome(
            trial, plan, outcome, 2**40, trials.study_reference_ms(study, outcome)
        )

    study.optimize(objective, n_trials=3)
    # The latency objective is the same time over the study's reference (the first's 3.2).
    assert [round(t.values[0], 6) for t in study.trials] == [
        round(ms / 3.2, 6) for ms in (2.0, 1.226, 1.5)
    ]
    assert [trials.trial_plan(t) for t in select.finalists(study, k=3)] == [
        graphed,
        unknown,
        host_bound,
    ]
    assert robust_ms(1.206, 1.0) == 2.0 and robust_ms(1.5, None) == 1.5
    assert robust_ms(1.226, 0.036) == 1.226


def test_bench_says_which_entries_the_host_paces() -> None:
    """The hot-path table's "paced by" column: the host when a call's host time reaches the
    GPU time of a forward, "host at 2x" when it would with the host HOST_HEADROOM times
    slower; those cases are named under the table (session 19's case 8: 2272.6 us of host a
    call, 1120.0 us of GPU time)."""
    from autotune.core.outcome import paced_by
    from autotune.tools.bench import BenchRow, summarise

    assert paced_by(2272.6, 1120.0) == "host"
    assert paced_by(600.0, 1120.0) == "host at 2x"
    assert paced_by(16.6, 60.9) == "GPU"
    assert paced_by(5.0, None) == "-"  # no GPU time measured: nothing to say
    rows = [
        BenchRow("2", "plan a", "PASS", 2.386, 0.065, 36.5, 0.01, host_us=16.6, gpu_us=60.9),
        BenchRow("8", "plan b", "PASS", 5.028, 2.158, 2.33, 0.01, host_us=2272.6, gpu_us=1120.0),
    ]
    text = summarise(rows)
    assert "paced by" in text.splitlines()[1]
    line8 = next(x for x in text.splitlines() if x.startswith("8 ") and "2272.6" in x)
    assert " host " in line8
    assert "paced by the host, now or with the host 2x slower: case 8 (" in text
    assert "case 2" not in text.split("paced by the host")[-1]
    assert "host speed" not in text  # no probe in these rows: nothing said
    rows[0].launch_us, rows[1].launch_us = 6.0, 8.0
    assert "host speed: 7.0 us of host time per eager launch (the median of 2" in summarise(rows)


def test_bench_csv_of_an_older_version_is_rewritten_under_the_new_header(tmp_path) -> None:
    """A resumed bench appends to its CSV; when an older version wrote it (fewer columns),
    the file is rewritten whole with this version's header, its rows kept, instead of a
    row whose columns no longer line up."""
    from autotune.tools.bench import CSV_FIELDS, BenchRow, append_csv, read_csv

    path = tmp_path / "bench.csv"
    old_fields = [f for f in CSV_FIELDS if f != "launch_us"]
    old_row = {f: "" for f in old_fields} | {
        "case": "2", "route": "plan a", "verdict": "PASS", "ref_ms": "2.386",
        "table_ms": "0.065", "speedup": "36.5", "failed_elements": "0",
        "anchors": "{}", "anchor_ms": "{}", "table_hash": "abc", "host_us": "16.6",
    }  # fmt: skip
    path.write_text(",".join(old_fields) + "\n" + ",".join(old_row[f] for f in old_fields) + "\n")
    new = BenchRow("7", "plan b", "PASS", 2.1, 0.06, 35.0, table_hash="abc", launch_us=6.5)
    append_csv(new, path)
    assert path.read_text().splitlines()[0] == ",".join(CSV_FIELDS)
    first, second = read_csv(path)
    assert (first.case, first.host_us, first.launch_us) == ("2", 16.6, None)
    assert (second.case, second.launch_us) == ("7", 6.5)
    append_csv(BenchRow("12", "plan c", "PASS", table_hash="abc"), path)  # plain append now
    assert [r.case for r in read_csv(path)] == ["2", "7", "12"]


def test_report_reads_a_resumed_bench_in_case_order_and_names_the_table_it_measured(
    tmp_path,
) -> None:
    """A bench resumed over calls appends cases in the order it ran them (2, 3 first, then
    1, ...): the report shows them by case number, a case's rows in their order. It says
    which table the bench measured: this one, or another version whose routes are (or are
    not) this table's entries' plans (a table re-issued with rebuilt buckets keeps them)."""
    from types import SimpleNamespace

    from autotune.tools.bench import BenchRow, append_csv
    from autotune.tools.report import bench_frame, bench_table_markdown

    one, two = Plan(attention="sdpa_math"), Plan(attention="sdpa_math", qkv="packed")
    path = tmp_path / "bench.csv"
    for case, plan, ms in (("12", two, 0.2), ("2", one, 0.1), ("10", one, 0.3), ("2", one, 0.4)):
        route = f"plan {plan.hash}: {plan.describe()}"
        append_csv(BenchRow(case, route, "PASS", 2.0, ms, 2.0 / ms, table_hash="h" * 64), path)
    frame = bench_frame(path)
    assert list(frame["case"]) == ["2", "2", "10", "12"]
    assert list(frame["table_ms"][:2]) == [0.1, 0.4]  # a case's rows keep their order

    def table(content_hash: str, plans: dict[str, Plan]) -> SimpleNamespace:
        entries = {
            (c,): {"case": c, "admitted": True, "plan": p.to_dict(), "plan_hash": p.hash}
            for c, p in plans.items()
        }
        return SimpleNamespace(content_hash=content_hash, version=7, entries=entries)

    same = bench_table_markdown(frame, table("h" * 64, {}))
    assert same[0] == f"The bench measured this table (content hash `{'h' * 16}`)."
    kept = " ".join(bench_table_markdown(frame, table("k" * 64, {"2": one, "10": one, "12": two})))
    assert f"content hash `{'h' * 16}`; this is version 7, `{'k' * 16}`" in kept
    assert "cases 2, 10, 12 benched this table's entry;" in kept
    assert "its times stand for this table's entries" in kept
    moved = " ".join(bench_table_markdown(frame, table("k" * 64, {"2": one, "10": two})))
    assert "case 2 benched this table's entry;" in moved
    assert f"cases 10 (plan {one.hash}), 12 (plan {two.hash}) benched a route" in moved
    assert "bench this table again for them" in moved
    import pandas as pd  # an entry that keeps the reference, benched as the reference

    kept_ref = pd.DataFrame([{"case": "5", "route": "reference", "table_hash": "h" * 64}])
    held = table("k" * 64, {})
    held.entries[("5",)] = {"case": "5", "admitted": False, "plan": {}}
    assert "case 5 benched this table's entry;" in bench_table_markdown(kept_ref, held)[0]


def test_report_holds_a_bench_against_an_earlier_one_at_either_runs_reference() -> None:
    """Two benches on hosts of different speed: the table's medians and the reference's
    case by case, and this run's table at the earlier run's reference times (session 23's
    v48 bench against session 22's, cases 7 and 13: a slow host doubled case 7's reference)."""
    import pandas as pd

    from autotune.tools.report import bench_change_markdown

    now = pd.DataFrame(
        [
            {"case": "7", "ref_ms": 4.425, "table_ms": 0.076, "launch_us": 14.5},
            {"case": "13", "ref_ms": 19.830, "table_ms": 0.761, "launch_us": 14.1},
            {"case": "14", "ref_ms": 3000.0, "table_ms": 3100.0, "launch_us": 14.0},
        ]
    )
    before = pd.DataFrame(
        [
            {"case": "7", "ref_ms": 1.0, "table_ms": 1.0, "launch_us": 8.0},  # replaced below
            {"case": "7", "ref_ms": 2.215, "table_ms": 0.058, "launch_us": 8.1},
            {"case": "13", "ref_ms": 19.635, "table_ms": 0.819, "launch_us": 8.4},
            {"case": "2", "ref_ms": 5.0, "table_ms": None, "launch_us": 8.0},
        ]
    )
    text = "\n".join(bench_change_markdown(now, before, "bench_s22.csv"))
    assert "Cases 7, 13 against `bench_s22.csv`" in text  # 14 and 2: not in both
    assert re.search(r"\|\s+7 \|\s+0\.076 \|\s+0\.058 \|\s+1\.310 \|\s+4\.425 \|\s+2\.215 \|", text)
    assert "29.14x" in text and "25.80x" in text  # case 7 and 13 at the earlier reference
    table = (0.076 / 0.058 * 0.761 / 0.819) ** 0.5
    assert f"the table's medians x{table:.3f} of the earlier run's" in text
    assert "27.42x at the earlier run's reference times" in text
    assert "Host speed: 14.3 us per eager launch in this run, 8.2 in the earlier one." in text
    assert "No case of this bench has a time in `x.csv`" in "\n".join(
        bench_change_markdown(now[now["case"] == "14"], before, "x.csv")
    )


def test_report_holds_the_table_at_the_median_and_the_fastest_earlier_references() -> None:
    """Earlier benches' references: per case their median with this run's (the runs that
    timed the case), the run whose references are fastest in geometric mean over the cases
    every run timed, and this run's table medians at both."""
    import pandas as pd

    from autotune.tools.report import bench_history_markdown

    now = pd.DataFrame(
        [
            {"case": "1", "ref_ms": 4.0, "table_ms": 0.1},
            {"case": "2", "ref_ms": 3.0, "table_ms": 0.1},
            {"case": "3", "ref_ms": None, "table_ms": None},  # not timed: left out
        ]
    )
    fast = pd.DataFrame([{"case": "1", "ref_ms": 2.0}, {"case": "2", "ref_ms": 2.5}])
    slow = pd.DataFrame(
        [{"case": "1", "ref_ms": 9.0}, {"case": "1", "ref_ms": 3.0}, {"case": "2", "ref_ms": 5.0}]
    )
    part = pd.DataFrame([{"case": "1", "ref_ms": 1.0}])  # fastest on case 1, but not full
    text = "\n".join(
        bench_history_markdown(now, [("fast.csv", fast), ("slow.csv", slow), ("part.csv", part)])
    )
    assert "Cases 1, 2:" in text and "fastest run (" in text
    assert "cases every run timed: fast.csv)" in text
    # case 1: references 4, 2, 3 (the last row of slow.csv), 1 -> median 2.5 over 4 runs
    assert re.search(r"\|\s+1 \|\s+0\.100 \|\s+4\.000 \|\s+2\.500 \(4\) \|\s+2\.000 \|", text)
    assert re.search(r"\|\s+2 \|.*\|\s+3\.000 \(3\) \|\s+2\.500 \|", text)
    this = (40 * 30) ** 0.5
    median = (25 * 30) ** 0.5
    fastest = (20 * 25) ** 0.5
    assert (
        f"{this:.2f}x in this run, {median:.2f}x at each case's median reference, "
        f"{fastest:.2f}x at the fastest run's references (fast.csv)"
    ) in text


def test_report_says_where_each_cases_time_goes_beside_its_floor() -> None:
    """From a bench CSV with the hot path: per case the host and GPU time, what paces it,
    the floor at the profile's ceilings and the time a target speedup needs; the cases
    below the target, those no schedule can bring to it, and those the host paces are
    named (session 19's v40 bench, cases 2 and 8)."""
    import pandas as pd

    from autotune.tools.floors import CEILINGS, floor_of
    from autotune.tools.report import time_goes_markdown

    frame = pd.DataFrame(
        [
            {"case": "2", "ref_ms": 2.386, "table_ms": 0.0654, "speedup": 36.5,
             "host_us": 16.6, "gpu_us": 60.9, "kernels": 8},
            {"case": "8", "ref_ms": 5.028, "table_ms": 2.158, "speedup": 2.33,
             "host_us": 2272.6, "gpu_us": 1120.0, "kernels": 42},
        ]
    )  # fmt: skip
    text = "\n".join(time_goes_markdown(frame, "h200", 25.0))
    floor8 = floor_of(get_case("8"), CEILINGS["h200"]).floor_us
    assert f"{floor8:.1f}" in text and "us for 25x" in text
    assert "Below 25x over this run's reference: 8 (2158.0 us, needs 201.1)." in text
    assert "Cannot reach 25x on any schedule" in text and "8 (reference 9.1x)" in text
    assert "Paced by the host, now or with the host 2x slower: case 8 (" in text
    # A profile without measured ceilings: no floors, said so; no hot path: no section.
    assert "no measured ceilings for profile 'cpu'" in "\n".join(
        time_goes_markdown(frame, "cpu", None)
    )
    assert time_goes_markdown(frame.drop(columns=["host_us", "gpu_us"]), "h200", 25.0) == []
    # The run's host speed, where the bench measured it (older CSVs: nothing said).
    assert "Host speed in this run" not in text
    frame["launch_us"] = [5.0, 7.0]
    assert "Host speed in this run: 6.0 us of host time per eager launch" in "\n".join(
        time_goes_markdown(frame, "h200", 25.0)
    )


def test_a_passing_plan_slower_than_the_reference_beyond_the_noise_is_said_so() -> None:
    """PASS is the rule's verdict, not a recommendation: the line says when the plan is
    slower than the reference by more than the noise, and only then."""

    def line(ref_ms: float, cand_ms: float, noise: float) -> str:
        timing = TimingStats(ref_ms, cand_ms, ref_ms / cand_ms, noise, 3, 100)
        return Outcome(OutcomeKind.PASSED, timing=timing).summary_line()

    assert line(1.0, 1.25, 0.05).endswith("noise 5.0%, slower than the reference)")
    assert "slower" not in line(1.0, 1.02, 0.05)  # within the noise
    assert "slower" not in line(2.0, 1.0, 0.05)


def test_report_names_the_study_and_profile_an_entrys_plan_came_from() -> None:
    """Session 49: tables/h100.py's entries came from H200 studies, validated on the H100;
    the report's 'from' column said 'study trial 2' as if an H100 study had picked them."""
    from autotune.tools.report import _entry_source

    study = "h200|1,128,128,4,128,4,causal,float32|gpu-54a0e4027765c195"
    validated = {
        "admitted": True,
        "evidence": {"study": study, "trial": 2, "reason": "validated here: verified here: PASS"},
    }
    assert _entry_source(validated, "h100") == "h200 study trial 2, validated here"
    incumbent = {"admitted": True, "evidence": {"study": study, "trial": 2, "reason": "kept"}}
    assert _entry_source(incumbent, "h200") == "study trial 2"
    assert _entry_source(incumbent, "h100") == "h200 study trial 2"
    anchor = {"admitted": True, "evidence": {"study": "anchor sdpa", "trial": None}}
    assert _entry_source(anchor, "h200") == "anchor sdpa"
    anchor["evidence"]["reason"] = "validated here: verified here: PASS"
    assert _entry_source(anchor, "h100") == "anchor sdpa, validated here"
    assert _entry_source({"admitted": False, "evidence": {}}, "h200") == "reference kept"
