"""Buckets: the table's tuned entries grouped into regimes of batch size and sequence
length, each served by one plan verified across its range (``autotune export --buckets``).

Per group of entries with the same d_model, heads, FFN, layers, causality and dtype:

1. The tuned batch sizes and sequence lengths cut each axis into cells, one per tuned
   value, the boundaries at the geometric midpoints between neighbours; the outer edges
   are the smallest and largest tuned values (no extrapolation past the tuned grid). A
   plan's longest supported sequence also cuts a cell (the fused heads layer stops at
   S = 256), so the plan keeps the part where it runs.
2. Each cell takes the plans of the group's entries, nearest tuned shape first
   (``runtime.buckets.shape_distance``), keeping those whose support rules hold at the
   cell's corners, that never read the mask on the host and that need no compile per
   shape. A cell whose nearest tuned shape kept the reference (no plan beat it there)
   gets none. The plan of an earlier bucket that covered the cell's centre (the table's
   own, being rebuilt) comes right after the nearest entry's plan, or first where that
   one cannot run there: an entry that changed to a plan of narrower reach (session 31:
   case 6 to a kernel of S <= 128) leaves the region to the plan verified there before,
   not to a farther entry's.
3. Neighbouring cells with the same first plan merge into one rectangle, along the batch
   axis first, then along the sequence axis.
4. Each rectangle's plan is verified at its four corners and its geometric centre: the
   selection gate (5 seeds + 5 padded seeds against the dense reference) and a timing
   against the reference; it must pass everywhere and beat the reference beyond the
   noise everywhere. If it does not, the cell's next plan is tried; a merged rectangle no
   plan holds across is verified again cell by cell, and a cell no plan holds for gets no
   bucket (the reference serves it, or the opt-in gate). Where the plan that holds is a
   new one and the earlier bucket's plan for the region comes later in the draft, that
   one is verified at the same points too and stays unless the new one beats it beyond
   the noise (both timed in one process): a merged rectangle changes plan only for one
   nowhere slower (else its cells are verified one by one), a single cell for one faster
   on the geometric mean of its points, which may be slower at some of them (the
   ``replaces`` line names those: session 53, batch 1,132 x 32 tokens).

A rectangle that is a single shape is the entry itself and gets no bucket; a cell where
the dense reference would need more than a quarter of the device's memory is cut to the
batch sizes where it does not (the rest cannot be verified here).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.core.device import DeviceInfo
from autotune.core.files import Journal
from autotune.core.reference import TransformerConfig
from autotune.plan import Plan
from autotune.runtime.buckets import Key, dims_of, shape_distance

MAX_REFERENCE_SHARE = 0.25  # of device memory: larger shapes are not verified here
EARLIER = "an earlier bucket"  # the end of a plan's source when an earlier bucket held it


@dataclasses.dataclass(frozen=True)
class Draft:
    """A rectangle of (batch, seq) and its plans, best first: (plan, where it came from)."""

    dims: tuple[Any, ...]
    batch: tuple[int, int]
    seq: tuple[int, int]
    plans: tuple[tuple[Plan, str], ...]
    # The cells merged into this rectangle, each with its own plans (empty: one cell). A
    # rectangle no plan holds across is verified again cell by cell.
    cells: tuple[Draft, ...] = ()

    def points(self) -> list[tuple[int, int]]:
        """Where the plan is verified: the corners and the geometric centre."""
        (blo, bhi), (slo, shi) = self.batch, self.seq
        centre = (round(math.sqrt(blo * bhi)), round(math.sqrt(slo * shi)))
        out: list[tuple[int, int]] = []
        for p in [(blo, slo), (blo, shi), (bhi, slo), (bhi, shi), centre]:
            if p not in out:
                out.append(p)
        return out

    def label(self) -> str:
        return (
            f"d_model {self.dims[0]}, {self.dims[1]} heads, FFN {self.dims[2]}, "
            f"{self.dims[3]} layers: batch {self.batch[0]}-{self.batch[1]} x seq "
            f"{self.seq[0]}-{self.seq[1]}"
        )


def config_at(dims: tuple[Any, ...], batch: int, seq: int) -> TransformerConfig:
    d_model, heads, ffn, layers, causal = dims[:5]
    return TransformerConfig(batch, seq, d_model, heads, ffn, layers, causal=bool(causal))


def axis_cells(values: list[int], cuts: tuple[int, ...] = ()) -> list[tuple[int, int, int]]:
    """(lo, hi, value) per tuned value: boundaries at geometric midpoints, outer edges at
    the smallest and largest value. A cut ``c`` inside a cell splits it into ``[lo, c]``
    and ``[c + 1, hi]``; each part's value is the tuned value clamped into it."""
    values = sorted(set(values))
    cells = []
    for i, v in enumerate(values):
        lo = v if i == 0 else math.floor(math.sqrt(values[i - 1] * v)) + 1
        hi = v if i == len(values) - 1 else math.floor(math.sqrt(v * values[i + 1]))
        edges = [lo] + [c + 1 for c in sorted(set(cuts)) if lo <= c < hi] + [hi + 1]
        for a, b in itertools.pairwise(edges):
            cells.append((a, b - 1, min(max(v, a), b - 1)))
    return cells


