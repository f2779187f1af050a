"""Winner selection: from a study's feasible Pareto set, re-measure the best few in one
interleaved run with more repeats and more correctness seeds; admit a winner only when
its gain over the reference exceeds the measured noise, else the case keeps the
reference. A memory cap picks along the front."""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
import torch
from optuna.trial import FrozenTrial

from autotune.build import build_candidate
from autotune.core.outcome import TimingStats
from autotune.core.profiles import ProfileSelection
from autotune.core.reference import official_settings
from autotune.evaluate import _cleanup, classify_exception
from autotune.judge.gate import SELECTION_GATE, CaseBench, GateSettings, run_gate
from autotune.measure import (
    TimingSettings,
    measure_interleaved,
    paired_stats,
    peak_forward_memory,
    tensor_bytes,
)
from autotune.plan import REFERENCE_PLAN, Plan
from autotune.search.study import is_feasible, trial_outcome, trial_plan

SELECTION_TIMING = TimingSettings(warmup=20, rounds=3, reps=100, max_round_seconds=1.5, min_reps=10)
MIN_GAIN = 0.02  # a winner must beat the reference by more than noise and by 2%


@dataclasses.dataclass(frozen=True)
class Winner:
    """The exported choice for one case, with its evidence."""

    case_id: str
    case_key: tuple[Any, ...]
    plan: Plan
    admitted: bool  # False: the reference serves (no candidate beat it beyond noise)
    reason: str
    study: str
    trial: int | None
    space_hash: str
    timing: TimingStats | None
    peak_memory_bytes: int | None
    ref_peak_memory_bytes: int | None
    seeds: int
    padded_seeds: int
    worst_budget_share: float | None
    finalists: tuple[dict[str, Any], ...] = ()
    # Where the dense reference cannot run: what the whole-batch verification against the
    # streamed oracle checked (seeds, elements, failures, worst error, time, memory).
    full_batch: dict[str, Any] | None = None

    def evidence(self) -> dict[str, Any]:
        t = self.timing
        extra = {"full_batch": dict(self.full_batch)} if self.full_batch else {}
        return extra | {
            "speedup": round(t.speedup, 4) if t else None,
            "noise": round(t.noise, 4) if t else None,
            "ref_median_ms": round(t.ref_median_ms, 5) if t else None,
            "plan_median_ms": round(t.cand_median_ms, 5) if t else None,
            "timing": f"{t.rounds} rounds x {t.reps} reps, {t.clock}" if t else None,
            "peak_memory_bytes": self.peak_memory_bytes,
            "ref_peak_memory_bytes": self.ref_peak_memory_bytes,
            "correctness_seeds": self.seeds,
            "padded_seeds": self.padded_seeds,
            "worst_budget_share": (
                round(self.worst_budget_share, 5) if self.worst_budget_share is not None else None
            ),
            "study": self.study,
            "trial": self.trial,
            "space_hash": self.space_hash,
            "reason": self.reason,
            "finalists": [dict(n) for n in self.finalists],
        }


