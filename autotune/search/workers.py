"""Many workers on one study.

A *worker* drives one study through Optuna's RDB storage with heartbeats, so a worker
killed mid-trial leaves a trial that the others mark failed and retry
(``RetryFailedTrialCallback``). ``run_workers`` starts N workers on one host (one GPU
each through ``CUDA_VISIBLE_DEVICES``, or N on the CPU) and hands out exactly as many
trial tickets as the study still needs; workers on other hosts share the study through
a PostgreSQL URL. Each worker evaluates its trials through an isolated runner
(``autotune.search.runner``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from autotune.search import trials
from autotune.search.interrupt import Interrupted, InterruptGuard
from autotune.search.runner import CTX

# tests only: "N" kills the worker that runs the study's trial number N, in that trial (one
# worker whatever the scheduling: numbers are unique; session 34: "W@N", worker W's N-th
# trial, never fired when a loaded machine started worker W after the others had taken the
# plans, and the test failed)
KILL_WORKER_ENV = "AUTOTUNE_KILL_WORKER"
SOLO_ROUNDS = 3  # single-ticket rounds at most, until the study has its reference
INTERRUPTED_EXIT = 130  # a worker ended by Ctrl-C (its trial failed and enqueued again)


# --- workers on one host -------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class WorkerJob:
    """Everything a worker process needs to drive one case's study (plain data)."""

    storage_url: str
    profile: str
    emulated: bool
    case_id: str
    case_spec: dict[str, Any]
    space_files: tuple[str, ...]
    sampler: str
    seed: int
    n_trials: int
    trial_timeout: float
    heartbeat_interval: int
    grace_period: int
    isolate: bool = True
    # --timeout's share of this case: no trial starts after this wall-clock time (time.time())
    deadline: float | None = None
    oracle_batch: int = 1
    run: str = ""  # the command's run token (trials.RUN), shared by its workers
    quiet: bool = False


def _worker_main(
    index: int, job: WorkerJob, tickets: Any, in_flight: Any, env: dict[str, str]
) -> None:
    os.environ.update(env)
    try:
        run_worker_trials(job, index, tickets, in_flight)
    except KeyboardInterrupt:
        # A second signal (the terminal's Ctrl-C reaches the worker, and the parent
        # forwards its own): the trial in flight, if any, is failed by its heartbeat and
        # retried when the study resumes; the parent says the one line.
        sys.exit(INTERRUPTED_EXIT)


def run_worker_trials(job: Any, index: int, tickets: Any, in_flight: Any) -> None:
    """One worker process: take a ticket, run one trial (heartbeats on), repeat."""
    import queue

    from autotune.core.cases import get_case
    from autotune.core.profiles import select_profile
    from autotune.measure import STUDY_TIMING
    from autotune.search.runner import make_evaluator
    from autotune.search.space import available_spaces, select_space
    from autotune.search.study import RunState, make_objective, open_study, optimize

    selection = select_profile(job.profile, emulate=job.emulated)
    case = get_case(job.case_id)
    space = select_space(selection.profile.name, case, available_spaces(list(job.space_files)))
    storage = trials.open_storage(job.storage_url, job.heartbeat_interval, job.grace_period)
    study = open_study(selection, case, space, storage, job.sampler, job.seed + index)
    spec = os.environ.get(KILL_WORKER_ENV, "")
    kill_at = int(spec) if spec.isdigit() else None
    with InterruptGuard() as guard:
        run = RunState(job.n_trials, guard, job.run or trials.new_run_token(), quiet=job.quiet)
        evaluator = make_evaluator(
            selection, case, STUDY_TIMING, job.isolate, job.trial_timeout, job.oracle_batch
        )
        objective = make_objective(
            study,
            case,
            space,
            selection.capacity_bytes,
            evaluator,
            run,
            kill_at,
            device=selection.effective_device(),
        )
        try:
            while not (run.stop or guard.requested or _past(job.deadline)):
                try:
                    tickets.get(timeout=1.0)
                except queue.Empty:
                    return
                in_flight[index] = 1
                optimize(study, objective, run, max_trials=1)
                in_flight[index] = 0
        finally:
            evaluator.close()
    if guard.requested:
        sys.exit(INTERRUPTED_EXIT)


