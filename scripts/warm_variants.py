"""Warm-start variants compared by replay on the committed efficiency caches (no device).

Each variant replays the studies' TPE (``autotune.search.study.tpe_gamma``, multivariate,
grouped, constant liar) on cases 2, 13 and 8 as ``autotune efficiency --replay
--budget-measured 60 --stop-at-target --max-trials-per-run 200`` does (repeats, forbidden
and refused plans free; at most 200 free trials in a row), warm-started from the other
case's cache as the committed replays are (case 2 from 13, 13 from 2, 8 from 2). It prints,
per case, the median measured trials to within 3% of the exhaustive best (61: not within
60) and the seeds that got there within 30, and appends every seed's count to --log.

    PYTHONPATH=. python scripts/warm_variants.py --seeds 0-200 --only "cold,k5 enqueue"

Variants (``VARIANTS``): how many of the other case's fastest plans are enqueued (measured
first, costing trials), whether they must differ from each other in at least two of the
space's parameters ("distinct"), how many candidates the choice may look through (as
``--warm-k`` limits them), whether TPE's 8 random startup trials are raised by the number
enqueued, and warm plans given as priors instead: Optuna ``study.add_trial`` trials that
nothing measures, with the other case's own values ("raw") or, after the 8 startup trials,
scaled to this case's best so far by their ratio to the other case's best ("anchored").
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import warnings
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution

import autotune.search.efficiency as ef
from autotune.core.outcome import OutcomeKind
from autotune.plan import Plan
from autotune.search.space import load_space_file
from autotune.search.study import tpe_gamma

SOURCE = {2: 13, 13: 2, 8: 2}  # the warm start of each case, as in the committed replays
VARIANTS: dict[str, dict[str, Any]] = {
    "cold": dict(k=0),
    "k5 enqueue": dict(k=5),  # the replays' warm start until now
    "k3 enqueue": dict(k=3),
    "k2 enqueue": dict(k=2),
    "k1 enqueue": dict(k=1),
    "k1 enqueue startup+1": dict(k=1, extra=1),
    "k2 enqueue startup+2": dict(k=2, extra=2),
    "k3 enqueue startup+3": dict(k=3, extra=3),
    "k5 enqueue startup+5": dict(k=5, extra=5),
    "k2 distinct": dict(k=2, distinct=True),
    "k3 distinct": dict(k=3, distinct=True),
    "k4 distinct": dict(k=4, distinct=True),
    "k3 distinct startup+3": dict(k=3, distinct=True, extra=3),
    "k3 distinct of 5 startup+3": dict(k=3, distinct=True, extra=3, candidates=5),
    "k5 raw priors": dict(k=5, mode="raw"),
    "k5 raw priors startup+5": dict(k=5, mode="raw", extra=5),
    "k5 anchored priors": dict(k=5, mode="anchored"),
    "k3 anchored priors": dict(k=3, mode="anchored"),
}


class _Recorder:
    """Answers a plan's parameters and records their distributions (for a prior trial)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.distributions: dict[str, CategoricalDistribution] = {}

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        self.distributions[name] = CategoricalDistribution(list(choices))
        return self.values[name]


def prior_trial(space: Any, plan: Plan, latency: float, peak: float) -> Any:
    rec = _Recorder(space.params_for(plan))
    space.sample(rec)
    return optuna.trial.create_trial(
        params={k: rec.values[k] for k in rec.distributions},
        distributions=rec.distributions,
        values=[latency, peak],
        user_attrs={"warm_prior": True},
        constraints={"correctness": 0.0, "memory": 0.0},
    )


def _differ(a: dict[str, Any], b: dict[str, Any]) -> int:
    """In how many of the space's parameters two plans differ (one asked, one not: differ)."""
    return sum(a.get(x) != b.get(x) for x in set(a) | set(b))


def warm_list(
    space: Any, source: dict[str, ef.Measured], k: int, distinct: bool, candidates: int | None
) -> list[tuple[Plan, ef.Measured]]:
    feasible = sorted(
        (m for m in source.values() if m.feasible(None)), key=lambda m: (m.latency, m.plan_hash)
    )
    out: list[tuple[Plan, ef.Measured]] = []
    for m in feasible[:candidates]:
        plan = Plan.from_dict(m.plan)
        params = space.params_for(plan)
        if distinct:
            others = [space.params_for(p) for p, _ in out]
            if any(_differ(params, o) < 2 for o in others):
                continue
        out.append((plan, m))
        if len(out) == k:
            break
    return out


