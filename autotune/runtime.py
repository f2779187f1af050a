"""The runtime dispatcher: a drop-in for the reference that serves tuned plans.

``DispatchedTransformer(config, table=...)`` has the reference's state dict and forward
signature. Per call it looks up the input's case key, checks the runtime contract
(device and capability, dtype, mask shape and kind, inference mode, matmul precision
and TF32 flags) and runs the table's plan on a hit, otherwise the reference.
``explain(x, mask)`` returns the route and every reason an entry was not used. It never
tunes. A table whose hash does not match its content, or made for another GPU or an
incompatible torch/triton, is refused with a clear message, and the reference serves.

Imports torch and the standard library only: no optuna, sqlalchemy, pandas, matplotlib.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import types
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from autotune.build import CandidateTransformer, not_supported_reasons
from autotune.device import DeviceInfo, detect_device, software_versions
from autotune.plan import Plan
from autotune.reference import ReferenceTransformer, TransformerConfig, official_settings_active
from autotune.table import SCHEMA_VERSION, content_hash

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_TABLE_FIELDS = (
    "SCHEMA_VERSION",
    "PROFILE",
    "TABLE_VERSION",
    "PROVENANCE",
    "ENTRIES",
    "CONTENT_HASH",
)


@dataclasses.dataclass(frozen=True)
class DispatchTable:
    profile: str
    version: int
    provenance: Mapping[str, Any]
    entries: Mapping[tuple[Any, ...], Mapping[str, Any]]
    content_hash: str
    source: str
    problems: tuple[str, ...] = ()  # set: the table is refused as a whole

    @property
    def usable(self) -> bool:
        return not self.problems


def _read_module_file(path: Path) -> dict[str, Any]:
    """The table's literal assignments, read without executing the file."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError) as exc:
        raise ValueError(f"cannot read table {str(path)!r}: {exc}") from exc
    values: dict[str, Any] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError as exc:
                raise ValueError(
                    f"table {str(path)!r}: {node.targets[0].id} is not a literal ({exc}); "
                    "re-export it with 'autotune export'"
                ) from exc
    return values


def load_table(
    table: str | Path | types.ModuleType | Mapping[str, Any] | DispatchTable,
) -> DispatchTable:
    """Read a table (a path, an imported module or a mapping) and check its integrity.

    A table that is malformed raises ValueError. One whose hash does not match its
    content loads with ``problems`` set: it will be refused and the reference serves.
    """
    if isinstance(table, DispatchTable):
        return table
    if isinstance(table, (str, Path)):
        path = Path(table)
        if not path.is_file():
            raise ValueError(
                f"table file {str(path)!r} does not exist; make one with "
                "'autotune export --gpu PROFILE'"
            )
        values, source = _read_module_file(path), str(path)
    elif isinstance(table, types.ModuleType):
        values = {k: getattr(table, k) for k in _TABLE_FIELDS if hasattr(table, k)}
        source = getattr(table, "__file__", None) or table.__name__
    else:
        values, source = dict(table), "<mapping>"
    missing = [k for k in _TABLE_FIELDS if k not in values]
    if missing:
        raise ValueError(f"{source} is not a dispatch table: it lacks {missing}")
    problems = []
    if values["SCHEMA_VERSION"] != SCHEMA_VERSION:
        problems.append(
            f"schema version {values['SCHEMA_VERSION']} is not the supported "
            f"{SCHEMA_VERSION}; re-export the table with this autotune"
        )
    entries = {tuple(k): v for k, v in values["ENTRIES"].items()}
    try:
        actual = content_hash(
            values["PROFILE"], values["TABLE_VERSION"], values["PROVENANCE"], entries
        )
    except (TypeError, ValueError) as exc:
        actual = f"unhashable ({exc})"
    if actual != values["CONTENT_HASH"]:
        problems.append(
            f"content hash mismatch: the file says {str(values['CONTENT_HASH'])[:16]}..., its "
            f"content hashes to {actual[:16]}...; the table was edited after export: "
            "re-export it with 'autotune export'"
        )
    return DispatchTable(
        values["PROFILE"],
        int(values["TABLE_VERSION"]),
        values["PROVENANCE"],
        entries,
        values["CONTENT_HASH"],
        source,
        tuple(problems),
    )


def _major_minor(version: str | None) -> str | None:
    if not version:
        return None
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else version


def compatibility_problems(table: DispatchTable, device: DeviceInfo) -> list[str]:
    """Why this table must not serve on this device and software stack (empty: fine)."""
    prov = table.provenance
    made_on = prov.get("device", {})
    problems = []
    if made_on.get("type") != device.type:
        problems.append(
            f"table was made on a {made_on.get('type')} device, this is "
            f"{device.type} ({device.name})"
        )
    elif device.type == "cuda":
        cap = tuple(made_on.get("capability") or ())
        if cap != tuple(device.capability or ()):
            problems.append(
                f"table was made for capability sm_{''.join(map(str, cap))} "
                f"({made_on.get('name')}), this GPU is {device.sm} ({device.name})"
            )
        elif made_on.get("name") != device.name and not prov.get("emulated"):
            problems.append(
                f"table was made on {made_on.get('name')}, this GPU is "
                f"{device.name}; validate it here with 'autotune validate'"
            )
    versions = prov.get("versions", {})
    here = software_versions()
    if _major_minor(versions.get("torch")) != _major_minor(here["torch"]):
        problems.append(
            f"table was made with torch {versions.get('torch')}, this is torch "
            f"{here['torch']}; re-validate or re-tune"
        )
    uses_triton = any(
        Plan.from_dict(e.get("plan", {})).uses_triton
        for e in table.entries.values()
        if e.get("admitted")
    )
    if uses_triton and _major_minor(versions.get("triton")) != _major_minor(here["triton"]):
        problems.append(
            f"table uses Triton kernels made with triton {versions.get('triton')}, "
            f"this is triton {here['triton']}"
        )
    return problems


