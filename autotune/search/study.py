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
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.build import not_supported_reasons
from autotune.core.cases import Case
from autotune.core.device import DeviceInfo
from autotune.core.outcome import Outcome, OutcomeKind
from autotune.core.profiles import ProfileSelection
from autotune.evaluate import DeviceBroken
from autotune.measure import STUDY_TIMING, TimingSettings, predict_peak_bytes
from autotune.plan import REFERENCE_PLAN, Plan
from autotune.search import trials
from autotune.search.interrupt import Interrupted, InterruptGuard
from autotune.search.runner import TrialEvaluator, make_evaluator
from autotune.search.space import SearchSpace

SAMPLERS = ("tpe", "nsga2", "gp", "random", "grid")

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def tpe_gamma(n: int) -> int:
    """How many of n finished trials TPE models as good: 15%, at most 25 (Optuna's
    default takes 10%). Replayed on the H200 efficiency caches over 120 seeds
    (``scripts/tpe_variants.py``), the measured trials to within 3% of the exhaustive best
    fell from a median of 38 to 31.5 on case 2 and from 33 to 30 on case 13."""
    return min(int(0.15 * n) + 1, 25)


def _tpe_sampler(seed: int | None) -> optuna.samplers.TPESampler:
    """The studies' TPE. Optuna 4.9 deprecated ``gamma`` (removal planned for 6.0): its
    FutureWarning is not shown, and where the argument is gone Optuna's default serves."""
    kwargs: dict[str, Any] = dict(
        seed=seed, multivariate=True, group=True, n_startup_trials=8, constant_liar=True
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*gamma.*deprecated", category=FutureWarning)
        try:
            return optuna.samplers.TPESampler(**kwargs, gamma=tpe_gamma)
        except TypeError:
            return optuna.samplers.TPESampler(**kwargs)


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return _tpe_sampler(seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=16)
    if name == "gp":
        # Knobs that exist only under some variants are sampled at random by GP (it has
        # no conditional space); said once in the docs, not per trial.
        return optuna.samplers.GPSampler(
            seed=seed, n_startup_trials=8, warn_independent_sampling=False
        )
    if name in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}; valid samplers: {', '.join(SAMPLERS)}")


@dataclasses.dataclass(frozen=True)
class StudyOptions:
    """How each case's study runs (what ``autotune study`` takes besides the cases)."""

    n_trials: int
    storage_url: str
    sampler: str = "tpe"
    seed: int = 0
    timeout: float | None = None  # seconds for the whole run, shared by the cases
    workers: int = 1
    isolate: bool = True
    trial_timeout: float = 600.0
    heartbeat: int = 10
    oracle_batch: int = 1
    warm_start: tuple[str, ...] = ()
    space_files: tuple[str, ...] = ()
    quiet: bool = False  # no progress bar, and no line when a trial waits on another

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(
                f"unknown sampler {self.sampler!r}; valid samplers: {', '.join(SAMPLERS)}"
            )
        if self.n_trials < 1:
            raise ValueError(f"--n-trials must be at least 1, got {self.n_trials}")
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")
        if self.oracle_batch < 1:
            raise ValueError(f"--oracle-batch must be at least 1, got {self.oracle_batch}")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"--timeout takes seconds above 0, got {self.timeout:g}")
        if not self.trial_timeout > 0:
            raise ValueError(f"--trial-timeout takes seconds above 0, got {self.trial_timeout:g}")
        if self.heartbeat < 1:
            raise ValueError(
                f"--heartbeat takes whole seconds, 1 or more, got {self.heartbeat} (default 10)"
            )


def warm_for(
    options: StudyOptions, storage: Any, selection: ProfileSelection, case: Case
) -> list[tuple[Plan, str]] | None:
    if not options.warm_start:
        return None
    return warm_start_plans(
        list(options.warm_start),
        storage,
        selection.profile.name,
        str(case.key),
        near=case.key.as_tuple(),
    )


