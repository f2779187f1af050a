"""Reliability: isolated trials, faults, many workers on one study, bad input."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.search.trials import LATENCY_REFERENCE_MS, REFERENCE_MS, counts
from tests.conftest import cli

# One pytest-xdist worker runs this module's tests one after another (README's test command,
# --dist loadgroup): the two PostgreSQL tests share one database, and each deletes every
# study in it before it starts.
pytestmark = pytest.mark.xdist_group("workers")

SPACE = {
    "name": "reliability",
    "profiles": ["cpu"],
    "regimes": ["*"],
    "params": [
        {"name": "qkv", "values": ["separate", "packed"]},
        {"name": "heads", "values": ["contiguous", "strided"]},
        {"name": "mask", "values": ["apply", "elide"]},
    ],
}


@pytest.fixture()
def space_file(tmp_path):
    f = tmp_path / "space.json"
    f.write_text(json.dumps(SPACE))
    return str(f)


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    (summary,) = optuna.get_all_study_summaries(url)
    return optuna.load_study(study_name=summary.study_name, storage=url).get_trials()


def test_injected_crash_hang_wrong_and_raise_are_recorded_and_the_study_completes(
    tmp_path, space_file, monkeypatch
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    monkeypatch.setenv("AUTOTUNE_INJECT_FAULT", "crash@1,hang@2,wrong@3,raise@4")
    study = "study --gpu cpu --cases smoke-1 --n-trials 6 --sampler grid --trial-timeout 5"
    assert cli(f"{study} --space {space_file} --storage {url} --quiet") == 0
    trials = [t for t in _trials(url) if t.state != TrialState.WAITING]  # grid: rest queued
    kinds = [t.user_attrs["outcome_kind"] for t in trials]
    assert len(trials) == 6 and all(t.state == TrialState.COMPLETE for t in trials)
    assert kinds[1:5] == ["crashed", "timeout", "wrong_result", "runtime_error"]
    assert kinds[0] == kinds[5] == "passed"
    assert "SIGABRT" in trials[1].user_attrs["outcome"]["message"]
    for t in trials[1:5]:  # constraints steer samplers away from each failure
        assert t.constraints["correctness"] > 0
    # A plan that crashed is never run again: proposing it again reuses its outcome.
    from autotune.search.trials import find_prior

    study = optuna.load_study(
        study_name=optuna.get_all_study_summaries(url)[0].study_name, storage=url
    )
    assert find_prior(study, trials[1].user_attrs["plan_hash"], -1).number == 1


def _worker_run(url: str, space_file: str, n: int, env: dict[str, str], monkeypatch) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    study = f"study --gpu cpu --cases smoke-1 --n-trials {n} --workers 3 --no-isolation"
    assert cli(f"{study} --heartbeat 1 --space {space_file} --storage {url} --quiet") == 0


def _storages(tmp_path) -> list[str]:
    urls = [f"sqlite:///{tmp_path / 'w.db'}"]
    pg = os.environ.get("AUTOTUNE_TEST_POSTGRES")
    if pg:
        urls.append(pg)
    elif os.environ.get("CI"):
        pytest.fail("CI must provide AUTOTUNE_TEST_POSTGRES (.ci/run starts PostgreSQL)")
    return urls


def _clean_postgres(url: str) -> None:
    if url.startswith("postgresql"):
        for s in optuna.get_all_study_summaries(url):
            optuna.delete_study(study_name=s.study_name, storage=url)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_three_workers_finish_exactly_n_trials_and_a_killed_workers_trial_is_retried(
    backend, tmp_path, space_file, monkeypatch
) -> None:
    urls = [u for u in _storages(tmp_path) if u.startswith(backend)]
    if not urls:
        pytest.skip("set AUTOTUNE_TEST_POSTGRES (scripts/postgres.sh start) to run this")
    url = urls[0]
    _clean_postgres(url)
    n = 8  # the whole space: the run ends when no plan is left to measure
    _worker_run(url, space_file, n, {"AUTOTUNE_KILL_WORKER": "3"}, monkeypatch)
    trials = _trials(url)
    states = [t.state for t in trials]
    measured = [t for t in trials if t.state == TrialState.COMPLETE and counts(t)]
    assert len(measured) == n  # no trial lost, none extra (repeats are free, not counted)
    assert len({t.user_attrs["plan_hash"] for t in measured}) == n  # no plan measured twice
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states
    failed = [t for t in trials if t.state == TrialState.FAIL]
    # The killed worker's trial, and any whose heartbeat a starved machine let go stale
    # (a 1 s heartbeat on 2 cores), each retried once with its plan, to completion.
    assert len(failed) >= 1
    for fail in failed:
        retried = [t for t in trials if t.system_attrs.get("failed_trial") == fail.number]
        assert len(retried) == 1 and retried[0].params == fail.params
        assert retried[0].state in (TrialState.COMPLETE, TrialState.FAIL)
    assert all(
        any(t.state == TrialState.COMPLETE and t.params == fail.params for t in trials)
        for fail in failed
    )
    assert len({t.number for t in trials}) == len(trials)
    # The first trial ran alone and fixed the study's reference: every timed trial's
    # latency divides by that one time, none by its own process's.
    (summary,) = optuna.get_all_study_summaries(url)
    reference = optuna.load_study(study_name=summary.study_name, storage=url).user_attrs[
        REFERENCE_MS
    ]
    used = [
        t.user_attrs[LATENCY_REFERENCE_MS] for t in measured if LATENCY_REFERENCE_MS in t.user_attrs
    ]
    assert len(used) == n and set(used) == {reference}
    _clean_postgres(url)


def test_a_corrupted_database_is_refused_with_a_message(tmp_path, capsys) -> None:
    db = tmp_path / "studies.db"
    db.write_bytes(b"this is not a database" * 100)
    before = db.read_bytes()
    assert cli(f"study --gpu cpu --cases smoke-1 --storage {f'sqlite:///{db}'} --quiet") == 2
    err = capsys.readouterr().err
    assert "not a database" in err or "cannot open storage" in err
    assert db.read_bytes() == before  # nothing written


def test_a_read_only_database_is_refused_and_left_intact(tmp_path, capsys) -> None:
    db = tmp_path / "studies.db"
    optuna.storages.RDBStorage(f"sqlite:///{db}")  # an empty, valid database
    before = db.read_bytes()
    url = f"sqlite:///file:{db}?mode=ro&uri=true"
    assert cli(f"study --gpu cpu --cases smoke-1 --storage {url} --quiet") == 2
    assert "readonly" in capsys.readouterr().err.replace("-", "").replace(" ", "")
    assert db.read_bytes() == before


def test_a_locked_database_is_refused_after_the_wait(tmp_path, capsys, monkeypatch) -> None:
    db = tmp_path / "studies.db"
    optuna.storages.RDBStorage(f"sqlite:///{db}")
    monkeypatch.setenv("AUTOTUNE_SQLITE_TIMEOUT", "0.5")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(20, holder.rollback)
    release.start()
    try:
        t0 = time.monotonic()
        code = cli(f"study --gpu cpu --cases smoke-1 --storage {f'sqlite:///{db}'} --quiet")
        assert time.monotonic() - t0 < 20
    finally:
        release.cancel()
        holder.rollback()
        holder.close()
    assert code == 2
    assert "locked" in capsys.readouterr().err
    assert optuna.get_all_study_summaries(f"sqlite:///{db}") == []  # nothing half-written


def test_an_impossible_shape_is_refused_naming_the_field(capsys) -> None:
    assert cli("evaluate --case 8,16,30,4,64,1,causal --plan reference") == 2
    assert "num_heads" in capsys.readouterr().err


def test_ctrl_c_stops_a_study_cleanly_and_the_same_command_resumes(tmp_path) -> None:
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT

    url = f"sqlite:///{tmp_path / 'c.db'}"
    cmd = [
        sys.executable,
        "-m",
        "autotune",
        "study",
        "--gpu",
        "cpu",
        "--cases",
        "smoke-2",
        "--n-trials",
        "40",
        "--no-isolation",
        "--storage",
        url,
        "--quiet",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    done = 0
    while time.monotonic() < deadline and done < 2:
        time.sleep(0.5)
        try:
            done = sum(t.state == TrialState.COMPLETE for t in _trials(url))
        except (ValueError, KeyError, optuna.exceptions.StorageInternalError):
            done = 0
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    states = [t.state for t in _trials(url)]
    assert TrialState.RUNNING not in states  # the interrupted trial was closed, not left open
    before = sum(t.state == TrialState.COMPLETE and counts(t) for t in _trials(url))
    assert before >= 2
    target = before + 1
    assert (
        cli(
            f"study --gpu cpu --cases smoke-2 --n-trials {target} --no-isolation "
            f"--storage {url} --quiet"
        )
        == 0
    )
    assert sum(t.state == TrialState.COMPLETE and counts(t) for t in _trials(url)) == target


def _study_cmd(url: str, *extra: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "autotune", "study", "--gpu", "cpu", "--storage", url,
            "--quiet", *extra]  # fmt: skip


@pytest.mark.parametrize("stop", ["ctrl-c to the group", "sigterm to the study"])
def test_ctrl_c_to_the_process_group_fails_the_trial_in_flight_at_once_and_the_run_resumes(
    tmp_path, space_file, stop
) -> None:
    """A terminal's Ctrl-C reaches the study and its runner child together (SIGTERM, as
    from ``timeout`` or a service manager, reaches the study alone): one line on stderr,
    exit 130, the hung trial in flight FAIL with its reason at once and enqueued again,
    and the same command (without the hang) resumes and finishes it."""
    import signal
    import subprocess

    from autotune.search import trials as records
    from tests.conftest import ROOT

    url = f"sqlite:///{tmp_path / 'g.db'}"
    cmd = _study_cmd(url, "--cases", "smoke-1", "--n-trials", "8", "--trial-timeout", "300")
    cmd += ["--space", space_file, "--sampler", "grid"]  # 8 distinct plans, trial 2 hangs
    env = dict(os.environ, PYTHONPATH=str(ROOT), AUTOTUNE_INJECT_FAULT="hang@2")
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    hung = False
    while time.monotonic() < deadline and not hung:
        time.sleep(0.5)
        try:
            hung = any(t.number == 2 and t.state == TrialState.RUNNING for t in _trials(url))
        except (ValueError, KeyError, optuna.exceptions.StorageInternalError):
            hung = False
    assert hung, "trial 2 never started"
    time.sleep(1.0)  # it is inside the runner now, hanging
    if stop == "ctrl-c to the group":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "interrupted; 2 trials of this run kept; rerun the same command to resume" in lines[0]
    done = _trials(url)
    assert TrialState.RUNNING not in [t.state for t in done]
    (failed,) = [t for t in done if t.state == TrialState.FAIL]
    assert failed.number == 2 and failed.user_attrs["fail_reason"] == records.INTERRUPTED
    (retry,) = [t for t in done if t.user_attrs.get("retry_of") is not None]
    assert retry.state == TrialState.WAITING and retry.user_attrs["retry_of"] == 2
    assert retry.system_attrs["fixed_params"] == failed.params  # the same plan, first
    resumed = subprocess.run(
        cmd, env=dict(env, AUTOTUNE_INJECT_FAULT=""), capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    done = _trials(url)
    assert sum(t.state == TrialState.COMPLETE and counts(t) for t in done) == 8  # every plan, once
    assert next(t for t in done if t.number == retry.number).state == TrialState.COMPLETE


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_independent_processes_on_one_storage_complete_exactly_n_trials_measuring_no_plan_twice(
    backend, tmp_path, space_file
) -> None:
    import subprocess

    from tests.conftest import ROOT

    urls = [u for u in _storages(tmp_path) if u.startswith(backend)]
    if not urls:
        pytest.skip("set AUTOTUNE_TEST_POSTGRES (scripts/postgres.sh start) to run this")
    url = urls[0]
    _clean_postgres(url)
    cmd = _study_cmd(
        url, "--cases", "smoke-1", "--n-trials", "8", "--no-isolation", "--space", space_file
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    news = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        news += [int(n) for n in re.findall(r"measured trials \((\d+) new", out)]
    done = _trials(url)
    complete = [t for t in done if t.state == TrialState.COMPLETE and counts(t)]
    assert len(complete) == 8  # in total, not per process
    # each says the trials it measured: both said all 8 before (the study's, not theirs)
    assert len(news) == 2 and sum(news) == 8
    assert len({t.user_attrs["run"] for t in complete}) <= 2
    measured = [t.user_attrs["plan_hash"] for t in complete if "duplicate_of" not in t.user_attrs]
    assert len(measured) == len(set(measured))  # a repeat reuses the recorded outcome
    assert TrialState.RUNNING not in [t.state for t in done]
    _clean_postgres(url)


def test_a_study_stops_when_its_space_is_exhausted_and_repeats_cost_no_trial(tmp_path) -> None:
    space = dict(SPACE, params=SPACE["params"][:2])  # 4 plans
    f = tmp_path / "small.json"
    f.write_text(json.dumps(space))
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = "study --gpu cpu --cases smoke-1 --n-trials 6 --sampler grid --no-isolation"
    assert cli(f"{study} --space {f} --storage {url} --quiet") == 0
    complete = [t for t in _trials(url) if t.state == TrialState.COMPLETE]
    measured = [t for t in complete if counts(t)]
    assert len(measured) == 4 == len({t.user_attrs["plan_hash"] for t in measured})
    assert len(complete) - len(measured) <= 1  # one repeat shows the space is spent: stop


def test_opening_a_storage_with_heartbeats_warns_nothing(tmp_path) -> None:
    """Optuna 5 calls heartbeats experimental on every open; an export opened the storage
    twice and printed the warning's source line each time (session 18's campaign logs)."""
    import warnings

    from autotune.search.trials import open_storage

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        storage = open_storage(f"sqlite:///{tmp_path / 'studies.db'}")
    assert storage.get_heartbeat_interval() == 10


_ASKER = """
import json, sys
import optuna
from autotune.search.trials import open_storage
optuna.logging.set_verbosity(optuna.logging.ERROR)
study = optuna.load_study(study_name="race", storage=open_storage(sys.argv[1], None, None))
got = []
while study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
    got.append(study.ask().number)
