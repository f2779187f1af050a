"""The trial record: what a study and its trials hold in Optuna storage, and the only
module that reads or writes it.

A study is named ``PROFILE|CASE-KEY|SPACE-HASH`` and carries user attributes naming its
case, space, environment, sampler and reference. A trial carries its plan (and hash), the
outcome as JSON, the seconds it cost and, for a plan seen before, the trial it repeats.
Two objectives (relative latency, peak MiB) and two constraints (correctness, predicted
memory over the capacity) make a trial feasible when both constraints are <= 0; the
Pareto set is Optuna's own ``study.best_trials``.
"""

from __future__ import annotations

import copy
import datetime
import os
import time
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.cases import Case, get_case, parse_custom
from autotune.core.outcome import Outcome, OutcomeKind, robust_ms
from autotune.plan import Plan

OBJECTIVES = ("relative_latency", "peak_memory_mib")
CONSTRAINTS = ("correctness", "memory")
PENALTY_LATENCY = 100.0  # relative latency recorded for plans that did not pass
FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)

# Trial user attributes.
PLAN = "plan"
PLAN_HASH = "plan_hash"
OUTCOME = "outcome"
OUTCOME_KIND = "outcome_kind"
SECONDS = "seconds"
DUPLICATE_OF = "duplicate_of"
FORBIDDEN = "forbidden"  # the plan breaks a restriction of the space: not run
# The plan's support rules refuse it on this case and device (not run): free like forbidden
UNSUPPORTED_HERE = "unsupported_here"
ENQUEUED = "enqueued"
WARM_START = "warm_start"
FAIL_REASON = "fail_reason"
# The command run whose process (or workers) ran the trial: its "new" count is its own,
# not that of another command sharing the study.
RUN = "run"


def new_run_token() -> str:
    """A command run's token (``RUN``), unique among the runs sharing a storage."""
    return uuid.uuid4().hex[:16]


RETRY_OF = "retry_of"
SURPLUS = "surplus"
INTERRUPTED = "interrupted (Ctrl-C): rerun the same command to resume"


# --- study names and attributes ------------------------------------------------------
def study_name(profile: str, case: Case, space: Any) -> str:
    """Deterministic: the same profile, case shape and space content give the same name."""
    return f"{profile}|{case.key}|{space.name}-{space.content_hash}"


def profile_of(name: str) -> str:
    """The profile a study name belongs to."""
    return name.split("|", 1)[0]


def study_attrs(
    case: Case, space: Any, environment: dict[str, Any], sampler: str, reference: str, seed: Any
) -> dict[str, Any]:
    return {
        "case": case.as_dict(),
        "case_key": str(case.key),
        "space": {"name": space.name, "hash": space.content_hash, "source": space.source},
        "environment": environment,
        "sampler": sampler,
        "reference": reference,
        "seed": seed,
    }


def case_id_of(study: optuna.Study) -> str:
    return str(study.user_attrs.get("case", {}).get("id", study.study_name))


def case_key_of(study: optuna.Study) -> str:
    return str(study.user_attrs.get("case_key", study.study_name))


def measured_memory(study: optuna.Study) -> bool:
    """Whether the study's peak memory was measured (CUDA), not only predicted (CPU)."""
    return study.user_attrs.get("environment", {}).get("device", {}).get("type") == "cuda"


def space_hash_of(study: optuna.Study) -> str:
    return str(study.user_attrs.get("space", {}).get("hash", ""))


def case_of(study: optuna.Study) -> Case:
    """The case a study tuned: the registered one of that id when its shape matches, else
    the custom shape the study recorded."""
    data = study.user_attrs["case"]
    try:
        case = get_case(data["id"])
    except ValueError:
        case = None
    if case is None or case.config.as_dict() != data["config"]:
        cfg = data["config"]
        case = parse_custom(
            f"{cfg['batch_size']},{cfg['seq_len']},{cfg['d_model']},{cfg['num_heads']},"
            f"{cfg['ffn_dim']},{cfg['num_layers']},"
            f"{'causal' if cfg['causal'] else 'noncausal'}"
        )
    return case


