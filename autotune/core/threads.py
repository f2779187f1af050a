"""State a module keeps per object but never copies: locks and thread-local values."""

from __future__ import annotations

from collections.abc import Callable
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