def support_limits(
    plans: list[Plan],
    dims: tuple[Any, ...],
    batch: int,
    seq: tuple[int, int],
    device: DeviceInfo,
    reasons: Callable[[Plan, TransformerConfig, DeviceInfo], list[str]],
) -> tuple[int, ...]:
    """The longest sequence each plan supports, where that falls inside ``seq`` (a plan
    limited to S <= 256 cuts a cell at 256 rather than losing the whole cell)."""
    cuts = set()
    lo, hi = seq
    for plan in plans:
        if reasons(plan, config_at(dims, batch, lo), device):
            continue
        if not reasons(plan, config_at(dims, batch, hi), device):
            continue
        a, b = lo, hi  # supported at a, not at b: bisect
        while b - a > 1:
            mid = (a + b) // 2
            if reasons(plan, config_at(dims, batch, mid), device):
                b = mid
            else:
                a = mid
        cuts.add(a)
    return tuple(sorted(cuts))


def _fits(dims: tuple[Any, ...], batch: int, seq: int, device: DeviceInfo) -> bool:
    from autotune.measure import predict_peak_bytes
    from autotune.plan import REFERENCE_PLAN

    if not device.total_memory:
        return True
    need = predict_peak_bytes(REFERENCE_PLAN, config_at(dims, batch, seq))
    return need <= MAX_REFERENCE_SHARE * device.total_memory


