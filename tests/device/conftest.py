"""The device tests run compiled Triton kernels: under the interpreter (``TRITON_INTERPRET=1``,
which ``tests/conftest.py`` sets by default and ``tests/kernels/conftest.py`` sets unless
told otherwise) a kernel launched on CUDA tensors fails deep inside Triton. Say so once,
with the fix, instead."""

from __future__ import annotations

import pytest
import torch

from kernels._triton import interpreter_enabled


@pytest.fixture(autouse=True)
def _compiled_kernels() -> None:
    if torch.cuda.is_available() and interpreter_enabled():
        pytest.fail(
            "tests/device needs compiled Triton kernels but TRITON_INTERPRET is on: run with "
            "TRITON_INTERPRET=0 (scripts/device_prelude.sh exports it)",
            pytrace=False,
        )