print(json.dumps(got))
"""


def test_processes_asking_one_sqlite_storage_never_get_the_same_enqueued_trial(tmp_path) -> None:
    """Optuna hands out an enqueued trial by reading it waiting, then marking it running;
    on SQLite with deferred transactions two processes could both take it (before the fix
    in open_storage: 9 of 300 trials handed out twice to 3 processes). open_storage's
    storages begin every SQLite transaction with the write lock, so each goes to one."""
    import subprocess

    from autotune.search.trials import open_storage
    from tests.conftest import ROOT

    url = f"sqlite:///{tmp_path / 'race.db'}"
    study = optuna.create_study(study_name="race", storage=open_storage(url, None, None))
    for i in range(150):
        study.enqueue_trial({"x": i})
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _ASKER, url], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    got = [n for p in procs for n in json.loads(p.communicate(timeout=300)[0])]
    assert all(p.returncode == 0 for p in procs)
    assert len(got) >= 150 and len(got) == len(set(got))


def test_a_sticky_device_fault_replaces_the_runner_before_the_next_plan(
    tmp_path, space_file, monkeypatch
) -> None:
    """A CUDA device-side fault is sticky: after it every call in the process raises. The
    faulting trial is a runtime error; its runner exits with its answer and a fresh one
    evaluates the next plan, which passes (in the poisoned runner it would raise too)."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    monkeypatch.setenv("AUTOTUNE_INJECT_FAULT", "device@1")
    study = "study --gpu cpu --cases smoke-1 --n-trials 4 --sampler grid"
    assert cli(f"{study} --space {space_file} --storage {url} --quiet") == 0
    trials = [t for t in _trials(url) if t.state != TrialState.WAITING]
    kinds = [t.user_attrs["outcome_kind"] for t in trials]
    assert kinds == ["passed", "runtime_error", "passed", "passed"]
    assert "illegal memory access" in trials[1].user_attrs["outcome"]["message"]


