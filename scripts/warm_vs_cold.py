"""How many trials a warm start saved: per case key studied in both storages (same
profile), the measured trials each study took to come within 3% of the best latency either
study found (free trials -- repeats, forbidden or unsupported plans -- not counted), and
the GPU seconds spent until then. Prints a markdown table.

    python scripts/warm_vs_cold.py --profile rtx5080 --warm sqlite:///studies.db \
        --cold sqlite:///docs/results/rtx5080/cold_studies.db
"""

from __future__ import annotations

import argparse
import math

import optuna

from autotune.search import trials

WITHIN = 0.03


def _progress(study: optuna.Study) -> list[tuple[float, float]]:
    """(latency or inf, seconds) of each counted trial, in trial order."""
    out = []
    finished = study.get_trials(deepcopy=False, states=trials.FINISHED)
    for t in sorted(finished, key=lambda t: t.number):
        if not trials.counts(t):
            continue
        lat = t.values[0] if trials.is_feasible(t) and t.values else math.inf
        out.append((lat, trials.trial_seconds(t) or 0.0))
    return out


def _to_within(progress: list[tuple[float, float]], target: float) -> tuple[str, str]:
    spent = 0.0
    for i, (lat, sec) in enumerate(progress, 1):
        spent += sec
        if lat <= target:
            return str(i), f"{spent:.0f}"
    return f"> {len(progress)}", f"> {spent:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--warm", required=True, help="storage URL of the warm-started studies")
    ap.add_argument("--cold", required=True, help="storage URL of the cold studies")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    current = trials.current_study(args.profile)
    warm = trials.studies_by_case(
        trials.open_storage(args.warm, heartbeat_interval=None, grace_period=None),
        args.profile,
        current,
    )
    cold = trials.studies_by_case(
        trials.open_storage(args.cold, heartbeat_interval=None, grace_period=None),
        args.profile,
        current,
    )
    print("| case | best (either) | warm: trials | warm: s | cold: trials | cold: s | cold best |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(set(warm) & set(cold)):
        w, c = _progress(warm[key]), _progress(cold[key])
        best = min([lat for lat, _ in w + c] + [math.inf])
        if not math.isfinite(best):
            print(f"| {key} | none feasible | | | | | |")
            continue
        target = best * (1 + WITHIN)
        (wn, ws), (cn, cs) = _to_within(w, target), _to_within(c, target)
        cbest = min(lat for lat, _ in c)
        print(
            f"| {trials.case_id_of(warm[key])} | {1 / best:.2f}x | {wn} of {len(w)} | {ws} | "
            f"{cn} of {len(c)} | {cs} | {1 / cbest:.2f}x |"
        )


if __name__ == "__main__":
    main()
