"""How good is the search? Samplers against exhaustive tuning on one case (issue 10).

Two phases, so the GPU pays only once:

1. ``measure_space``: every plan of a (reduced) search space is evaluated once, exactly as
   a study trial is (the same gate, timing and isolation), and cached in a JSON file that
   a re-run resumes. The minimum relative latency over the feasible plans is the answer
   exhaustive tuning (what Triton's ``@autotune`` gives by trying every config) finds.
2. ``replay``: each sampler (TPE, GP, NSGA-II, random; several seeds) runs a real Optuna
   study on the same space whose objective looks the measured outcome up instead of
   re-measuring. A sampler's cost to come within 3% of the exhaustive best is the number
   of trials and the GPU seconds of the distinct plans it had evaluated by then (a
   repeated plan costs nothing: studies reuse identical plans' outcomes). Warm starts
   enqueue the best plans of another case's measurements first.

By default a replay runs a fixed number of trials, repeats included. With
``budget_measured`` it runs as a study does instead: only trials that measure a new plan
count toward the budget (repeats, forbidden plans and plans refused unrun are free), and
a run that meets ``max_free_streak`` free trials in a row (the sampler keeps proposing
plans it has seen: the studies' ``MAX_FREE_STREAK``) stops early, which the run records.
``stop_below`` also ends such a run at its first plan within the target: the trials to the
target are the same (the same study, cut short), and a sampler whose every trial is slow
(GP, with hundreds of repeats) is not run on for nothing. ``max_trials`` bounds such a run
in trials, free ones included (studies have no such bound): GP's trials cost more the more
trials there are, and it can find a new plan often enough never to meet the free cap.

The replay fixes each plan's latency at its one measurement: timing noise is not
re-drawn per trial. What it measures is the search, not the timer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from autotune.core.files import save_figure, together, unwritable_folder, write_atomic
from autotune.core.outcome import Outcome, OutcomeKind
from autotune.plan import Plan
from autotune.search.space import SearchSpace
from autotune.search.study import MAX_FREE_STREAK, make_sampler
from autotune.search.trials import PENALTY_LATENCY

WITHIN = 0.03


@dataclasses.dataclass(frozen=True)
class Measured:
    """One plan of the space, measured once."""

    plan_hash: str
    plan: dict[str, Any]
    kind: str
    passed: bool
    latency: float  # candidate / reference median; PENALTY_LATENCY when not passed
    peak_mib: float
    violation: float  # correctness constraint (<= 0 feasible)
    predicted_bytes: int
    seconds: float  # what evaluating it cost (build, first call, gate, timing)
    # Absolute medians (ms) of the plan and of the reference timed beside it in its own
    # process (None in caches made before session 11): with them a cache ranks plans by
    # their own times over one reference (``rebased``), as studies now do, not by ratios
    # to references that swing up to 2x between processes.
    cand_ms: float | None = None
    ref_ms: float | None = None

    def feasible(self, capacity: int | None) -> bool:
        fits = capacity is None or self.predicted_bytes <= capacity
        return self.passed and self.violation <= 0 and fits

    @classmethod
    def from_outcome(cls, plan: Plan, outcome: Outcome, seconds: float) -> Measured:
        timed = outcome.passed and outcome.timing is not None
        latency = (
            outcome.timing.cand_median_ms / outcome.timing.ref_median_ms
            if timed and outcome.timing is not None
            else PENALTY_LATENCY
        )
        peak = outcome.peak_memory_bytes or outcome.predicted_memory_bytes or 0
        timing = outcome.timing if timed else None
        return cls(
            plan.hash,
            plan.to_dict(full=False),
            outcome.kind.value,
            bool(timed),
            float(latency),
            peak / 2**20,
            float(outcome.violation) if math.isfinite(outcome.violation) else 1e9,
            int(outcome.predicted_memory_bytes or 0),
            round(seconds, 4),
            timing.cand_median_ms if timing is not None else None,
            timing.ref_median_ms if timing is not None else None,
        )


def rebased(plans: dict[str, dict[str, Any]]) -> dict[str, Measured]:
    """A cache's measurements; where every timed plan has its absolute time, each latency
    is that time over one reference (the median of the plans' references), so plans rank
    by their own times, as a study's objective does. Older caches keep their ratios."""
    measured = {h: Measured(**m) for h, m in plans.items()}
    timed = [m for m in measured.values() if m.passed]
    if not timed or any(m.cand_ms is None or not m.ref_ms for m in timed):
        return measured
    reference = statistics.median(m.ref_ms for m in timed if m.ref_ms)
    return {
        h: dataclasses.replace(m, latency=m.cand_ms / reference)
        if m.passed and m.cand_ms is not None
        else m
        for h, m in measured.items()
    }


def load_cache(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        return {"plans": {}}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"measurement cache {str(path)!r} is not valid JSON ({exc}); move it away to start over"
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("plans"), dict):
        raise ValueError(f"{str(path)!r} is not an 'autotune efficiency' measurement cache")
    return data


def measure_space(
    space: SearchSpace,
    evaluate: Callable[[Plan, int], Outcome],
    cache_path: str | Path,
    header: dict[str, Any],
    *,
    deadline: float | None = None,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, Measured], bool]:
    """Evaluate every plan not yet in the cache; returns (measured, complete). The cache is
    rewritten atomically after each plan, so a killed run loses at most that plan."""
    path = Path(cache_path)
    data = load_cache(path)
    old = data.get("header", {})
    for key in ("space_hash", "case_key", "profile"):
        if old and old.get(key) != header.get(key):
            raise ValueError(
                f"{str(path)!r} holds measurements for {key}={old.get(key)!r}, not "
                f"{header.get(key)!r}; use another --cache file"
            )
    data["header"] = header
    plans = list(space.enumerate())
    measured = {h: Measured(**m) for h, m in data["plans"].items()}  # as stored, to resume
    todo = [p for p in plans if p.hash not in measured]
    log(f"space {space.name}: {len(plans)} plans, {len(plans) - len(todo)} measured already")
    for i, plan in enumerate(todo):
        if deadline is not None and time.monotonic() > deadline:
            log(f"time budget spent: {len(todo) - i} plan(s) left for the next run")
            return measured, False
        t0 = time.perf_counter()
        outcome = evaluate(plan, i)
        spent = sum(outcome.phase_seconds.values()) or (time.perf_counter() - t0)
        m = Measured.from_outcome(plan, outcome, spent)
        measured[plan.hash] = m
        data["plans"][plan.hash] = dataclasses.asdict(m)
        write_atomic(path, json.dumps(data, indent=0, sort_keys=True) + "\n")
        log(
            f"[{len(measured)}/{len(plans)}] {plan.describe()}: "
            + (f"{1 / m.latency:.2f}x" if m.passed else m.kind)
            + f" ({m.seconds:.1f} s)"
        )
    return measured, True


