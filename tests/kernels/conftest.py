"""Kernel tests run under the Triton interpreter on the CPU by default.

``TRITON_INTERPRET=1`` must be set before the kernel modules are imported (Triton picks
interpreter or compiler when ``@triton.jit`` runs), so it is set here and the kernel
modules are imported right away, whatever order the test modules are collected in. In a
run over all of ``tests/`` the variable stays set for the whole session.

To run the same tests on a GPU with compiled kernels:
``KERNELS_TEST_DEVICE=cuda python -m pytest tests/kernels`` (leaves TRITON_INTERPRET alone).
Test modules skip themselves when triton is not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import pytest

TEST_DEVICE = os.environ.get("KERNELS_TEST_DEVICE", "cpu")
if TEST_DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

if importlib.util.find_spec("triton") is not None:
    for module in (
        "kernels.attention",
        "kernels.layernorm",
        "kernels.ffn",
        "kernels.layer",
        "kernels.stack",
    ):
        importlib.import_module(module)


@pytest.fixture(scope="session")
def device() -> str:
    """Device the kernels run on: "cpu" (interpreter) unless KERNELS_TEST_DEVICE says so."""
    if TEST_DEVICE == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("KERNELS_TEST_DEVICE=cuda but no CUDA device is available")
    return TEST_DEVICE
