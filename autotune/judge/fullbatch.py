"""Full-batch verification where the dense reference cannot run (case 14, any long shape).

During search an oracle-judged case is checked on a batch subset (``CaseBench``). Before
a plan ships for such a case it is run here on the whole batch of every official seed and
compared element by element with the streamed exact oracle. Several routes (a plan under
a profile; a profile smaller than the device caps the allocator while its route runs, so
an emulated 16 GB card really has 16 GB) share one oracle output per seed: the oracle is
the expensive part (tens of seconds a seed at case 14), so it runs once per seed.

Each route's record says exactly what was verified: seeds, elements compared, failed
elements, the worst error, wall time of every forward, peak device memory, and the
polynomial guard's decisions. Input and output of the whole batch (12.2 GiB each at case
14) live where the route's plan expects them: on the device, or in pinned host memory for
``host_io`` plans (and for the oracle whenever a capped route runs).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from autotune.build import build_candidate
from autotune.core.cases import Case
from autotune.core.device import DeviceInfo, pinned_copy
from autotune.core.reference import (
    ACCURACY_SEEDS,
    ATOL,
    RTOL,
    CorrectnessReport,
    ReferenceTransformer,
    build_reference,
    check_outputs,
    generate_random_case,
    official_settings,
)
from autotune.measure import MIN_GAIN
from autotune.plan import REFERENCE_PLAN, Plan


@dataclasses.dataclass(frozen=True)
class Route:
    """A plan to verify, under a profile's memory (``capacity_bytes`` None: the device's)."""

    label: str
    plan: Plan
    device: DeviceInfo
    capacity_bytes: int | None = None
    dense_reference: bool = False  # the dense reference itself (where it fits): proves the oracle


@dataclasses.dataclass
class RouteRecord:
    label: str
    plan: dict[str, Any]
    plan_hash: str
    capacity_bytes: int | None
    seeds: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    error: str = ""
    input_scale: float = 1.0  # the official inputs are 1; other scales are stress tests
    # Every layer's q projection (weight and bias) multiplied by this in the model and the
    # oracle alike: each attention score scales by it (the official weights are 1; other
    # scales are stress tests of approximations and their guards).
    score_scale: float = 1.0

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.seeds) and all(s["failed"] == 0 for s in self.seeds)

    def summary(self) -> dict[str, Any]:
        times = [s["wall_s"] for s in self.seeds]
        guard = [g for s in self.seeds for g in s.get("guard", [])]
        return {
            "label": self.label,
            "plan": self.plan,
            "plan_hash": self.plan_hash,
            "capacity_bytes": self.capacity_bytes,
            "input_scale": self.input_scale,
            "score_scale": self.score_scale,
            "passed": self.passed,
            "error": self.error,
            "seeds": [s["seed"] for s in self.seeds],
            "elements": sum(s["elements"] for s in self.seeds),
            "failed": sum(s["failed"] for s in self.seeds),
            "max_abs_err": max((s["max_abs_err"] for s in self.seeds), default=None),
            "worst_budget_share": max((s["budget_share"] for s in self.seeds), default=None),
            "median_wall_s": statistics.median(times) if times else None,
            "wall_s": times,
            "peak_memory_bytes": max((s["peak_bytes"] for s in self.seeds), default=None),
            "guard_paths": {
                p: sum(1 for g in guard if g["path"] == p) for p in {g["path"] for g in guard}
            },
            "guard_max_spread": max((g["spread"] for g in guard), default=None),
            "per_seed": self.seeds,
        }


def scaled_scores(state: dict[str, Tensor], score_scale: float) -> dict[str, Tensor]:
    """``state`` with every layer's q projection (weight and bias) times ``score_scale``:
    ``q`` and so every attention score scale by it, nothing else changes."""
    if score_scale == 1.0:
        return state
    suffixes = ("attention.q_proj.weight", "attention.q_proj.bias")
    return {k: v * score_scale if k.endswith(suffixes) else v for k, v in state.items()}


def merge_reports(parts: list[tuple[int, CorrectnessReport]]) -> CorrectnessReport:
    """One report from reports of batch slices (``(first row, report)``)."""
    worst_start, worst = max(parts, key=lambda p: p[1].budget_share)
    first = parts[0][1]
    return CorrectnessReport(
        passed=all(r.passed for _, r in parts),
        n_elements=sum(r.n_elements for _, r in parts),
        n_failed=sum(r.n_failed for _, r in parts),
        n_nonfinite=sum(r.n_nonfinite for _, r in parts),
        max_abs_err=max(r.max_abs_err for _, r in parts),
        max_rel_err=max(r.max_rel_err for _, r in parts),
        worst_index=(worst.worst_index[0] + worst_start, *worst.worst_index[1:]),
        budget_share=worst.budget_share,
        atol=first.atol,
        rtol=first.rtol,
    )


def compare_sliced(
    out: Tensor, ref: Tensor, device: torch.device, rows: int = 1
) -> CorrectnessReport:
    """The correctness rule over a whole batch, ``rows`` sequences at a time on ``device``
    (so neither tensor needs to fit there whole)."""
    parts = []
    for b0 in range(0, out.shape[0], rows):
        o = out[b0 : b0 + rows].to(device, non_blocking=True)
        r = ref[b0 : b0 + rows].to(device, non_blocking=True)
        parts.append((b0, check_outputs(o, r, ATOL, RTOL)))
        del o, r
    return merge_reports(parts)


def oracle_batch_chunk(
    config: Any, query_chunk: int, key_chunk: int, budget: int = 512 * 2**20
) -> int:
    """Sequences the oracle takes at once: as many as keep a score chunk and a slice's
    activations under ``budget`` bytes (1 at case 14; hundreds for short sequences)."""
    s = config.seq_len
    per_seq = (
        config.num_heads * min(query_chunk, s) * min(key_chunk, s) * 4 * 2
        + s * max(config.d_model, config.ffn_dim) * 4 * 12
    )
    return max(1, min(config.batch_size, budget // per_seq))


def _io_fits(io_bytes: int, capacity: int) -> bool:
    """Whether a whole batch's input, output and the oracle's output (each ``io_bytes``,
    with room to spare) fit ``capacity`` bytes of device memory."""
    return 3.3 * io_bytes <= capacity


def _from_host(route: Route, io_bytes: int) -> bool:
    """Whether ``route`` runs its whole batch from host memory: a ``host_io`` plan always;
    a capped (emulated) route when the batch's input and output do not fit its cap, as on
    the real card (case 14 on a 16 GB card; case 6's 0.6 GiB input stays on the device)."""
    return route.plan.host_io or (
        route.capacity_bytes is not None and not _io_fits(io_bytes, route.capacity_bytes)
    )


def _check_host_memory(case: Case, routes: list[Route]) -> None:
    """Refuse, before allocating, a run whose whole batch's input, the oracle's output and a
    route's output (each ``io_bytes``) cannot sit in this machine's memory where they live
    there: on the CPU always, on CUDA where they do not fit the card or a route streams
    them from the host. (Case 14 on a 24 GiB CPU machine wants ~37 GiB: the kernel's
    out-of-memory killer ended such a run, and any process beside it, after 84 s.)"""
    from autotune.core.device import host_memory

    device = routes[0].device
    config = case.config
    io_bytes = config.batch_size * config.seq_len * config.d_model * 4
    on_host = device.type != "cuda" or any(_from_host(r, io_bytes) for r in routes)
    if device.type == "cuda" and device.total_memory:
        on_host = on_host or not _io_fits(io_bytes, device.total_memory)
    host = host_memory()
    if on_host and host and 3 * io_bytes > host:
        raise ValueError(
            f"case {case.id}'s whole batch needs {3 * io_bytes / 2**30:.1f} GiB of host memory "
            f"at least (its input, the oracle's output and a route's output, "
            f"{io_bytes / 2**30:.1f} GiB each) and this machine has {host / 2**30:.1f} GiB: "
            "run it where the batch fits (a GPU machine with its memory, or more host memory)"
        )


def _set_cap(device: DeviceInfo, capacity: int | None) -> None:
    if device.type != "cuda" or not device.total_memory:
        return
    fraction = 1.0 if capacity is None else min(1.0, capacity / device.total_memory)
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(fraction)


def verify_full_batch(
    case: Case,
    routes: list[Route],
    *,
    seeds: tuple[int, ...] = ACCURACY_SEEDS,
    oracle_chunks: tuple[int, int] = (1024, 4096),
    log: Callable[[str], None] = print,
    on_seed: Callable[[list[RouteRecord]], None] | None = None,
    input_scale: float = 1.0,
    score_scale: float = 1.0,
) -> list[RouteRecord]:
    """Every route on every seed's whole batch against the streamed oracle (see module).
    ``on_seed`` sees the records after each seed (to save partial results);
    ``input_scale`` multiplies the official generator's inputs, ``score_scale`` every
    layer's q projection in the weights the routes and the oracle share (stress tests:
    only scale 1 of both is evidence an export accepts). A pre-norm layer normalises its
    input, so ``input_scale`` leaves the attention scores as they are; ``score_scale``
    scales them."""
    from autotune.judge.oracle import StreamedOracle

    if not routes:
        raise ValueError("verify_full_batch needs at least one route")
    device = routes[0].device
    dev = device.torch_device
    cuda = device.type == "cuda"
    config = case.config
    reference = build_reference(config, "cpu")
    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    del reference
    state = scaled_scores(state, score_scale)
    oracle = StreamedOracle(
        config,
        batch_chunk=oracle_batch_chunk(config, *oracle_chunks),
        query_chunk=oracle_chunks[0],
        key_chunk=oracle_chunks[1],
    )
    oracle.load_state_dict(state)
    oracle = oracle.to(dev).eval()
    records = [
        RouteRecord(
            r.label,
            r.plan.to_dict(full=False),
            r.plan.hash,
            r.capacity_bytes,
            input_scale=input_scale,
            score_scale=score_scale,
        )
        for r in routes
    ]
    models: list[Any] = []
    with official_settings():
        for route, rec in zip(routes, records, strict=True):
            try:
                if route.dense_reference:
                    dense = ReferenceTransformer(config)
                    dense.load_state_dict(state)
                    models.append(dense.to(dev).eval())
                    continue
                models.append(build_candidate(route.plan, config, route.device, state))
            except Exception as exc:  # recorded, the other routes go on
                rec.error = f"build: {type(exc).__name__}: {exc}"[:300]
                models.append(None)
        # Warm-up on one sequence: compilation and autotuning are not timed below.
        _set_cap(device, None)
        x1, m1 = generate_random_case(
            dataclasses.replace(config, batch_size=1), dev, torch.float32, seeds[0]
        )
        for route, rec, model in zip(routes, records, models, strict=True):
            if model is None:
                continue
            _set_cap(device, route.capacity_bytes)
            try:
                with torch.inference_mode():
                    xi, mi = (x1, m1) if not route.plan.host_io else (x1.cpu(), m1.cpu())
                    model(xi, mi)
            except Exception as exc:
                rec.error = f"warm-up: {type(exc).__name__}: {exc}"[:300]
        _set_cap(device, None)
        del x1, m1
        # A device too small for the whole batch's input, output and the oracle's output
        # (a real 16 GB card at case 14) keeps them in host memory: the input is generated
        # on the device (the official generator), moved out, and the oracle streams it.
        io_bytes = config.batch_size * config.seq_len * config.d_model * 4
        host_only = (
            cuda and bool(device.total_memory) and not _io_fits(io_bytes, device.total_memory)
        )
        from_host = [_from_host(r, io_bytes) for r in routes]
        any_host = any(from_host)
        # Routes with the whole batch on the device first, then those streaming from host.
        order = sorted(range(len(routes)), key=lambda i: from_host[i])
        for seed in seeds:
            t0 = time.perf_counter()
            x, mask = generate_random_case(
                config, dev, torch.float32, seed, case.padding_ratio, input_scale
            )
            if host_only:
                x, mask = pinned_copy(x), pinned_copy(mask)
                torch.cuda.empty_cache()
            with torch.inference_mode():
                ref = oracle(x, mask)
            if cuda:
                torch.cuda.synchronize()
            log(f"seed {seed}: oracle {time.perf_counter() - t0:.1f} s")
            io: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
            if host_only:
                io["host"] = (x, mask, ref)
            else:
                io["device"] = (x, mask, ref)
                if any_host:
                    io["host"] = tuple(pinned_copy(t) for t in io["device"])  # type: ignore[assignment]
            del x, mask, ref
            for i in order:
                route, rec, model = routes[i], records[i], models[i]
                if model is None or rec.error:
                    continue
                where = "host" if from_host[i] or host_only else "device"
                if where == "host" and not route.plan.host_io:
                    rec.error = (
                        "a capped route needs host_io=true: the whole batch's input and output "
                        f"({io_bytes / 2**30:.1f} GiB each) do not fit its memory"
                    )
                    log(f"{route.label}: {rec.error}")
                    continue
                if where == "host":
                    io.pop("device", None)  # free the device copies before capping
                _set_cap(device, route.capacity_bytes)
                try:
                    line = _run_route(model, *io[where], dev, seed, cuda)
                except Exception as exc:
                    rec.error = f"seed {seed}: {type(exc).__name__}: {exc}"[:300]
                    log(f"seed {seed}: {route.label}: {rec.error}")
                    continue
                rec.seeds.append(line)
                log(
                    f"seed {seed}: {route.label}: {line['wall_s']:.3f} s, "
                    f"{line['failed']} failed of {line['elements']}, max abs "
                    f"{line['max_abs_err']:.3g}, peak {line['peak_bytes'] / 2**30:.2f} GiB"
                    + (
                        f", guard paths {[g['path'] for g in line['guard']]}"
                        if line["guard"]
                        else ""
                    )
                )
            _set_cap(device, None)
            io.clear()
            if cuda:
                torch.cuda.empty_cache()
            if on_seed is not None:
                on_seed(records)
    return records


def _run_route(
    model: Any, x: Tensor, mask: Tensor, ref: Tensor, dev: torch.device, seed: int, cuda: bool
) -> dict[str, Any]:
    # One untimed forward of the whole batch first: the official protocol excludes first
    # runs, and the warm-up above ran one sequence, so a route's first forward here also
    # built its libraries' plans for the chunk's batch (cuDNN's SDPA at 4 sequences) and
    # took the allocator's blocks for the whole output (session 37: 0.11-0.13 s of the
    # exact route's 3.1 s were outside its kernels). Timed: the next forward.
    with torch.inference_mode():
        first = model(x, mask)
    del first
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    on_device = x.device.type == "cuda"
    held = (x.numel() * 4 + mask.numel()) if on_device else 0
    held += sum(p.numel() * p.element_size() for p in model.parameters())
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model(x, mask)
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - before + held) if cuda else 0
    guard = [
        {"path": d.path, "spread": float(d.spread), "threshold": float(d.threshold)}
        for d in getattr(model, "guard_log", [])
    ]
    report = compare_sliced(out, ref, dev)
    del out
    return {
        "seed": seed,
        "wall_s": round(wall, 4),
        "peak_bytes": int(peak),
        "elements": report.n_elements,
        "failed": report.n_failed,
        "nonfinite": report.n_nonfinite,
        "max_abs_err": report.max_abs_err,
        "budget_share": report.budget_share,
        "worst_index": list(report.worst_index),
        "guard": guard,
    }


