"""The runtime dispatcher: a drop-in for the reference that serves tuned plans.

``DispatchedTransformer(config, table=...)`` has the reference's state dict and forward
signature. Per call it looks up the input's case key, checks the runtime contract
(device and capability, dtype, mask shape and kind, inference mode, matmul precision
and TF32 flags) and runs the table's plan on a hit, otherwise the reference.
``explain(x, mask)`` returns the route and every reason an entry was not used. It never
tunes. A plan with guarded polynomial attention (case 14) states its guard's rule, and
after a call what the guard decided per batch chunk and layer (``Route.guard``; one INFO
line per forward and a DEBUG line per attention call on the ``autotune.runtime`` logger).

A shape with no entry of its own is served by the table's bucket that holds it (a range
of batch and sequence length whose plan was verified across it at export), when the
plan's support rules hold for the shape; graphs and tiles are captured per shape at first
use. With ``gate_unseen=True`` (opt-in) a shape outside every bucket gets a one-time
correctness gate on first use: the nearest plan of the same dims against the reference
arithmetic on this model's own weights (5 seeds + 5 padded seeds at this shape); the
verdict is reported (a warning, and ``explain()``), cached per shape, and kept in
``gate_cache`` (a JSON file) across processes if one is given. Otherwise such a shape is
served by the reference, with the reason in ``explain()``. Never an unverified plan.

A table whose hash does not match its content, or made for another GPU or an
incompatible torch/triton, is refused with a clear message, and the reference serves.
A call that would hit a tuned entry but breaks the serving contract (gradients enabled,
matmul precision/TF32 flags not the official ones) is served by the reference with one
warning per model; ``serving()`` is the context that meets the contract.

Imports torch and the standard library only: no optuna, sqlalchemy, pandas, matplotlib.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from autotune.build import (
    CandidateTransformer,
    not_supported_reasons,
    refresh_after_load,
    watch_registrations,
)
from autotune.core.device import DeviceInfo, detect_device
from autotune.core.reference import (
    ReferenceTransformer,
    TransformerConfig,
    any_autocast,
    cublas_tf32,
    cudnn_tf32,
    matmul_precision,
    official_settings,
    official_settings_active,
    settings_key,
)
from autotune.core.threads import FreshOnCopy
from autotune.plan import Plan
from autotune.runtime import buckets as bucketing
from autotune.runtime.table import DispatchTable, compatibility_problems, load_table

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

SERVING_FIX = "wrap calls in autotune.runtime.serving()"

# One INFO line per forward whose plan has a guarded approximation (what its guard
# decided), and a DEBUG line per attention call.
LOG = logging.getLogger("autotune.runtime")


@contextlib.contextmanager
def serving() -> Iterator[None]:
    """The serving contract tuned entries were verified under: ``torch.inference_mode()``
    with the official flags (matmul precision "high", TF32 on for CUDA matmuls and cuDNN).
    Grad mode and the flags are restored on exit. ``with serving(): y = model(x, mask)``.
    """
    with official_settings(), torch.inference_mode():
        yield


def _flag_differences() -> list[str]:
    """The flags that differ from ``official_settings()`` (its values: "high", True, True)."""
    out = []
    for name, value in (("cuda.matmul", cublas_tf32()), ("cudnn", cudnn_tf32())):
        if value is None:
            out.append(
                f"torch.backends.{name}.allow_tf32 unreadable (torch.backends.fp32_precision, "
                "the newer API, is in use)"
            )
        elif not value:
            out.append(f"torch.backends.{name}.allow_tf32=False")
    precision = matmul_precision()
    if precision is None:
        out.append(
            "float32_matmul_precision unreadable (allow_tf32 was set against "
            "set_float32_matmul_precision)"
        )
    elif precision != "high":
        out.append(f"float32_matmul_precision={precision!r}")
    return out


def contract_problems() -> list[str]:
    """What in the current thread's state breaks the serving contract (empty: it holds)."""
    problems = []
    if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
        problems.append(
            "gradients are enabled: tuned plans serve inference only "
            "(use torch.inference_mode(), as serving() does)"
        )
    if matmul_precision() is None or not official_settings_active():
        differ = ", ".join(_flag_differences()) or "unknown"
        problems.append(
            f"TF32/matmul precision flags differ from the official settings the table was "
            f"validated under: {differ} (official: float32_matmul_precision='high', "
            "allow_tf32=True for CUDA matmuls and cuDNN)"
        )
    if any_autocast():
        problems.append(
            "autocast is on: tuned plans were verified in float32 without it (the reference "
            "serves, under the autocast asked for; leave autocast off inside serving() for "
            "the plans)"
        )
    return problems