def test_a_sticky_device_fault_in_process_stops_the_run_and_a_rerun_resumes(
    tmp_path, space_file, monkeypatch, capsys
) -> None:
    """Evaluated in the study's own process (--no-isolation), a sticky device fault leaves
    nothing able to run: the faulting trial is recorded, the next one is not measured (no
    false failure), the run ends with one line, and the same command resumes and measures
    the plan that was left."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = f"study --gpu cpu --cases smoke-1 --n-trials 4 --sampler grid --no-isolation --space {space_file} --storage {url} --quiet"  # noqa: E501
    monkeypatch.setenv("AUTOTUNE_INJECT_FAULT", "device@1")
    assert cli(study) == 2
    assert "the device faulted in an earlier trial" in capsys.readouterr().err
    done = [t for t in _trials(url) if t.state == TrialState.COMPLETE]
    assert [t.user_attrs["outcome_kind"] for t in done] == ["passed", "runtime_error"]
    monkeypatch.setenv("AUTOTUNE_INJECT_FAULT", "")
    import autotune.evaluate

    assert autotune.evaluate.device_broken()
    autotune.evaluate._sticky_fault = False  # a new process's state (conftest resets it too)
    assert cli(study) == 0
    done = [t for t in _trials(url) if t.state == TrialState.COMPLETE]
    kinds = [t.user_attrs["outcome_kind"] for t in done]
    assert len(done) == 4 and kinds.count("runtime_error") == 1


def test_a_signal_while_the_runner_starts_is_an_interruption_not_a_failed_plan(
    tmp_path,
) -> None:
    """Ctrl-C kills a runner that is still starting: the trial is closed as interrupted
    and enqueued again (the rerun measures its plan), not failed as the plan's fault."""
    from autotune.core.cases import get_case
    from autotune.core.profiles import select_profile
    from autotune.search import trials as records
    from autotune.search.interrupt import InterruptGuard
    from autotune.search.space import builtin_spaces, select_space
    from autotune.search.study import RunState, make_objective, open_study, optimize

    selection = select_profile("cpu")
    case = get_case("smoke-1")
    space = select_space("cpu", case, builtin_spaces())
    storage = records.open_storage(f"sqlite:///{tmp_path / 's.db'}", None, None)
    study = open_study(selection, case, space, storage, "tpe", 0)
    guard = InterruptGuard()

    class Starting:  # the runner dies while it starts, killed by the signal's handler
        def evaluate(self, plan, number):
            guard.requested = True
            raise RuntimeError("trial runner died while starting (exit code -9)")

        def interrupt(self) -> None:
            pass

    run = RunState(4, guard)
    objective = make_objective(study, case, space, None, Starting(), run, None)
    optimize(study, objective, run, max_trials=1)  # the caller raises Interrupted
    assert guard.requested
    (trial, *rest) = study.get_trials()
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["fail_reason"] == records.INTERRUPTED
    (retry,) = [t for t in rest if t.user_attrs.get("retry_of") == trial.number]
    assert retry.state == TrialState.WAITING