FULL_BATCH_KEYS = (
    "seeds",
    "elements",
    "failed",
    "max_abs_err",
    "worst_budget_share",
    "median_wall_s",
    "peak_memory_bytes",
    "capacity_bytes",
    "guard_paths",
)


# Knobs that a batch subset cannot rank: at the oracle's one sequence every batch_chunk runs
# the same forward (one chunk, so one stream whatever batch_streams says), and the search
# and the export's re-measurement see no difference.
WHOLE_BATCH_KNOBS = ("batch_chunk", "batch_streams")


def _evidence(verified: str, case: Case, cap: int | None) -> list[dict[str, Any]]:
    """The routes of an ``autotune long --out`` record that count as evidence for ``case``
    under memory cap ``cap``: the official seeds, unscaled inputs, no error; each with the
    record's source and oracle settings."""
    data = json.loads(Path(verified).read_text())
    source = f"{verified} ({data.get('command', '')}, commit {data.get('commit', '?')})"
    return [
        dict(r) | {"source": source, "oracle": data.get("oracle")}
        for r in data.get("routes", [])
        if str(r.get("case")) == case.id
        and r.get("capacity_bytes") == cap
        and list(r.get("seeds", [])) == list(ACCURACY_SEEDS)
        # scaled inputs or scores are stress tests, not evidence
        and r.get("input_scale", 1.0) == 1.0
        and r.get("score_scale", 1.0) == 1.0
        and not r.get("error")
    ]


