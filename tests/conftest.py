from __future__ import annotations

import glob
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# No GPU here or in CI: Triton kernels run in the interpreter (set before triton loads).
os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent.parent
GOLDEN_DIR = ROOT.parent / "shared" / "golden"
GOLDEN = sorted(glob.glob(str(GOLDEN_DIR / "*.pt")))


@pytest.fixture(scope="session")
def golden_paths() -> list[str]:
    if not GOLDEN:
        pytest.fail(f"no golden vectors at {GOLDEN_DIR}: shared/ must sit beside the repo")
    return GOLDEN


@pytest.fixture()
def cpu_device():
    from autotune.core.device import detect_device

    return detect_device("cpu")


@pytest.fixture(autouse=True)
def _no_fault_injection(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("AUTOTUNE_INJECT_FAULT", raising=False)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    yield
    # The injected sticky device fault marks the process, as a real one would: no test
    # leaves it marked for the next.
    evaluate = sys.modules.get("autotune.evaluate")
    if evaluate is not None:
        evaluate._sticky_fault = False


def cli(command: str) -> int:
    """Run ``autotune COMMAND`` in this process; returns the exit code."""
    import shlex

    from autotune.cli import main

    return main(shlex.split(command))