@dataclasses.dataclass(frozen=True)
class Route:
    """Where a call goes, and every reason a table entry was not used."""

    target: str  # "plan <hash>: <description>" or "reference"
    key: tuple[Any, ...] | None
    plan: Plan | None
    reasons: tuple[str, ...]
    # Where the plan comes from: "entry", "bucket batch .. x seq ..", "gate (...)", or ""
    source: str = ""
    # A shape outside every bucket with gate_unseen: the plan its first call will gate.
    pending_gate: Plan | None = None
    # A plan with a guarded approximation (polynomial attention): its rule, then what the
    # guard decided on the last call of this call key, one line per attention call (batch
    # chunk and layer); only the rule before the first call.
    guard: tuple[str, ...] = ()

    def __str__(self) -> str:
        why = "" if not self.reasons else " (" + "; ".join(self.reasons) + ")"
        where = f" [{self.source}]" if self.source and self.plan is not None else ""
        guard = f" [{self.guard[0]}]" if self.guard else ""
        return f"{self.target}{where}{why}{guard}"


def guard_rule(plan: Plan) -> str:
    """What a polynomial plan's guard does, in one line."""
    prefix = (
        f"; the first {plan.poly_exact_prefix} rows always exact" if plan.poly_exact_prefix else ""
    )
    return (
        f"guard: per attention call, polynomial attention where the sampled score spread is "
        f"<= {plan.poly_guard:g}, exact attention otherwise{prefix}"
    )