def studies_by_case(
    storage: Any, profile: str, current: Callable[[optuna.Study], bool] | None = None
) -> dict[str, optuna.Study]:
    """One study per case key of a profile: a ``current`` one (the study of the space that
    serves the case today) first, then the one with the most finished trials."""
    best: dict[str, tuple[tuple[bool, int], optuna.Study]] = {}
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        name = summary.study_name
        if profile_of(name) != profile:
            continue
        study = optuna.load_study(study_name=name, storage=storage)
        key = case_key_of(study)
        rank = (
            bool(current(study)) if current is not None else False,
            len(study.get_trials(deepcopy=False, states=FINISHED)),
        )
        if key not in best or rank > best[key][0]:
            best[key] = (rank, study)
    return {k: v[1] for k, v in sorted(best.items())}


def current_study(profile: str) -> Callable[[optuna.Study], bool]:
    """Whether a study is the one today's spaces would run for its case under ``profile``
    (not an older space's): the ``current`` argument of ``studies_by_case``."""
    from autotune.search.space import available_spaces, select_space

    spaces = available_spaces()

    def current(study: optuna.Study) -> bool:
        case = case_of(study)
        try:
            space = select_space(profile, case, spaces)
        except ValueError:
            return False
        return study.study_name == study_name(profile, case, space)

    return current


def study_names(storage: Any) -> list[str]:
    return [s.study_name for s in optuna.get_all_study_summaries(storage)]


# --- trials --------------------------------------------------------------------------
# The study's reference time (ms), fixed by its first timed trial: every trial's latency
# objective is its own candidate median over this one number, not over the reference timed
# in its own process (on launch-bound cases that swings 1.4-3.2 ms between processes, where
# a graph-captured plan's time moves a few percent: ratios against per-trial references
# ranked 0.271 ms above 0.204 ms on case 11, session 11).
REFERENCE_MS = "reference_ms"
# On each timed trial: the reference time its latency objective divided by (the study's,
# or its own where the study had none yet), so every value can be checked or re-derived.
LATENCY_REFERENCE_MS = "latency_reference_ms"


def study_reference_ms(study: optuna.Study, outcome: Outcome) -> float | None:
    """The study's fixed reference time: stored by the first timed trial (this one, when
    none is stored yet). ``run_workers`` runs a study's first trial alone, so that workers
    do not race to set it; independent processes started together on one storage may each
    use their own for their first trial (``LATENCY_REFERENCE_MS`` records which)."""
    stored = study.user_attrs.get(REFERENCE_MS)
    if stored is not None:
        return float(stored)
    if outcome.timing is None or not outcome.timing.ref_median_ms > 0:
        return None
    ref = float(outcome.timing.ref_median_ms)
    study.set_user_attr(REFERENCE_MS, ref)
    return ref


def record_outcome(
    trial: optuna.Trial,
    plan: Plan,
    outcome: Outcome,
    capacity: int,
    reference_ms: float | None = None,
) -> list[float]:
    """Store the outcome on the trial, set the constraints, return the objective values:
    latency is the candidate's time over ``reference_ms`` (the study's fixed reference
    time; without it, over the reference timed beside it), and peak memory in MiB. The
    time is the median, or HOST_HEADROOM x the host time a call where that is longer
    (``robust_ms``: what export ranks by; the host time is measured on CUDA only)."""
    trial.set_user_attr(PLAN, plan.to_dict())
    trial.set_user_attr(PLAN_HASH, plan.hash)
    trial.set_user_attr(OUTCOME_KIND, outcome.kind.value)
    trial.set_user_attr(OUTCOME, outcome.to_json())
    trial.set_user_attr(SECONDS, round(sum(outcome.phase_seconds.values()), 3))
    correctness = float(outcome.violation)
    predicted = outcome.predicted_memory_bytes or 0
    memory = (predicted - capacity) / capacity if capacity else 0.0
    trial.set_constraint("correctness", correctness)
    trial.set_constraint("memory", memory)
    # Also where ``constraints_func`` stores them, the list that optuna-dashboard reads.
    trial.storage.set_trial_system_attr(trial._trial_id, "constraints", [correctness, memory])
    peak = outcome.peak_memory_bytes or predicted
    if outcome.passed and outcome.timing is not None:
        ref = reference_ms if reference_ms else outcome.timing.ref_median_ms
        trial.set_user_attr(LATENCY_REFERENCE_MS, ref)
        paced_ms = robust_ms(outcome.timing.cand_median_ms, outcome.host_ms_per_call)
        return [paced_ms / ref, peak / 2**20]
    return [PENALTY_LATENCY, peak / 2**20]


