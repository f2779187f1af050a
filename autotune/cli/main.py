"""The ``autotune`` command line: the parser of every command group, and how a run ends
(a user error is one line and exit 2). Heavy modules are imported inside each command."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

from autotune.cli import info, long, results, ship, tune
from autotune.cli.common import CliError, check_args
from autotune.search import interrupt

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
    """Run one command (``argv``, or the process's arguments); its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv_text = [shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)][1:]
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with interrupt.early_signals(), _own_warnings_in_one_line(args.command):
        try:
            check_args(args)
            return int(args.func(args) or 0)
        except KeyboardInterrupt as exc:
            return _interrupted(args, getattr(exc, "kept", None))
        except Exception as exc:
            if interrupt.EARLY.is_set():  # a signal some import swallowed, then this
                return _interrupted(args, None)
            return _error_exit(args, exc)


@contextlib.contextmanager
def _own_warnings_in_one_line(command: str) -> Iterator[None]:
    """autotune's own warnings (a torn CSV row, a table refused) as one line each, as its
    errors are; Python's default adds the file, line and source of the warn() call.
    Other libraries' warnings keep their form."""
    import warnings

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if os.path.abspath(filename).startswith(package + os.sep):
            print(f"autotune {command}: warning: {message}", file=file or sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    # Only the hook is set back after: catch_warnings() would also drop the filters that
    # modules imported during the command install (Optuna's ExperimentalWarning off).
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def entry() -> NoReturn:
    """The ``autotune`` program (console script, ``python -m autotune``): one command, then
    a teardown that a late SIGINT or SIGTERM does not turn into a kill (``quiet_teardown``)."""
    code = main()
    interrupt.quiet_teardown()
    raise SystemExit(code)


def _interrupted(args: argparse.Namespace, kept: int | None) -> int:
    print(
        f"autotune {args.command}: interrupted"
        + (
            f"; {kept} trials of this run kept; rerun the same command to resume"
            if kept is not None
            else ""
        ),
        file=sys.stderr,
    )
    return 130


def _error_exit(args: argparse.Namespace, exc: Exception) -> int:
    """A user error, a full disk or a storage failure: one line, exit 2; a bug raises. A
    reader that closed the pipe (``autotune cases | head -1``) ends it quietly, with the
    status of a process SIGPIPE ended (141), as other command-line tools do."""
    if isinstance(exc, BrokenPipeError):
        with contextlib.suppress(OSError):  # no later flush to the closed pipe at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    if isinstance(exc, (CliError, ValueError, RuntimeError, OSError)):
        print(f"autotune {args.command}: error: {exc}", file=sys.stderr)
        return 2
    found = _chained_cause(exc)
    if found is None:
        raise exc
    if isinstance(found, OSError):  # a full disk, under another library's error
        print(f"autotune {args.command}: error: {found}", file=sys.stderr)
        return 2
    cause = found.__cause__ or found
    text = str(cause).strip()
    first = text.splitlines()[0] if text else type(cause).__name__
    print(
        f"autotune {args.command}: storage error: {first}; nothing was written by the "
        "failed step (each write is one transaction). Check that the database is not "
        "locked by another program, is writable, and is intact.",
        file=sys.stderr,
    )
    return 2


# A full disk, a quota, a read-only file system: reported in one line wherever they
# surface (another error raised while handling one is not a bug of ours).
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def _storage_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] == "sqlalchemy" or (
        type(exc).__name__ == "StorageInternalError"
    )


def _chained_cause(exc: BaseException) -> BaseException | None:
    """The storage error or OS error behind ``exc``, itself or along the exceptions it was
    raised from or during (Optuna turns a storage failure inside a trial into an
    ``AssertionError``), or None: a bug, whose traceback is shown."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _storage_error(current) or (
            isinstance(current, OSError) and current.errno in _DISK_ERRNOS
        ):
            return current
        current = current.__cause__ or current.__context__
    return None