def test_workers_stop_starting_trials_at_the_timeout(tmp_path, space_file) -> None:
    """--timeout holds with --workers: no trial starts after it, and the summary says the
    run stopped there (it used to run every trial)."""
    import subprocess

    from tests.conftest import ROOT

    url = f"sqlite:///{tmp_path / 't.db'}"
    cmd = _study_cmd(url, "--cases", "smoke-1", "--n-trials", "8", "--workers", "2",
                     "--timeout", "1", "--space", space_file, "--sampler", "grid")  # fmt: skip
    cmd.remove("--quiet")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = sum(t.state == TrialState.COMPLETE and counts(t) for t in _trials(url))
    assert measured < 8, done.stdout[-2000:]
    assert "--timeout reached" in done.stdout + done.stderr


def _spawned_children(pid: int) -> list[int]:
    """The processes ``pid`` started through multiprocessing's spawn (Linux /proc)."""
    out = []
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for kid in kids:
        try:
            if b"multiprocessing.spawn" in Path(f"/proc/{kid}/cmdline").read_bytes():
                out.append(int(kid))
        except OSError:
            continue
    return out


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("when", ["workers starting", "trials running"])
def test_ctrl_c_while_workers_start_or_run_is_one_line_and_resumes(
    tmp_path, space_file, when
) -> None:
    """Ctrl-C to the group while a worker is still starting (its imports) or while trials
    run: one line, exit 130, no worker traceback, and the same command resumes to exactly
    --n-trials with nothing left running."""
    import signal
    import subprocess

    from tests.conftest import ROOT

    url = f"sqlite:///{tmp_path / 'w.db'}"
    cmd = _study_cmd(url, "--cases", "smoke-1", "--n-trials", "6", "--workers", "2",
                     "--space", space_file, "--sampler", "grid")  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _spawned_children(proc.pid):
        time.sleep(0.02)  # the first worker is being spawned
    time.sleep(0.3 if when == "workers starting" else 6.0)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:  # the whole study ended before the signal: nothing to see
        pytest.skip("the study finished before Ctrl-C")
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    done = _trials(url)
    assert sum(t.state == TrialState.COMPLETE and counts(t) for t in done) == 6
    assert TrialState.RUNNING not in [t.state for t in done]


