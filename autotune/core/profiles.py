"""GPU profiles: which device a profile is for, how to recognise it, its memory."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

from autotune.core.device import DeviceInfo, detect_device, project_commit, software_versions

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class GpuProfile:
    name: str
    description: str
    device_type: str  # "cuda" or "cpu"
    name_pattern: str  # regex on the device name (case-insensitive)
    capability: tuple[int, int] | None
    memory_bytes: int
    smem_per_block: int = 0

    def matches(self, device: DeviceInfo) -> bool:
        if device.type != self.device_type:
            return False
        if self.device_type == "cpu":
            return True
        if self.capability is not None and device.capability != self.capability:
            return False
        return re.search(self.name_pattern, device.name, re.IGNORECASE) is not None

    def describe_rule(self) -> str:
        if self.device_type == "cpu":
            return "any CPU"
        cap = f"sm_{self.capability[0]}{self.capability[1]}" if self.capability else "any sm"
        return f"name ~ /{self.name_pattern}/, {cap}"


PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in (
        GpuProfile("cpu", "the host CPU (CPU-capable variants only)", "cpu", ".*", None, 8 * GIB),
        GpuProfile(
            "rtx5080",
            "GeForce RTX 5080, Blackwell consumer",
            "cuda",
            r"RTX 5080",
            (12, 0),
            16 * GIB,
            101376,
        ),
        GpuProfile(
            "rtx4090", "GeForce RTX 4090, Ada", "cuda", r"RTX 4090", (8, 9), 24 * GIB, 101376
        ),
        GpuProfile("a100", "A100 (40/80 GB), Ampere", "cuda", r"A100", (8, 0), 80 * GIB, 166912),
        GpuProfile("h100", "H100 (SXM/PCIe), Hopper", "cuda", r"H100", (9, 0), 80 * GIB, 232448),
        GpuProfile("h200", "H200 141 GB, Hopper", "cuda", r"H200", (9, 0), 141 * 10**9, 232448),
    )
}


@dataclasses.dataclass(frozen=True)
class ProfileSelection:
    profile: GpuProfile
    device: DeviceInfo
    emulated: bool

    @property
    def capacity_bytes(self) -> int:
        if self.device.type == "cpu":
            return self.profile.memory_bytes
        if self.emulated:
            return min(self.profile.memory_bytes, self.device.total_memory)
        return self.device.total_memory or self.profile.memory_bytes

    def environment(self) -> dict[str, Any]:
        """Where a run happens: profile, emulation, device, software versions, commit."""
        return {
            "profile": self.profile.name,
            "emulated": self.emulated,
            "capacity_bytes": self.capacity_bytes,
            "device": self.device.as_dict(),
            "versions": software_versions(),
            "commit": project_commit(),
        }

    def effective_device(self) -> DeviceInfo:
        """The device as plans see it: shared memory capped to the profile's when emulating."""
        if not self.emulated:
            return self.device
        smem = self.profile.smem_per_block or self.device.smem_per_block
        return dataclasses.replace(
            self.device,
            smem_per_block=min(smem, self.device.smem_per_block or smem),
            total_memory=self.capacity_bytes,
        )


def get_profile(name: str) -> GpuProfile:
    if name not in PROFILES:
        raise ValueError(
            f"unknown GPU profile {name!r}; valid profiles: {', '.join(PROFILES)} or auto "
            "(see 'autotune profiles')"
        )
    return PROFILES[name]


def profile_for_device(device: DeviceInfo) -> GpuProfile:
    for profile in PROFILES.values():
        if profile.device_type == "cuda" and profile.matches(device):
            return profile
    if device.type == "cpu":
        return PROFILES["cpu"]
    raise ValueError(
        f"no profile recognises {device.name} ({device.sm}); pick one with --gpu and "
        "--emulate, or add a profile to autotune/core/profiles.py"
    )


def select_profile(name: str, *, emulate: bool = False) -> ProfileSelection:
    """Resolve ``--gpu NAME [--emulate]`` against the device present."""
    if name == "auto":
        device = detect_device("auto")
        _pin_cpu_threads(device)
        return ProfileSelection(profile_for_device(device), device, False)
    profile = get_profile(name)
    device = (
        detect_device("cpu" if profile.device_type == "cpu" else "cuda")
        if profile.device_type == "cpu" or torch.cuda.is_available()
        else None
    )
    if device is None:
        raise ValueError(
            f"profile {name!r} needs a CUDA GPU, but torch sees none (torch "
            f"{torch.__version__}); use --gpu cpu, or run on the GPU"
        )
    _pin_cpu_threads(device)
    if profile.matches(device):
        return ProfileSelection(profile, device, False)
    if not emulate:
        raise ValueError(
            f"profile {name!r} ({profile.describe_rule()}) does not match the device found: "
            f"{device.name} ({device.sm}, {device.total_memory / GIB:.0f} GiB); use --gpu auto, "
            f"or add --emulate to cap memory to {profile.memory_bytes / GIB:.0f} GiB and record "
            "the run as emulated"
        )
    if device.type == "cuda" and device.total_memory:
        fraction = min(1.0, profile.memory_bytes / device.total_memory)
        torch.cuda.set_per_process_memory_fraction(fraction)
    return ProfileSelection(profile, device, True)


CPU_THREADS_ENV = "AUTOTUNE_CPU_THREADS"


def _pin_cpu_threads(device: DeviceInfo) -> None:
    """CPU timing: one intra-op thread by default (``AUTOTUNE_CPU_THREADS`` overrides).

    With several OpenMP threads on a small shared machine, a descheduled worker thread
    stalls a whole matmul, and paired ratios swing by 100x; one thread measures stably.
    """
    if device.type != "cpu":
        return
    import os

    torch.set_num_threads(max(1, int(os.environ.get(CPU_THREADS_ENV, "1"))))
