"""TPE settings compared by replay on committed efficiency caches (no device): per case and
variant, the measured trials each seed took to come within 3% of the exhaustive best
(61 = not within the 60-trial budget). Prints one line per (case, variant).

    PYTHONPATH=. python scripts/tpe_variants.py --cases 2,13 --seeds 20-60
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from typing import Any

import optuna

import autotune.search.efficiency as ef
from autotune.search.space import load_space_file

# The studies' TPE before session 8 (Optuna's default gamma, 10%), and variants of it.
BASE: dict[str, Any] = dict(multivariate=True, group=True, n_startup_trials=8, constant_liar=True)
VARIANTS: dict[str, dict[str, Any]] = {
    "default gamma": {},
    "n_ei_candidates 64": dict(n_ei_candidates=64),
    "prior_weight 2": dict(prior_weight=2.0),
    "prior_weight 0.5": dict(prior_weight=0.5),
    "consider_endpoints": dict(consider_endpoints=True),
    "gamma 0.15n": dict(gamma=lambda n: min(int(0.15 * n) + 1, 25)),  # adopted: tpe_gamma
    "gamma 0.20n": dict(gamma=lambda n: min(int(0.20 * n) + 1, 25)),
    "6 startup trials": dict(n_startup_trials=6),
    "10 startup trials": dict(n_startup_trials=10),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="2,13")
    ap.add_argument("--seeds", default="0-20", help="FIRST-END (end excluded)")
    ap.add_argument("--space", default="docs/efficiency/space_gpu_reduced.py")
    ap.add_argument("--only", default="", help="comma-separated variant names (default all)")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    first, end = (int(x) for x in args.seeds.split("-"))
    space = load_space_file(args.space)
    for case in args.cases.split(","):
        data = ef.load_cache(f"docs/efficiency/h200_case{case}.json")
        measured = ef.rebased(data["plans"])
        target = ef.exhaustive_best(measured, None).latency * (1 + ef.WITHIN)
        only = [v for v in args.only.split(",") if v]
        for name, kw in VARIANTS.items():
            if only and name not in only:
                continue
            ef.make_sampler = lambda _n, seed, kw=kw: optuna.samplers.TPESampler(  # type: ignore[assignment]
                seed=seed, **{**BASE, **kw}
            )
            hits = [
                ef.replay(space, measured, "tpe", seed, 60, None).measured_to_within(target) or 61
                for seed in range(first, end)
            ]
            within = sum(h <= 30 for h in hits)
            print(
                f"case {case}  {name:<20} median {statistics.median(hits):>5}  "
                f"<= 30 trials: {within}/{len(hits)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
