"""Every registered kernel check passes on the test device, quickly, with unique names."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from autotune.core.reference import ReferenceTransformer, TransformerConfig
from kernels.registry import CheckResult, KernelCheck, iter_checks


def reference(**shape: object) -> ReferenceTransformer:
    return ReferenceTransformer(TransformerConfig(**shape))  # type: ignore[arg-type]


def test_check_names_are_unique_and_cover_every_kernel_family() -> None:
    names = [check.name for check in iter_checks(reference)]
    assert len(names) == len(set(names))
    for family in ("attention/", "layernorm/", "ffn/bias_gelu", "ffn/linear_gelu", "block/"):
        assert any(name.startswith(family) for name in names), family
    for precision in ("ieee", "tf32", "fp16", "bf16"):
        assert any(name.startswith("attention/") and name.endswith(precision) for name in names)


def test_every_check_passes(device: str) -> None:
    """The list `autotune kernels check` runs (the same checks, with the reference for the
    fused block's), each passing on the test device (the CPU: the interpreter)."""
    # No timing assertion: on a shared 2-core machine the list's time says nothing.
    failures = []
    for check in iter_checks(reference):
        result = check.run(device)
        if not result.passed:
            failures.append(f"{check.name}: {result.detail}")
    assert not failures, "\n".join(failures)


def test_a_crashing_check_is_reported_as_a_failed_result() -> None:
    def crash(device: str) -> CheckResult:
        raise RuntimeError(f"boom on {device}")

    result = KernelCheck("crash", "always raises", crash).run("cpu")
    assert not result.passed
    assert "RuntimeError: boom on cpu" in result.detail


def test_the_fused_block_is_checked_only_against_a_given_reference() -> None:
    assert not any(c.name.startswith("block/") for c in iter_checks())
    assert sum(c.name.startswith("block/") for c in iter_checks(reference)) == 3


def test_kernels_check_match_runs_only_the_named_checks(capsys, device) -> None:
    """`autotune kernels check --match TEXT`: only the checks whose name holds TEXT; a TEXT
    that names none is bad input (exit 2, one line naming it)."""
    from autotune.backends.checks import kernel_checks
    from autotune.cli.main import main

    lines = list(kernel_checks(device, match="ffn/bias_gelu"))
    assert [line.name for line in lines] == [
        "ffn/bias_gelu/B2-S37-N40",
        "ffn/bias_gelu/B2-S37-N40/fp16-io",
    ]
    assert all(line.passed for line in lines)
    # repeated: any of them, each check once (the first also holds the second's text)
    both = list(kernel_checks(device, match=["ffn/bias_gelu", "fp16-io"]))
    names = [line.name for line in both]
    assert set(names) > {line.name for line in lines} and len(set(names)) == len(names)
    assert all("ffn/bias_gelu" in line.name or "fp16-io" in line.name for line in both)
    capsys.readouterr()
    assert main(["kernels", "check", "--match", "ffn/bias_gelu"]) == 0  # the command, passing
    out = capsys.readouterr().out
    assert out.split()[:2] == ["ffn/bias_gelu/B2-S37-N40", "PASS"]
    assert out.rstrip().endswith("2 passed, 0 failed")
    assert main(["kernels", "check", "--match", "no-such-kernel"]) == 2
    err = capsys.readouterr().err
    assert "--match 'no-such-kernel' names no kernel check here" in err