def draft_buckets(
    entries: Mapping[Key, Mapping[str, Any]],
    device: DeviceInfo,
    reasons: Callable[[Plan, TransformerConfig, DeviceInfo], list[str]] | None = None,
    earlier: Sequence[Mapping[str, Any]] = (),
) -> list[Draft]:
    """Rectangles and their candidate plans from the admitted entries (steps 1-3), with
    the plans of the ``earlier`` buckets (a table's, being rebuilt) where they were."""
    if reasons is None:
        from autotune.build import not_supported_reasons as reasons
    # Per dims: every tuned shape, with its plan, or None where the entry keeps the
    # reference (no plan beat it there: a cell nearest to it gets no bucket).
    groups: dict[tuple[Any, ...], dict[tuple[int, int], tuple[Plan | None, str]]] = {}
    for key, entry in entries.items():
        plan = Plan.from_dict(entry.get("plan", {})) if entry.get("admitted") else None
        groups.setdefault(dims_of(key), {})[(key[0], key[1])] = (plan, f"case {entry['case']}")
    drafts: list[Draft] = []
    for dims, points in sorted(groups.items(), key=lambda kv: str(kv[0])):
        tuned = {k: (p, w) for k, (p, w) in points.items() if p is not None}
        if dims[5] != "float32" or not tuned:
            continue
        bcells = axis_cells([b for b, _ in points])
        seqs = [s for _, s in points]
        plans = list({plan: None for plan, _ in tuned.values()})
        cuts = support_limits(plans, dims, min(b for b, _ in points), (min(seqs), max(seqs)),
                              device, reasons)  # fmt: skip
        scells = axis_cells(seqs, cuts)
        cells: dict[tuple[int, int], tuple[int, int, int, int, list[tuple[Plan, str]]]] = {}
        for i, (blo, bhi_cell, bv_cell) in enumerate(bcells):
            for j, (slo, shi, sv) in enumerate(scells):
                bhi, bv = bhi_cell, bv_cell
                if not _fits(dims, bhi, shi, device):
                    if not _fits(dims, blo, shi, device):
                        continue
                    fits, over = blo, bhi  # the largest batch the reference can verify
                    while over - fits > 1:
                        mid = (fits + over) // 2
                        fits, over = (mid, over) if _fits(dims, mid, shi, device) else (fits, mid)
                    bhi, bv = fits, min(bv, fits)
                corners = [(blo, slo), (blo, shi), (bhi, slo), (bhi, shi)]
                nearest = min(points, key=lambda k: (shape_distance((bv, sv), k), k))
                if points[nearest][0] is None:
                    continue  # nearest to a shape where the reference kept its entry
                cell_plans: list[tuple[Plan, str]] = []
                for _, (plan, where) in sorted(
                    tuned.items(), key=lambda kv: (shape_distance((bv, sv), kv[0]), kv[0])
                ):
                    if _usable(plan, cell_plans, dims, corners, device, reasons):
                        cell_plans.append((plan, where))
                centre = (round(math.sqrt(blo * bhi)), round(math.sqrt(slo * shi)))
                at = 1 if cell_plans and cell_plans[0][0] == points[nearest][0] else 0
                for bucket in earlier:
                    (b0, b1), (s0, s1) = bucket["batch"], bucket["seq"]
                    if tuple(bucket["dims"]) != dims or not (
                        b0 <= centre[0] <= b1 and s0 <= centre[1] <= s1
                    ):
                        continue
                    plan = Plan.from_dict(bucket.get("plan", {}))
                    if _usable(plan, cell_plans, dims, corners, device, reasons):
                        where = f"{bucket.get('from', '?')}, {EARLIER}"
                        cell_plans.insert(at, (plan, where))
                if cell_plans:
                    cells[(i, j)] = (blo, bhi, slo, shi, cell_plans)
        drafts += _merge(dims, cells, len(bcells), len(scells))
    return _proper(drafts)


def _usable(
    plan: Plan,
    taken: list[tuple[Plan, str]],
    dims: tuple[Any, ...],
    corners: list[tuple[int, int]],
    device: DeviceInfo,
    reasons: Callable[[Plan, TransformerConfig, DeviceInfo], list[str]],
) -> bool:
    """Whether a cell can take the plan: not taken yet, no mask read on the host, no
    compile per shape, its support rules holding at the cell's corners."""
    if any(plan == p for p, _ in taken):
        return False
    if device.type == "cuda" and plan.reads_mask_on_host:
        return False
    if plan.compile != "none":
        return False  # a compile per new shape at first use: not for buckets
    return not any(reasons(plan, config_at(dims, b, s), device) for b, s in corners)


def _merge(
    dims: tuple[Any, ...],
    cells: dict[tuple[int, int], tuple[int, int, int, int, list[tuple[Plan, str]]]],
    nb: int,
    ns: int,
) -> list[Draft]:
    def single(cell: tuple[int, int, int, int, list[tuple[Plan, str]]]) -> Draft:
        return Draft(dims, (cell[0], cell[1]), (cell[2], cell[3]), tuple(cell[4]))

    # [blo, bhi, slo, shi, plans, the cells' drafts], merged along batch per seq row
    runs: list[list[Any]] = []
    for j in range(ns):
        current: list[Any] | None = None
        for i in range(nb):
            cell = cells.get((i, j))
            if current is not None and cell is not None and cell[4][0][0] == current[4][0][0]:
                current[1] = cell[1]  # same first plan: the run grows along batch
                current[5].append(single(cell))
                continue
            if current is not None:
                runs.append(current)
            current = [*cell, [single(cell)]] if cell is not None else None
        if current is not None:
            runs.append(current)
    merged: list[list[Any]] = []
    for blo, bhi, slo, shi, plans, parts in runs:  # rows in order: merge into the one below
        below = next(
            (
                m
                for m in merged
                if m[0] == blo and m[1] == bhi and m[3] + 1 == slo and m[4][0][0] == plans[0][0]
            ),
            None,
        )
        if below is not None:
            below[3] = shi
            below[5] += parts
        else:
            merged.append([blo, bhi, slo, shi, plans, list(parts)])
    return [
        Draft(dims, (m[0], m[1]), (m[2], m[3]), tuple(m[4]), tuple(m[5]) if len(m[5]) > 1 else ())
        for m in merged
    ]