def enqueue_defaults(
    study: optuna.Study,
    space: SearchSpace,
    sampler: str,
    warm: list[tuple[Plan, str]] | None = None,
) -> int:
    """Enqueue, once: the reference, the space's defaults, warm-start plans (with their
    source), and for ``grid`` every plan of the space. Plans outside the space are skipped.

    A study that has trials already (a resumed run) takes only the warm-start plans it
    has neither measured nor queued: a ``--warm-start`` given on a rerun is measured
    first, not dropped."""
    existing = study.get_trials(deepcopy=False)
    plans = list(warm or [])
    if not existing:
        plans = [(REFERENCE_PLAN, ""), *plans, *((p, "") for p in space.enqueue)]
        if sampler == "grid":
            plans += [(p, "") for p in space.enumerate()]
    # A resumed study: a plan measured (complete) or waiting its turn is not queued again;
    # one whose trial was pruned or failed before it was measured is.
    measured = {trials.trial_plan_hash(t) for t in existing if t.state == TrialState.COMPLETE}
    queued = [
        t.system_attrs.get("fixed_params")
        for t in existing
        if t.state in (TrialState.WAITING, TrialState.RUNNING)
    ]
    seen: set[Plan] = set()
    n = 0
    outside: dict[str, list[int]] = {}  # a table given: [its plans outside the space, all]
    for plan, source in plans:
        if plan in seen:
            continue
        seen.add(plan)
        tally = outside.setdefault(source[6:], [0, 0]) if source.startswith("table ") else None
        if tally is not None:
            tally[1] += 1
        try:
            params = space.params_for(plan)
        except ValueError as e:
            if source.startswith("plan "):  # named by the user: say why it is not measured
                print(
                    f"--warm-start {source[5:]}: outside the space {space.name!r}, not "
                    f"measured ({e}); add the value to the space or pass --space",
                    file=sys.stderr,
                )
            if tally is not None:
                tally[0] += 1
            continue  # the reference may lie outside a user's space
        if space.plan_of(params).hash in measured or params in queued:
            continue
        study.enqueue_trial(params, user_attrs=trials.enqueue_attrs(source))
        n += 1
    for src, (skipped, total) in outside.items():
        if skipped:  # (an anchor export shipped, e.g. sdpa_auto, is in no search space)
            print(
                f"--warm-start {src}: {skipped} of its {total} plans lie outside the space "
                f"{space.name!r}, not measured",
                file=sys.stderr,
            )
    return n


def named_in_queue(
    study: optuna.Study, space: SearchSpace, warm: list[tuple[Plan, str]] | None
) -> int:
    """How many waiting trials the study runs (oldest first, as Optuna takes them) before
    the last plan named in ``warm`` by file (source ``plan ...``) has its turn; 0 if none
    waits."""
    named = set()
    for plan, source in warm or []:
        if source.startswith("plan "):
            try:
                named.add(space.plan_of(space.params_for(plan)).hash)  # as enqueued
            except ValueError:
                continue  # outside the space: not enqueued
    if not named:
        return 0
    waiting = sorted(
        study.get_trials(deepcopy=False, states=(TrialState.WAITING,)), key=lambda t: t.number
    )
    last = 0
    for i, t in enumerate(waiting, 1):
        try:
            plan = space.plan_of(t.system_attrs.get("fixed_params") or {})
        except (ValueError, KeyError, TypeError):
            continue
        if plan.hash in named:
            last = i
    return last


def warm_start_plans(
    sources: list[str],
    storage: Any,
    profile: str,
    exclude_case_key: str | None = None,
    per_study: int = 4,
    near: tuple[Any, ...] | None = None,
) -> list[tuple[Plan, str]]:
    """Plans to seed a new study with: ``@plan.json`` (one plan), a table file's admitted
    plans, or the fastest feasible plans (by measured time) of other studies (a profile
    name: all its studies; or one study name), in the order of ``sources``. The target
    case's own study is skipped. A table's plans come nearest first when ``near`` (the
    target's case key) is given: the entry of that very shape, then the same dims by batch
    and sequence length, then the other dims, so a short study measures the likeliest
    winners first."""
    from pathlib import Path

    from autotune.runtime.buckets import dims_of, shape_distance

    def nearness(key: tuple[Any, ...]) -> tuple[bool, float]:
        if near is None:
            return (False, 0.0)
        return (dims_of(key) != dims_of(near), shape_distance(key[:2], near[:2]))

    out: list[tuple[Plan, str]] = []
    for src in sources:
        if src.startswith("@"):  # one plan file (a JSON plan), as --plan takes it
            from autotune.plan import parse_plan

            out.append((parse_plan(src), f"plan {src[1:]}"))
            continue
        if src.endswith(".py") or Path(src).is_file():
            from autotune.runtime.dispatch import load_table

            table = load_table(src)
            for _, entry in sorted(table.entries.items(), key=lambda kv: nearness(kv[0])):
                if entry.get("admitted"):
                    out.append((Plan.from_dict(entry.get("plan", {})), f"table {src}"))
            continue
        names = trials.study_names(storage)
        chosen = [n for n in names if n == src or trials.profile_of(n) == src]
        if not chosen:
            raise ValueError(
                f"--warm-start {src!r}: no table file, profile or study of that "
                f"name in the storage (studies: {len(names)}); one plan goes in a file: "
                "--warm-start @plan.json (JSON or knob=value)"
            )
        for name in chosen:
            study = optuna.load_study(study_name=name, storage=storage)
            if (
                exclude_case_key
                and trials.case_key_of(study) == exclude_case_key
                and trials.profile_of(name) == profile
            ):
                continue
            taken: set[str | None] = set()
            for t in trials.feasible_by_time(study.get_trials(deepcopy=False)):
                plan = trials.trial_plan(t)
                if plan is None or plan.hash in taken:
                    continue
                taken.add(plan.hash)
                out.append((plan, f"study {name} trial {t.number}"))
                if len(taken) == per_study:
                    break
    return out


