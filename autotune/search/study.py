"""Optuna orchestration: one study per (profile, case, search-space hash).

Two objectives, both minimised: latency relative to the reference (measured paired in
the same process) and peak memory (MiB). Correctness and predicted memory are
``trial.set_constraint`` values, so samplers learn where the feasible region is. The
reference plan and the space's defaults are enqueued first. Rerunning the same command
resumes: ``--n-trials`` is the number of finished trials a study should reach.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.cases import Case
from autotune.core.device import project_commit, software_versions
from autotune.core.outcome import Outcome, OutcomeKind
from autotune.core.profiles import ProfileSelection
from autotune.evaluate import evaluate_plan
from autotune.judge.gate import CaseBench
from autotune.measure import STUDY_TIMING, TimingSettings, predict_peak_bytes
from autotune.plan import REFERENCE_PLAN, Plan
from autotune.search.space import SearchSpace

OBJECTIVES = ("relative_latency", "peak_memory_mib")
PENALTY_LATENCY = 100.0  # relative latency recorded for plans that did not pass
SAMPLERS = ("tpe", "nsga2", "gp", "random", "grid")
FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def study_name(profile: str, case: Case, space: SearchSpace) -> str:
    """Deterministic: the same profile, case shape and space content give the same name."""
    return f"{profile}|{case.key}|{space.name}-{space.content_hash}"


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, n_startup_trials=8, constant_liar=True
        )
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=16)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=8)
    if name in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}; valid samplers: {', '.join(SAMPLERS)}")


def environment(selection: ProfileSelection) -> dict[str, Any]:
    dev = selection.device
    return {
        "profile": selection.profile.name,
        "emulated": selection.emulated,
        "capacity_bytes": selection.capacity_bytes,
        "device": dev.as_dict(),
        "versions": software_versions(),
        "commit": project_commit(),
    }


def enqueue_defaults(
    study: optuna.Study,
    space: SearchSpace,
    sampler: str,
    warm: list[tuple[Plan, str]] | None = None,
) -> int:
    """Enqueue, once: the reference, the space's defaults, warm-start plans (with their
    source), and for ``grid`` every plan of the space. Plans outside the space are skipped."""
    if study.trials:
        return 0
    plans = [(REFERENCE_PLAN, ""), *(warm or []), *((p, "") for p in space.enqueue)]
    if sampler == "grid":
        plans += [(p, "") for p in space.enumerate()]
    seen: set[Plan] = set()
    n = 0
    for plan, source in plans:
        if plan in seen:
            continue
        seen.add(plan)
        try:
            params = space.params_for(plan)
        except ValueError:
            continue  # the reference may lie outside a user's space
        attrs: dict[str, Any] = {"enqueued": True}
        if source:
            attrs["warm_start"] = source
        study.enqueue_trial(params, user_attrs=attrs)
        n += 1
    return n


def warm_start_plans(
    sources: list[str],
    storage: Any,
    profile: str,
    exclude_case_key: str | None = None,
    per_study: int = 4,
) -> list[tuple[Plan, str]]:
    """Plans to seed a new study with: a table file's admitted plans, or the fastest
    feasible Pareto plans of other studies (a profile name: all its studies; or one study
    name). The target case's own study is skipped."""
    from pathlib import Path

    out: list[tuple[Plan, str]] = []
    for src in sources:
        if src.endswith(".py") or Path(src).is_file():
            from autotune.runtime.dispatch import load_table

            table = load_table(src)
            for entry in table.entries.values():
                if entry.get("admitted"):
                    out.append((Plan.from_dict(entry.get("plan", {})), f"table {src}"))
            continue
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        chosen = [n for n in names if n == src or n.split("|", 1)[0] == src]
        if not chosen:
            raise ValueError(
                f"--warm-start {src!r}: no table file, profile or study of that "
                f"name in the storage (studies: {len(names)})"
            )
        for name in chosen:
            study = optuna.load_study(study_name=name, storage=storage)
            if (
                exclude_case_key
                and study.user_attrs.get("case_key") == exclude_case_key
                and name.split("|", 1)[0] == profile
            ):
                continue
            from autotune.ship.select import pareto_front

            for t in pareto_front(study.get_trials(deepcopy=False))[:per_study]:
                plan = trial_plan(t)
                if plan is not None:
                    out.append((plan, f"study {name} trial {t.number}"))
    return out


def record_outcome(trial: optuna.Trial, plan: Plan, outcome: Outcome, capacity: int) -> list[float]:
    """Store the outcome on the trial, set the constraints, return the objective values."""
    trial.set_user_attr("plan", plan.to_dict())
    trial.set_user_attr("plan_hash", plan.hash)
    trial.set_user_attr("outcome_kind", outcome.kind.value)
    trial.set_user_attr("outcome", outcome.to_json())
    trial.set_constraint("correctness", float(outcome.violation))
    predicted = outcome.predicted_memory_bytes or 0
    trial.set_constraint("memory", (predicted - capacity) / capacity if capacity else 0.0)
    peak = outcome.peak_memory_bytes or predicted
    if outcome.passed and outcome.timing is not None:
        latency = outcome.timing.cand_median_ms / outcome.timing.ref_median_ms
        return [latency, peak / 2**20]
    return [PENALTY_LATENCY, peak / 2**20]


