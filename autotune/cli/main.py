"""The ``autotune`` command line: the parser of every command group, and how a run ends
(a user error is one line and exit 2). Heavy modules are imported inside each command."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from typing import NoReturn

from autotune.cli import info, long, results, ship, tune
from autotune.cli.common import CliError

GROUPS = (info, tune, ship, results, long)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (the bad value, and where help is) rather
    than the whole usage block before it; every command's parser is one of these."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="autotune",
        description="Tune a fixed Transformer layer per input shape under a hard "
        "per-element correctness rule, and export the winners as a dispatch table.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv_text = [shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)][1:]
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        return int(args.func(args) or 0)
    except (CliError, ValueError, RuntimeError, OSError) as exc:
        print(f"autotune {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        storage_error = type(exc).__module__.split(".")[0] == "sqlalchemy" or (
            type(exc).__name__ == "StorageInternalError"
        )
        if not storage_error:
            raise
        cause = exc.__cause__ or exc
        text = str(cause).strip()
        first = text.splitlines()[0] if text else type(cause).__name__
        print(
            f"autotune {args.command}: storage error: {first}; nothing was written by the "
            "failed step (each write is one transaction). Check that the database is not "
            "locked by another program, is writable, and is intact.",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt as exc:
        kept = getattr(exc, "kept", None)
        print(
            f"autotune {args.command}: interrupted"
            + (
                f"; {kept} trials kept; rerun the same command to resume"
                if kept is not None
                else ""
            ),
            file=sys.stderr,
        )
        return 130