@dataclasses.dataclass
class StudyProgress:
    """What the progress bar shows: trials, best speedup so far, feasible share."""

    total: int = 0
    finished: int = 0  # trials that count toward ``total`` (``trials.counts``)
    feasible: int = 0
    best_speedup: float = 0.0

    def update(self, trial: FrozenTrial) -> None:
        # A repeat, forbidden or refused plan costs no trial: the bar would pass its total.
        counted = trial.state == TrialState.COMPLETE and trials.counts(trial)
        self.finished += counted
        if trials.is_feasible(trial):
            self.feasible += counted
            self.best_speedup = max(self.best_speedup, 1.0 / trial.values[0])

    @classmethod
    def of(cls, study: optuna.Study, total: int) -> StudyProgress:
        """What ``study`` holds now (counted as ``update`` counts)."""
        state = cls(total=total)
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            state.update(t)
        return state

    def postfix(self) -> dict[str, str]:
        if not self.finished:  # nothing measured yet: nothing to show as 0
            return {"best": "-", "feasible": "-"}
        share = self.feasible / self.finished
        return {"best": f"{self.best_speedup:.2f}x", "feasible": f"{100 * share:.0f}%"}


@dataclasses.dataclass
class StudySummary:
    name: str
    case: Case
    trials: int
    new_trials: int
    feasible: int  # measured trials that passed
    best_speedup: float | None
    seconds: float
    measured: int = 0  # complete trials that count toward --n-trials
    target: int = 0  # the --n-trials this run aimed at (0: not said)
    stopped: str = ""  # why the study ended short of ``target``


@dataclasses.dataclass
class RunState:
    """What one process's run of a study shares with its objective."""

    n_trials: int
    guard: InterruptGuard
    # this command's run (trials.RUN on each trial it runs; its workers share it)
    token: str = dataclasses.field(default_factory=trials.new_run_token)
    quiet: bool = False  # --quiet: a long wait on another process's trial is not said
    stop: bool = False  # the study is full (a surplus trial was met)
    in_flight: int | None = None  # the storage id of the trial being evaluated
    last_free: bool = False  # the last trial cost nothing (a repeat, or forbidden)
    spent: int = 0  # trials of this process that were not free
    free_streak: int = 0  # free trials in a row (a sampler stuck on measured plans)
    broken: str = ""  # why this process's device can run nothing more (DeviceBroken)
    why: str = ""  # why the run stopped before the study had its trials, where it did


# Free trials in a row after which a run stops: the sampler keeps proposing measured plans.
MAX_FREE_STREAK = 200


