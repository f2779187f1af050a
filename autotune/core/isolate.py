"""One call in a spawned child process: a device fault or a crash there ends that call
only, and the parent gets the result or one line saying what happened."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _child(conn: Any, fn: Callable[[Any], Any], job: Any) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        conn.send(("ok", fn(job)))
    except BaseException as exc:  # reported to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]))
    finally:
        conn.close()


def call_isolated(fn: Callable[[Any], T], job: Any) -> tuple[T | None, str]:
    """``fn(job)`` in a spawned child (``fn`` a module-level function, ``job`` picklable):
    (its value, "") or (None, what happened). Ctrl-C in the parent kills the child."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, job), daemon=True)
    proc.start()
    child.close()
    try:
        message = parent.recv() if parent.poll(None) else None
    except EOFError:
        message = None
    except BaseException:
        proc.kill()
        proc.join()
        raise
    proc.join()
    if message is None:
        return None, f"its process ended with exit code {proc.exitcode} and no result"
    kind, value = message
    return (value, "") if kind == "ok" else (None, value)