def exhaustive_best(measured: dict[str, Measured], capacity: int | None) -> Measured:
    feasible = [m for m in measured.values() if m.feasible(capacity)]
    if not feasible:
        raise ValueError("no plan of the space is feasible: nothing to compare samplers with")
    return min(feasible, key=lambda m: (m.latency, m.plan_hash))


@dataclasses.dataclass
class Run:
    sampler: str
    seed: int
    warm: bool
    best: list[float]  # best feasible latency after each trial (inf before any)
    seconds: list[float]  # cumulative GPU seconds of distinct plans after each trial
    # Trials that measured a new plan, cumulative after each trial: what a study counts
    # toward --n-trials (repeats, forbidden plans and plans unsupported on the device are
    # free). Empty: every trial counted.
    measured: list[int] = dataclasses.field(default_factory=list)
    # Free trials by kind over the whole run: "repeat" (a plan seen before), "forbidden"
    # (refused by the space's restrictions), "unsupported" (refused unrun when measured).
    free: dict[str, int] = dataclasses.field(default_factory=dict)
    # Why a run with a measured-trial budget ended before spending it ("" when it spent
    # it, and always "" for a run with a trial budget).
    stopped: str = ""

    @property
    def free_trials(self) -> int:
        """Trials that measured no new plan (what a study does not count)."""
        return len(self.best) - (self.measured[-1] if self.measured else len(self.best))

    def best_by_measured(self, budget: int) -> list[float]:
        """Best feasible latency after 1..``budget`` measured trials (the best only changes
        on a trial that measured a new plan); a run that stopped early keeps its last best."""
        out: list[float] = []
        for b, m in zip(self.best, self.measured or range(1, len(self.best) + 1), strict=True):
            if m > len(out) and len(out) < budget:
                out.append(b)
        last = self.best[-1] if self.best else math.inf
        return out + [last] * (budget - len(out))

    def to_within(self, target: float) -> tuple[int | None, float | None]:
        for i, b in enumerate(self.best):
            if b <= target:
                return i + 1, self.seconds[i]
        return None, None

    def measured_to_within(self, target: float) -> int | None:
        """The trials a study spends to come within ``target`` (repeats free)."""
        for i, b in enumerate(self.best):
            if b <= target:
                return self.measured[i] if self.measured else i + 1
        return None