def mark_duplicate(trial: optuna.Trial, prior: FrozenTrial) -> Outcome:
    """The trial repeats an earlier plan: its outcome is reused, not re-run."""
    trial.set_user_attr(DUPLICATE_OF, prior.number)
    return Outcome.from_json(prior.user_attrs[OUTCOME])


def enqueue_attrs(source: str = "") -> dict[str, Any]:
    return {ENQUEUED: True} | ({WARM_START: source} if source else {})


def trial_outcome(trial: FrozenTrial) -> Outcome | None:
    data = trial.user_attrs.get(OUTCOME)
    return Outcome.from_json(data) if data else None


def trial_plan(trial: FrozenTrial) -> Plan | None:
    data = trial.user_attrs.get(PLAN)
    return Plan.from_dict(data) if data else None


def trial_plan_hash(trial: FrozenTrial) -> str | None:
    return trial.user_attrs.get(PLAN_HASH)


def trial_kind(trial: FrozenTrial) -> str:
    return str(trial.user_attrs.get(OUTCOME_KIND, "?"))


def trial_seconds(trial: FrozenTrial) -> float | None:
    return trial.user_attrs.get(SECONDS)


def is_feasible(trial: FrozenTrial) -> bool:
    return (
        trial.state == TrialState.COMPLETE
        and trial.user_attrs.get(OUTCOME_KIND) == OutcomeKind.PASSED.value
        and all(v <= 0 for v in trial.constraints.values())
    )


def speedup_of(trial: FrozenTrial) -> float | None:
    """A feasible trial's speedup over the study's reference, by its latency objective
    (on CUDA the time with the host HOST_HEADROOM times slower where that is longer; None
    when infeasible)."""
    return 1.0 / trial.values[0] if is_feasible(trial) else None


def pareto_front(study: optuna.Study) -> list[FrozenTrial]:
    """The feasible trials no other feasible trial beats on both latency and memory
    (Optuna's ``best_trials``, constraints included), fastest first."""
    front = [t for t in study.best_trials if is_feasible(t)]
    return sorted(front, key=_latency_order)


def candidate_ms(trial: FrozenTrial) -> float | None:
    """The candidate's median time as its trial measured it (absolute; None untimed)."""
    outcome = trial.user_attrs.get(OUTCOME) or {}
    timing = outcome.get("timing") or {}
    ms = timing.get("cand_median_ms")
    return float(ms) if ms is not None else None


def candidate_host_ms(trial: FrozenTrial) -> float | None:
    """The candidate's host time per call as its trial measured it (CUDA; None unknown)."""
    outcome = trial.user_attrs.get(OUTCOME) or {}
    ms = outcome.get("host_ms_per_call")
    return float(ms) if ms is not None else None