def run_workers(
    job: WorkerJob,
    workers: int,
    gpus: int,
    rounds: int = 4,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Start ``workers`` processes on one study; replace any that die; retry their trials.

    Exactly ``n_trials - completed`` tickets are handed out, and every trial claims its
    slot in the storage (``trials.claim``), so the study ends with ``n_trials`` completed
    trials; a ticket held by a worker that died is handed out again. ``progress`` sees the
    study's completed trials about once a second. Ctrl-C: the workers fail and re-enqueue
    their trials in flight, and ``Interrupted`` is raised here once they have exited."""

    storage = trials.open_storage(job.storage_url, job.heartbeat_interval, job.grace_period)
    live: dict[int, Any] = {}

    def forward() -> None:  # a SIGINT sent to this process alone reaches the workers too
        for proc in list(live.values()):
            with contextlib.suppress(OSError, ValueError):
                os.kill(proc.pid, signal.SIGINT)

    # A new study's reference time is fixed by its first timed trial (trials.REFERENCE_MS):
    # one worker runs alone until it is (at most SOLO_ROUNDS trials), so that N workers
    # starting together do not each divide by their own.
    solo_left = SOLO_ROUNDS if workers > 1 else 0
    with InterruptGuard() as guard:
        guard.on_signal = forward
        done_rounds = 0
        while done_rounds < rounds and not _past(job.deadline):
            solo = solo_left > 0 and trials.REFERENCE_MS not in _study(job, storage).user_attrs
            if solo:
                solo_left -= 1
            else:
                solo_left = 0
                done_rounds += 1
            n, cap = (1, 1) if solo else (workers, None)
            if guard.requested or _run_round(job, n, gpus, storage, live, guard, progress, cap):
                break
    if guard.requested:
        study = _study(job, storage)
        raise Interrupted(trials.completed_trials(study, job.run))


def _drain(tickets: Any) -> None:
    import queue

    with contextlib.suppress(queue.Empty, OSError, ValueError):
        while True:
            tickets.get_nowait()


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.time() >= deadline


def _study(job: WorkerJob, storage: Any) -> Any:
    import optuna

    return optuna.load_study(study_name=_job_study_name(job), storage=storage)


def _run_round(
    job: WorkerJob,
    workers: int,
    gpus: int,
    storage: Any,
    procs: dict[int, Any],
    guard: InterruptGuard,
    progress: Callable[[int], None] | None,
    cap: int | None = None,
) -> bool:
    """One round of workers, at most ``cap`` tickets; True when the study is done (or
    nothing is left to try)."""
    import optuna

    study = _study(job, storage)
    remaining = job.n_trials - trials.completed_trials(study)
    if remaining <= 0:
        return True
    tickets = CTX.Queue()
    for _ in range(remaining if cap is None else min(cap, remaining)):
        tickets.put(1)
    in_flight = CTX.Array("i", [0] * workers)
    for i in range(workers):
        procs[i] = _spawn(i, job, tickets, in_flight, gpus)
    replacements = 0
    exit_codes: list[int] = []
    done_before = trials.completed_trials(study)
    owed = 0  # tickets of workers that died mid-trial
    died_at = 0.0
    stale_after = job.grace_period + job.heartbeat_interval + 1
    shown = time.monotonic()
    stopping = 0.0
    while procs or (owed and not guard.requested):
        for i, p in list(procs.items()):
            p.join(timeout=0.2)
            if p.exitcode is None:
                continue
            del procs[i]
            exit_codes.append(p.exitcode)
            if p.exitcode != 0 and not guard.requested:
                if in_flight[i]:
                    owed += 1
                    in_flight[i] = 0
                    died_at = time.monotonic()
                if replacements < 4 * workers:
                    replacements += 1
                    procs[i] = _spawn(i, job, tickets, in_flight, gpus, replacement=True)
        if progress is not None and time.monotonic() - shown > 1.0:
            progress(trials.completed_trials(study))
            shown = time.monotonic()
        if guard.requested:  # the workers end their trials themselves; wait for them
            if not stopping:  # a worker still starting finds no ticket, and exits
                _drain(tickets)
            stopping = stopping or time.monotonic()
            if time.monotonic() - stopping > 30:
                for proc in procs.values():
                    proc.kill()
            continue
        if owed and time.monotonic() - died_at > stale_after:
            # The dead worker's trial is RUNNING until its heartbeat is stale: fail it
            # (the retry callback enqueues a copy), then hand its ticket out again so
            # a worker runs the retried trial (a waiting trial is taken first).
            study = _study(job, storage)
            optuna.storages.fail_stale_trials(study)
            for _ in range(owed):
                tickets.put(1)
            owed = 0
            if not procs:
                procs[0] = _spawn(0, job, tickets, in_flight, gpus, replacement=True)
        elif not procs:
            time.sleep(0.2)
    if guard.requested:
        return True
    study = _study(job, storage)
    if progress is not None:
        progress(trials.completed_trials(study))
    if trials.completed_trials(study) == done_before and all(c != 0 for c in exit_codes):
        raise RuntimeError(
            f"{len(exit_codes)} worker processes exited without finishing a trial "
            f"(exit codes {sorted(set(exit_codes))}); run with --workers 1 to see why"
        )
    if trials.completed_trials(study) >= job.n_trials:
        return True
    # Trials of dead workers are RUNNING until their heartbeat goes stale: wait for the
    # grace period, fail them (the retry callback re-enqueues each), go again.
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    if running:
        time.sleep(job.grace_period + job.heartbeat_interval)
        optuna.storages.fail_stale_trials(study)
    return False


def _spawn(
    i: int, job: WorkerJob, tickets: Any, in_flight: Any, gpus: int, replacement: bool = False
) -> Any:
    env = {"CUDA_VISIBLE_DEVICES": str(i % gpus)} if gpus > 0 else {}
    if replacement:
        env[KILL_WORKER_ENV] = ""  # the test hook kills a worker once, not its replacements
    from autotune.search.runner import sigint_ignored

    p = CTX.Process(target=_worker_main, args=(i, job, tickets, in_flight, env))
    # Ignored until the worker installs its own handler (InterruptGuard): a Ctrl-C while
    # it starts is no traceback; the parent stops it by draining the tickets.
    with sigint_ignored():
        p.start()
    return p


def _job_study_name(job: WorkerJob) -> str:
    from autotune.core.cases import get_case
    from autotune.search.space import available_spaces, select_space

    case = get_case(job.case_id)
    space = select_space(job.profile, case, available_spaces(list(job.space_files)))
    return trials.study_name(job.profile, case, space)


def run_case_with_workers(
    selection: Any,
    case: Any,
    space: Any,
    storage: Any,
    options: Any,
    warm: list[Any] | None = None,
    progress: Any = None,
    timeout: float | None = None,
) -> Any:
    """One case's study driven by ``options.workers`` processes on this host (one GPU
    each when there are GPUs), no trial started after ``timeout`` seconds (this case's
    share of ``--timeout``); returns what the study holds afterwards."""
    import torch

    from autotune.search.study import StudyProgress, open_study, space_spent, summarise_study

    start = time.perf_counter()
    study = open_study(selection, case, space, storage, options.sampler, options.seed, warm)
    job = WorkerJob(
        storage_url=options.storage_url,
        profile=selection.profile.name,
        emulated=selection.emulated,
        case_id=case.id,
        case_spec=case.as_dict(),
        space_files=tuple(options.space_files),
        sampler=options.sampler,
        seed=options.seed,
        n_trials=options.n_trials,
        trial_timeout=options.trial_timeout,
        heartbeat_interval=options.heartbeat,
        grace_period=3 * options.heartbeat,
        isolate=options.isolate,
        deadline=time.time() + timeout if timeout is not None else None,
        oracle_batch=options.oracle_batch,
        run=trials.new_run_token(),
        quiet=options.quiet,
    )
    gpus = torch.cuda.device_count() if selection.device.type == "cuda" else 0
    before = trials.completed_trials(study)
    show, close = progress(case) if progress is not None else (None, lambda: None)

    def shown(_completed: int) -> None:  # the workers' trials, best and feasible share
        if show is not None:
            show(StudyProgress.of(study, options.n_trials))

    shown(before)
    try:
        run_workers(job, options.workers, gpus, progress=shown)
    finally:
        close()
    # The workers' own stop reasons stay in their processes; the space's is readable here.
    spent = space_spent(study, space)
    if spent:
        why = "every plan of the search space is measured"
    elif _past(job.deadline):
        why = "--timeout reached (rerun to resume)"
    else:
        why = "see the workers' log"
    mine = trials.completed_trials(study, job.run)
    return summarise_study(study, case, mine, start, options.n_trials, why)
