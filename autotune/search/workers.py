"""Isolated trials and many workers on one study.

A *trial runner* is a child process that owns the device, holds the case's reference
outputs, and evaluates one plan per request. A segfault, a CUDA device-side fault, an
abort or a hang past the trial's time limit ends only the runner: the trial is recorded
as ``crashed`` or ``timeout`` (its constraint set, so samplers steer away), a fresh
runner replaces it, and the study goes on.

A *worker* drives one study through Optuna's RDB storage with heartbeats, so a worker
killed mid-trial leaves a trial that the others mark failed and retry
(``RetryFailedTrialCallback``). ``run_workers`` starts N workers on one host (one GPU
each through ``CUDA_VISIBLE_DEVICES``, or N on the CPU) and hands out exactly as many
trial tickets as the study still needs; workers on other hosts share the study through
a PostgreSQL URL.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from autotune.core.outcome import Outcome, OutcomeKind

KILL_WORKER_ENV = "AUTOTUNE_KILL_WORKER"  # tests only: "W@N" kills worker W in its N-th trial
_CTX = mp.get_context("spawn")


# --- the runner (child process) ------------------------------------------------------
def _runner_main(conn: Connection, setup: dict[str, Any]) -> None:
    """Child: build the case bench once, then evaluate plans until told to stop."""
    for key, value in setup.get("env", {}).items():
        os.environ[key] = value
    from autotune.core.cases import Case
    from autotune.evaluate import FAULT_ENV, evaluate_plan
    from autotune.judge.gate import CaseBench

    os.environ.pop(FAULT_ENV, None)  # faults are passed per request, by trial number
    from autotune.core.profiles import select_profile
    from autotune.core.reference import TransformerConfig
    from autotune.measure import TimingSettings
    from autotune.plan import Plan

    selection = select_profile(setup["profile"], emulate=setup["emulated"])
    c = setup["case"]
    case = Case(
        c["id"],
        TransformerConfig.from_dict(c["config"]),
        c["regime"],
        c["official"],
        c["dtype"],
        c["padding_ratio"],
    )
    bench = CaseBench(
        case, selection.effective_device(), oracle_batch=int(setup.get("oracle_batch", 1))
    )
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "stop":
            return
        _, plan_data, timing_data, fault = message
        try:
            outcome = evaluate_plan(
                bench,
                Plan.from_dict(plan_data),
                timing=TimingSettings(**timing_data) if timing_data else None,
                capacity_bytes=selection.capacity_bytes,
                fault=fault,
            )
            conn.send(("outcome", outcome.to_json()))
        except Exception:  # evaluate_plan never raises for a plan; this is our own bug
            conn.send(("error", traceback.format_exc()[-2000:]))


@dataclasses.dataclass
class TrialRunner:
    """The parent side of a runner: start, evaluate with a time limit, replace on death."""

    setup: dict[str, Any]
    trial_timeout: float = 600.0
    setup_timeout: float = 900.0
    process: Any = None
    conn: Connection | None = None
    restarts: int = 0

    def _start(self) -> None:
        parent, child = _CTX.Pipe()
        self.process = _CTX.Process(target=_runner_main, args=(child, self.setup), daemon=True)
        self.process.start()
        child.close()
        self.conn = parent
        if not parent.poll(self.setup_timeout):
            self._kill()
            raise RuntimeError(f"trial runner did not start within {self.setup_timeout:.0f} s")
        try:
            kind, _ = parent.recv()
        except EOFError:
            code = self.process.exitcode if self.process else None
            self._kill()
            raise RuntimeError(f"trial runner died while starting (exit code {code})") from None
        assert kind == "ready"

    def _kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        if self.process is not None:
            self.process.join(timeout=10)
        if self.conn is not None:
            self.conn.close()
        self.process = None
        self.conn = None

    def evaluate(
        self, plan_data: dict[str, Any], timing: dict[str, Any] | None, fault: str = ""
    ) -> Outcome:
        if self.process is None or not self.process.is_alive():
            if self.process is not None:
                self.restarts += 1
            self._start()
        assert self.conn is not None
        self.conn.send(("plan", plan_data, timing, fault))
        start = time.monotonic()
        if not self.conn.poll(self.trial_timeout):
            self._kill()
            return Outcome(
                OutcomeKind.TIMEOUT,
                f"no result within the trial limit of {self.trial_timeout:.0f} s; "
                "the runner was killed and replaced",
                phase_seconds={"wall": time.monotonic() - start},
            )
        try:
            kind, payload = self.conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            code = self.process.exitcode if self.process is not None else None
            if self.process is not None:
                self.process.join(timeout=10)
                code = self.process.exitcode
            self._kill()
            how = (
                f"killed by signal {signal.Signals(-code).name}"
                if code and code < 0
                else f"exit code {code}"
            )
            return Outcome(
                OutcomeKind.CRASHED,
                f"the trial runner died ({how}); it was replaced",
                phase_seconds={"wall": time.monotonic() - start},
            )
        if kind == "error":
            return Outcome(OutcomeKind.RUNTIME_ERROR, f"harness error: {payload}")
        return Outcome.from_json(payload)

    def close(self) -> None:
        if self.conn is not None and self.process is not None and self.process.is_alive():
            try:
                self.conn.send(("stop",))
                self.process.join(timeout=10)
            except (OSError, BrokenPipeError):
                pass
        self._kill()


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


def _worker_main(
    index: int, job: WorkerJob, tickets: Any, in_flight: Any, env: dict[str, str]
) -> None:
    os.environ.update(env)
    from autotune.search.study import run_worker_trials

    run_worker_trials(job, index, tickets, in_flight)


def run_workers(job: WorkerJob, workers: int, gpus: int, rounds: int = 4) -> None:
    """Start ``workers`` processes on one study; replace any that die; retry their trials.

    Exactly ``n_trials - completed`` tickets are handed out, so the study ends with
    ``n_trials`` completed trials; a ticket held by a worker that died is handed out again.
    """
    import optuna

    from autotune.search.study import completed_trials, open_storage

    storage = open_storage(job.storage_url, job.heartbeat_interval, job.grace_period)
    for _ in range(rounds):
        study = optuna.load_study(study_name=_job_study_name(job), storage=storage)
        remaining = job.n_trials - completed_trials(study)
        if remaining <= 0:
            return
        tickets = _CTX.Queue()
        for _ in range(remaining):
            tickets.put(1)
        in_flight = _CTX.Array("i", [0] * workers)
        procs: dict[int, Any] = {}

        for i in range(workers):
            procs[i] = _spawn(i, job, tickets, in_flight, gpus)
        replacements = 0
        exit_codes: list[int] = []
        done_before = completed_trials(study)
        owed = 0  # tickets of workers that died mid-trial
        died_at = 0.0
        stale_after = job.grace_period + job.heartbeat_interval + 1
        while procs or owed:
            for i, p in list(procs.items()):
                p.join(timeout=0.2)
                if p.exitcode is None:
                    continue
                del procs[i]
                exit_codes.append(p.exitcode)
                if p.exitcode != 0:
                    if in_flight[i]:
                        owed += 1
                        in_flight[i] = 0
                        died_at = time.monotonic()
                    if replacements < 4 * workers:
                        replacements += 1
                        procs[i] = _spawn(i, job, tickets, in_flight, gpus)
            if owed and time.monotonic() - died_at > stale_after:
                # The dead worker's trial is RUNNING until its heartbeat is stale: fail it
                # (the retry callback enqueues a copy), then hand its ticket out again so
                # a worker runs the retried trial (a waiting trial is taken first).
                study = optuna.load_study(study_name=_job_study_name(job), storage=storage)
                optuna.storages.fail_stale_trials(study)
                for _ in range(owed):
                    tickets.put(1)
                owed = 0
                if not procs:
                    procs[0] = _spawn(0, job, tickets, in_flight, gpus)
            elif not procs:
                time.sleep(0.2)
        study = optuna.load_study(study_name=_job_study_name(job), storage=storage)
        if completed_trials(study) == done_before and all(c != 0 for c in exit_codes):
            raise RuntimeError(
                f"{len(exit_codes)} worker processes exited without finishing a trial "
                f"(exit codes {sorted(set(exit_codes))}); run with --workers 1 to see why"
            )
        # Trials of dead workers are RUNNING until their heartbeat goes stale: wait for
        # the grace period, fail them (the retry callback re-enqueues each), go again.
        study = optuna.load_study(study_name=_job_study_name(job), storage=storage)
        running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        if completed_trials(study) >= job.n_trials:
            return
        if running:
            time.sleep(job.grace_period + job.heartbeat_interval)
            optuna.storages.fail_stale_trials(study)


def _spawn(i: int, job: WorkerJob, tickets: Any, in_flight: Any, gpus: int) -> Any:
    env = {"CUDA_VISIBLE_DEVICES": str(i % gpus)} if gpus > 0 else {}
    p = _CTX.Process(target=_worker_main, args=(i, job, tickets, in_flight, env))
    p.start()
    return p


def _job_study_name(job: WorkerJob) -> str:
    from autotune.core.cases import get_case
    from autotune.search.space import available_spaces, select_space
    from autotune.search.study import study_name

    case = get_case(job.case_id)
    space = select_space(job.profile, case, available_spaces(list(job.space_files)))
    return study_name(job.profile, case, space)