def feasible_by_time(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Feasible trials, fastest first by their own absolute candidate time, as it would be
    with the host ``HOST_HEADROOM`` times slower where the trial measured its host time
    (``robust_ms``); a trial without a time by its latency objective, after those with."""
    feasible = [t for t in trials if is_feasible(t)]

    def order(t: FrozenTrial) -> tuple[int, float, float, int]:
        ms = candidate_ms(t)
        if ms is None:
            return (1, *_latency_order(t))
        return (0, robust_ms(ms, candidate_host_ms(t)), t.values[1], t.number)

    return sorted(feasible, key=order)


def _latency_order(t: FrozenTrial) -> tuple[float, float, int]:
    return (t.values[0], t.values[1], t.number)


def counts(trial: FrozenTrial) -> bool:
    """Whether a finished trial counts toward ``--n-trials``: it measured a plan. A repeat
    of a measured plan (its outcome reused), a plan the space forbids and a plan the
    support rules refuse on this case and device (neither run) are recorded, so the
    sampler learns from them, but cost no trial."""
    attrs = trial.user_attrs
    return DUPLICATE_OF not in attrs and FORBIDDEN not in attrs and UNSUPPORTED_HERE not in attrs


def completed_trials(study: optuna.Study, run: str | None = None) -> int:
    """The complete trials that count (``counts``); with ``run``, those that run measured."""
    return sum(
        1
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if counts(t) and (run is None or t.user_attrs.get(RUN) == run)
    )


def find_prior(study: optuna.Study, plan_hash: str, number: int) -> FrozenTrial | None:
    """An earlier finished trial of the same plan: its outcome is reused, not re-run."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if (
            t.number != number
            and t.user_attrs.get(PLAN_HASH) == plan_hash
            and OUTCOME in t.user_attrs
        ):
            return t
    return None


def mark_interrupted(trial: optuna.Trial) -> None:
    trial.set_user_attr(FAIL_REASON, INTERRUPTED)


def close_interrupted(study: optuna.Study, trial_id: int | None) -> None:
    """The trial this process had in flight, if Ctrl-C left it RUNNING: FAIL, with why."""
    if trial_id is None:
        return
    storage = study._storage
    if storage.get_trial(trial_id).state == TrialState.RUNNING:
        storage.set_trial_user_attr(trial_id, FAIL_REASON, INTERRUPTED)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)


def retry_interrupted(study: optuna.Study) -> int:
    """Enqueue again every interrupted trial not yet retried (its plan, its origin), so a
    resumed study measures it; returns how many were enqueued."""
    done = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(RETRY_OF) for t in done}
    n = 0
    for t in done:
        if (
            t.state == TrialState.FAIL
            and t.user_attrs.get(FAIL_REASON) == INTERRUPTED
            and t.number not in retried
            and t.params
        ):
            attrs = {k: v for k, v in t.user_attrs.items() if k in (ENQUEUED, WARM_START)}
            study.enqueue_trial(t.params, user_attrs=attrs | {RETRY_OF: t.number})
            n += 1
    return n


