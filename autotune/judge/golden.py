"""Golden vectors from the original benchmark script, and the conformance check."""

from __future__ import annotations

import dataclasses
import math
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from autotune.core.reference import (
    CorrectnessReport,
    ReferenceTransformer,
    TransformerConfig,
    check_outputs,
    generate_random_case,
    official_settings,
)

REQUIRED_KEYS = (
    "name",
    "config",
    "seed",
    "padding_ratio",
    "input_scale",
    "state_dict",
    "x",
    "valid_token_mask",
    "output",
)
REFERENCE_TOLERANCE = 1e-5


@dataclasses.dataclass
class GoldenVector:
    name: str
    config: TransformerConfig
    seed: int
    padding_ratio: float
    input_scale: float
    state_dict: dict[str, Tensor]
    x: Tensor
    valid_token_mask: Tensor
    output: Tensor


def load_vector(path: str | Path) -> GoldenVector:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"golden vector {str(path)!r} does not exist")
    try:
        data: dict[str, Any] = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch's message runs to many lines: its first says what
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        why = f" ({first[:200]})"
        if not zipfile.is_zipfile(path):  # torch's own first line blames weights_only
            why = ": not a torch.save file"
        raise ValueError(
            f"cannot read golden vector {str(path)!r}{why}; give a .pt file from shared/golden"
        ) from exc
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ValueError(
            f"golden vector {str(path)!r} lacks keys {missing}; the format is in shared/golden"
        )
    return GoldenVector(
        name=str(data["name"]),
        config=TransformerConfig.from_dict(dict(data["config"])),
        seed=int(data["seed"]),
        padding_ratio=float(data["padding_ratio"]),
        input_scale=float(data["input_scale"]),
        state_dict=dict(data["state_dict"]),
        x=data["x"],
        valid_token_mask=data["valid_token_mask"],
        output=data["output"],
    )


@dataclasses.dataclass
class ConformanceResult:
    name: str
    passed: bool
    max_abs_err: float
    detail: str
    report: CorrectnessReport | None = None
    # A table's dispatcher: where the call went ("reference", "plan <hash> [entry]", ...)
    route: str = ""

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        err = f"{self.max_abs_err:.3e}" if math.isfinite(self.max_abs_err) else "inf"
        tail = f"  {self.detail}" if self.detail else ""
        route = f"  (route: {self.route})" if self.route else ""
        return f"{self.name:<28} {verdict}  max abs err {err}{tail}{route}"


# A subject under test: given a config and the vector's weights, a module to run.
SubjectFactory = Callable[[TransformerConfig, dict[str, Tensor]], nn.Module]


def reference_subject(config: TransformerConfig, state_dict: dict[str, Tensor]) -> nn.Module:
    model = ReferenceTransformer(config).eval()
    model.load_state_dict(state_dict)
    return model


def plan_subject(plan: Any) -> SubjectFactory:
    """A plan's candidate on the CPU (golden vectors are CPU vectors)."""
    from autotune.build import build_candidate
    from autotune.core.device import detect_device

    device = detect_device("cpu")

    def subject(config: TransformerConfig, state_dict: dict[str, Tensor]) -> nn.Module:
        return build_candidate(plan, config, device, state_dict)

    return subject


def oracle_subject(query_chunk: int, key_chunk: int) -> SubjectFactory:
    """The streamed exact oracle with small chunks (they cross chunk edges)."""
    from autotune.judge.oracle import StreamedOracle

    def subject(config: TransformerConfig, state_dict: dict[str, Tensor]) -> nn.Module:
        model = StreamedOracle(config, query_chunk=query_chunk, key_chunk=key_chunk)
        model.load_state_dict(state_dict)
        return model.eval()

    return subject


def table_subject(table: Any) -> SubjectFactory:
    """A generated table's dispatcher (a path, module or loaded table)."""
    from autotune.runtime import DispatchedTransformer, load_table

    loaded = load_table(table)

    def subject(config: TransformerConfig, state_dict: dict[str, Tensor]) -> nn.Module:
        model = DispatchedTransformer(config, table=loaded)
        model.load_state_dict(state_dict)
        return model.eval()

    return subject


def check_vector(
    vector: GoldenVector,
    subject: SubjectFactory = reference_subject,
    *,
    exact_tolerance: float | None = REFERENCE_TOLERANCE,
) -> ConformanceResult:
    """Regenerate inputs (exactly), run the subject, compare with the stored output.

    ``exact_tolerance`` set: the subject must match within that absolute error (the
    reference's own conformance). ``None``: the correctness rule decides (candidates).
    """
    x, mask = generate_random_case(
        vector.config, "cpu", torch.float32, vector.seed, vector.padding_ratio, vector.input_scale
    )
    if not torch.equal(x, vector.x):
        return ConformanceResult(vector.name, False, math.inf, "regenerated x differs")
    if not torch.equal(mask, vector.valid_token_mask):
        return ConformanceResult(vector.name, False, math.inf, "regenerated mask differs")
    try:
        model = subject(vector.config, vector.state_dict)
        with official_settings(), torch.inference_mode():
            out = model(vector.x.clone(), vector.valid_token_mask.clone())
    except Exception as exc:  # a subject that cannot run fails the vector, with the reason
        return ConformanceResult(vector.name, False, math.inf, f"{type(exc).__name__}: {exc}")
    report = check_outputs(out, vector.output)
    if exact_tolerance is not None:
        ok = report.n_nonfinite == 0 and report.max_abs_err <= exact_tolerance
        detail = "" if ok else f"over {exact_tolerance:g} absolute"
        return ConformanceResult(vector.name, ok, report.max_abs_err, detail, report)
    detail = "" if report.passed else report.summary()
    if report.passed:
        detail = f"worst {report.budget_share:.3f} of allowance"
    from autotune.runtime.dispatch import Route

    route = getattr(model, "last_route", None)  # a table's dispatcher says where it went
    where = ""
    if isinstance(route, Route):  # (a built plan's last_route is its own route's name)
        where = route.target.split(":", 1)[0] + (f" [{route.source}]" if route.source else "")
    return ConformanceResult(vector.name, report.passed, report.max_abs_err, detail, report, where)


def run_conformance(
    paths: Sequence[str | Path],
    subject: SubjectFactory = reference_subject,
    *,
    exact_tolerance: float | None = REFERENCE_TOLERANCE,
    emit: Callable[[str], None] = print,
) -> tuple[int, int]:
    """Check every vector; print a line each and ``N passed, N failed``."""
    passed = failed = 0
    routes = []
    for path in paths:
        try:
            vector = load_vector(path)
        except ValueError as exc:
            result = ConformanceResult(Path(path).stem, False, math.inf, str(exc))
        else:
            result = check_vector(vector, subject, exact_tolerance=exact_tolerance)
        emit(result.line())
        passed += result.passed
        failed += not result.passed
        routes.append(result.route)
    emit(f"{passed} passed, {failed} failed")
    if routes and all(r == "reference" for r in routes):
        emit(
            "note: every vector ran on the reference (no entry or bucket of the table covers "
            "their shapes): none of the table's plans was tested"
        )
    return passed, failed