def _proper(drafts: tuple[Draft, ...] | list[Draft]) -> list[Draft]:
    """Drafts that are more than one shape (a single shape is its entry, not a bucket)."""
    return [d for d in drafts if d.batch[0] != d.batch[1] or d.seq[0] != d.seq[1]]


def draft_of(bucket: Mapping[str, Any]) -> Draft:
    """A written bucket as a draft of its one plan (to verify it again elsewhere)."""
    plan = Plan.from_dict(bucket.get("plan", {}))
    return Draft(
        tuple(bucket["dims"]),
        (int(bucket["batch"][0]), int(bucket["batch"][1])),
        (int(bucket["seq"][0]), int(bucket["seq"][1])),
        ((plan, str(bucket.get("from", "?"))),),
    )


@dataclasses.dataclass(frozen=True)
class VerifyJob:
    """One draft's verification, as plain data a child process can take."""

    draft: Draft
    profile: str
    emulated: bool


WRONG = "wrong"  # failed the correctness gate at a point
SLOWER = "slower"  # passed but did not beat the reference beyond the noise
CANNOT_RUN = "cannot run"  # unsupported, out of memory, crashed


def _verify_plan(job: VerifyJob, plan: Plan) -> tuple[list[dict[str, Any]], str]:
    """The plan at each of the draft's points: the evidence per point, or, at the first
    point where it does not pass or does not win, a line starting with its kind."""
    from autotune.core.cases import Case, classify_regime
    from autotune.core.outcome import OutcomeKind
    from autotune.core.profiles import select_profile
    from autotune.evaluate import evaluate_plan
    from autotune.judge.gate import SELECTION_GATE, CaseBench
    from autotune.measure import STUDY_TIMING

    selection = select_profile(job.profile, emulate=job.emulated)
    device = selection.effective_device()
    points: list[dict[str, Any]] = []
    for b, s in job.draft.points():
        config = config_at(job.draft.dims, b, s)
        case = Case(f"bucket-{b}x{s}", config, classify_regime(config))
        bench = CaseBench(case, device, reference="dense")
        o = evaluate_plan(
            bench,
            plan,
            timing=STUDY_TIMING,
            gate=SELECTION_GATE,
            capacity_bytes=selection.capacity_bytes,
        )
        bench.release()
        t = o.timing
        if not o.passed or t is None:
            kind = WRONG if o.kind is OutcomeKind.WRONG_RESULT else CANNOT_RUN
            return points, f"{kind}: at batch {b} seq {s}: {o.summary_line()}"
        if t.speedup - 1.0 <= t.noise:
            return points, (
                f"{SLOWER}: at batch {b} seq {s}: {t.speedup:.2f}x does not beat the "
                f"reference beyond the noise ({100 * t.noise:.1f}%)"
            )
        points.append(
            {
                "batch": b,
                "seq": s,
                "worst_budget_share": round(o.report.budget_share, 5) if o.report else None,
                "seeds": o.seeds_checked,
                "padded_seeds": o.padded_seeds_checked,
                "speedup": round(t.speedup, 4),
                "noise": round(t.noise, 4),
                "ref_median_ms": round(t.ref_median_ms, 5),
                "plan_median_ms": round(t.cand_median_ms, 5),
            }
        )
    return points, ""


