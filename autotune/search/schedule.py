"""Several cases' studies in one run: the time budget shared by regime, each case on one
worker (this process) or on many (``autotune.search.workers``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from autotune.core.cases import Case
from autotune.core.profiles import ProfileSelection
from autotune.search.interrupt import Interrupted
from autotune.search.space import SearchSpace
from autotune.search.study import (
    StudyOptions,
    StudyProgress,
    StudySummary,
    run_case_study,
    warm_for,
)

# Share of a --timeout each case gets, by regime: launch-bound shapes converge in few
# (fast) trials; capacity, long and projection-bound shapes have slow trials and more to find.
BUDGET_WEIGHTS = {
    "launch-bound": 0.6,
    "capacity": 1.8,
    "long-sequence": 1.6,
    "projection-bound": 1.4,
    "infeasible-dense": 2.0,
}


def budget_weight(case: Case) -> float:
    return BUDGET_WEIGHTS.get(case.regime, 1.0)


# A progress display for one case: called with each state, closed when the case ends.
ProgressFactory = Callable[[Case], tuple[Callable[[StudyProgress], None], Callable[[], None]]]


def run_studies(
    selection: ProfileSelection,
    cases: list[tuple[Case, SearchSpace]],
    options: StudyOptions,
    storage: Any,
    *,
    progress: ProgressFactory | None = None,
    emit: Callable[[str], None] = print,
) -> list[StudySummary]:
    """Run (or resume) each case's study in order; ``options.timeout`` is shared by the
    cases left, weighted by regime. Returns what each finished study holds."""
    deadline = time.monotonic() + options.timeout if options.timeout else None
    summaries: list[StudySummary] = []
    try:
        _run_each(selection, cases, options, storage, deadline, summaries, progress, emit)
    except Interrupted as stop:  # the trials of the cases finished before count too
        raise Interrupted(stop.kept + sum(s.new_trials for s in summaries)) from None
    return summaries


def _run_each(
    selection: ProfileSelection,
    cases: list[tuple[Case, SearchSpace]],
    options: StudyOptions,
    storage: Any,
    deadline: float | None,
    summaries: list[StudySummary],
    progress: ProgressFactory | None,
    emit: Callable[[str], None],
) -> None:
    for i, (case, space) in enumerate(cases):
        timeout = None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                emit(f"time budget spent; {len(cases) - i} case(s) left for the next run")
                break
            weights = [budget_weight(c) for c, _ in cases[i:]]
            timeout = left * weights[0] / sum(weights)
        warm = warm_for(options, storage, selection, case)
        if options.workers > 1:
            from autotune.search.workers import run_case_with_workers

            summaries.append(
                run_case_with_workers(
                    selection, case, space, storage, options, warm, progress, timeout
                )
            )
            continue
        show, close = progress(case) if progress is not None else (None, lambda: None)
        try:
            summary = run_case_study(
                selection,
                case,
                space,
                storage=storage,
                n_trials=options.n_trials,
                timeout=timeout,
                sampler=options.sampler,
                seed=options.seed,
                progress=show,
                isolate=options.isolate,
                trial_timeout=options.trial_timeout,
                warm=warm,
                oracle_batch=options.oracle_batch,
                quiet=options.quiet,
            )
        finally:
            close()
        summaries.append(summary)