def trial_outcome(trial: FrozenTrial) -> Outcome | None:
    data = trial.user_attrs.get("outcome")
    return Outcome.from_json(data) if data else None


def trial_plan(trial: FrozenTrial) -> Plan | None:
    data = trial.user_attrs.get("plan")
    return Plan.from_dict(data) if data else None


def is_feasible(trial: FrozenTrial) -> bool:
    return (
        trial.state == TrialState.COMPLETE
        and trial.user_attrs.get("outcome_kind") == OutcomeKind.PASSED.value
        and all(v <= 0 for v in trial.constraints.values())
    )


@dataclasses.dataclass
class StudyProgress:
    """What the progress bar shows: trials, best speedup so far, feasible share."""

    total: int = 0
    finished: int = 0
    feasible: int = 0
    best_speedup: float = 0.0

    def update(self, trial: FrozenTrial) -> None:
        self.finished += 1
        if is_feasible(trial):
            self.feasible += 1
            self.best_speedup = max(self.best_speedup, 1.0 / trial.values[0])

    def postfix(self) -> dict[str, str]:
        share = self.feasible / self.finished if self.finished else 0.0
        return {"best": f"{self.best_speedup:.2f}x", "feasible": f"{100 * share:.0f}%"}


@dataclasses.dataclass
class StudySummary:
    name: str
    case: Case
    trials: int
    new_trials: int
    feasible: int
    best_speedup: float | None
    seconds: float


def open_storage(
    url: str, heartbeat_interval: int | None = 10, grace_period: int | None = 30
) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage with heartbeats (a dead worker's trial is failed and retried);
    a URL that cannot be opened is a clear error."""
    import sqlalchemy.exc

    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        timeout = float(os.environ.get("AUTOTUNE_SQLITE_TIMEOUT", "30"))
        engine_kwargs = {"connect_args": {"timeout": timeout}}
    retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3)
    try:
        return optuna.storages.RDBStorage(
            url,
            engine_kwargs=engine_kwargs,
            heartbeat_interval=heartbeat_interval,
            grace_period=grace_period,
            heartbeat_stale_trial_callback=retry if heartbeat_interval else None,
        )
    except (sqlalchemy.exc.SQLAlchemyError, ValueError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"cannot open storage {url!r}: {first}; check the URL, that the "
            "server runs, and that the file is a writable, intact database"
        ) from exc


def completed_trials(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def _previous(study: optuna.Study, plan_hash: str, number: int) -> FrozenTrial | None:
    """An earlier finished trial of the same plan: its outcome is reused, not re-run."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if (
            t.number != number
            and t.user_attrs.get("plan_hash") == plan_hash
            and "outcome" in t.user_attrs
        ):
            return t
    return None


Evaluator = Callable[[Plan, int], Outcome]


def make_objective(
    study: optuna.Study,
    case: Case,
    space: SearchSpace,
    capacity: int,
    evaluate: Evaluator,
    kill_at: int | None = None,
) -> Callable[[optuna.Trial], list[float]]:
    """The trial: sample a plan; reuse the outcome of an identical earlier plan (so a plan
    that crashed or hung is never run again); refuse space restrictions unrun; else
    evaluate; store everything and set the constraints."""
    count = [0]

    def objective(trial: optuna.Trial) -> list[float]:
        count[0] += 1
        plan = space.sample(trial)
        if kill_at is not None and count[0] == kill_at:
            time.sleep(2.5)  # test hook: a worker dies mid-trial, after its first heartbeats
            os.kill(os.getpid(), signal.SIGKILL)
        prior = _previous(study, plan.hash, trial.number)
        if prior is not None:
            trial.set_user_attr("duplicate_of", prior.number)
            outcome = Outcome.from_json(prior.user_attrs["outcome"])
        elif (reason := space.violated(plan)) is not None:
            outcome = Outcome(
                OutcomeKind.UNSUPPORTED,
                reason,
                predicted_memory_bytes=predict_peak_bytes(plan, case.config),
            )
        else:
            outcome = evaluate(plan, trial.number)
        trial.set_user_attr("seconds", round(sum(outcome.phase_seconds.values()), 3))
        return record_outcome(trial, plan, outcome, capacity)

    return objective


def _study_for(
    selection: ProfileSelection,
    case: Case,
    space: SearchSpace,
    storage: Any,
    sampler: str,
    seed: int | None,
    warm: list[tuple[Plan, str]] | None = None,
) -> optuna.Study:
    study = optuna.create_study(
        storage=storage,
        study_name=study_name(selection.profile.name, case, space),
        directions=["minimize", "minimize"],
        sampler=make_sampler(sampler, seed),
        load_if_exists=True,
    )
    if not study.user_attrs:
        study.set_metric_names(list(OBJECTIVES))
        for key, value in {
            "case": case.as_dict(),
            "case_key": str(case.key),
            "space": {"name": space.name, "hash": space.content_hash, "source": space.source},
            "environment": environment(selection),
            "sampler": sampler,
            "reference": _reference_note(case, selection),
            "seed": seed,
        }.items():
            study.set_user_attr(key, value)
    enqueue_defaults(study, space, sampler, warm)
    return study


