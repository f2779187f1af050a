"""Issue 21's checks on a multi-worker run, read from its storage and nvidia-smi samples:
trials per study (exactly N measured), plans measured twice (none), and GPU busy share per
device while the study ran.

    python3 scripts/workers_check.py --storage sqlite:///w2.db --n-trials 40 --smi smi.csv
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter, defaultdict

import optuna

from autotune.search import trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", required=True)
    parser.add_argument("--n-trials", type=int, required=True)
    parser.add_argument("--smi", help="nvidia-smi --query-gpu=timestamp,index,utilization.gpu CSV")
    args = parser.parse_args()
    storage = trials.open_storage(args.storage, heartbeat_interval=None, grace_period=None)
    ok = True
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        measured = [t for t in done if trials.counts(t)]
        twice = [
            h for h, n in Counter(trials.trial_plan_hash(t) for t in measured).items() if n > 1
        ]
        good = len(measured) == args.n_trials and not twice
        ok &= good
        print(
            f"{'OK ' if good else 'BAD'} {summary.study_name}: {len(measured)} measured trials "
            f"(of {args.n_trials}), {len(done) - len(measured)} free, "
            f"{len(twice)} plans measured twice"
        )
    if args.smi:
        busy: dict[str, list[float]] = defaultdict(list)
        with open(args.smi) as f:
            for row in csv.reader(f):
                if len(row) < 3 or not row[2].strip().split()[0].isdigit():
                    continue
                busy[row[1].strip()].append(float(row[2].strip().split()[0]))
        for gpu, samples in sorted(busy.items()):
            share = sum(1 for s in samples if s > 0) / len(samples)
            mean = sum(samples) / len(samples)
            print(
                f"GPU {gpu}: {len(samples)} samples, busy in {100 * share:.0f}%, mean {mean:.0f}%"
            )
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