def make_objective(
    study: optuna.Study,
    case: Case,
    space: SearchSpace,
    capacity: int,
    evaluator: TrialEvaluator,
    run: RunState,
    kill_at: int | None = None,
    device: DeviceInfo | None = None,
) -> Callable[[optuna.Trial], list[float]]:
    """The trial: sample a plan and claim it (``trials.claim``: a surplus trial is pruned
    and ends this process's run; a plan measured before, here or by another process, has
    its outcome reused, so a plan that crashed or hung is never run again); refuse space
    restrictions unrun, and plans the support rules refuse on ``device`` (both free);
    else evaluate; store everything and set the constraints. Ctrl-C
    stops the evaluation in flight and fails the trial (``autotune.search.interrupt``)."""

    def objective(trial: optuna.Trial) -> list[float]:
        run.in_flight = trial._trial_id
        run.last_free = False
        trial.set_user_attr(trials.RUN, run.token)
        plan = space.sample(trial)
        verdict, prior = trials.claim(
            study, trial, plan.hash, run.n_trials, note=None if run.quiet else _say
        )
        if verdict == trials.SURPLUS:
            run.stop = True
            raise optuna.TrialPruned(f"surplus: the study has {run.n_trials} complete trials")
        if kill_at is not None and trial.number == kill_at:
            time.sleep(2.5)  # test hook: a worker dies mid-trial, after its first heartbeats
            os.kill(os.getpid(), signal.SIGKILL)
        if prior is not None:
            outcome = trials.mark_duplicate(trial, prior)  # free: it does not count
            run.last_free = True
            if space_spent(study, space):
                run.stop = True
                run.why = "every plan of the search space is measured"
        elif (reason := space.violated(plan)) is not None:
            trial.set_user_attr(trials.FORBIDDEN, True)
            run.last_free = True
            outcome = Outcome(
                OutcomeKind.UNSUPPORTED,
                reason,
                predicted_memory_bytes=predict_peak_bytes(plan, case.config),
            )
        elif device is not None and (
            refused := not_supported_reasons(plan, case.config, device, prune=True)
        ):
            trial.set_user_attr(trials.UNSUPPORTED_HERE, True)
            run.last_free = True
            outcome = Outcome(
                OutcomeKind.UNSUPPORTED,
                "; ".join(refused),
                predicted_memory_bytes=predict_peak_bytes(plan, case.config),
            )
        else:
            run.guard.on_signal = evaluator.interrupt
            try:
                outcome = evaluator.evaluate(plan, trial.number)
            except KeyboardInterrupt:  # raised by the handler inside an in-process trial
                trials.mark_interrupted(trial)
                _quiet_optuna()
                raise
            except DeviceBroken as exc:  # an earlier in-process trial broke the device:
                trials.mark_interrupted(trial)  # this plan was not measured; a rerun will
                run.broken = str(exc)
                _quiet_optuna()
                raise
            except Exception:
                if not run.guard.requested:
                    raise
                # The signal's handler killed the runner while it started: the plan was
                # not measured, and the rerun measures it (not a failure of the plan).
                trials.mark_interrupted(trial)
                _quiet_optuna()
                raise KeyboardInterrupt from None
            finally:
                run.guard.on_signal = None
        if run.guard.requested:  # the outcome of an interrupted evaluation is not kept
            trials.mark_interrupted(trial)
            _quiet_optuna()  # the run ends here: one line from the CLI, no trial traceback
            raise KeyboardInterrupt
        reference_ms = trials.study_reference_ms(study, outcome) if outcome.passed else None
        return trials.record_outcome(trial, plan, outcome, capacity, reference_ms)

    return objective