def _reference_note(case: Case, selection: ProfileSelection) -> str:
    from autotune.judge.gate import dense_reference_fits

    if dense_reference_fits(case, selection.effective_device()):
        return "dense reference, full batch"
    return "streamed exact oracle on a batch subset (see each trial's outcome)"


def _evaluator(
    selection: ProfileSelection,
    case: Case,
    timing: TimingSettings,
    isolate: bool,
    trial_timeout: float,
    oracle_batch: int = 1,
) -> tuple[Evaluator, Callable[[], None]]:
    """Evaluate in an isolated runner process, or in this process (``isolate=False``)."""
    from autotune.evaluate import fault_for_trial

    if isolate:
        from autotune.search.workers import TrialRunner

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

        return run_isolated, runner.close
    bench = CaseBench(case, selection.effective_device(), oracle_batch=oracle_batch)

    def run_here(plan: Plan, number: int) -> Outcome:
        return evaluate_plan(
            bench,
            plan,
            timing=timing,
            capacity_bytes=selection.capacity_bytes,
            fault=fault_for_trial(number),
        )

    return run_here, bench.release


def run_case_study(
    selection: ProfileSelection,
    case: Case,
    space: SearchSpace,
    *,
    storage: str | optuna.storages.BaseStorage,
    n_trials: int,
    timeout: float | None = None,
    sampler: str = "tpe",
    seed: int | None = 0,
    timing: TimingSettings = STUDY_TIMING,
    progress: Callable[[StudyProgress], None] | None = None,
    isolate: bool = True,
    trial_timeout: float = 600.0,
    warm: list[tuple[Plan, str]] | None = None,
    oracle_batch: int = 1,
) -> StudySummary:
    """Run (or resume) one case's study until it has ``n_trials`` completed trials."""
    study = _study_for(selection, case, space, storage, sampler, seed, warm)
    done_before = completed_trials(study)
    remaining = n_trials - done_before
    start = time.perf_counter()
    state = StudyProgress(total=n_trials, finished=done_before)
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if is_feasible(t):
            state.feasible += 1
            state.best_speedup = max(state.best_speedup, 1.0 / t.values[0])
    if remaining <= 0:
        return _summary(study, case, 0, start)
    evaluate, close = _evaluator(selection, case, timing, isolate, trial_timeout, oracle_batch)
    objective = make_objective(study, case, space, selection.capacity_bytes, evaluate)

    def callback(study: optuna.Study, trial: FrozenTrial) -> None:
        state.update(trial)
        if progress is not None:
            progress(state)

    stop = optuna.study.MaxTrialsCallback(n_trials, states=(TrialState.COMPLETE,))
    try:
        study.optimize(
            objective,
            n_trials=remaining,
            timeout=timeout,
            callbacks=[callback, stop],
            catch=(Exception,),
            gc_after_trial=False,
        )
    finally:
        close()
    return _summary(study, case, completed_trials(study) - done_before, start)


def run_worker_trials(job: Any, index: int, tickets: Any, in_flight: Any) -> None:
    """One worker process: take a ticket, run one trial (heartbeats on), repeat."""
    import queue

    from autotune.core.cases import get_case
    from autotune.core.profiles import select_profile
    from autotune.search.space import available_spaces, select_space
    from autotune.search.workers import KILL_WORKER_ENV

    selection = select_profile(job.profile, emulate=job.emulated)
    case = get_case(job.case_id)
    space = select_space(selection.profile.name, case, available_spaces(list(job.space_files)))
    storage = open_storage(job.storage_url, job.heartbeat_interval, job.grace_period)
    study = _study_for(selection, case, space, storage, job.sampler, job.seed + index)
    kill_at = None
    spec = os.environ.get(KILL_WORKER_ENV, "")
    if spec:
        who, _, at = spec.partition("@")
        kill_at = int(at) if who.isdigit() and int(who) == index and at.isdigit() else None
    evaluate, close = _evaluator(selection, case, STUDY_TIMING, job.isolate, job.trial_timeout)
    objective = make_objective(study, case, space, selection.capacity_bytes, evaluate, kill_at)
    try:
        while True:
            try:
                tickets.get(timeout=1.0)
            except queue.Empty:
                return
            in_flight[index] = 1
            study.optimize(objective, n_trials=1, catch=(Exception,), gc_after_trial=False)
            in_flight[index] = 0
    finally:
        close()


def _summary(study: optuna.Study, case: Case, new: int, start: float) -> StudySummary:
    trials = study.get_trials(deepcopy=False, states=FINISHED)
    feasible = [t for t in trials if is_feasible(t)]
    best = max((1.0 / t.values[0] for t in feasible), default=None)
    return StudySummary(
        study.study_name, case, len(trials), new, len(feasible), best, time.perf_counter() - start
    )
