"""What a launcher's Triton kernels cost on a CUDA architecture, without a GPU.

``offline_launches(arch)`` is a context manager: inside it, every launch of a ``@triton.jit``
kernel compiles the kernel for ``sm_<arch>`` with the installed Triton and its bundled
``ptxas`` (as the device would, with the same specialisation of the arguments: dtypes,
16-byte alignment, integers equal to 1) and records it instead of running it, so a
launcher can be driven with CPU tensors. Nothing is computed: outputs stay as allocated.
``KernelStats`` reads each compiled kernel's resources (registers, stack, shared memory)
and its SASS (``cuobjdump``, bundled with Triton), counted by instruction class.

The numbers are those of the installed Triton: a device running another Triton version
compiles other code (``triton_version`` says which made these).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from typing import Any

from kernels import _triton

# SASS opcodes (the part before the first '.') by class; the rest count as "other"
# (integer and address arithmetic, moves, predicates, branches, special registers).
SASS_CLASSES: dict[str, tuple[str, ...]] = {
    cls: tuple(ops.split())
    for cls, ops in {
        "mma": "HMMA HGMMA IMMA IGMMA BMMA DMMA QGMMA UTCHMMA UTCQMMA",
        "fp32": "FADD FMUL FFMA FSEL FSETP FMNMX FCHK FSWZADD FADD32I FMUL32I FFMA32I FSET",
        "fp16": "HADD2 HMUL2 HFMA2 HSETP2 HMNMX2",
        "convert": "F2F F2FP F2I I2F I2FP FRND I2IP",
        "sfu": "MUFU",
        "shuffle": "SHFL REDUX VOTE MATCH",
        "global": "LDG STG LDGSTS LDGDEPBAR RED ATOM ATOMG UBLKCP UTMALDG UTMASTG UTMAPF ST LD",
        "shared": "LDS STS LDSM STSM ATOMS",
        "local": "LDL STL",  # register spills (and local arrays)
        "sync": "BAR WARPSYNC DEPBAR WARPGROUP SYNCS ARRIVES MEMBAR ACQBULK ELECT FENCE CCTL",
    }.items()
}
_CLASS_OF = {op: cls for cls, ops in SASS_CLASSES.items() for op in ops}
# One instruction line of `cuobjdump -sass`: "/*0040*/  @!P0 LDG.E.128 R4, desc[..] ;"
_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)[.\s;]", re.M)

# Per architecture: (max warps an SM, shared memory an SM in bytes, max blocks an SM).
# Registers: 65,536 an SM, allocated in units of 256 a warp; 1 KiB of shared memory is
# reserved a block (CUDA occupancy calculator, compute capabilities 8.0-12.0).
SM_LIMITS: dict[int, tuple[int, int, int]] = {
    80: (64, 167936, 32),
    86: (48, 102400, 16),
    89: (48, 102400, 24),
    90: (64, 233472, 32),
    100: (64, 233472, 32),
    120: (48, 102400, 32),
}
REGISTERS_PER_SM = 65536
REGISTER_UNIT = 256
RESERVED_SMEM_PER_BLOCK = 1024


def sass_opcodes(sass: str) -> list[str]:
    """The opcode (before its first '.') of every instruction in ``cuobjdump -sass`` text."""
    return [m.group(1) for m in _SASS_LINE.finditer(sass)]


def classify(opcodes: list[str]) -> dict[str, int]:
    """Counts by class of ``SASS_CLASSES`` ("other" for the rest), in that order."""
    counts = Counter(_CLASS_OF.get(op, "other") for op in opcodes)
    return {cls: counts.get(cls, 0) for cls in [*SASS_CLASSES, "other"]}


def blocks_per_sm(arch: int, num_warps: int, registers: int, shared: int) -> dict[str, int]:
    """Resident blocks an SM as each resource allows (``warps``, ``registers``, ``shared``),
    and the least of them (``blocks``)."""
    max_warps, smem_per_sm, max_blocks = SM_LIMITS.get(arch, SM_LIMITS[90])
    per_warp = -(-max(registers, 1) * 32 // REGISTER_UNIT) * REGISTER_UNIT
    limits = {
        "warps": min(max_blocks, max_warps // num_warps),
        "registers": REGISTERS_PER_SM // (per_warp * num_warps),
        "shared": smem_per_sm // (shared + RESERVED_SMEM_PER_BLOCK),
    }
    limits["blocks"] = min(limits.values())
    return limits


@dataclasses.dataclass
class KernelStats:
    """One compiled kernel and the launches of it that were recorded."""

    name: str
    grids: list[tuple[int, ...]]
    num_warps: int
    num_stages: int
    registers: int
    stack: int  # bytes a thread of local memory: spills (0 when none)
    shared: int  # bytes a block
    sass: dict[str, int]  # instructions by class, static (each loop body once)
    arch: int
    triton_version: str

    @property
    def launches(self) -> int:
        return len(self.grids)

    @property
    def programs(self) -> int:
        """Blocks of the first recorded launch."""
        n = 1
        for g in self.grids[0]:
            n *= g
        return n

    @property
    def occupancy(self) -> dict[str, int]:
        return blocks_per_sm(self.arch, self.num_warps, self.registers, self.shared)

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(launches=self.launches, programs=self.programs, occupancy=self.occupancy)
        return data


def _tool(name: str) -> str:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise RuntimeError(
            f"{path} is missing: this Triton ({triton.__version__}) has no bundled {name}; "
            "install a Linux x86-64 or aarch64 build of triton"
        )
    return path


def _cubin_facts(cubin: bytes) -> tuple[int, int, dict[str, int]]:
    """(registers, stack bytes, SASS counts by class) of one compiled kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        res = subprocess.run(
            [_tool("cuobjdump"), "-res-usage", path], capture_output=True, text=True, check=True
        ).stdout
        sass = subprocess.run(
            [_tool("cuobjdump"), "-sass", path], capture_output=True, text=True, check=True
        ).stdout
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    if regs is None:
        raise RuntimeError(f"cuobjdump -res-usage printed no register count: {res[:200]!r}")
    return int(regs.group(1)), int(stack.group(1)) if stack else 0, classify(sass_opcodes(sass))


