"""The generated table's format: canonical content hash and Python-literal rendering.

Shared by the exporter and the runtime; imports nothing beyond the standard library.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

SCHEMA_VERSION = 1


def canonical_payload(
    profile: str, version: int, provenance: dict[str, Any], entries: dict[tuple[Any, ...], Any]
) -> str:
    """The bytes the content hash covers: everything in the table but the hash itself."""
    body = {
        "schema": SCHEMA_VERSION,
        "profile": profile,
        "version": version,
        "provenance": provenance,
        "entries": [[list(k), entries[k]] for k in sorted(entries, key=_key_order)],
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)


def content_hash(
    profile: str, version: int, provenance: dict[str, Any], entries: dict[tuple[Any, ...], Any]
) -> str:
    payload = canonical_payload(profile, version, provenance, entries)
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