def replay(
    space: SearchSpace,
    measured: dict[str, Measured],
    sampler: str,
    seed: int,
    n_trials: int,
    capacity: int | None,
    enqueue: list[Plan] | None = None,
    *,
    budget_measured: int | None = None,
    max_free_streak: int = MAX_FREE_STREAK,
    stop_below: float | None = None,
    max_trials: int | None = None,
) -> Run:
    """A real Optuna study on the space with measured outcomes looked up, not re-run:
    ``n_trials`` trials, or, with ``budget_measured``, until that many trials measured a
    new plan, ``max_free_streak`` free trials came in a row, or every plan was seen (and,
    with ``stop_below``, at the first feasible plan at or below that latency; with
    ``max_trials``, after that many trials in all)."""
    if budget_measured is not None and (budget_measured < 1 or max_free_streak < 1):
        raise ValueError(
            f"a measured-trial budget ({budget_measured}) and a cap on free trials in a "
            f"row ({max_free_streak}) must be at least 1"
        )
    study = optuna.create_study(
        directions=["minimize", "minimize"], sampler=make_sampler(sampler, seed)
    )
    for plan in enqueue or []:
        study.enqueue_trial(space.params_for(plan), skip_if_exists=True)
    best: list[float] = []
    seconds: list[float] = []
    seen: set[str] = set()
    counted: list[int] = []
    state = {"best": math.inf, "spent": 0.0, "counted": 0}
    free = {"repeat": 0, "forbidden": 0, "unsupported": 0}

    def objective(trial: optuna.Trial) -> list[float]:
        plan = space.sample(trial)
        m = measured.get(plan.hash)
        if m is None:  # refused by the space's restrictions: never run, costs nothing
            free["forbidden"] += 1
            trial.set_constraint("correctness", 1.0)
            trial.set_constraint("memory", 0.0)
            values = [PENALTY_LATENCY, 0.0]
        else:
            if plan.hash not in seen:
                seen.add(plan.hash)
                state["spent"] += m.seconds
                if m.kind != OutcomeKind.UNSUPPORTED.value:  # refused unrun: free
                    state["counted"] += 1
                else:
                    free["unsupported"] += 1
            else:
                free["repeat"] += 1
            trial.set_constraint("correctness", m.violation if m.passed else 1.0)
            over = 0.0 if capacity is None else (m.predicted_bytes - capacity) / capacity
            trial.set_constraint("memory", over)
            values = [m.latency, m.peak_mib]
            if m.feasible(capacity):
                state["best"] = min(state["best"], m.latency)
        best.append(state["best"])
        seconds.append(state["spent"])
        counted.append(int(state["counted"]))
        return values

    stopped = ""
    if budget_measured is None:
        study.optimize(objective, n_trials=n_trials)
    else:
        # Plans a trial can measure: every plan of the space except those refused unrun.
        countable = sum(m.kind != OutcomeKind.UNSUPPORTED.value for m in measured.values())
        streak = [0, 0]  # free trials in a row; measured trials at the last trial

        def stop_when_spent(study: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
            nonlocal stopped
            now = counted[-1]
            streak[0] = 0 if now > streak[1] else streak[0] + 1
            streak[1] = now
            if now >= budget_measured or (stop_below is not None and best[-1] <= stop_below):
                study.stop()
            elif now >= countable:
                stopped = f"every plan of the space measured ({now}) before the budget"
                study.stop()
            elif streak[0] >= max_free_streak:
                stopped = (
                    f"{max_free_streak} free trials in a row (repeats or refused plans) "
                    f"after {now} measured"
                )
                study.stop()
            elif max_trials is not None and len(counted) >= max_trials:
                stopped = f"{max_trials} trials in all, free ones included, after {now} measured"
                study.stop()

        study.optimize(objective, n_trials=None, callbacks=[stop_when_spent])
    return Run(sampler, seed, bool(enqueue), best, seconds, counted, free, stopped)


def summarise_runs(
    runs: list[Run],
    target: float,
    space_size: int,
    exhaustive_seconds: float,
    budget_measured: int | None = None,
) -> list[dict[str, Any]]:
    """Per (sampler, warm): trials and seconds to the target, median and spread. Runs
    replayed with a measured-trial budget (``budget_measured``) are summarised by
    ``summarise_measured_runs``."""
    if budget_measured is not None:
        return summarise_measured_runs(
            runs, target, space_size, exhaustive_seconds, budget_measured
        )
    rows = []
    keys = list(dict.fromkeys((r.sampler, r.warm) for r in runs))
    for sampler, warm in keys:
        group = [r for r in runs if r.sampler == sampler and r.warm == warm]
        hits = [r.to_within(target) for r in group]
        trials = [t for t, _ in hits if t is not None]
        secs = [s for _, s in hits if s is not None]
        missed = len(group) - len(trials)
        # A seed that never got there counts as the whole budget (the median is then an
        # upper bound, and 'reached' says so).
        budget = len(group[0].best)
        all_trials = sorted(trials + [budget + 1] * missed)

        def q(values: list[float], f: float) -> float:
            return statistics.quantiles(values, n=4)[int(f)] if len(values) > 1 else values[0]

        med = statistics.median(all_trials)
        # The same seeds counted as a study counts now: repeats and forbidden plans free.
        free = [r.measured_to_within(target) for r in group]
        spent = sorted([t for t in free if t is not None] + [budget + 1] * missed)
        med_spent = statistics.median(spent)
        rows.append(
            {
                "sampler": sampler,
                "warm start": warm,
                "seeds": len(group),
                "reached": f"{len(trials)}/{len(group)}",
                "median trials": med,
                "trials q1-q3": f"{q(all_trials, 0):.0f}-{q(all_trials, 2):.0f}",
                "% of exhaustive trials": 100.0 * med / space_size,
                "median trials, repeats free": med_spent,
                "% of exhaustive, repeats free": 100.0 * med_spent / space_size,
                **_gpu_seconds(secs, exhaustive_seconds),
            }
        )
    return rows


def _gpu_seconds(secs: list[float], exhaustive_seconds: float) -> dict[str, float | None]:
    """The median GPU seconds to the target, and that as a share of the exhaustive run's."""
    med = statistics.median(secs) if secs else None
    share = 100.0 * med / exhaustive_seconds if med is not None and exhaustive_seconds else None
    return {"median GPU s": med, "% of exhaustive GPU s": share}


def _quartiles(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.0f}-{values[0]:.0f}"
    q = statistics.quantiles(values, n=4)
    return f"{q[0]:.0f}-{q[2]:.0f}"


def summarise_measured_runs(
    runs: list[Run], target: float, space_size: int, exhaustive_seconds: float, budget: int
) -> list[dict[str, Any]]:
    """Per (sampler, warm), for runs with a budget of ``budget`` measured trials: measured
    trials to the target (a seed that never got there counts as ``budget`` + 1), the free
    trials each run skipped (repeats, forbidden and refused plans), and the runs that
    stopped before spending the budget."""
    rows = []
    keys = list(dict.fromkeys((r.sampler, r.warm) for r in runs))
    for sampler, warm in keys:
        group = [r for r in runs if r.sampler == sampler and r.warm == warm]
        hits = [r.measured_to_within(target) for r in group]
        secs = [r.to_within(target)[1] for r in group]
        reached = [h for h in hits if h is not None]
        spent = sorted(float(h) if h is not None else budget + 1.0 for h in hits)
        med = statistics.median(spent)
        free = [float(r.free_trials) for r in group]
        repeats = [float(r.free.get("repeat", 0)) for r in group]
        gpu = [s for s in secs if s is not None]
        rows.append(
            {
                "sampler": sampler,
                "warm start": warm,
                "seeds": len(group),
                "reached": f"{len(reached)}/{len(group)}",
                "median measured trials": med,
                "measured q1-q3": _quartiles(spent),
                "% of exhaustive trials": 100.0 * med / space_size,
                "median trials run": statistics.median(len(r.best) for r in group),
                "median free trials": statistics.median(free),
                "free q1-q3": _quartiles(free),
                "median repeats": statistics.median(repeats),
                "stopped early": sum(bool(r.stopped) for r in group),
                **_gpu_seconds(gpu, exhaustive_seconds),
            }
        )
    return rows


def plot_runs(
    runs: list[Run], exhaustive: float, path: str | Path, budget_measured: int | None = None
) -> Path:
    """Best-so-far latency over the exhaustive best, median over seeds, per sampler: over
    trials, or over measured trials for runs with a measured-trial budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    keys = list(dict.fromkeys((r.sampler, r.warm) for r in runs))
    for sampler, warm in keys:
        group = [r for r in runs if r.sampler == sampler and r.warm == warm]
        if budget_measured is None:
            curves = [r.best for r in group]
        else:
            curves = [r.best_by_measured(budget_measured) for r in group]
        n = min(len(c) for c in curves)
        ys = [statistics.median(c[i] / exhaustive for c in curves) for i in range(n)]
        ys = [y if math.isfinite(y) else float("nan") for y in ys]
        ax.plot(range(1, n + 1), ys, label=sampler + (" (warm start)" if warm else ""))
    ax.axhline(1 + WITHIN, color="grey", ls="--", lw=1, label=f"within {100 * WITHIN:.0f}%")
    ax.set_xlabel("trials" if budget_measured is None else "measured trials (repeats free)")
    ax.set_ylabel("best latency / exhaustive best (median over seeds)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = save_figure(fig, path)
    plt.close(fig)
    return path


def warm_plans(
    cache: dict[str, Any], space: SearchSpace, capacity: int | None, k: int
) -> list[Plan]:
    """The ``k`` fastest feasible plans of another measurement cache that this space holds."""
    others = sorted(
        rebased(cache["plans"]).values(),
        key=lambda m: (m.latency, m.plan_hash),
    )
    out = []
    for m in others:
        if not m.feasible(capacity):
            continue
        plan = Plan.from_dict(m.plan)
        try:
            space.params_for(plan)
        except ValueError:
            continue
        out.append(plan)
        if len(out) == k:
            break
    return out


@dataclasses.dataclass(frozen=True)
class EfficiencyOptions:
    """What ``autotune efficiency`` takes."""

    case_id: str
    space_path: str
    cache: str
    out: str = "docs/efficiency"
    samplers: tuple[str, ...] = ("tpe", "gp", "nsga2", "random")
    seeds: int = 5
    trials: int | None = None
    warm_from: str | None = None
    warm_k: int = 5
    timeout: float | None = None
    trial_timeout: float = 120.0
    isolate: bool = True
    measure_only: bool = False
    replay: bool = False
    budget_measured: int | None = None  # replay budget in measured trials (repeats free)
    max_free_streak: int | None = None  # with budget_measured; None: MAX_FREE_STREAK
    stop_at_target: bool = False  # with budget_measured: a run ends within 3% of the best
    max_trials_per_run: int | None = None  # with budget_measured: trials in all, free included
    command: str = "autotune efficiency"

    def __post_init__(self) -> None:
        from autotune.search.study import SAMPLERS

        bad = [s for s in self.samplers if s not in SAMPLERS or s == "grid"]
        if bad:
            raise ValueError(f"unknown sampler(s) {bad}; valid: tpe, gp, nsga2, random")
        if not self.samplers or len(set(self.samplers)) != len(self.samplers):
            raise ValueError(
                f"--samplers {','.join(self.samplers)!r}: give each sampler once, such as "
                "tpe,gp,nsga2,random"
            )
        if self.seeds < 1:
            raise ValueError(f"--seeds must be at least 1, got {self.seeds}")
        for flag, value in (("--trials", self.trials), ("--warm-k", self.warm_k)):
            if value is not None and value < 1:
                raise ValueError(f"{flag} must be at least 1, got {value}")
        for flag, seconds in (("--timeout", self.timeout), ("--trial-timeout", self.trial_timeout)):
            if seconds is not None and not 0 < seconds < math.inf:
                raise ValueError(f"{flag} takes seconds above 0, got {seconds}")
        if self.replay and self.measure_only:
            raise ValueError(
                "--replay replays a complete cache and --measure-only only fills it; give one"
            )
        cache = Path(self.cache)
        if cache.is_dir():
            raise ValueError(f"--cache {self.cache} is a folder; give a JSON file path")
        if self.replay and not cache.is_file():
            raise ValueError(
                f"--replay needs the measurement cache {self.cache!r}, which does not exist; "
                "measure on the device first"
            )
        if not self.replay:
            blocked = unwritable_folder(cache.absolute().parent)
            if blocked is not None:
                raise ValueError(f"--cache {self.cache}: {blocked} is not a writable directory")
        if self.warm_from is not None and not Path(self.warm_from).is_file():
            raise ValueError(
                f"--warm-from {self.warm_from!r} does not exist; give another case's --cache file"
            )
        if self.budget_measured is not None:
            if self.budget_measured < 1:
                raise ValueError(
                    f"--budget-measured must be at least 1, got {self.budget_measured}"
                )
            if self.trials is not None:
                raise ValueError("--trials and --budget-measured are both replay budgets; give one")
        if self.stop_at_target and self.budget_measured is None:
            raise ValueError("--stop-at-target applies only with --budget-measured")
        if self.max_trials_per_run is not None:
            if self.budget_measured is None:
                raise ValueError("--max-trials-per-run applies only with --budget-measured")
            if self.max_trials_per_run < self.budget_measured:
                raise ValueError(
                    f"--max-trials-per-run must be at least --budget-measured "
                    f"({self.budget_measured}), got {self.max_trials_per_run}"
                )
        if self.max_free_streak is not None:
            if self.budget_measured is None:
                raise ValueError("--max-free-streak applies only with --budget-measured")
            if self.max_free_streak < 1:
                raise ValueError(
                    f"--max-free-streak must be at least 1, got {self.max_free_streak}"
                )


def run_efficiency(
    options: EfficiencyOptions,
    selection: Any = None,
    emit: Callable[[str], None] = print,
) -> tuple[bool, dict[str, Any] | None]:
    """Measure the space (resumable; needs ``selection``, the profile to measure under)
    unless ``options.replay``, then replay the samplers and write the JSON and curves.
    Returns whether the measurements are complete, and the record written (None when
    incomplete or when only measuring was asked)."""
    import pandas as pd

    from autotune.core.cases import get_case
    from autotune.measure import STUDY_TIMING
    from autotune.search.runner import make_evaluator
    from autotune.search.space import load_space_file

    case = get_case(options.case_id)
    space = load_space_file(options.space_path)
    size = space.size()
    if size < 2:
        raise ValueError(f"space {options.space_path!r} has {size} plan(s): nothing to search")
    cache = Path(options.cache)
    if options.replay:  # no device needed: the measurements are the device's
        data = load_cache(cache)
        header = data.get("header", {})
        measured = rebased(data["plans"])
        missing = [p.describe() for p in space.enumerate() if p.hash not in measured]
        if header.get("space_hash") != space.content_hash or missing:
            raise ValueError(
                f"--replay needs a complete cache of this space: {str(cache)!r} has "
                f"space hash {header.get('space_hash')!r} (space: {space.content_hash!r}) "
                f"and lacks {len(missing)} plan(s); measure on the device first"
            )
        capacity = header.get("capacity_bytes")
        if header.get("case_key") not in (None, str(case.key)):
            raise ValueError(
                f"--replay: {str(cache)!r} holds case {header.get('case')!r}'s measurements "
                f"({header.get('case_key')}), not case {case.id!r}'s; give its own --case"
            )
    else:
        capacity = selection.capacity_bytes
        header = {
            "profile": selection.profile.name,
            "emulated": selection.emulated,
            "capacity_bytes": capacity,
            "case": case.id,
            "case_key": str(case.key),
            "space": options.space_path,
            "space_hash": space.content_hash,
            "device": selection.device.name,
        }
        evaluator = make_evaluator(
            selection, case, STUDY_TIMING, options.isolate, options.trial_timeout
        )
        deadline = time.monotonic() + options.timeout if options.timeout else None
        try:
            measured, complete = measure_space(
                space, evaluator.evaluate, cache, header, deadline=deadline, log=emit
            )
        finally:
            evaluator.close()
        if not complete:
            emit("measurement incomplete: run the same command again to resume")
            return False, None
        if options.measure_only:
            return True, None
        measured = rebased({h: dataclasses.asdict(m) for h, m in measured.items()})
    best = exhaustive_best(measured, capacity)
    exhaustive_s = sum(m.seconds for m in measured.values())
    emit(
        f"exhaustive: {size} plans, {exhaustive_s:.0f} s; best {1 / best.latency:.2f}x over "
        f"the median of the plans' reference times ({Plan.from_dict(best.plan).describe()})"
    )
    trials = options.trials or size
    budget = options.budget_measured
    streak = options.max_free_streak or MAX_FREE_STREAK
    target = best.latency * (1 + WITHIN)
    warm = []
    if options.warm_from:
        warm = warm_plans(load_cache(options.warm_from), space, capacity, options.warm_k)
        emit(f"warm start: {len(warm)} plans from {options.warm_from}")
    runs = []
    wall: list[float] = []  # seconds each replay took on this machine
    limits: dict[str, Any] = {}
    if budget is not None:
        limits = {"budget_measured": budget, "max_free_streak": streak}
        limits["stop_below"] = target if options.stop_at_target else None
        limits["max_trials"] = options.max_trials_per_run
    for sampler in options.samplers:
        for seed in range(options.seeds):
            for enqueue in [None, warm] if warm else [None]:
                t0 = time.perf_counter()
                run = replay(space, measured, sampler, seed, trials, capacity, enqueue, **limits)
                run_s = time.perf_counter() - t0
                runs.append(run)
                wall.append(round(run_s, 2))
                if budget is not None:
                    emit(
                        f"{sampler}{' warm' if enqueue else ''} seed {seed}: {len(run.best)} "
                        f"trials, {run.free_trials} free, {run_s:.1f} s"
                        + (f"; stopped early: {run.stopped}" if run.stopped else "")
                    )
    rows = summarise_runs(runs, target, size, exhaustive_s, budget)
    if budget is None:
        emit(
            f"trials and GPU seconds to within {100 * WITHIN:.0f}% of the exhaustive best "
            f"(budget {trials} trials; a seed that never got there counts as budget + 1):"
        )
    else:
        emit(
            f"measured trials and GPU seconds to within {100 * WITHIN:.0f}% of the "
            f"exhaustive best (budget {budget} measured trials, repeats and refused plans "
            f"free, at most {streak} free trials in a row"
            + ("; a run ends at the target" if options.stop_at_target else "")
            + (
                f"; at most {options.max_trials_per_run} trials a run"
                if options.max_trials_per_run
                else ""
            )
            + "; a seed that never got there counts as budget + 1):"
        )
    emit(markdown_for_people(pd.DataFrame(rows)))
    early = [r for r in runs if r.stopped]
    if early:
        emit(f"{len(early)} of {len(runs)} runs stopped before spending the budget:")
        for r in early:
            emit(f"  {r.sampler}{' warm' if r.warm else ''} seed {r.seed}: {r.stopped}")
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "header": header,
        "command": options.command,
        "space_size": size,
        "exhaustive_seconds": exhaustive_s,
        "exhaustive_best": dataclasses.asdict(best),
        "within": WITHIN,
        "trials_budget": trials if budget is None else None,
        **(
            {}
            if budget is None
            else {
                "measured_budget": budget,
                "max_free_streak": streak,
                "stop_at_target": options.stop_at_target,
                "max_trials_per_run": options.max_trials_per_run,
            }
        ),
        "rows": rows,
        "runs": [
            {
                "sampler": r.sampler,
                "seed": r.seed,
                "warm": r.warm,
                "best": r.best,
                "seconds": r.seconds,
                "measured": r.measured,
                **(
                    {}
                    if budget is None
                    else {"free": r.free, "stopped": r.stopped, "replay_seconds": w}
                ),
            }
            for r, w in zip(runs, wall, strict=True)
        ],
    }
    with together():  # the figure and its record replace the old pair together
        plot_runs(runs, best.latency, out / "efficiency.png", budget)
        write_atomic(out / "efficiency.json", json.dumps(record, indent=1, default=str) + "\n")
    emit(f"wrote {out / 'efficiency.json'} and {out / 'efficiency.png'}")
    return True, record


def markdown_for_people(frame: Any, colalign: tuple[str, ...] | None = None) -> str:
    """A pandas table as people read it: "-" where there is no value (a sampler that never
    got there, an entry without evidence), yes / no for flags, numbers to 3 figures."""
    shown = frame.astype(object).where(frame.notna(), "-")
    for column in shown.columns:
        shown[column] = [
            ("yes" if v else "no")
            if isinstance(v, bool)
            else f"{v:.3g}"
            if isinstance(v, float)
            else v
            for v in shown[column]
        ]
    return shown.to_markdown(index=False, colalign=colalign)