def gain_over(
    points: list[dict[str, Any]], incumbent: list[dict[str, Any]]
) -> tuple[list[float], float, float]:
    """How much faster a plan ran than the incumbent at each of the same points (the ratio
    of their medians, both timed in this process), the geometric mean of those ratios, and
    the noise a difference must exceed (the larger of the two plans' worst noise)."""
    ratios = [
        i["plan_median_ms"] / p["plan_median_ms"] for p, i in zip(points, incumbent, strict=True)
    ]
    gain = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    noise = max(max(p["noise"] for p in points), max(i["noise"] for i in incumbent))
    return ratios, gain, noise


SPLIT = "split"  # neither plan holds across the rectangle: its cells are verified one by one
REPLACES = "replaces"  # a new plan beat the earlier bucket's at the same points: it takes over


def verify_draft(job: VerifyJob) -> tuple[dict[str, Any] | None, list[str]]:
    """Step 4: the first plan of the draft that passes and wins at every point, as a
    bucket; and a line per plan that did not, starting with its kind (``WRONG``,
    ``SLOWER``, ``CANNOT_RUN`` or ``SPLIT``) and a colon, and a ``REPLACES`` line where a
    new plan took the earlier bucket's place (both plans' speeds at the same points).

    Where that plan is new and the plan an earlier bucket served the region with comes
    later in the draft, that one is verified at the same points too (session 36: a rebuilt
    rectangle's new plan, verified against the reference only, ran batch 1132 x seq 32 at
    2.0x where the earlier bucket's ran 3.8x). The new plan takes the rectangle if it is
    nowhere slower beyond the noise and faster beyond it on the geometric mean; where each
    is faster somewhere, a merged rectangle goes back to its cells (no bucket here, note
    ``SPLIT``) and a single cell takes the faster on the geometric mean; otherwise the
    earlier plan stays."""
    draft = job.draft
    notes: list[str] = []
    for i, (plan, where) in enumerate(draft.plans):
        points, problem = _verify_plan(job, plan)
        if problem:
            kind, _, detail = problem.partition(": ")
            notes.append(f"{kind}: {plan.describe()} (from {where}) {detail}")
            continue
        incumbent = next(((p, w) for p, w in draft.plans[i + 1 :] if w.endswith(EARLIER)), None)
        if incumbent is None or where.endswith(EARLIER):
            return _bucket_of(draft, plan, where, points), notes
        held, problem = _verify_plan(job, incumbent[0])
        if problem:
            kind, _, detail = problem.partition(": ")
            notes.append(f"{kind}: {incumbent[0].describe()} (from {incumbent[1]}) {detail}")
            return _bucket_of(draft, plan, where, points), notes
        ratios, gain, noise = gain_over(points, held)
        slower = [
            f"{p['batch']}x{p['seq']} {r:.2f}x"
            for p, r in zip(points, ratios, strict=True)
            if r < 1.0 - noise
        ]
        faster = any(r > 1.0 + noise for r in ratios)
        versus = (
            f"{plan.describe()} (from {where}) ran {gain:.2f}x the speed of the plan of "
            f"{incumbent[1]} at the same points (noise {100 * noise:.1f}%"
            + (f"; slower at {', '.join(slower)})" if slower else ")")
        )
        if slower and faster and draft.cells:
            notes.append(f"{SPLIT}: {versus}: each is faster somewhere; its cells next")
            return None, notes
        if gain - 1.0 > noise and (not slower or not draft.cells):
            # said even where it wins: a cell taking the faster on the geometric mean may
            # be slower than the earlier plan at some of its points
            notes.append(f"{REPLACES}: {versus}: the new plan takes it")
            return _bucket_of(draft, plan, where, points), notes
        notes.append(f"{SLOWER}: {versus}: the earlier plan stays")
        return _bucket_of(draft, *incumbent, held), notes
    return None, notes


def _bucket_of(
    draft: Draft, plan: Plan, where: str, points: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "dims": list(draft.dims),
        "batch": list(draft.batch),
        "seq": list(draft.seq),
        "plan": plan.to_dict(full=False),
        "plan_hash": plan.hash,
        "from": where,
        "evidence": {
            "points": points,
            "failed_elements": 0,
            "gate": "5 seeds + 5 padded seeds per point, dense reference",
        },
    }