def whole_batch_choice(
    winner: Any,
    case: Case,
    selection: Any,
    verified: str | None,
    log: Callable[[str], None] = print,
    max_memory: int | None = None,
) -> Any:
    """The knobs a batch subset cannot rank (``WHOLE_BATCH_KNOBS``), chosen from the
    whole-batch record: among its passing routes that equal the winner in every other knob,
    the fastest by median wall time, when the winner itself is in the record (so the two
    were timed side by side in one process) and the gain is beyond both routes' spread
    over the seeds and ``MIN_GAIN``; a route whose whole-batch peak exceeds ``max_memory``
    does not compete. Otherwise the winner as it is."""
    if not verified or not winner.admitted:
        return winner
    cap = selection.capacity_bytes if selection.emulated else None

    def plan_of(route: dict[str, Any]) -> Plan | None:
        try:
            return Plan.from_dict(route.get("plan") or {})
        except (TypeError, ValueError):  # a knob or value this code does not know
            return None

    def rest(plan: Plan) -> dict[str, Any]:
        return {k: v for k, v in plan.to_dict().items() if k not in WHOLE_BATCH_KNOBS}

    routes = [  # (route, its plan): passing routes of plans this code knows
        (r, p)
        for r in _evidence(verified, case, cap)
        if r.get("passed") and (p := plan_of(r)) is not None
    ]
    mine = next((r for r, _ in routes if r.get("plan_hash") == winner.plan.hash), None)
    if mine is None:
        return winner
    same = [
        (r, p)
        for r, p in routes
        if rest(p) == rest(winner.plan)
        and (max_memory is None or (r.get("peak_memory_bytes") or 0) <= max_memory)
    ]
    best, plan = min([(mine, winner.plan), *same], key=lambda rp: rp[0]["median_wall_s"])

    def spread(r: dict[str, Any]) -> float:
        walls = r.get("wall_s") or [r["median_wall_s"]]
        return (max(walls) - min(walls)) / r["median_wall_s"]

    gain = 1.0 - best["median_wall_s"] / mine["median_wall_s"]
    if plan.hash == winner.plan.hash or gain <= max(spread(best), spread(mine), MIN_GAIN):
        return winner
    knobs = ", ".join(
        f"{k}={getattr(plan, k)}"
        for k in WHOLE_BATCH_KNOBS
        if getattr(plan, k) != getattr(winner.plan, k)
    )
    note = (
        f"{knobs} from the whole-batch record: {best['median_wall_s']:.3f} s against "
        f"{mine['median_wall_s']:.3f} s a forward ({100 * gain:.1f}% faster; the subset "
        f"cannot tell them apart)"
    )
    log(f"case {case.id}: {note}")
    return dataclasses.replace(winner, plan=plan, trial=None, reason=f"{winner.reason}; {note}")


