"""Isolated trials: a child process per case that evaluates one plan per request.

A *trial runner* owns the device, holds the case's reference outputs, and evaluates one
plan per request. A segfault, an abort or a hang past the trial's time limit ends only the
runner: the trial is recorded as ``crashed`` or ``timeout`` (its constraint set, so
samplers steer away), a fresh runner replaces it, and the study goes on. A CUDA
device-side fault (an illegal memory access) raises instead, and is sticky: the trial is
recorded as ``runtime_error``, and the runner, whose device can run nothing more, exits
after its answer and is replaced before the next plan. ``make_evaluator`` gives a study its
evaluation function: through a runner, or in the calling process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from autotune.core.outcome import Outcome, OutcomeKind
from autotune.core.profiles import ProfileSelection
from autotune.measure import TimingSettings
from autotune.plan import Plan

CTX = mp.get_context("spawn")
Evaluator = Callable[[Plan, int], Outcome]


# --- the runner (child process) ------------------------------------------------------
def _runner_main(conn: Connection, setup: dict[str, Any]) -> None:
    """Child: build the case bench once, then evaluate plans until told to stop. Ctrl-C
    is the parent's to handle (it kills this process if it must): ignored here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for key, value in setup.get("env", {}).items():
        os.environ[key] = value
    from autotune.core.cases import Case
    from autotune.evaluate import FAULT_ENV, device_broken, evaluate_plan
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
            if device_broken():  # a sticky device fault: the next plan needs a fresh runner
                conn.send(("last outcome", outcome.to_json()))
                return
            conn.send(("outcome", outcome.to_json()))
        except Exception:  # evaluate_plan never raises for a plan; this is our own bug
            conn.send(("error", traceback.format_exc()[-2000:]))


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored for the block (in the main thread): a child process started inside
    inherits it ignored until it installs a handler of its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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
        parent, child = CTX.Pipe()
        self.process = CTX.Process(target=_runner_main, args=(child, self.setup), daemon=True)
        with sigint_ignored():  # inherited: a Ctrl-C during the child's start-up is ignored
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
        if kind == "last outcome":  # the plan broke the runner's device: it has exited
            self._kill()
            self.restarts += 1
        return Outcome.from_json(payload)

    def stop_now(self) -> None:
        """Kill the child at once (safe in a signal handler): the request in flight ends."""
        if self.process is not None and self.process.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self.process.pid, signal.SIGKILL)

    def close(self) -> None:
        if self.conn is not None and self.process is not None and self.process.is_alive():
            try:
                self.conn.send(("stop",))
                self.process.join(timeout=10)
            except (OSError, BrokenPipeError):
                pass
        self._kill()


@dataclasses.dataclass(frozen=True)
class TrialEvaluator:
    """How a study evaluates its trials: ``evaluate(plan, trial number)``, ``close()`` when
    done, and ``interrupt()`` (from a signal handler) to stop the trial in flight at once."""

    evaluate: Evaluator
    close: Callable[[], None]
    interrupt: Callable[[], None]


def make_evaluator(
    selection: ProfileSelection,
    case: Any,
    timing: TimingSettings,
    isolate: bool,
    trial_timeout: float,
    oracle_batch: int = 1,
) -> TrialEvaluator:
    """Evaluate in an isolated runner process, or in this process (``isolate=False``)."""
    from autotune.evaluate import DeviceBroken, device_broken, evaluate_plan, fault_for_trial

    if isolate:
        runner = TrialRunner(
            {
                "profile": selection.profile.name,
                "emulated": selection.emulated,
                "case": case.as_dict(),
                "env": {},
                "oracle_batch": oracle_batch,
            },
            trial_timeout=trial_timeout,
        )
        timing_data = dataclasses.asdict(timing)

        def run_isolated(plan: Plan, number: int) -> Outcome:
            return runner.evaluate(plan.to_dict(), timing_data, fault_for_trial(number))

        return TrialEvaluator(run_isolated, runner.close, runner.stop_now)
    from autotune.judge.gate import CaseBench

    bench = CaseBench(case, selection.effective_device(), oracle_batch=oracle_batch)

    def run_here(plan: Plan, number: int) -> Outcome:
        if device_broken():  # an earlier trial's device fault: every call here would fail
            raise DeviceBroken(
                "the device faulted in an earlier trial of this process (a sticky CUDA error, "
                "such as an illegal memory access) and can run nothing more; that trial is "
                "recorded, this one is not: rerun the same command to resume (without "
                "--no-isolation a fresh runner process takes over by itself)"
            )
        return evaluate_plan(
            bench,
            plan,
            timing=timing,
            capacity_bytes=selection.capacity_bytes,
            fault=fault_for_trial(number),
        )

    def raise_here() -> None:
        raise KeyboardInterrupt

    return TrialEvaluator(run_here, bench.release, raise_here)
