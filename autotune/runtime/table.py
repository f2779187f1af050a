"""The generated table: its format (canonical content hash, Python-literal rendering),
the one reader of table files, loading with integrity checks, and whether a table may
serve on this device and software stack.

Shared by the exporter and the runtime dispatcher; imports torch and the standard
library only.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.core.device import DeviceInfo, software_versions
from autotune.plan import Plan

# Schema 2 adds BUCKETS (regimes of batch and sequence length served by one verified
# plan, autotune.ship.buckets); schema-1 tables (no BUCKETS) still load.
SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
TABLE_FIELDS = (
    "SCHEMA_VERSION",
    "PROFILE",
    "TABLE_VERSION",
    "PROVENANCE",
    "ENTRIES",
    "CONTENT_HASH",
)
OPTIONAL_FIELDS = ("BUCKETS",)


def canonical_payload(
    profile: str,
    version: int,
    provenance: dict[str, Any],
    entries: dict[tuple[Any, ...], Any],
    buckets: list[Any] | None = None,
    schema: int = SCHEMA_VERSION,
) -> str:
    """The bytes the content hash covers: everything in the table but the hash itself
    (a schema-1 table has no buckets and hashes as it always did)."""
    body: dict[str, Any] = {
        "schema": schema,
        "profile": profile,
        "version": version,
        "provenance": provenance,
        "entries": [[list(k), entries[k]] for k in sorted(entries, key=_key_order)],
    }
    if schema >= 2:
        body["buckets"] = list(buckets or [])
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)


def content_hash(
    profile: str,
    version: int,
    provenance: dict[str, Any],
    entries: dict[tuple[Any, ...], Any],
    buckets: list[Any] | None = None,
    schema: int = SCHEMA_VERSION,
) -> str:
    payload = canonical_payload(profile, version, provenance, entries, buckets, schema)
    return hashlib.sha256(payload.encode()).hexdigest()


def _key_order(key: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(
        f"{v:012d}" if isinstance(v, int) and not isinstance(v, bool) else str(v) for v in key
    )


def render(value: Any, indent: int = 0) -> str:
    """A deterministic Python literal, one dict item per line, keys sorted."""
    pad = "    " * (indent + 1)
    end = "    " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        keys = sorted(value, key=lambda k: _key_order(k) if isinstance(k, tuple) else (str(k),))
        items = [f"{pad}{render(k, indent + 1)}: {render(value[k], indent + 1)}," for k in keys]
        return "{\n" + "\n".join(items) + f"\n{end}}}"
    if isinstance(value, tuple):
        inner = ", ".join(render(v, indent + 1) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        if not value:
            return "[]"
        if all(not isinstance(v, (dict, list, tuple)) for v in value):
            return "[" + ", ".join(render(v, indent + 1) for v in value) + "]"
        items = [f"{pad}{render(v, indent + 1)}," for v in value]
        return "[\n" + "\n".join(items) + f"\n{end}]"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"a table cannot hold the non-finite number {value!r}")
        return repr(value)
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    raise TypeError(f"a table cannot hold {type(value).__name__} {value!r}")


@dataclasses.dataclass(frozen=True)
class DispatchTable:
    profile: str
    version: int
    provenance: Mapping[str, Any]
    entries: Mapping[tuple[Any, ...], Mapping[str, Any]]
    content_hash: str
    source: str
    problems: tuple[str, ...] = ()  # set: the table is refused as a whole
    buckets: tuple[Mapping[str, Any], ...] = ()
    schema: int = SCHEMA_VERSION

    @property
    def usable(self) -> bool:
        return not self.problems


def read_table_file(path: Path) -> dict[str, Any]:
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
        if path.is_dir():
            raise ValueError(
                f"table {str(path)!r} is a folder; give a table file such as "
                f"{str(path / 'h200.py')!r}"
            )
        if not path.is_file():
            raise ValueError(
                f"table file {str(path)!r} does not exist; make one with "
                "'autotune export --gpu PROFILE'"
            )
        values, source = read_table_file(path), str(path)
    elif isinstance(table, types.ModuleType):
        fields = TABLE_FIELDS + OPTIONAL_FIELDS
        values = {k: getattr(table, k) for k in fields if hasattr(table, k)}
        source = getattr(table, "__file__", None) or table.__name__
    else:
        values, source = dict(table), "<mapping>"
    missing = [k for k in TABLE_FIELDS if k not in values]
    if missing:
        raise ValueError(f"{source} is not a dispatch table: it lacks {missing}")
    schema = values["SCHEMA_VERSION"]
    if type(schema) is not int or schema not in READABLE_SCHEMAS:  # not 2.0 or True either
        # Another schema's fields may have other shapes: none of them is read, and the
        # table is refused whole (the reference serves), not raised on.
        version = values["TABLE_VERSION"]
        return DispatchTable(
            str(values["PROFILE"]),
            version if isinstance(version, int) else -1,
            {},
            {},
            str(values["CONTENT_HASH"]),
            source,
            (
                f"schema version {schema!r} is not one this autotune reads "
                f"({', '.join(map(str, READABLE_SCHEMAS))}); re-export the table with this "
                "autotune, or serve it with the one that wrote it",
            ),
            (),
            -1,
        )
    _check_shape(values, source)
    problems = []
    entries = {tuple(k): v for k, v in values["ENTRIES"].items()}
    buckets = list(values.get("BUCKETS") or [])
    problems += _unreadable_parts(values["PROVENANCE"], entries, buckets)
    if schema == 1 and buckets:
        problems.append("a schema-1 table cannot hold BUCKETS; re-export it")
    try:
        actual = content_hash(
            values["PROFILE"],
            values["TABLE_VERSION"],
            values["PROVENANCE"],
            entries,
            buckets,
            schema,
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
        values["TABLE_VERSION"],
        values["PROVENANCE"],
        entries,
        values["CONTENT_HASH"],
        source,
        tuple(problems),
        tuple(buckets),
        schema,
    )


def _check_shape(values: Mapping[str, Any], source: str) -> None:
    """The table's fields have the types export writes, else one ValueError naming the
    field (a hand edit that no hash check could make sense of)."""
    kinds: dict[str, tuple[type, ...]] = {
        "PROFILE": (str,),
        "TABLE_VERSION": (int,),
        "PROVENANCE": (dict,),
        "ENTRIES": (dict,),
        "CONTENT_HASH": (str,),
        "BUCKETS": (list, tuple, type(None)),
    }
    for field, types_ in kinds.items():
        value = values.get(field)
        if field in values and (not isinstance(value, types_) or isinstance(value, bool)):
            want = " or ".join(t.__name__ for t in types_ if t is not type(None))
            raise ValueError(
                f"{source}: {field} is {type(value).__name__} {str(value)[:40]!r}, not "
                f"{'an' if want == 'int' else 'a'} {want}; re-export the table with "
                "'autotune export'"
            )
    for key, entry in values["ENTRIES"].items():
        if not isinstance(key, tuple) or not isinstance(entry, dict):
            raise ValueError(
                f"{source}: ENTRIES holds {str(key)[:60]!r}: {type(entry).__name__}, not a "
                "case-key tuple and its entry dict; re-export the table with 'autotune export'"
            )
    for bucket in values.get("BUCKETS") or ():
        if not isinstance(bucket, dict):
            raise ValueError(
                f"{source}: BUCKETS holds a {type(bucket).__name__}, not a bucket dict; "
                "re-export the table with 'autotune export'"
            )


def _unreadable_parts(
    provenance: Mapping[str, Any],
    entries: Mapping[tuple[Any, ...], Mapping[str, Any]],
    buckets: list[Mapping[str, Any]],
) -> list[str]:
    """Why parts of a well-formed table cannot be read by this autotune: the provenance's
    device and versions records, and every plan the table could serve (a newer autotune's
    knob, a value this one lacks). A table with any is refused whole: no call may fail on
    a plan it cannot read."""
    problems = [
        f"PROVENANCE[{name!r}] is {type(provenance.get(name)).__name__}, not a dict"
        for name in ("device", "versions")
        if not isinstance(provenance.get(name, {}), dict)
    ]
    plans = [(f"entry {key}", e.get("plan", {})) for key, e in entries.items() if e.get("admitted")]
    plans += [(f"bucket {i}", b.get("plan", {})) for i, b in enumerate(buckets)]
    for where, plan in plans:
        try:
            Plan.from_dict(plan)
        except (TypeError, ValueError) as exc:
            problems.append(
                f"{where}'s plan cannot be read by this autotune ({str(exc)[:160]}); "
                "re-export the table with this autotune, or serve it with the one that wrote it"
            )
            break  # one is enough to refuse the table; the rest say the same
    return problems


def _major_minor(version: str | None) -> str | None:
    if not version:
        return None
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else version


def compatibility_problems(table: DispatchTable, device: DeviceInfo) -> list[str]:
    """Why this table must not serve on this device and software stack (empty: fine)."""
    prov = table.provenance
    made_on = prov.get("device", {})
    made_on = made_on if isinstance(made_on, dict) else {}  # load_table named it a problem
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
        elif made_on.get("name") != device.name:
            how = f"emulating profile {table.profile!r} " if prov.get("emulated") else ""
            problems.append(
                f"table was made {how}on {made_on.get('name')}, this GPU is "
                f"{device.name}; validate it here with 'autotune validate'"
            )
    versions = prov.get("versions", {})
    versions = versions if isinstance(versions, dict) else {}
    here = software_versions()
    differ = []  # (name, the table's version, this one)
    if _major_minor(versions.get("torch")) != _major_minor(here["torch"]):
        differ.append(("torch", versions.get("torch"), here["torch"]))
    plans = [e.get("plan", {}) for e in table.entries.values() if e.get("admitted")]
    plans += [b.get("plan", {}) for b in table.buckets]
    uses_triton = any(_uses_triton(p) for p in plans)
    if uses_triton and _major_minor(versions.get("triton")) != _major_minor(here["triton"]):
        differ.append(("triton", versions.get("triton"), here["triton"]))
    if differ:
        problems.append(version_mismatch_problem(table, differ))
    return problems


def _uses_triton(plan: Any) -> bool:
    """Whether a plan runs Triton kernels; one this autotune cannot read counts as one
    (load_table refuses its table anyway)."""
    try:
        return Plan.from_dict(plan).uses_triton
    except (TypeError, ValueError):
        return True


def _version(name: str, version: str | None, missing: str) -> str:
    return f"{name} {version}" if version else f"no {name} {missing}"


def version_mismatch_problem(
    table: DispatchTable, differ: list[tuple[str, str | None, str | None]]
) -> str:
    """Which versions differ (the table's and this stack's) and the one honest way forward:
    re-verify every entry here, then write a new table whose provenance is this stack's."""
    theirs = ", ".join(_version(n, t, "recorded") for n, t, _ in differ)
    ours = ", ".join(_version(n, h, "installed") for n, _, h in differ)
    uses = " (the table uses Triton kernels)" if any(n == "triton" for n, _, _ in differ) else ""
    path = table.source if not table.source.startswith("<") else "PATH"
    return (
        f"software versions differ: the table was made with {theirs}, this is {ours}{uses}; "
        "its entries were verified and timed under the table's versions only. Way forward: "
        f"re-verify every entry on this device and write those that pass as a new table "
        f"with this stack's provenance: 'autotune validate --table {path} --allow-reference "
        "--out NEW_PATH'; never edit a table in place"
    )
