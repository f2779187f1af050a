"""Ctrl-C during a study.

The first SIGINT (a terminal sends it to the whole process group: the study, its
workers and their trial runners) ends the run at a safe point: the trial in flight is
stopped at once (its runner child is killed, or, evaluated in this process, interrupted),
marked FAIL with the reason, and enqueued again so the same command measures it when it
resumes; finished trials are kept. Runner children ignore SIGINT: the process
that owns the trial decides. A second Ctrl-C interrupts immediately. SIGTERM (what
``timeout``, ``kill`` and service managers send) is taken as Ctrl-C. One that comes after
the ``autotune`` process's command ended, while it tears down, is ignored: the process
exits with the command's own status (``quiet_teardown``).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any


class Interrupted(KeyboardInterrupt):
    """A study run ended by Ctrl-C; ``kept`` trials finished in this run are stored."""

    def __init__(self, kept: int) -> None:
        super().__init__(f"interrupted; {kept} trials of this run kept")
        self.kept = kept


# The signals a guard takes: Ctrl-C, and SIGTERM, which ends a run the same way.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


# Set by a SIGINT or SIGTERM that came while a command started, before any guard was in
# (``early_signals``): an import may swallow the KeyboardInterrupt it raised (torch's did,
# and the study then ran to its end); the first guard ends the run at once instead.
EARLY = threading.Event()


def _early(signum: int, frame: Any) -> None:
    EARLY.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def early_signals() -> Iterator[None]:
    """For a whole command (in the main thread): SIGINT and SIGTERM raise KeyboardInterrupt
    and are remembered in ``EARLY`` where a swallowed one would be lost."""
    EARLY.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _early) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# The longest a teardown may take with the signals ignored: past it SIGALRM's default
# action ends the process (a teardown that hangs is not made unkillable by TERM for good).
TEARDOWN_LIMIT_S = 30


def quiet_teardown() -> None:
    """For the ``autotune`` process after its command ended (its output and storage written):
    SIGINT and SIGTERM are ignored while the interpreter tears down (storages closed,
    libraries unloaded: up to a second), so the process exits with the command's status
    rather than killed by the signal (143, no line said). Ignored, not handled: the
    interpreter resets Python handlers before most of the teardown, not ignored signals.
    SIGALRM ends a teardown that takes longer than ``TEARDOWN_LIMIT_S``."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing more to say there
            stream.flush()
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.alarm(TEARDOWN_LIMIT_S)


class InterruptGuard:
    """SIGINT and SIGTERM handling for the duration (in the main thread; elsewhere it does
    nothing).

    The first signal sets ``requested`` and calls ``on_signal`` if set (the code in flight
    sets it to stop what it waits for: kill a runner child, or raise in this process);
    code checks ``requested`` at safe points. A second signal raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.requested = False
        self.on_signal: Callable[[], None] | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> InterruptGuard:
        if EARLY.is_set():  # signalled while the command started: nothing runs
            raise KeyboardInterrupt
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.on_signal is not None:
            self.on_signal()
