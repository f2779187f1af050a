"""Files written so that a crash, a kill or a full disk never leaves half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to a temporary sibling, fsync it, then rename it over ``path``: a
    reader sees the old file or the new one, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def append_line(path: str | Path, header: str, line: str) -> None:
    """Append ``line`` to a text file, ``header`` first when the file is new or empty;
    flushed and fsynced, so a run cut short keeps every line it wrote (CSV rows)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.is_file() or path.stat().st_size == 0
    with path.open("a", newline="") as fh:
        fh.write((header if new else "") + line)
        fh.flush()
        os.fsync(fh.fileno())