def guard_report(
    decisions: list[Any], batch: int, batch_chunk: int, layers: int
) -> tuple[str, ...]:
    """A summary line, then one line per attention call (``GuardDecision``s in call order:
    every layer of a batch chunk, then the next chunk)."""
    per = batch_chunk if 0 < batch_chunk < batch else batch
    chunks = -(-batch // per)
    by_position = len(decisions) == chunks * layers
    lines = []
    for i, d in enumerate(decisions):
        if by_position:
            c, layer = divmod(i, layers)
            lo, hi = c * per, min((c + 1) * per, batch) - 1
            where = f"sequence {lo}" if lo == hi else f"sequences {lo}-{hi}"
            lines.append(f"{where}, layer {layer}: {d.path} ({d.reason})")
        else:
            lines.append(f"attention call {i}: {d.path} ({d.reason})")
    poly = sum(1 for d in decisions if d.path == "polynomial")
    spreads = [d.spread for d in decisions]
    summary = (
        f"last call: {poly} of {len(decisions)} attention calls polynomial, "
        f"{len(decisions) - poly} exact; sampled spread {min(spreads):.3g}-{max(spreads):.3g}, "
        f"threshold {decisions[0].threshold:g}"
    )
    return (summary, *lines)


def _config_at(config: TransformerConfig, key: tuple[Any, ...]) -> TransformerConfig:
    """The model's config at a call's batch size and sequence length."""
    return dataclasses.replace(config, batch_size=key[0], seq_len=key[1])


class DispatchedTransformer(FreshOnCopy, ReferenceTransformer):
    """Drop-in for the reference: same parameters, same forward, tuned plans inside.

    Threads may share one model: a call key's first call (its route, and any one-time
    gate) is resolved by one thread while the others wait, ``last_route`` is each
    thread's own, and a captured graph replays for one thread at a time.
    """

    # Per thread: the last call's route. Per call key, a lock: resolving its first call
    # (a gate runs seconds; other keys' first calls do not wait for it). And what calls
    # built (plans on these weights, routes, guard reports): a copy or an unpickled model
    # builds its own on its first calls; gate verdicts are kept.
    FRESH = (
        ("_local", threading.local),
        ("_resolve_locks", dict),
        # Plans are shape-generic (graphs are captured per shape): one module per plan hash
        ("_candidates", dict),
        ("_routes", dict),  # per case key
        # The steady state: per call key (shapes, dtypes, device, grad mode, flags), the
        # route and the module serving it, resolved once and then looked up.
        ("_served", dict),
        ("_guards", dict),  # per call key, what a guarded approximation last decided
        ("_devices", dict),  # each device's table checks: the loading machine's own
        ("_fingerprint", lambda: None),  # of the weights, for gate verdicts
        ("_generation", int),  # moved by _drop_plans
    )
    _candidates: dict[str, CandidateTransformer]
    _routes: dict[tuple[Any, ...], Route]
    _served: dict[tuple[Any, ...], tuple[Route, CandidateTransformer | None]]
    _guards: dict[tuple[Any, ...], tuple[str, ...]]
    _devices: dict[torch.device, tuple[DeviceInfo, tuple[str, ...]]]
    _fingerprint: str | None
    _generation: int

    def __init__(
        self,
        config: TransformerConfig,
        table: Any = None,
        *,
        gate_unseen: bool = False,
        gate_cache: str | Path | None = None,
        watch_edits: bool = False,
    ) -> None:
        super().__init__(config)
        self._make_fresh()
        self.watch_edits = watch_edits
        self.table: DispatchTable | None = load_table(table) if table is not None else None
        self.gate_unseen = gate_unseen
        self.gate_cache = Path(gate_cache) if gate_cache is not None else None
        if self.gate_cache is not None and (
            self.gate_cache.is_dir() or not self.gate_cache.parent.is_dir()
        ):
            raise ValueError(
                f"gate_cache {str(gate_cache)!r} is "
                + ("a folder" if self.gate_cache.is_dir() else "in a folder that does not exist")
                + "; give a JSON file's path in an existing folder, e.g. gate_cache='gates.json'"
            )
        # One-time gate verdicts per (case key, plan hash, device name): (passed, detail).
        self._gated: dict[str, tuple[bool, str]] = self._read_gate_cache()
        self._warned = False  # the table refused as a whole: said once
        self._warned_contract = False  # a tuned entry skipped for the contract: said once
        self.register_load_state_dict_post_hook(refresh_after_load)

    _watch_edits = False

    @property
    def watch_edits(self) -> bool:
        """True: each call reads the version counters of the parameters a plan copies, so
        any in-place edit is seen (3-8 us of host time a call); False: optimizer steps,
        load_state_dict, .to() and replaced parameters or submodules are seen, other
        in-place edits need refresh(). Set at any time: the plans already made follow."""
        return self._watch_edits

    @watch_edits.setter
    def watch_edits(self, on: bool) -> None:
        object.__setattr__(self, "_watch_edits", bool(on))
        for cand in list(self._candidates.values()):
            cand.watch_edits = on

    def _make_fresh(self) -> None:
        super()._make_fresh()
        # Our layers or final norm replaced (setattr, add_module): plans made on the old
        # ones are dropped (a global registration hook; a copy registers itself here).
        watch_registrations(self, [self])

    def registration_changed(self) -> None:
        self._drop_plans()

    def _drop_plans(self) -> None:
        """Plans, routes and guard reports made on our modules dropped: the next calls
        resolve again (a call resolving meanwhile sees the generation move, and resolves
        again itself)."""
        self._generation += 1
        self._candidates.clear()  # they read our parameters; graphs must be re-captured
        self._routes.clear()
        self._served.clear()
        self._guards.clear()
        self._fingerprint = None

    @property
    def last_route(self) -> Route | None:
        """Where this thread's last call went (None before its first call, and after a
        call refused with ``ValueError`` or failing while its route was resolved)."""
        return getattr(self._local, "route", None)

    def refresh(self) -> None:
        """The parameters changed: the plans remake their derived weights and graphs
        (``load_state_dict``, ``.to()`` and in-place edits that version counters see do
        this themselves; edits through ``.data`` or of inference tensors need this call),
        and routes that rest on a one-time gate verdict are gated again on the new weights
        (only here and in ``load_state_dict``: verdicts belong to the weights they judged)."""
        for cand in self._candidates.values():
            cand.refresh()
        self._guards.clear()  # decisions made with the old weights
        self._forget_gated_routes()

    def _forget_gated_routes(self) -> None:
        self._fingerprint = None
        gated = {k for k, r in self._routes.items() if r.pending_gate or "gate" in r.source}
        if gated:
            self._routes = {k: r for k, r in self._routes.items() if k not in gated}
            self._served.clear()

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self._drop_plans()
        return super()._apply(fn, recurse)

    def _device(self, device: torch.device) -> tuple[DeviceInfo, tuple[str, ...]]:
        if device not in self._devices:
            info = detect_device("cuda" if device.type == "cuda" else "cpu", device.index)
            problems: tuple[str, ...] = ()
            if self.table is not None:  # a table refused as read is not read further
                problems = self.table.problems or tuple(compatibility_problems(self.table, info))
            self._devices[device] = (info, problems)
        return self._devices[device]

    def explain(self, x: Tensor, valid_token_mask: Tensor | None = None) -> Route:
        """The route a call with these inputs takes, and every reason it is not a plan."""
        c = self.config
        if self.table is None:
            return Route("reference", None, None, ("no table given",))
        if x.dim() != 3 or x.shape[-1] != c.d_model:
            return Route(
                "reference", None, None, (f"x shape {tuple(x.shape)} is not [B, S, {c.d_model}]",)
            )
        if x.shape[0] == 0 or x.shape[1] == 0:
            return Route("reference", None, None, (f"x shape {tuple(x.shape)} is empty",))
        mixed = self._dtype_mismatch(x)
        if mixed:  # as for a wrong shape: no plan; the call itself raises
            return Route("reference", None, None, (f"the call is refused: {mixed}",))
        key = (
            x.shape[0],
            x.shape[1],
            c.d_model,
            c.num_heads,
            c.ffn_dim,
            c.num_layers,
            c.causal,
            _DTYPE_NAMES.get(x.dtype, str(x.dtype).removeprefix("torch.")),
        )
        static = self._static_route(key, x.device)
        reasons = list(static.reasons)
        tuned = sorted({k[-1] for k in self.table.entries})
        if static.plan is None and tuned and key[-1] not in tuned:
            reasons.insert(
                0,
                f"x is {key[-1]}: the table's plans are tuned for {', '.join(tuned)} inputs "
                f"(and weights); call model.float() and pass {tuned[0]} inputs for them",
            )
        mask = valid_token_mask
        if mask is not None and mask.dtype != torch.bool:
            reasons.append(f"mask dtype {mask.dtype} is not torch.bool")
        elif mask is not None and mask.shape != x.shape[:2]:
            b, n = x.shape[:2]
            fits = mask.dim() == 2 and mask.shape[0] in (1, b) and mask.shape[1] in (1, n)
            reasons.append(
                f"a mask of shape {tuple(mask.shape)} "
                + ("is broadcast" if fits else "does not fit x")
                + f": plans take one of shape {(b, n)}"
            )
        reasons += contract_problems()
        if not reasons:
            if static.plan is not None and static.plan.attention == "polynomial":
                done = self._guards.get(_call_key(x, valid_token_mask), ())
                return dataclasses.replace(static, guard=(guard_rule(static.plan), *done))
            return static
        # Only the missing gate verdict keeps the plan out: the first call gates it.
        pending = static.pending_gate if reasons == list(static.reasons) else None
        return Route("reference", key, None, tuple(reasons), pending_gate=pending)

    def _static_route(self, key: tuple[Any, ...], device: torch.device) -> Route:
        """What depends only on the case key and the device, worked out once."""
        cached = self._routes.get((key, device))
        if cached is not None:
            return cached
        assert self.table is not None
        info, problems = self._device(device)
        reasons = [f"table refused: {p}" for p in problems]
        if problems:  # none of its plans is read: one it cannot read must not fail a call
            route = Route("reference", key, None, tuple(reasons))
            self._routes[(key, device)] = route
            return route
        config = _config_at(self.config, key)
        entry = self.table.entries.get(key)
        plan = None
        source = "entry"
        pending = None
        if entry is None:
            plan, source, more, pending = self._unseen(key, config, info)
            reasons += more
        elif not entry.get("admitted"):
            reasons.append(
                f"entry for {key} keeps the reference: "
                f"{entry.get('evidence', {}).get('reason', '')}"
            )
        else:
            plan = Plan.from_dict(entry.get("plan", {}))
            reasons += [
                f"plan unsupported here: {r}" for r in not_supported_reasons(plan, config, info)
            ]
        if reasons or plan is None:
            route = Route("reference", key, None, tuple(reasons), pending_gate=pending)
        else:
            route = Route(f"plan {plan.hash}: {plan.describe()}", key, plan, (), source)
        self._routes[(key, device)] = route
        return route

    def _unseen(
        self, key: tuple[Any, ...], config: TransformerConfig, info: DeviceInfo
    ) -> tuple[Plan | None, str, list[str], Plan | None]:
        """A shape without an entry of a table that serves here: the bucket holding it, a
        gate verdict, or why not. Returns (plan, source, reasons, the plan a first call
        would gate)."""
        assert self.table is not None
        reasons = [f"no entry for case key {key}"]
        bucket = bucketing.find_bucket(self.table.buckets, key)
        if bucket is not None:
            plan = Plan.from_dict(bucket.get("plan", {}))
            why = not_supported_reasons(plan, config, info)
            if not why:
                return plan, bucketing.span(bucket), [], None
            reasons.append(f"{bucketing.span(bucket)}: its plan is unsupported here: {why[0]}")
        else:
            reasons.append(f"no bucket holds batch {key[0]} x seq {key[1]}")
        if not self.gate_unseen:
            near = bucketing.nearest_plans(self.table.entries, self.table.buckets, key)
            if near:
                reasons.append(
                    "DispatchedTransformer(..., gate_unseen=True) would gate the nearest plan "
                    f"(of {near[0][1]}) on first use"
                )
            return None, "", reasons, None
        for plan_dict, where in bucketing.nearest_plans(
            self.table.entries, self.table.buckets, key
        ):
            plan = Plan.from_dict(plan_dict)
            if (
                plan.compile != "none"  # a compile per new shape: not for unseen shapes
                or (info.type == "cuda" and plan.reads_mask_on_host)
                or not_supported_reasons(plan, config, info)
            ):
                continue
            source = f"gate on first use (plan of {where})"
            verdict = self._gated.get(self._gate_key(key, plan, info))
            if verdict is None:
                reasons.append(f"unseen shape: a one-time gate checks the plan of {where} first")
                return None, source, reasons, plan
            passed, detail = verdict
            if passed:
                return plan, f"{source}: passed, {detail}", [], None
            reasons.append(f"one-time gate of the plan of {where} failed: {detail}")
            return None, source, reasons, None
        reasons.append("no plan of these dims is supported at this shape")
        return None, "", reasons, None

    # --- the one-time gate ----------------------------------------------------------
    def _gate_key(self, key: tuple[Any, ...], plan: Plan, info: DeviceInfo) -> str:
        """What a verdict holds for: the table, the shape, the plan, the device, the
        software stack and these weights (their fingerprint)."""
        from autotune.core.device import software_versions

        assert self.table is not None
        versions = software_versions()
        stack = [versions.get("torch"), versions.get("triton")]
        return json.dumps(
            [self.table.content_hash[:16], list(key), plan.hash, info.name, *stack,
             self._weights_fingerprint()]
        )  # fmt: skip

    def _weights_fingerprint(self) -> str:
        """A digest of every parameter's sum and sum of squares (one host sync, once per
        parameter version: only when a gate verdict is looked up or made)."""
        if self._fingerprint is None:
            import hashlib

            with torch.no_grad():
                stats = torch.stack(
                    [
                        torch.stack([p.detach().double().sum(), p.detach().double().square().sum()])
                        for p in self.parameters()
                    ]
                )
            self._fingerprint = hashlib.sha256(stats.cpu().numpy().tobytes()).hexdigest()[:16]
        return self._fingerprint

    def _read_gate_cache(
        self, then: str = "gating again", stacklevel: int = 3
    ) -> dict[str, tuple[bool, str]]:
        """The cache's verdicts; an unreadable cache warns at the caller's line (``then``
        says what follows) and reads as empty."""
        if self.gate_cache is None or not self.gate_cache.is_file():
            return {}
        try:
            raw = json.loads(self.gate_cache.read_text())
            return {k: (bool(v[0]), str(v[1])) for k, v in raw.items()}
        except (OSError, ValueError, TypeError, IndexError, AttributeError) as exc:
            warnings.warn(
                f"gate cache {self.gate_cache} unreadable ({exc}); {then}",
                stacklevel=stacklevel,
            )
            return {}

    def _run_gate(self, route: Route, x: Tensor) -> None:
        """Gate ``route.pending_gate`` at the call's shape; record and report the verdict."""
        from autotune.core.files import write_atomic
        from autotune.core.reference import ACCURACY_SEEDS, check_outputs, generate_random_case

        assert route.key is not None and route.pending_gate is not None
        plan, key = route.pending_gate, route.key
        info, _ = self._device(x.device)
        cand = self._candidate(key, plan, info)
        config = _config_at(self.config, key)
        worst = 0.0
        verdict: tuple[bool, str] | None = None
        try:
            for padding in (0.0, 0.25):
                for seed in ACCURACY_SEEDS:
                    xs, ms = generate_random_case(config, x.device, x.dtype, seed, padding)
                    report = check_outputs(cand(xs, ms), super().forward(xs, ms))
                    worst = max(worst, report.budget_share)
                    if not report.passed:
                        pad = f", padding {padding}" if padding else ""
                        verdict = (False, f"seed {seed}{pad}: {report.summary()}")
                        break
                if verdict is not None:
                    break
        except Exception as exc:  # a plan that cannot run here is not served
            verdict = (False, f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
        if verdict is None:
            verdict = (True, f"10 inputs (5 seeds, 5 padded), worst {worst:.3f} of the allowance")
        self._gated[self._gate_key(key, plan, info)] = verdict
        if self.gate_cache is not None:
            merged = (
                self._read_gate_cache(  # other processes' verdicts kept
                    "rewritten with this process's verdicts",
                    stacklevel=8,  # the caller's line
                )
                | self._gated
            )
            try:
                write_atomic(self.gate_cache, json.dumps(merged, indent=1, sort_keys=True))
            except OSError as exc:  # the verdict still holds in this process
                why = exc.strerror or str(exc)  # not the temporary file's name
                warnings.warn(
                    f"gate cache {self.gate_cache} not written ({why}); the verdict is kept "
                    "in this process only",
                    stacklevel=7,
                )
        warnings.warn(
            f"DispatchedTransformer: unseen shape {key}: one-time gate of plan {plan.hash} "
            f"{'passed' if verdict[0] else 'FAILED (the reference serves)'}: {verdict[1]}",
            stacklevel=7,  # the caller's: past _resolve, _forward, forward, nn.Module's two
        )
        self._routes = {k: r for k, r in self._routes.items() if k[0] != key}

    def _warn_contract(self, route: Route, device: torch.device) -> None:
        """Once per model: a call with a tuned entry went to the reference for the contract."""
        if route.key is None or self._static_route(route.key, device).plan is None:
            return  # no tuned entry to miss
        problems = contract_problems()
        if not problems or set(route.reasons) != set(problems):
            return  # another reason (the mask) keeps the entry out anyway: explain() says it
        fix = f"{SERVING_FIX} (torch.inference_mode() with the official flags)"
        if all(p.startswith("autocast") for p in problems):
            fix = "call the model outside torch.autocast"
        warnings.warn(
            f"DispatchedTransformer: the tuned entry for case key {route.key} was not used "
            f"and the reference served, because {'; and '.join(problems)}. Fix: {fix}. "
            "Warned once per model; explain(x, mask) gives every reason.",
            stacklevel=7,  # the caller's: past _resolve, _forward, forward, nn.Module's two
        )
        self._warned_contract = True

    def _candidate(
        self, key: tuple[Any, ...], plan: Plan, info: DeviceInfo
    ) -> CandidateTransformer:
        cand = self._candidates.get(plan.hash)
        if cand is None:
            cand = CandidateTransformer(_config_at(self.config, key), plan, info)
            # Share our modules: one set of weights, loaded once, seen by every plan.
            cand.layers = self.layers
            cand.final_norm = self.final_norm
            cand.watch_edits = self.watch_edits
            cand.eval()
            self._candidates[plan.hash] = cand
        return cand

    def forward(self, x: Tensor, valid_token_mask: Tensor | None = None) -> Tensor:
        with input_device(x):
            return self._forward(x, valid_token_mask)

    def _forward(self, x: Tensor, valid_token_mask: Tensor | None) -> Tensor:
        key = _call_key(x, valid_token_mask)
        served = self._served.get(key)
        if served is None:
            self._local.route = None  # until this call has one (a refused call goes nowhere)
            # One thread resolves (and gates) a key; its other callers wait for the route.
            with self._resolve_locks.setdefault(key, threading.Lock()):
                served = self._served.get(key)
                while served is None:
                    generation = self._generation
                    served = self._served[key] = self._resolve(x, valid_token_mask)
                    if self._generation != generation:  # our modules replaced meanwhile
                        self._served.pop(key, None)
                        served = None
        route, cand = served
        self._local.route = route
        if cand is None:
            return super().forward(x, valid_token_mask)
        out = cand.forward(x, valid_token_mask)  # our own candidate: no hooks to run
        if cand.guard_log:  # a guarded approximation ran: say what its guard decided
            self._report_guard(key, route, cand, x.shape[0])
        return out

    def _report_guard(
        self, key: tuple[Any, ...], route: Route, cand: CandidateTransformer, batch: int
    ) -> None:
        assert route.plan is not None
        report = guard_report(cand.guard_log, batch, route.plan.batch_chunk, self.config.num_layers)
        self._guards[key] = report
        self._local.route = dataclasses.replace(route, guard=(guard_rule(route.plan), *report))
        LOG.info("%s: %s", route.target, report[0])
        for line in report[1:]:
            LOG.debug("  %s", line)

    def _check_inputs(self, x: Tensor, mask: Tensor | None) -> None:
        """Inputs the reference cannot run either, refused in one line that says what it
        takes (the reference's own error names a LayerNorm or an unpacking). Checked on a
        call key's first call only: the steady state costs nothing."""
        d = self.config.d_model
        if x.dim() != 3 or x.shape[-1] != d:
            raise ValueError(
                f"x has shape {tuple(x.shape)}; this model takes [batch, seq_len, {d}] "
                f"(d_model {d}); add a batch dimension with x[None] for one sequence"
            )
        mixed = self._dtype_mismatch(x)
        if mixed:
            raise ValueError(mixed)
        if mask is None:
            return
        b, s = x.shape[:2]
        if mask.dtype != torch.bool:
            raise ValueError(
                f"valid_token_mask has dtype {mask.dtype}; it must be torch.bool (True for a "
                "real token), e.g. mask.bool()"
            )
        if mask.dim() != 2 or mask.shape[0] not in (1, b) or mask.shape[1] not in (1, s):
            raise ValueError(
                f"valid_token_mask has shape {tuple(mask.shape)}; it must be [{b}, {s}] (or "
                f"a shape the reference broadcasts to it: [1, {s}] for every sequence) for x "
                f"of shape {tuple(x.shape)}"
            )

    def _dtype_mismatch(self, x: Tensor) -> str:
        """Why x's dtype cannot meet the weights' ('' where it can): the reference's own
        error names a matmul ('mat1 and mat2 must have the same dtype'). Only where every
        floating weight has one dtype; under autocast the reference casts, and serves."""
        dtypes = {p.dtype for p in self.parameters() if p.is_floating_point()}
        if len(dtypes) != 1 or x.dtype in dtypes or any_autocast():
            return ""  # a model of mixed dtypes is the caller's: the reference says
        (weights,) = dtypes
        name = str(weights).removeprefix("torch.")
        return (
            f"x has dtype {x.dtype}, the model's weights {weights}; pass "
            f"x.to(torch.{name}), or convert the model to x's dtype (model.to({x.dtype}))"
        )

    def _resolve(
        self, x: Tensor, valid_token_mask: Tensor | None
    ) -> tuple[Route, CandidateTransformer | None]:
        """The first call of a call key: its route, the module that serves it, warnings."""
        self._check_inputs(x, valid_token_mask)
        route = self.explain(x, valid_token_mask)
        if route.pending_gate is not None:
            self._run_gate(route, x)
            route = self.explain(x, valid_token_mask)
        if route.plan is None:
            if (
                self.table is not None
                and not self._warned
                and any(r.startswith("table refused") for r in route.reasons)
            ):
                warnings.warn(
                    f"dispatch table {self.table.source} refused, the reference "
                    f"serves: {'; '.join(route.reasons)}",
                    stacklevel=6,
                )
                self._warned = True
            elif self.table is not None and not self._warned_contract:
                self._warn_contract(route, x.device)
            return route, None
        info, _ = self._device(x.device)
        assert route.key is not None
        return route, self._candidate(route.key, route.plan, info)


def input_device(x: Tensor) -> contextlib.AbstractContextManager[Any]:
    """The input's GPU made current for the call where it is not already: Triton launches
    its kernels, and CUDA graphs are captured and replayed, on the current device, not on
    the tensors' (a model on cuda:1 called while cuda:0 is current would hand device-1
    pointers to kernels on device 0). Nothing to enter on the CPU or the current GPU."""
    if x.is_cuda and (index := x.get_device()) != torch.cuda.current_device():
        return torch.cuda.device(index)
    return _NO_CONTEXT


_NO_CONTEXT = contextlib.nullcontext()  # reusable: it holds no state


def _call_key(x: Tensor, mask: Tensor | None) -> tuple[Any, ...]:
    """Everything a route depends on besides the table and the weights: read per call, in
    a few microseconds, never the tensors' values."""
    return (
        x.shape,
        x.dtype,
        x.device,
        None if mask is None else (mask.shape, mask.dtype),
        settings_key(),
    )