def kernel_overrides(overrides: dict[str, int] | None, kernel: str) -> dict[str, int]:
    """The compile options ``overrides`` set for the kernel named ``kernel``: the plain keys,
    then its own ``KERNEL:KEY`` keys over them."""
    mine = {k: v for k, v in (overrides or {}).items() if ":" not in k}
    for key, value in (overrides or {}).items():
        name, _, option = key.rpartition(":")
        if name == kernel:
            mine[option] = value
    return mine


def unmatched_kernels(overrides: dict[str, int] | None, launched: set[str]) -> str:
    """An error line when a ``KERNEL:KEY`` key of ``overrides`` names no kernel that was
    launched (a typo would otherwise leave the numbers unchanged under the option's name),
    else ""."""
    names = sorted({k.rpartition(":")[0] for k in overrides or {} if ":" in k} - launched)
    if not names:
        return ""
    return (
        f"compile option(s) for {', '.join(names)}: no such kernel was launched; launched: "
        + ", ".join(sorted(launched))
    )


def _source_class(fn: Any) -> Any:
    """The compiler's source class of a jitted function: Gluon's for a ``gluon.jit``
    kernel (its body is Gluon, not Triton), ``ASTSource`` otherwise."""
    from triton.compiler import ASTSource

    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource
    return ASTSource


@contextlib.contextmanager
def offline_launches(
    arch: int = 90, overrides: dict[str, int] | None = None
) -> Iterator[list[KernelStats]]:
    """Within the block, Triton launches compile for ``sm_<arch>`` and are recorded (one
    ``KernelStats`` per distinct compiled kernel, in first-launch order) instead of run.
    ``overrides`` replace compile options (``num_stages``, ``maxnreg``, ...: what a
    launcher change would pass), to see their cost before making the change: a plain key
    of every kernel, a ``KERNEL:KEY`` key (``_attention_fwd_kernel:maxnreg``) of the kernel
    of that name alone, which wins over the plain key.

    Needs the kernels decorated for compilation: ``TRITON_INTERPRET`` unset or 0 when
    ``kernels`` was imported (the interpreter runs kernels in Python and compiles nothing).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime import jit

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    found: dict[str, KernelStats] = {}
    stats: list[KernelStats] = []
    binders: dict[int, Any] = {}  # per kernel function, built at its first launch

    def record(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kwargs["debug"] = kwargs.get("debug", self.debug)
        binder = binders.get(id(self))
        if binder is None:
            binder = jit.create_function_from_signature(self.signature, self.params, backend)
            binders[id(self)] = binder
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(
            backend, kwargs, bound, specialization, options
        )
        mine = kernel_overrides(overrides, self.fn.__name__)
        if overrides:
            keys = {k.rpartition(":")[2] for k in overrides}
            unknown = sorted(keys - set(vars(options)))
            if unknown:
                raise ValueError(
                    f"compile option(s) {unknown} unknown to this Triton; valid: "
                    + ", ".join(sorted(vars(options)))
                )
        if mine:
            options = dataclasses.replace(options, **mine)
        noise = io.StringIO()  # Triton prints the whole PTX when ptxas fails
        try:
            with contextlib.redirect_stderr(noise), contextlib.redirect_stdout(noise):
                compiled = triton.compile(
                    _source_class(self)(self, signature, constexprs, attrs),
                    target=target,
                    options=options.__dict__,
                )
        except Exception as exc:  # ptxas refusing a register cap, say: one line, the options
            if not mine:
                raise
            lines = str(exc).splitlines()
            why = next(
                (ln for key in ("fatal", "rror") for ln in lines if key in ln),
                lines[0] if lines else type(exc).__name__,
            )
            raise ValueError(
                f"{self.fn.__name__} does not compile with {mine}: {why.strip()[:300]}"
            ) from exc
        if warmup:  # compiled, not launched (a launcher reading the kernel's resources)
            return compiled
        grid = grid(bound) if callable(grid) else grid
        grid = tuple(int(g) for g in grid)
        entry = found.get(compiled.hash)
        if entry is None:
            registers, stack, sass = _cubin_facts(compiled.asm["cubin"])
            entry = KernelStats(
                name=self.fn.__name__,
                grids=[],
                num_warps=int(compiled.metadata.num_warps),
                num_stages=int(compiled.metadata.num_stages),
                registers=registers,
                stack=stack,
                shared=int(compiled.metadata.shared),
                sass=sass,
                arch=arch,
                triton_version=triton.__version__,
            )
            found[compiled.hash] = entry
            stats.append(entry)
        entry.grids.append(grid)
        return compiled

    saved = jit.JITFunction.run
    jit.JITFunction.run = record  # type: ignore[method-assign]
    _triton.OFFLINE_ARCH = arch
    try:
        yield stats
    finally:
        jit.JITFunction.run = saved  # type: ignore[method-assign]
        _triton.OFFLINE_ARCH = None
    if why := unmatched_kernels(overrides, {s.name for s in stats}):
        raise ValueError(why)