def space_spent(study: optuna.Study, space: SearchSpace) -> bool:
    """Every plan of the space is measured (or refused here): further trials could only
    repeat (the space is enumerated only as far as the number of plans tried, never
    counted)."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    tried = [t for t in done if trials.counts(t) or trials.UNSUPPORTED_HERE in t.user_attrs]
    return not space.larger_than(len({t.user_attrs.get(trials.PLAN_HASH) for t in tried}))


def _say(line: str) -> None:
    """A line to stderr that leaves a progress bar whole (tqdm clears and redraws it)."""
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm comes with Optuna; a bare print where it does not
        print(line, file=sys.stderr, flush=True)
    else:
        tqdm.write(line, file=sys.stderr)


def _quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def optimize(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], list[float]],
    run: RunState,
    *,
    max_trials: int,
    timeout: float | None = None,
    callbacks: list[Callable[[optuna.Study, FrozenTrial], None]] | None = None,
) -> None:
    """``study.optimize`` until the study has ``run.n_trials`` complete trials, this call
    has spent ``max_trials`` trials (free ones, repeats and forbidden plans, do not count),
    the time is up, the study is full or its space spent, or Ctrl-C (then the trial in
    flight is failed, and enqueued again for the next run: the caller raises
    ``Interrupted``)."""
    start = run.spent

    def stop_when_done(study: optuna.Study, trial: FrozenTrial) -> None:
        if run.last_free:
            run.free_streak += 1
        else:
            run.free_streak = 0
            run.spent += 1
        if run.free_streak >= MAX_FREE_STREAK and not run.why:
            run.why = (
                f"{MAX_FREE_STREAK} free trials in a row (plans measured before, forbidden by "
                "the space or refused on this device; --sampler random or grid reach every "
                "plan of a small space)"
            )
        if run.spent - start >= max_trials and not run.why:
            run.why = f"{max_trials} trials spent, some failed in the harness (see the study)"
        if (
            run.stop
            or run.broken
            or run.guard.requested
            or run.spent - start >= max_trials
            or run.free_streak >= MAX_FREE_STREAK
            or trials.completed_trials(study) >= run.n_trials
        ):
            study.stop()

    try:
        study.optimize(
            objective,
            n_trials=None,
            timeout=timeout,
            callbacks=[*(callbacks or []), stop_when_done],
            catch=(Exception,),
            gc_after_trial=False,
        )
    except KeyboardInterrupt:
        if not run.guard.requested:
            run.guard.requested = True  # a second Ctrl-C, or one outside the guard
    finally:
        if run.guard.requested or run.broken:
            trials.close_interrupted(study, run.in_flight)
            trials.retry_interrupted(study)
        optuna.logging.set_verbosity(optuna.logging.WARNING)


def open_study(
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
        study_name=trials.study_name(selection.profile.name, case, space),
        directions=["minimize", "minimize"],
        sampler=make_sampler(sampler, seed),
        load_if_exists=True,
    )
    if not study.user_attrs:
        study.set_metric_names(list(trials.OBJECTIVES))
        attrs = trials.study_attrs(
            case, space, selection.environment(), sampler, _reference_note(case, selection), seed
        )
        for key, value in attrs.items():
            study.set_user_attr(key, value)
    enqueue_defaults(study, space, sampler, warm)
    return study


def _reference_note(case: Case, selection: ProfileSelection) -> str:
    from autotune.judge.gate import dense_reference_fits

    if dense_reference_fits(case, selection.effective_device()):
        return "dense reference, full batch"
    return "streamed exact oracle on a batch subset (see each trial's outcome)"


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
    quiet: bool = False,
) -> StudySummary:
    """Run (or resume) one case's study until it has ``n_trials`` completed trials (in
    total, whatever other processes share the study), or more where plans named in
    ``warm`` (``--warm-start @PLAN.json``) wait their turn: those are measured even in a
    study that has its trials already. Ctrl-C raises ``Interrupted``."""
    study = open_study(selection, case, space, storage, sampler, seed, warm)
    done_before = trials.completed_trials(study)
    n_trials = max(n_trials, done_before + named_in_queue(study, space, warm))
    remaining = n_trials - done_before
    start = time.perf_counter()
    state = StudyProgress.of(study, n_trials)
    if progress is not None:
        progress(state)  # a resumed study shows where it stands, with or without work left
    if remaining <= 0:
        return summarise_study(study, case, 0, start, n_trials)

    def callback(study: optuna.Study, trial: FrozenTrial) -> None:
        state.update(trial)
        if progress is not None:
            progress(state)

    with InterruptGuard() as guard:
        run = RunState(n_trials, guard, quiet=quiet)
        evaluator = make_evaluator(selection, case, timing, isolate, trial_timeout, oracle_batch)
        objective = make_objective(
            study,
            case,
            space,
            selection.capacity_bytes,
            evaluator,
            run,
            device=selection.effective_device(),
        )
        try:
            # Trials that fail in the harness are not complete: allow a few beyond the rest.
            optimize(
                study,
                objective,
                run,
                max_trials=2 * remaining + 2,
                timeout=timeout,
                callbacks=[callback],
            )
        finally:
            evaluator.close()
    new = trials.completed_trials(study, run.token)
    if guard.requested:
        raise Interrupted(new)
    if run.broken:
        raise DeviceBroken(run.broken)
    timed_out = timeout is not None and time.perf_counter() - start >= timeout
    why = run.why or ("--timeout reached (rerun to resume)" if timed_out else "")
    return summarise_study(study, case, new, start, n_trials, why)


def summarise_study(
    study: optuna.Study, case: Case, new: int, start: float, target: int = 0, why: str = ""
) -> StudySummary:
    """What ``study`` holds: its measured trials (``trials.counts``), the free ones (repeats,
    forbidden or refused plans), and, where it stopped short of ``target``, why."""
    finished = study.get_trials(deepcopy=False, states=trials.FINISHED)
    complete = [t for t in finished if t.state == TrialState.COMPLETE]
    measured = sum(trials.counts(t) for t in complete)
    feasible = [t for t in finished if trials.is_feasible(t)]
    best = max((1.0 / t.values[0] for t in feasible), default=None)
    return StudySummary(
        study.study_name,
        case,
        len(finished),
        new,
        sum(trials.counts(t) for t in feasible),
        best,
        time.perf_counter() - start,
        measured=measured,
        target=target,
        stopped=why if target and measured < target else "",
    )