# --- claims: how many trials, and who measures a plan ----------------------------------
def claim(
    study: optuna.Study,
    trial: optuna.Trial,
    plan_hash: str,
    n_trials: int,
    *,
    poll: float = 0.2,
    wait: Callable[[float], None] = time.sleep,
    note: Callable[[str], None] | None = None,
) -> tuple[str, FrozenTrial | None]:
    """Before a trial measures anything: whether it may run, and whether its plan is
    already measured, among every process sharing the study (any storage).

    The trial records its plan hash first (its claim). Trials are numbered atomically by
    the storage and start in number order (Optuna hands out enqueued trials lowest number
    first, and creates new ones only when none wait), so a lower number has priority: a
    trial waits until every lower-numbered running trial has made its claim; it is
    ``"surplus"`` when the study already has ``n_trials`` complete trials, and waits while
    complete plus lower running trials reach ``n_trials`` (one of them may still fail); it
    is ``"duplicate"`` of the first complete trial of the same plan (returned), waits while
    a lower running trial measures that plan, and is otherwise ``"measure"``. Waits end
    because a running trial finishes or fails (a dead process's trial goes stale on its
    heartbeat). The one order the storage does not guarantee: a trial enqueued again by
    one process while another creates a new one may start after it. ``note`` hears, once
    per lower trial, a wait on it longer than ``NOTE_AFTER`` seconds."""
    trial.set_user_attr(PLAN_HASH, plan_hash)
    me = trial.number
    since: dict[int, float] = {}  # when this trial began to wait on each lower one
    said: set[int] = set()

    def waiting(on: list[FrozenTrial], why: str) -> None:
        now = time.monotonic()
        for t in on:
            since.setdefault(t.number, now)
        long = [
            t.number for t in on if t.number not in said and now - since[t.number] >= NOTE_AFTER
        ]
        if note is not None and long:
            said.update(long)
            stale = _stale_after(study)
            note(
                f"trial {me} has waited {NOTE_AFTER:g} s for trial(s) "
                f"{', '.join(map(str, long))} ({why}): RUNNING in another process, or left by "
                "one that ended"
                + (f"; one is failed after {stale} s without a heartbeat" if stale else "")
            )
        _wait_stale(study, wait, poll)

    unclaimed_since = None
    while True:
        live = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        ahead = [t for t in live if t.state == TrialState.RUNNING and t.number < me]
        unclaimed = [t for t in ahead if PLAN_HASH not in t.user_attrs]
        if unclaimed:  # a lower trial has not claimed its plan yet: milliseconds, unless
            # its process died first (its heartbeat goes stale, and it is failed)
            unclaimed_since = unclaimed_since or time.monotonic()
            if time.monotonic() - unclaimed_since < 1.0:
                wait(poll)
            else:
                if not _fail_never_beating(study, unclaimed):  # died in ask(): none beat
                    waiting(unclaimed, "not yet claimed a plan")
            continue
        unclaimed_since = None
        complete = sum(1 for t in live if t.state == TrialState.COMPLETE and counts(t))
        if complete >= n_trials:
            return SURPLUS, None
        if complete + len(ahead) >= n_trials:
            waiting(ahead, f"with them the study has its {n_trials} trials, if they complete")
            continue
        measured = [
            t
            for t in live
            if t.state == TrialState.COMPLETE
            and t.user_attrs.get(PLAN_HASH) == plan_hash
            and OUTCOME in t.user_attrs
        ]
        if measured:
            return "duplicate", min(measured, key=lambda t: t.number)
        same = [t for t in ahead if t.user_attrs.get(PLAN_HASH) == plan_hash]
        if not same:
            return "measure", None
        waiting(same, "measuring the same plan")


# A wait on another trial longer than this is said (``claim``'s ``note``): shorter ones
# are the normal hand-over between processes sharing a study.
NOTE_AFTER = 10.0


def _fail_never_beating(study: optuna.Study, running: list[FrozenTrial]) -> int:
    """Fail (and retry, as a stale heartbeat is) each RUNNING trial that began longer ago
    than the heartbeat grace period and never recorded a heartbeat: its process died in
    ``study.ask()`` (sampling), before Optuna's heartbeat thread started, and Optuna's
    ``fail_stale_trials`` passes over a trial without one. Returns how many it failed."""
    stale = _stale_after(study)
    if not stale:
        return 0
    failed = 0
    backend = getattr(study._storage, "_backend", study._storage)
    now = datetime.datetime.now()  # Optuna stamps datetime_start with this process's clock
    for t in running:
        start = t.datetime_start
        if start is None or (now - start).total_seconds() < stale or _beats(backend, t):
            continue
        try:
            study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another process failed (or its own finished) it first
        failed += 1
        retry = backend.get_heartbeat_stale_trial_callback()
        if retry is not None:
            retry(study, study._storage.get_trial(t._trial_id))
    return failed


