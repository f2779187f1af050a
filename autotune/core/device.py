"""Facts about the device a plan runs on, gathered once, without optuna or pandas."""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import subprocess
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    type: str  # "cpu" or "cuda"
    name: str
    capability: tuple[int, int] | None = None
    total_memory: int = 0  # bytes
    smem_per_block: int = 0  # bytes, opt-in maximum
    multiprocessors: int = 0

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda" if self.type == "cuda" else "cpu")

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}" if self.capability else "cpu"

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["capability"] = list(self.capability) if self.capability else None
        return data


def triton_usable(device: DeviceInfo) -> tuple[bool, str]:
    """Whether Triton kernels can run on this device, and why not."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return False, f"triton is not importable ({type(exc).__name__}: {exc})"
    if device.type == "cuda":
        return True, ""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True, ""
    return False, "Triton kernels need a CUDA device, or TRITON_INTERPRET=1 on the CPU"


@functools.cache
def cpu_name() -> str:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


def detect_device(kind: str = "auto", index: int | None = None) -> DeviceInfo:
    """The device to run on: ``cuda`` if present (or asked for), else the CPU. A GPU is
    described by its properties: GPU ``index``, or the current one."""
    if kind == "cpu" or (kind == "auto" and not torch.cuda.is_available()):
        return DeviceInfo("cpu", cpu_name(), None, host_memory())
    if not torch.cuda.is_available():
        raise ValueError(
            "a CUDA device was asked for, but torch sees none; run on the CPU (--gpu cpu, "
            "or --device cpu for 'autotune long')"
        )
    props = torch.cuda.get_device_properties(
        torch.cuda.current_device() if index is None else index
    )
    smem = int(getattr(props, "shared_memory_per_block_optin", 0) or 0)
    return DeviceInfo(
        "cuda",
        props.name,
        (props.major, props.minor),
        int(props.total_memory),
        smem,
        int(props.multi_processor_count),
    )


def host_memory() -> int:
    """This machine's physical memory in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


@functools.cache
def software_versions() -> dict[str, str | None]:
    """torch / triton / CUDA / driver versions, for provenance."""
    triton_version: str | None
    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = None
    driver: str | None = None
    if torch.cuda.is_available():
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            driver = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            driver = None
    return {
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "driver": driver,
        "python": platform.python_version(),
    }


@functools.cache
def project_commit() -> str | None:
    """The git commit of this checkout (``-dirty`` with local changes to tracked files).

    ``AUTOTUNE_COMMIT`` wins when set: the device machine gets a copy of the working tree
    without ``.git``, so device scripts pass the commit they were started from.
    """
    if os.environ.get("AUTOTUNE_COMMIT"):
        return os.environ["AUTOTUNE_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--verify", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def pinned_copy(t: torch.Tensor | None) -> torch.Tensor | None:
    """A copy of ``t`` in pinned host memory (asynchronous copies to and from the GPU)."""
    if t is None:
        return None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t)
    return host