def pareto_front(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Feasible trials no other feasible trial beats on both latency and memory."""
    feasible = [t for t in trials if is_feasible(t)]
    front = []
    for t in feasible:
        dominated = any(
            o is not t
            and all(a <= b for a, b in zip(o.values, t.values, strict=True))
            and any(a < b for a, b in zip(o.values, t.values, strict=True))
            for o in feasible
        )
        if not dominated:
            front.append(t)
    return sorted(front, key=lambda t: (t.values[0], t.values[1], t.number))


def finalists(
    study: optuna.Study,
    *,
    k: int = 3,
    max_memory: int | None = None,
    exclude_triton: bool = False,
) -> list[FrozenTrial]:
    """The fastest ``k`` distinct plans of the feasible Pareto set under the memory cap,
    topped up with the next-fastest feasible trials when the front is short."""
    trials = study.get_trials(deepcopy=False)
    if exclude_triton:
        trials = [t for t in trials if not (trial_plan(t) or REFERENCE_PLAN).uses_triton]
    feasible = sorted(
        (t for t in trials if is_feasible(t)), key=lambda t: (t.values[0], t.values[1], t.number)
    )
    ordered = pareto_front(trials) + feasible
    chosen: list[FrozenTrial] = []
    seen: set[str] = set()
    for t in ordered:
        outcome = trial_outcome(t)
        peak = outcome.peak_memory_bytes if outcome else None
        if max_memory is not None and peak is not None and peak > max_memory:
            continue
        h = t.user_attrs.get("plan_hash")
        if h in seen or h == REFERENCE_PLAN.hash:
            continue
        seen.add(h)
        chosen.append(t)
        if len(chosen) == k:
            break
    return chosen


@dataclasses.dataclass(frozen=True)
class Incumbent:
    """The entry the table at the output path already holds for a case."""

    plan: Plan
    study: str | None
    trial: int | None


def select_winner(
    study: optuna.Study,
    selection: ProfileSelection,
    bench: CaseBench,
    *,
    k: int = 3,
    max_memory: int | None = None,
    timing: TimingSettings = SELECTION_TIMING,
    gate: GateSettings = SELECTION_GATE,
    exclude_triton: bool = False,
    incumbent: Incumbent | None = None,
) -> Winner:
    """Re-verify and re-time the finalists (and the incumbent) against the reference in
    one interleaved run. A challenger replaces the incumbent only when it beats it by more
    than the noise; any winner must beat the reference by more than the noise."""
    case = bench.case
    space_hash = study.user_attrs.get("space", {}).get("hash", "")
    cap = max_memory if max_memory is not None else selection.capacity_bytes
    entries: list[tuple[int | None, Plan, str]] = [
        (t.number, trial_plan(t) or REFERENCE_PLAN, study.study_name)
        for t in finalists(study, k=k, max_memory=cap, exclude_triton=exclude_triton)
    ]
    inc_plan = None
    if (
        incumbent is not None
        and incumbent.plan != REFERENCE_PLAN
        and not (exclude_triton and incumbent.plan.uses_triton)
    ):
        inc_plan = incumbent.plan
        entries = [e for e in entries if e[1] != inc_plan]
        entries.append((incumbent.trial, inc_plan, incumbent.study or study.study_name))
    cuda = bench.device.type == "cuda"
    notes: list[dict[str, Any]] = []
    models: list[tuple[int | None, Plan, str, Any, Any, int | None]] = []
    x, mask = bench.timing_inputs()

    def note(trial: int | None, plan: Plan, **fields: Any) -> None:
        notes.append(
            {
                "trial": trial,
                "plan": plan.describe(),
                **({"incumbent": True} if plan == inc_plan else {}),
                **fields,
            }
        )

    with official_settings():
        for number, plan, source in entries:
            try:
                model = build_candidate(plan, case.config, bench.device, bench.state_dict)
                held = tensor_bytes(x, mask) + sum(tensor_bytes(p) for p in model.parameters())
                with torch.inference_mode():
                    peak = peak_forward_memory(lambda m=model: m(x, mask), held, cuda=cuda)
                result = run_gate(bench, model, gate)
            except Exception as exc:  # a finalist that fails now is dropped, with why
                note(number, plan, dropped=f"{classify_exception(exc).value}: {exc}"[:300])
                continue
            if not result.passed:
                assert result.worst is not None
                note(number, plan, dropped=f"wrong result on re-check: {result.worst.summary()}")
                continue
            if cap is not None and peak is not None and peak > cap:
                note(number, plan, dropped=f"peak {peak} B over the cap {cap} B")
                continue
            models.append((number, plan, source, model, result, peak))
        if not models:
            return _keep_reference(
                case,
                study,
                space_hash,
                "no finalist passed re-verification" if entries else "no feasible trial",
                notes,
            )
        ref = bench.reference
        fns = [lambda: ref(x, mask)] + [lambda m=m: m(x, mask) for *_, m, _, _ in models]
        with torch.inference_mode():
            ref_peak = peak_forward_memory(
                lambda: ref(x, mask),
                tensor_bytes(x, mask) + sum(tensor_bytes(p) for p in ref.parameters()),
                cuda=cuda,
            )
            reps, results = measure_interleaved(fns, timing, cuda=cuda)
    scored = []
    for (number, plan, source, _, result, peak), res in zip(models, results[1:], strict=True):
        stats = paired_stats(results[0], res, reps, cuda)
        note(number, plan, speedup=round(stats.speedup, 4), noise=round(stats.noise, 4))
        scored.append((stats, number, plan, source, result, peak))
    del models, fns
    _cleanup(cuda)
    best = max(scored, key=lambda s: s[0].speedup)
    reason = f"fastest of {len(scored)} re-measured finalists"
    held = [s for s in scored if s[2] == inc_plan]
    if held and best is not held[0]:
        inc = held[0]
        over = best[0].speedup / inc[0].speedup - 1.0
        margin = max(best[0].noise, inc[0].noise, MIN_GAIN)
        if over <= margin:
            reason = (
                f"incumbent kept: the best challenger {best[2].describe()} was "
                f"{100 * over:.1f}% faster, not above the noise {100 * margin:.1f}%"
            )
            best = inc
        else:
            reason = f"replaces the incumbent: {100 * over:.1f}% faster > noise {100 * margin:.1f}%"
    elif held:
        reason = "incumbent re-measured fastest"
    stats, number, plan, source, result, peak = best
    gain = stats.speedup - 1.0
    if gain <= max(stats.noise, MIN_GAIN):
        return _keep_reference(
            case,
            study,
            space_hash,
            f"best finalist {plan.describe()} gained {100 * gain:.1f}%, not above the noise "
            f"{100 * stats.noise:.1f}% (and {100 * MIN_GAIN:.0f}%)",
            notes,
        )
    return Winner(
        case_id=case.id,
        case_key=case.key.as_tuple(),
        plan=plan,
        admitted=True,
        reason=f"{reason}; gain over the reference {100 * gain:.1f}% > noise "
        f"{100 * stats.noise:.1f}%",
        study=source,
        trial=number,
        space_hash=space_hash,
        timing=stats,
        peak_memory_bytes=peak,
        ref_peak_memory_bytes=ref_peak,
        seeds=result.seeds_checked,
        padded_seeds=result.padded_seeds_checked,
        worst_budget_share=result.worst.budget_share if result.worst else None,
        finalists=tuple(notes),
    )


def _keep_reference(
    case: Any, study: optuna.Study, space_hash: str, reason: str, notes: list[dict[str, Any]]
) -> Winner:
    return Winner(
        case.id,
        case.key.as_tuple(),
        REFERENCE_PLAN,
        False,
        reason,
        study.study_name,
        None,
        space_hash,
        None,
        None,
        None,
        0,
        0,
        None,
        tuple(notes),
    )
