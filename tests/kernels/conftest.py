"""Kernel tests run under the Triton interpreter on the CPU by default.

``TRITON_INTERPRET=1`` must be set before the kernel modules are imported (Triton picks
interpreter or compiler when ``@triton.jit`` runs), so it is set here and the kernel
modules are imported right away, whatever order the test modules are collected in. In a
run over all of ``tests/`` the variable stays set for the whole session.

To run the same tests on a GPU with compiled kernels:
``KERNELS_TEST_DEVICE=cuda python -m pytest tests/kernels`` (leaves TRITON_INTERPRET alone),
or ``TRITON_INTERPRET=0`` on a machine with a GPU (the device prelude's setting): then a run
over all of ``tests/`` compiles the kernels for ``tests/device`` too, which the interpreter
cannot run on CUDA tensors.
Test modules skip themselves when triton is not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import pytest


def _test_device() -> str:
    """KERNELS_TEST_DEVICE when set; else "cuda" where the caller asked for compiled kernels
    (``TRITON_INTERPRET=0``, as ``scripts/device_prelude.sh`` exports) and a GPU is there,
    so one run over ``tests/`` on the GPU machine compiles every kernel; else "cpu"."""
    explicit = os.environ.get("KERNELS_TEST_DEVICE")
    if explicit:
        return explicit
    if os.environ.get("TRITON_INTERPRET") == "0":
        import torch

        if torch.cuda.is_available():
            return "cuda"
    return "cpu"


TEST_DEVICE = _test_device()
if TEST_DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

if importlib.util.find_spec("triton") is not None:
    for module in (
        "kernels.attention",
        "kernels.layernorm",
        "kernels.ffn",
        "kernels.layer",
        "kernels.stack",
        "kernels.mantissa",
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
