"""What every command group shares: the user-error type, common options, small parsers."""

from __future__ import annotations

import argparse
import glob
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_STORAGE = "sqlite:///studies.db"
DEFAULT_GOLDEN = "../shared/golden/*.pt"


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


def add_gpu(p: argparse.ArgumentParser, default: str = "cpu") -> None:
    p.add_argument(
        "--gpu",
        default=default,
        help=f"GPU profile: cpu, auto, h200, h100, a100, rtx4090, rtx5080 (default {default}"
        + (": the device at hand" if default == "auto" else "")
        + ")",
    )
    p.add_argument(
        "--emulate",
        action="store_true",
        help="run a profile on another device, capping memory to the profile's",
    )


def add_storage(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", default=DEFAULT_STORAGE, help="any SQLAlchemy URL")


def open_storage(url: str, heartbeat: int | None = None, *, must_exist: bool = True) -> Any:
    """The study storage at ``url``. Commands that only read (export, plot, report) refuse
    an SQLite file that does not exist instead of creating an empty one; ``study``
    (``must_exist=False``) creates the file, and its folder."""
    from autotune.search.trials import open_storage as open_rdb

    if url.startswith("sqlite:") and sqlite_path(url) is None:
        raise CliError(
            f"storage {url!r} names no file: an in-memory database keeps nothing between "
            "commands; give a file, e.g. --storage sqlite:///studies.db"
        )
    path = sqlite_path(url)
    if path is not None:
        if must_exist and not path.is_file():
            raise CliError(
                f"storage {url!r} does not exist (no file {str(path)!r}); give the --storage "
                "that 'autotune study' wrote to"
            )
        if not path.exists():
            from autotune.core.files import unwritable_folder

            blocked = unwritable_folder(path.absolute().parent)
            if blocked is not None:
                raise CliError(
                    f"storage {url!r}: {blocked} is not a writable folder, so {path.name} "
                    "cannot be made there; give --storage sqlite:///FILE in a folder you can "
                    "write"
                )
        path.parent.mkdir(parents=True, exist_ok=True)
    new = path is not None and not path.exists()
    try:
        return open_rdb(url, heartbeat, 3 * heartbeat if heartbeat else None)
    except BaseException:
        if new and path is not None and path.is_file() and path.stat().st_size == 0:
            path.unlink()  # made by this call, never written (a full disk): not left behind
        raise


def sqlite_path(url: str) -> Path | None:
    """The file of an ``sqlite:///PATH`` URL (None for other databases and memory)."""
    if not url.startswith("sqlite:///"):
        return None
    rest = url[len("sqlite:///") :].split("?", 1)[0]
    if rest.startswith("file:"):
        rest = rest[len("file:") :]
    return Path(rest) if rest and rest != ":memory:" else None


def storage_text(url: str) -> str:
    """The URL as given, and, for a relative sqlite path, the file it resolves to here
    (``sqlite:///tmp/x.db`` is ./tmp/x.db, not /tmp/x.db: four slashes for that)."""
    path = sqlite_path(url)
    if path is None or path.is_absolute():
        return url
    return f"{url} (the file {path.resolve()})"


def selection(args: argparse.Namespace) -> Any:
    from autotune.core.profiles import select_profile

    return select_profile(args.gpu, emulate=args.emulate)


def check_table_profile(table: Any, profile: str) -> None:
    """A command that serves ``table`` on this profile's device refuses another profile's
    table in one line (``validate`` and ``compare`` take one on purpose)."""
    if table.profile != profile:
        raise CliError(
            f"{table.source} is a table for profile {table.profile!r}, not {profile!r}; "
            f"pass --gpu {table.profile}"
        )


def default_vectors(paths: Sequence[str]) -> list[str]:
    """The vectors given, else ``DEFAULT_GOLDEN`` from here, else beside the checkout (the
    project's ``../shared/golden``, whatever the current directory)."""
    if paths:
        missing = [p for p in paths if not Path(p).is_file()]
        if missing:
            raise CliError(
                f"golden vector {missing[0]!r} is not a file"
                + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
                + f"; give .pt files such as those in {DEFAULT_GOLDEN}"
            )
        return list(paths)
    checkout = Path(__file__).resolve().parents[2]
    for pattern in (DEFAULT_GOLDEN, str(checkout / DEFAULT_GOLDEN)):
        found = sorted(glob.glob(pattern))
        if found:
            return found
    raise CliError(f"no vectors given and none found at {DEFAULT_GOLDEN}; pass .pt files")


def chunk_pair(text: str, flag: str) -> tuple[int, int]:
    """``QUERY,KEY`` positive chunk sizes."""
    try:
        q, k = (int(v) for v in text.split(","))
    except ValueError:
        raise CliError(f"{flag} takes 'QUERY,KEY' chunk sizes, got {text!r}") from None
    if q < 1 or k < 1:
        raise CliError(f"{flag} must be positive, got {text!r}")
    return q, k


def check_args(args: argparse.Namespace) -> None:
    """What every command refuses before it runs: an empty case spec (which would
    otherwise mean the command's default cases), and outputs it could not write."""
    for flag in ("cases", "case"):
        value = getattr(args, flag, None)
        if isinstance(value, str) and not value.strip():
            raise CliError(f"--{flag} {value!r} selects no case; try 'smoke', '1-13' or 'all'")
    shapes = getattr(args, "shapes", None)
    if isinstance(shapes, str) and not shapes.strip():
        raise CliError(f"--shapes {shapes!r} names no shape; give 'BATCHES x SEQS' such as "
                       "'1,8,64 x 32,256', or leave it out")  # fmt: skip
    seed = getattr(args, "seed", None)
    if isinstance(seed, int) and not 0 <= seed < 2**32:
        raise CliError(f"--seed {seed}: give a seed from 0 to {2**32 - 1}")
    check_outputs(args)


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before a command measures anything, an output it could not write: ``--json``,
    ``--csv`` and ``--journal`` are files, ``--out`` a file or (``out_is="dir"`` in the parser's
    defaults) a folder. A file must not be a folder, a folder not a file, and the nearest
    existing folder above either must be writable."""
    from autotune.core.files import unchangeable_file, unwritable_folder

    outputs = [
        (f"--{name}", getattr(args, name, None), "file") for name in ("json", "csv", "journal")
    ]
    outputs.append(("--out", getattr(args, "out", None), getattr(args, "out_is", "file")))
    for flag, value, kind in outputs:
        if value is None or not isinstance(value, str):
            continue
        path = Path(value)
        if not value.strip():
            raise CliError(f"{flag} '': give a {kind} path")
        if kind == "file" and path.is_dir():
            raise CliError(f"{flag} {value} is a folder; give a file path inside it")
        if kind == "dir" and path.exists() and not path.is_dir():
            raise CliError(f"{flag} {value} is a file; give a folder")
        blocked = unwritable_folder(path if kind == "dir" else path.absolute().parent)
        if blocked is not None:
            raise CliError(f"{flag} {value}: {blocked} is not a writable folder")
        if kind == "file" and (why := unchangeable_file(path, flag in ("--csv", "--journal"))):
            raise CliError(f"{flag} {value}: {why}")