def test_a_stale_trials_retry_carries_its_plan_but_not_the_dead_attempts_constraints(
    tmp_path,
) -> None:
    """A worker died after its trial's constraints were set: the retry keeps the plan and
    the attributes, not the constraint values, so its own are stored (no warning)."""
    import warnings

    from autotune.search.trials import RetryStale

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'r.db'}")
    study = optuna.create_study(storage=storage, directions=["minimize", "minimize"])
    dead = study.ask({"qkv": optuna.distributions.CategoricalDistribution(["a", "b"])})
    dead.set_user_attr("plan_hash", "p1")
    dead.set_constraint("correctness", 5.0)  # failed the rule, then the worker died
    dead.set_constraint("memory", -1.0)
    RetryStale(max_retry=3)(study, study.trials[0])
    (retry,) = study.get_trials(states=(TrialState.WAITING,))
    assert retry.params == dead.params and retry.user_attrs["plan_hash"] == "p1"
    assert retry.system_attrs["failed_trial"] == 0
    assert not [k for k in retry.system_attrs if k.startswith("constraints")]
    again = study.ask()
    assert again.number == retry.number
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again.set_constraint("correctness", -1.0)  # its own, stored
    assert study.trials[retry.number].constraints == {"correctness": -1.0}


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")  # ask()
@pytest.mark.parametrize("beat", [True, False], ids=["after its heartbeat", "inside ask"])
def test_a_trial_left_running_before_its_claim_is_failed_not_waited_on_forever(
    beat, tmp_path, monkeypatch
) -> None:
    """A process killed between Optuna's start of a trial and its claim left it RUNNING with
    no plan hash: a rerun's next trial waited on it for ever (a claim takes milliseconds,
    but a dead process never makes it). Killed after its first heartbeat, it is failed once
    the heartbeat is stale; killed inside ``study.ask()`` (sampling), before any heartbeat,
    once the grace period has passed since it began. A wait this long is said once."""
    from autotune.search import trials
    from autotune.search.trials import RetryStale, claim, open_storage

    monkeypatch.setattr(trials, "NOTE_AFTER", 0.0)
    storage = open_storage(f"sqlite:///{tmp_path / 'h.db'}", 1, 1)
    storage.heartbeat_stale_trial_callback = RetryStale(max_retry=3)
    study = optuna.create_study(storage=storage, directions=["minimize", "minimize"])
    dead = study.ask()
    if beat:
        storage.record_heartbeat(dead._trial_id)  # its process died right after: no claim
    me = study.ask()
    storage.record_heartbeat(me._trial_id)
    notes: list[str] = []
    start = time.monotonic()

    def wait(seconds: float) -> None:
        assert time.monotonic() - start < 20, "still waiting on the dead trial"
        storage.record_heartbeat(me._trial_id)  # this process lives (its heartbeat thread)
        time.sleep(seconds)

    verdict, prior = claim(study, me, "p1", 5, poll=0.05, wait=wait, note=notes.append)
    assert (verdict, prior) == ("measure", None)
    assert study.trials[dead.number].state == TrialState.FAIL
    retried = study.get_trials(states=(TrialState.WAITING,))
    assert len(retried) == 1 and retried[0].system_attrs["failed_trial"] == dead.number
    if beat:  # waited on until its heartbeat was stale: said (NOTE_AFTER is 0 here)
        assert len(notes) == 1 and f"for trial(s) {dead.number} (not yet claimed" in notes[0]
        assert "failed after 1 s without a heartbeat" in notes[0]
    else:  # older than the grace period when first waited on: failed at once, unsaid
        assert notes == []


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used")  # ask()
def test_a_short_wait_on_a_live_trial_is_not_said(tmp_path) -> None:
    """Processes sharing a study hand plans over in well under NOTE_AFTER: no line."""
    from autotune.search.trials import claim, open_storage

    storage = open_storage(f"sqlite:///{tmp_path / 'h.db'}", 5, 15)
    study = optuna.create_study(storage=storage, directions=["minimize", "minimize"])
    live = study.ask()
    storage.record_heartbeat(live._trial_id)
    live.set_user_attr("plan_hash", "p1")
    me = study.ask()
    notes: list[str] = []
    waits = iter(range(10))

    def wait(seconds: float) -> None:  # the lower trial completes during the third wait
        if next(waits) == 2:
            study.tell(live, [1.0, 1.0])
            live_trial = study.trials[live.number]
            assert live_trial.state == TrialState.COMPLETE
        time.sleep(0.01)

    assert claim(study, me, "p2", 1, poll=0.01, wait=wait, note=notes.append)[0] == "surplus"
    assert notes == []