def code_digest() -> str:
    """A digest of the code a verification runs (every ``.py`` file of ``autotune/``,
    ``kernels/`` and ``search_spaces/``): a journal line counts for the same code, not the
    same commit, so committing a call's logs between two calls keeps it."""
    import hashlib

    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for package in ("autotune", "kernels", "search_spaces"):
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def draft_key(draft: Draft) -> dict[str, Any]:
    """What a verification depends on besides the code and the device: the rectangle and
    its plans in order (each with the entry it came from, which the bucket names)."""
    return {
        "dims": list(draft.dims),
        "batch": list(draft.batch),
        "seq": list(draft.seq),
        "plans": [[plan.hash, where] for plan, where in draft.plans],
    }


def build_buckets(
    entries: Mapping[Key, Mapping[str, Any]],
    profile: str,
    emulated: bool,
    device: DeviceInfo,
    *,
    isolate: bool = True,
    emit: Callable[[str], None] = print,
    journal: Journal | None = None,
    earlier: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Draft the rectangles (with the ``earlier`` buckets' plans where they were) and
    verify each one (in a child process of its own when ``isolate``: a device fault ends
    that rectangle only). With a ``journal``, each finished verification is recorded as
    it ends and one recorded earlier is not run again."""
    from autotune.core.isolate import call_isolated

    buckets = []
    drafts = draft_buckets(entries, device, earlier=earlier)
    emit(f"buckets: {len(drafts)} rectangles to verify")
    if not drafts:
        shapes: dict[tuple[Any, ...], int] = {}  # float32 dims -> their entries' shapes
        for key in entries:
            if dims_of(key)[5] == "float32":
                shapes[dims_of(key)] = shapes.get(dims_of(key), 0) + 1
        why = (
            "no float32 dims here have more than one entry"
            if max(shapes.values(), default=0) < 2
            else "every cell here is nearest to an entry that keeps the reference, or too big "
            "to verify on this device"
        )
        emit(
            "buckets: a bucket spans the batches and sequence lengths between the entries of "
            "one d_model, heads, FFN, layers and causality (float32 inputs), with the plan of "
            f"the nearest tuned one; {why}: tune a grid around a case "
            "(autotune study --cases C --shapes 'BATCHES x SEQS')"
        )
    if journal is not None and journal.done:
        emit(f"buckets: {len(journal.done)} verifications recorded in {journal.path}")
    while drafts:
        draft = drafts.pop(0)
        job = VerifyJob(draft, profile, emulated)
        recorded = journal.get(draft_key(draft)) if journal is not None else None
        if recorded is not None:
            result, problem = (recorded["bucket"], recorded["notes"]), ""
            emit(f"bucket {draft.label()}: as recorded in {journal.path}")  # type: ignore[union-attr]
        elif isolate:
            result, problem = call_isolated(verify_draft, job)
        else:
            result, problem = verify_draft(job), ""
        if result is not None and recorded is None and journal is not None:
            journal.add(draft_key(draft), {"bucket": result[0], "notes": result[1]})
        if result is None:
            emit(f"bucket {draft.label()}: not verified ({problem})")
            if draft.cells:  # a crash or device fault: its cells are tried one by one
                drafts[:0] = _proper(draft.cells)
            continue
        bucket, notes = result
        for line in notes:
            emit(f"bucket {draft.label()}: {line}")
        if bucket is None and draft.cells:
            cells = len(draft.cells)
            emit(f"bucket {draft.label()}: no plan holds across it; its {cells} cells next")
            drafts[:0] = _proper(draft.cells)
            continue
        if bucket is None:
            emit(f"bucket {draft.label()}: no plan holds across it; no bucket")
            continue
        shares = [p["worst_budget_share"] or 0.0 for p in bucket["evidence"]["points"]]
        speedups = [p["speedup"] for p in bucket["evidence"]["points"]]
        emit(
            f"bucket {draft.label()}: {Plan.from_dict(bucket['plan']).describe()} (from "
            f"{bucket['from']}) verified at {len(shares)} shapes, worst share "
            f"{max(shares):.3f}, {min(speedups):.2f}x-{max(speedups):.2f}x"
        )
        buckets.append(bucket)
    return buckets