def full_batch_evidence(summary: dict[str, Any], source: str) -> dict[str, Any]:
    """A whole-batch record (``RouteRecord.summary()``, or a row of an ``autotune long``
    record) as a table entry's ``full_batch`` evidence, saying where it came from."""
    return {k: summary.get(k) for k in FULL_BATCH_KEYS} | {
        "source": source,
        "oracle": summary.get("oracle") or {"query_chunk": 1024, "key_chunk": 4096},
    }


def verified_on_full_batch(
    winner: Any,
    case: Case,
    selection: Any,
    verified: str | None,
    log: Callable[[str], None] = print,
) -> Any:
    """A winner judged on the oracle's batch subset ships only after its whole batch
    passes on the official seeds: taken from an ``autotune long --out`` record of the
    same case, plan and memory cap when given, else run here. A failure keeps the
    reference (no entry is better than a wrong one)."""
    cap = selection.capacity_bytes if selection.emulated else None
    found = None
    if verified:
        found = next(
            (r for r in _evidence(verified, case, cap) if r.get("plan_hash") == winner.plan.hash),
            None,
        )
    if found is None:
        log(f"case {case.id}: verifying {winner.plan.hash} on the whole batch, 5 seeds")
        record = verify_full_batch(
            case, [Route(selection.profile.name, winner.plan, selection.device, cap)]
        )[0]
        found = record.summary() | {"source": "verified by this export"}
    full = full_batch_evidence(found, found["source"])
    if not found.get("passed"):
        log(
            f"case {case.id}: {winner.plan.describe()} FAILED the whole batch "
            f"({found.get('failed')} of {found.get('elements')} elements): not shipped",
        )
        return dataclasses.replace(
            winner,
            plan=REFERENCE_PLAN,
            admitted=False,
            reason=f"{winner.plan.hash} failed whole-batch verification against the oracle: "
            f"{found.get('failed')} of {found.get('elements')} elements ({found.get('error', '')})",
            full_batch=full,
        )
    return dataclasses.replace(
        winner,
        reason=winner.reason + f"; whole batch verified: 0 failed of {full['elements']} "
        f"elements over {len(full['seeds'] or [])} seeds",
        full_batch=full,
    )


