"""State a module keeps per object but never copies (locks, thread-local values), and
process-wide settings that threads change for a block at once."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar


class FreshOnCopy:
    """Mixin for an ``nn.Module``: the attributes named in ``FRESH`` (locks, thread-local
    state) are made by their factories on construction and again on every copy or
    unpickling, never copied (``copy.deepcopy`` cannot copy a lock)."""

    FRESH: ClassVar[tuple[tuple[str, Callable[[], Any]], ...]] = ()

    def _make_fresh(self) -> None:
        for name, make in self.FRESH:
            object.__setattr__(self, name, make())

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # type: ignore[misc]
        for name, _ in self.FRESH:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[misc]
        self._make_fresh()


class SharedSection:
    """A process-wide setting changed for a block that threads may be inside at once:
    the first to enter saves it (``save``), every entrant applies the change (``apply``:
    another thread inside may have changed it since), the last to leave puts back what
    the first saved (``restore``). An interrupt anywhere (a signal handler raises where
    the code is) leaves the count right: only a counted entrant leaves."""

    def __init__(
        self, save: Callable[[], Any], apply: Callable[[], None], restore: Callable[[Any], None]
    ) -> None:
        self._save, self._apply, self._restore = save, apply, restore
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: Any = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        entered = False
        try:
            with self._lock:
                if self._depth == 0:
                    self._saved = self._save()
                self._depth += 1
                entered = True
                self._apply()
            yield
        finally:
            with self._lock:
                if entered:
                    self._depth -= 1
                if self._depth == 0 and self._saved is not None:
                    saved, self._saved = self._saved, None
                    self._restore(saved)
