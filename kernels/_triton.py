"""Triton availability, interpreter detection and launch-device checks.

This module does not import triton at import time, so it is safe to use on machines
without triton (``triton_available`` then says why).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

import torch

SUPPORTED_NUM_WARPS = (1, 2, 4, 8, 16)
INT32_MAX = 2**31 - 1
# Set by kernels.sass.offline_launches while launches compile for that CUDA architecture
# and are recorded instead of run: CPU tensors are then fine (nothing reads them).
OFFLINE_ARCH: int | None = None


def triton_available() -> tuple[bool, str]:
    """Return ``(True, version)`` when triton imports, else ``(False, why not)``."""
    try:
        triton = importlib.import_module("triton")
        importlib.import_module("triton.language")
    except ImportError as exc:
        return False, f"triton is not importable ({exc}); install triton to use kernels/"
    return True, f"triton {getattr(triton, '__version__', 'unknown')}"


def interpreter_enabled() -> bool:
    """True when ``TRITON_INTERPRET`` is set to a true value in the environment.

    Triton decides per kernel when the ``@triton.jit`` decorator runs (module import), so
    the variable must be set before the kernel modules are imported.
    """
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def launch_capability(device: torch.device) -> tuple[int, int]:
    """The compute capability launches on ``device`` compile for: ``OFFLINE_ARCH``'s while
    ``kernels.sass.offline_launches`` records them, else the CUDA device's."""
    if OFFLINE_ARCH is not None:
        return OFFLINE_ARCH // 10, OFFLINE_ARCH % 10
    return torch.cuda.get_device_capability(device)


def is_interpreted(kernel: object) -> bool:
    """True when ``kernel`` was decorated while the Triton interpreter was on."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_launch_device(kernel: object, tensors: Mapping[str, torch.Tensor]) -> torch.device:
    """Check that all tensors share one device the kernel can run on; return it."""
    devices = {name: t.device for name, t in tensors.items()}
    first_name, device = next(iter(devices.items()))
    for name, other in devices.items():
        if other != device:
            raise ValueError(
                f"{name} is on {other} but {first_name} is on {device}; "
                "move all tensors to the same device"
            )
    if device.type != "cuda" and not is_interpreted(kernel) and OFFLINE_ARCH is None:
        raise ValueError(
            f"Triton kernels need a CUDA device, or TRITON_INTERPRET=1 on the CPU "
            f"(set before importing kernels); got tensors on {device}"
        )
    return device


def is_power_of_2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def device_limits(device: torch.device | str) -> tuple[tuple[int, int] | None, int | None]:
    """``(capability, max shared memory per block in bytes)`` of a CUDA device, else Nones."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None, None
    props = torch.cuda.get_device_properties(device)
    smem = getattr(props, "shared_memory_per_block_optin", None)
    return (props.major, props.minor), (int(smem) if smem else None)


def device_reasons(device_type: str, kernel: object | None = None) -> list[str]:
    """Reasons a Triton kernel cannot run on ``device_type`` (empty when it can).

    Off CUDA, only an interpreted kernel can run. Pass the ``@triton.jit`` kernel to ask
    whether it was decorated in interpreter mode (what matters at launch); without it,
    the current ``TRITON_INTERPRET`` setting is used.
    """
    if device_type == "cuda":
        return []
    interpreted = interpreter_enabled() if kernel is None else is_interpreted(kernel)
    if interpreted:
        return []
    return [
        f"device type {device_type!r} has no Triton backend here; use a CUDA device "
        "or set TRITON_INTERPRET=1 before importing kernels to run the interpreter"
    ]