def route_for(profile_name: str, plan: Plan, device: DeviceInfo) -> Route:
    """A plan under a profile on this device: a profile the device does not match is
    emulated, its memory capped to the profile's."""
    from autotune.core.profiles import get_profile

    profile = get_profile(profile_name)
    capacity = None
    label = f"{profile_name} {plan.hash}"
    if not profile.matches(device):
        if device.type != "cuda":
            raise ValueError(
                f"profile {profile_name!r} needs a CUDA GPU to emulate on; found the CPU"
            )
        capacity = min(profile.memory_bytes, device.total_memory or profile.memory_bytes)
        label += f" (emulated: {capacity / 2**30:.1f} GiB cap)"
    return Route(label, plan, device, capacity)


def verify_cases(
    cases: list[Case],
    routes: list[Route],
    *,
    seeds: tuple[int, ...],
    oracle_chunks: tuple[int, int],
    out: str | Path | None = None,
    command: str = "autotune long",
    force: bool = False,
    log: Callable[[str], None] = print,
    input_scale: float = 1.0,
    score_scale: float = 1.0,
) -> list[dict[str, Any]]:
    """``autotune long``: every route on each case's whole batch against the oracle; the
    route summaries (one per case and route), also written to ``out`` after every seed
    (so a run cut short keeps what it verified)."""
    from autotune.judge.gate import dense_reference_fits

    if not routes:
        raise ValueError("give at least one --route PROFILE=PLAN (or --dense)")
    device = routes[0].device
    dense = any(r.dense_reference for r in routes)
    results: list[dict[str, Any]] = []
    for case in cases:  # every case's batch fits this machine, before any runs
        _check_host_memory(case, routes)
    for case in cases:
        if dense_reference_fits(case, device) and not force and not dense:
            raise ValueError(
                f"case {case.id} fits the dense reference on this device: 'autotune evaluate' "
                "judges it exactly; pass --force to verify against the oracle anyway"
            )
        if dense and not dense_reference_fits(case, device):
            raise ValueError(f"--dense: the dense reference cannot run case {case.id} here")
        log(
            f"case {case.id} ({case.config}): {len(routes)} route(s) x {len(seeds)} seed(s), "
            f"whole batch against the streamed oracle (chunks {oracle_chunks[0]}x"
            f"{oracle_chunks[1]}) on {device.name}"
        )

        def save(partial: list[RouteRecord], case: Case = case, done: list = results) -> None:
            if out:
                rows = [r.summary() | {"case": case.id, "partial": True} for r in partial]
                write_long_record(out, device, oracle_chunks, done + rows, command)

        records = verify_full_batch(
            case,
            routes,
            seeds=seeds,
            oracle_chunks=oracle_chunks,
            log=log,
            on_seed=save,
            input_scale=input_scale,
            score_scale=score_scale,
        )
        results.extend(r.summary() | {"case": case.id} for r in records)
    if out:
        write_long_record(out, device, oracle_chunks, results, command)
    return results


def write_long_record(
    path: str | Path,
    device: DeviceInfo,
    oracle_chunks: tuple[int, int],
    rows: list[dict[str, Any]],
    command: str,
) -> None:
    from autotune.core.device import project_commit, software_versions
    from autotune.core.files import write_atomic

    record: dict[str, Any] = {
        "device": device.name,
        "versions": software_versions(),
        "commit": project_commit(),
        "command": command,
        "oracle": {
            "query_chunk": oracle_chunks[0],
            "key_chunk": oracle_chunks[1],
            "batch_chunk": 1,
        },
        "routes": rows,
    }
    write_atomic(Path(path), json.dumps(record, indent=1, default=str) + "\n")