def _beats(backend: Any, trial: FrozenTrial) -> bool:
    """Whether the trial has a heartbeat record (True where that cannot be read: then it
    is left to Optuna's own stale-trial check)."""
    try:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        with _create_scoped_session(backend.scoped_session) as session:
            found = models.TrialHeartbeatModel.where_trial_id(trial._trial_id, session)
            return found is not None
    except Exception:  # another storage, or another Optuna: not ours to decide
        return True


def _stale_after(study: optuna.Study) -> int | None:
    """Seconds after which the storage fails a RUNNING trial whose heartbeat stopped."""
    storage = study._storage
    storage = getattr(storage, "_backend", storage)  # under Optuna's _CachedStorage
    interval = getattr(storage, "heartbeat_interval", None)
    if not interval:
        return None
    return getattr(storage, "grace_period", None) or 2 * interval


def _wait_stale(study: optuna.Study, wait: Callable[[float], None], poll: float) -> None:
    wait(max(poll, 0.5))
    optuna.storages.fail_stale_trials(study)


# --- storage -------------------------------------------------------------------------
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
    for attempt in range(4):
        try:
            return _rdb_storage(url, engine_kwargs, heartbeat_interval, grace_period)
        except (sqlalchemy.exc.SQLAlchemyError, ValueError, ImportError) as exc:
            # Processes that open a new database together race to create its schema:
            # the loser finds the tables made by the winner when it tries again.
            text = str(exc).lower()
            racing = isinstance(exc, sqlalchemy.exc.IntegrityError) or any(
                s in text for s in ("already exists", "duplicate key")
            )
            if racing and attempt < 3:
                time.sleep(0.5 * (attempt + 1))
                continue
            raise _storage_error(url, exc) from exc
    raise AssertionError("unreachable")


class RetryStale:
    """Optuna's ``RetryHeartbeatStaleTrialCallback`` without the dead attempt's constraint
    values: ``Trial.set_constraint`` keeps the first value a trial holds and ignores (with
    a warning) the retry's own, so a retried trial would be judged feasible or not by an
    attempt that never finished."""

    def __init__(self, max_retry: int | None) -> None:
        self._retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        kept = {
            k: v
            for k, v in trial.system_attrs.items()
            if k != "constraints" and not k.startswith("constraints:")
        }
        clean = copy.copy(trial)
        clean.system_attrs = kept
        self._retry(study, clean)


def _rdb_storage(
    url: str,
    engine_kwargs: dict[str, Any],
    heartbeat_interval: int | None,
    grace_period: int | None,
) -> optuna.storages.RDBStorage:
    # Heartbeats and their retry callback are experimental in Optuna 5, which says so on
    # every open (twice an export, once a worker): known and chosen, so not shown.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = RetryStale(max_retry=3)
        storage = optuna.storages.RDBStorage(
            url,
            engine_kwargs=engine_kwargs,
            heartbeat_interval=heartbeat_interval,
            grace_period=grace_period,
            heartbeat_stale_trial_callback=retry if heartbeat_interval else None,
        )
    if url.startswith("sqlite"):
        _serialise_sqlite(storage.engine)
    return storage


def _serialise_sqlite(engine: Any) -> None:
    """Every transaction on a SQLite storage takes the write lock when it begins (BEGIN
    IMMEDIATE, SQLAlchemy's recipe for pysqlite), where SQLite's default deferred one
    takes it at its first write. Optuna hands out an enqueued trial by reading that it
    waits and then marking it running; with deferred transactions two processes could
    both read it waiting and both run it (3 processes asking 300 enqueued trials got 9
    trials twice, session 22; optuna issue #4002). Postgres locks the row (SELECT ... FOR
    UPDATE) and needs nothing here. Connections opened before (the schema's) are dropped."""
    import sqlalchemy

    @sqlalchemy.event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite emits no BEGIN of its own

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()


def _storage_error(url: str, exc: Exception) -> ValueError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ValueError(
        f"cannot open storage {url!r}: {first}; check the URL, that the "
        "server runs, and that the file is a writable, intact database"
    )