@dataclasses.dataclass(frozen=True)
class Route:
    """Where a call goes, and every reason a table entry was not used."""

    target: str  # "plan <hash>: <description>" or "reference"
    key: tuple[Any, ...] | None
    plan: Plan | None
    reasons: tuple[str, ...]

    def __str__(self) -> str:
        why = "" if not self.reasons else " (" + "; ".join(self.reasons) + ")"
        return f"{self.target}{why}"


class DispatchedTransformer(ReferenceTransformer):
    """Drop-in for the reference: same parameters, same forward, tuned plans inside."""

    def __init__(self, config: TransformerConfig, table: Any = None) -> None:
        super().__init__(config)
        self.table: DispatchTable | None = load_table(table) if table is not None else None
        self._candidates: dict[tuple[Any, ...], CandidateTransformer] = {}
        self._devices: dict[torch.device, tuple[DeviceInfo, tuple[str, ...]]] = {}
        self._routes: dict[tuple[Any, ...], Route] = {}
        self._warned = False
        self.last_route: Route | None = None

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self._candidates.clear()  # they read our parameters; graphs must be re-captured
        self._routes.clear()
        return super()._apply(fn, recurse)

    def _device(self, device: torch.device) -> tuple[DeviceInfo, tuple[str, ...]]:
        if device not in self._devices:
            info = detect_device("cuda" if device.type == "cuda" else "cpu")
            problems: tuple[str, ...] = ()
            if self.table is not None:
                problems = self.table.problems + tuple(compatibility_problems(self.table, info))
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
        key = (
            x.shape[0],
            x.shape[1],
            c.d_model,
            c.num_heads,
            c.ffn_dim,
            c.num_layers,
            c.causal,
            _DTYPE_NAMES.get(x.dtype, str(x.dtype)),
        )
        static = self._static_route(key, x.device)
        reasons = list(static.reasons)
        if valid_token_mask is not None and (
            valid_token_mask.dtype != torch.bool or valid_token_mask.shape != x.shape[:2]
        ):
            reasons.append(
                f"mask must be bool {tuple(x.shape[:2])}, got "
                f"{valid_token_mask.dtype} {tuple(valid_token_mask.shape)}"
            )
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            reasons.append(
                "gradients are enabled: tuned plans serve inference only "
                "(use torch.inference_mode())"
            )
        if not official_settings_active():
            reasons.append(
                "matmul precision/TF32 flags differ from the official settings "
                "the table was validated under"
            )
        if not reasons:
            return static
        return Route("reference", key, None, tuple(reasons))

    def _static_route(self, key: tuple[Any, ...], device: torch.device) -> Route:
        """What depends only on the case key and the device, worked out once."""
        cached = self._routes.get((key, device))
        if cached is not None:
            return cached
        assert self.table is not None
        info, problems = self._device(device)
        reasons = [f"table refused: {p}" for p in problems]
        entry = self.table.entries.get(key)
        plan = None
        if entry is None:
            reasons.append(f"no entry for case key {key}")
        elif not entry.get("admitted"):
            reasons.append(
                f"entry for {key} keeps the reference: "
                f"{entry.get('evidence', {}).get('reason', '')}"
            )
        else:
            plan = Plan.from_dict(entry.get("plan", {}))
            reasons += [
                f"plan unsupported here: {r}"
                for r in not_supported_reasons(plan, self.config, info)
            ]
        if reasons or plan is None:
            route = Route("reference", key, None, tuple(reasons))
        else:
            route = Route(f"plan {plan.hash}: {plan.describe()}", key, plan, ())
        self._routes[(key, device)] = route
        return route

    def _candidate(
        self, key: tuple[Any, ...], plan: Plan, info: DeviceInfo
    ) -> CandidateTransformer:
        cand = self._candidates.get(key)
        if cand is None:
            cand = CandidateTransformer(self.config, plan, info)
            # Share our modules: one set of weights, loaded once, seen by every plan.
            cand.layers = self.layers
            cand.final_norm = self.final_norm
            cand.eval()
            self._candidates[key] = cand
        return cand

    def forward(self, x: Tensor, valid_token_mask: Tensor | None = None) -> Tensor:
        route = self.explain(x, valid_token_mask)
        self.last_route = route
        if route.plan is None:
            if (
                self.table is not None
                and not self._warned
                and any(r.startswith("table refused") for r in route.reasons)
            ):
                warnings.warn(
                    f"dispatch table {self.table.source} refused, the reference "
                    f"serves: {'; '.join(route.reasons)}",
                    stacklevel=2,
                )
                self._warned = True
            return super().forward(x, valid_token_mask)
        info, _ = self._device(x.device)
        assert route.key is not None
        return self._candidate(route.key, route.plan, info)(x, valid_token_mask)
