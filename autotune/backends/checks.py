"""``autotune kernels check``: every kernel of ``kernels/`` against its PyTorch reference
at small, odd shapes (the fused block against this project's reference model)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence


@dataclasses.dataclass(frozen=True)
class KernelCheckLine:
    name: str
    passed: bool
    detail: str


def kernel_checks(
    device: str | None = None, match: str | Sequence[str] = ""
) -> Iterator[KernelCheckLine]:
    """Run every registered check on ``device`` (default: CUDA if present, else the CPU,
    where kernels run under ``TRITON_INTERPRET=1``), or those whose name contains ``match``
    (several: any of them; each check runs once); a check that raises fails, with why."""
    import torch

    from autotune.core.reference import ReferenceTransformer, TransformerConfig
    from kernels.registry import iter_checks

    def reference(**shape: object) -> torch.nn.Module:
        return ReferenceTransformer(TransformerConfig(**shape))  # type: ignore[arg-type]

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    texts = [match] if isinstance(match, str) else list(match) or [""]
    for check in iter_checks(reference):
        if not any(text in check.name for text in texts):
            continue
        try:
            result = check.run(device)
        except Exception as exc:  # a kernel that cannot run fails its check, with why
            yield KernelCheckLine(check.name, False, f"{type(exc).__name__}: {exc}")
            continue
        detail = f"max abs err {result.max_abs_err:.2e}  {result.detail}"
        yield KernelCheckLine(check.name, result.passed, detail)