def run(
    space: Any,
    caches: dict[int, dict[str, ef.Measured]],
    case: int,
    seed: int,
    k: int = 0,
    extra: int = 0,
    mode: str = "enqueue",
    distinct: bool = False,
    candidates: int | None = None,
) -> int:
    """Measured trials to within 3% of the exhaustive best (61: not within 60)."""
    measured = caches[case]
    target = ef.exhaustive_best(measured, None).latency * (1 + ef.WITHIN)
    source = caches[SOURCE[case]]
    warm = warm_list(space, source, k, distinct, candidates) if k else []
    source_best = ef.exhaustive_best(source, None).latency
    sampler = optuna.samplers.TPESampler(
        seed=seed,
        multivariate=True,
        group=True,
        n_startup_trials=8 + (extra if warm else 0),
        constant_liar=True,
        gamma=tpe_gamma,
    )
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    if mode == "enqueue":
        for plan, _ in warm:
            study.enqueue_trial(space.params_for(plan), skip_if_exists=True)
    elif mode == "raw":
        for plan, m in warm:
            study.add_trial(prior_trial(space, plan, m.latency, m.peak_mib))
    seen: set[str] = set()
    st: dict[str, Any] = dict(best=math.inf, peak=0.0, n=0, streak=0, trials=0, added=False)
    hit: list[int] = []

    def objective(trial: optuna.Trial) -> list[float]:
        plan = space.sample(trial)
        m = measured.get(plan.hash)
        st["trials"] += 1
        if m is None:  # forbidden by the space: free
            trial.set_constraint("correctness", 1.0)
            trial.set_constraint("memory", 0.0)
            st["streak"] += 1
            return [ef.PENALTY_LATENCY, 0.0]
        if plan.hash not in seen and m.kind != OutcomeKind.UNSUPPORTED.value:
            st["n"] += 1
            st["streak"] = 0
        else:  # a repeat, or refused unrun: free
            st["streak"] += 1
        seen.add(plan.hash)
        trial.set_constraint("correctness", m.violation if m.passed else 1.0)
        trial.set_constraint("memory", 0.0)
        if m.feasible(None) and m.latency < st["best"]:
            st["best"], st["peak"] = m.latency, m.peak_mib
        if not hit and st["best"] <= target:
            hit.append(st["n"])
        return [m.latency, m.peak_mib]

    def stop(study: optuna.Study, _trial: Any) -> None:
        if mode == "anchored" and not st["added"] and st["n"] >= 8 and st["best"] < math.inf:
            st["added"] = True
            for plan, m in warm:
                scaled = st["best"] * m.latency / source_best
                study.add_trial(prior_trial(space, plan, scaled, st["peak"]))
        if hit or st["n"] >= 60 or st["streak"] >= 200 or st["trials"] >= 200:
            study.stop()

    study.optimize(objective, n_trials=None, callbacks=[stop])
    return hit[0] if hit else 61


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0-200", help="FIRST-END (end excluded)")
    ap.add_argument("--space", default="docs/efficiency/space_gpu_reduced.py")
    ap.add_argument("--only", default="", help="comma-separated variant names (default all)")
    ap.add_argument("--log", default="", help="append each variant's per-seed counts (JSONL)")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    first, end = (int(x) for x in args.seeds.split("-"))
    space = load_space_file(args.space)
    caches = {
        c: ef.rebased(ef.load_cache(f"docs/efficiency/h200_case{c}.json")["plans"])
        for c in (2, 13, 8)
    }
    only = [v for v in args.only.split(",") if v]
    for name, kw in VARIANTS.items():
        if only and name not in only:
            continue
        hits = {c: [run(space, caches, c, s, **kw) for s in range(first, end)] for c in caches}
        print(
            f"{name:<30}"
            + "  ".join(
                f"case {c} {statistics.median(h):>5} ({sum(x <= 30 for x in h)}/{len(h)})"
                for c, h in hits.items()
            ),
            flush=True,
        )
        if args.log:
            with open(args.log, "a") as f:
                f.write(json.dumps({"variant": name, "seeds": args.seeds, "hits": hits}) + "\n")


if __name__ == "__main__":
    main()
