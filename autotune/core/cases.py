"""The case registry: the official matrix, CPU-sized smoke cases and custom shapes."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

from autotune.core.reference import TransformerConfig

DTYPES = ("float32",)


@dataclasses.dataclass(frozen=True)
class Case:
    """One input shape to tune: a config, its regime and the input dtype."""

    id: str
    config: TransformerConfig
    regime: str
    official: bool = False
    dtype: str = "float32"
    padding_ratio: float = 0.0
    note: str = ""

    @property
    def key(self) -> CaseKey:
        return CaseKey.from_config(self.config, self.dtype)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "config": self.config.as_dict(),
            "regime": self.regime,
            "official": self.official,
            "dtype": self.dtype,
            "padding_ratio": self.padding_ratio,
        }


@dataclasses.dataclass(frozen=True, order=True)
class CaseKey:
    """What the runtime looks up: (B, S, d_model, heads, FFN, layers, causal, dtype)."""

    batch_size: int
    seq_len: int
    d_model: int
    num_heads: int
    ffn_dim: int
    num_layers: int
    causal: bool
    dtype: str

    @classmethod
    def from_config(cls, config: TransformerConfig, dtype: str = "float32") -> CaseKey:
        return cls(
            config.batch_size,
            config.seq_len,
            config.d_model,
            config.num_heads,
            config.ffn_dim,
            config.num_layers,
            config.causal,
            dtype,
        )

    def as_tuple(self) -> tuple[int, int, int, int, int, int, bool, str]:
        return dataclasses.astuple(self)  # type: ignore[return-value]

    def __str__(self) -> str:
        kind = "causal" if self.causal else "noncausal"
        return (
            f"{self.batch_size},{self.seq_len},{self.d_model},{self.num_heads},"
            f"{self.ffn_dim},{self.num_layers},{kind},{self.dtype}"
        )


def _official(n: int, b: int, s: int, d: int, h: int, ffn: int, layers: int, regime: str) -> Case:
    return Case(
        id=str(n),
        config=TransformerConfig(b, s, d, h, ffn, layers, causal=True),
        regime=regime,
        official=True,
    )


OFFICIAL_CASES: tuple[Case, ...] = (
    _official(1, 64, 128, 128, 4, 128, 4, "mid"),
    _official(2, 1, 128, 128, 4, 128, 4, "launch-bound"),
    _official(3, 4, 128, 128, 4, 128, 4, "launch-bound"),
    _official(4, 16, 128, 128, 4, 128, 4, "launch-bound"),
    _official(5, 128, 128, 128, 4, 128, 4, "mid"),
    _official(6, 10000, 128, 128, 4, 128, 4, "capacity"),
    _official(7, 64, 128, 32, 4, 32, 4, "tiny-head"),
    _official(8, 64, 128, 1024, 4, 1024, 4, "projection-bound"),
    _official(9, 64, 128, 128, 1, 128, 4, "one-head"),
    _official(10, 64, 128, 128, 2, 128, 4, "mid"),
    _official(11, 64, 128, 128, 16, 128, 4, "tiny-head"),
    _official(12, 64, 32, 128, 4, 128, 4, "short-sequence"),
    _official(13, 64, 1024, 128, 4, 128, 4, "long-sequence"),
    _official(14, 32, 100000, 1024, 16, 1024, 2, "infeasible-dense"),
)

SMOKE_CASES: tuple[Case, ...] = (
    Case("smoke-1", TransformerConfig(2, 16, 32, 2, 64, 2, causal=True), "launch-bound"),
    Case("smoke-2", TransformerConfig(1, 256, 32, 2, 32, 1, causal=True), "long-sequence"),
    Case("smoke-3", TransformerConfig(4, 32, 32, 4, 32, 2, causal=True), "tiny-head"),
    Case("smoke-4", TransformerConfig(2, 32, 256, 2, 256, 1, causal=True), "projection-bound"),
    Case(
        "smoke-5",
        TransformerConfig(8, 32, 64, 4, 128, 2, causal=True),
        "padded-batch",
        padding_ratio=0.3,
        note="timed and checked on right-padded inputs",
    ),
)

_REGISTRY: dict[str, Case] = {c.id: c for c in OFFICIAL_CASES + SMOKE_CASES}

_CUSTOM = re.compile(
    r"^\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)"
    r"\s*(?:,\s*(causal|noncausal|non-causal|true|false|1|0)\s*)?(?:,\s*(float32)\s*)?$",
    re.IGNORECASE,
)


def all_cases() -> list[Case]:
    return list(_REGISTRY.values())


def parse_custom(spec: str) -> Case:
    """A custom case from ``B,S,D,H,FFN,L[,causal|noncausal][,float32]``."""
    match = _CUSTOM.match(spec)
    if not match:
        raise ValueError(
            f"cannot read case {spec!r}: a custom case is 'B,S,d_model,heads,FFN,layers"
            "[,causal|noncausal]', e.g. '8,256,128,4,512,2,causal'"
        )
    nums = [int(g) for g in match.groups()[:6]]
    kind = (match.group(7) or "causal").lower()
    causal = kind in ("causal", "true", "1")
    config = TransformerConfig(*nums, causal=causal)
    regime = classify_regime(config)
    key = CaseKey.from_config(config)
    return Case(id=f"custom-{str(key).replace(',', '-')}", config=config, regime=regime)


def classify_regime(config: TransformerConfig) -> str:
    """A regime label for a shape not in the registry (selects a search space)."""
    tokens = config.batch_size * config.seq_len
    if config.seq_len * config.seq_len * config.batch_size * config.num_heads > 2**34:
        return "infeasible-dense"
    if config.seq_len >= 1024:
        return "long-sequence"
    if config.d_model >= 512:
        return "projection-bound"
    if config.head_dim <= 8:
        return "tiny-head"
    if tokens <= 16 * 128:
        return "launch-bound"
    if tokens >= 1_000_000:
        return "capacity"
    return "mid"


def case_sort_key(case_id: str) -> tuple[int, str]:
    """Official cases in number order, then the others by name."""
    return (int(case_id), "") if case_id.isdigit() else (10**6, case_id)


def get_case(case_id: str) -> Case:
    """Look a case up by id (``1``..``14``, ``smoke-N``) or parse a custom spec."""
    case_id = str(case_id).strip()
    if case_id in _REGISTRY:
        return _REGISTRY[case_id]
    if case_id.startswith("custom-"):
        case_id = case_id[len("custom-") :].replace("-", ",")
    if "," in case_id:
        return parse_custom(case_id)
    raise ValueError(
        f"unknown case {case_id!r}; valid ids are 1-14, smoke-1..smoke-{len(SMOKE_CASES)} "
        "(all of them: 'smoke'), or a custom 'B,S,d_model,heads,FFN,layers[,causal|noncausal]'"
    )


def _expand_range(token: str) -> list[str]:
    lo, hi = token.split("-", 1)
    if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
        raise ValueError(f"bad case range {token!r}; write e.g. '1-13'")
    ids = sorted(int(i) for i in _REGISTRY if i.isdigit())
    if int(lo) < ids[0] or int(hi) > ids[-1]:
        raise ValueError(
            f"case range {token!r} runs past the cases ({ids[0]}-{ids[-1]}); write e.g. '1-13'"
        )
    return [str(i) for i in range(int(lo), int(hi) + 1)]


def _refuse_malformed_shape(spec: str) -> None:
    """A comma list of numbers that are not all case ids is a custom shape with the wrong
    number of fields: say so, rather than 'unknown case'."""
    tokens = [t.strip().lower() for t in spec.split(",") if t.strip()]
    words = {"causal", "noncausal", "non-causal", "true", "false", "float32"}
    if not all(t.isdigit() or t in words for t in tokens):
        numbers = [t for t in tokens if t.isdigit()]
        odd = [t for t in tokens if not t.isdigit() and t not in words and t not in _REGISTRY]
        if len(numbers) >= 3 and any(t not in _REGISTRY for t in numbers) and odd:
            raise ValueError(
                f"case spec {spec!r} reads as a custom shape, but {odd[0]!r} is not one of "
                "its fields: B,S,d_model,heads,FFN,layers[,causal|noncausal][,float32], e.g. "
                "'8,256,128,4,512,2,causal'"
            )
        return
    numbers = [t for t in tokens if t.isdigit()]
    if any(t in words for t in tokens) or (
        len(numbers) >= 3 and any(t not in _REGISTRY for t in numbers)
    ):
        raise ValueError(
            f"case spec {spec!r} reads as a custom shape with {len(numbers)} number(s); a "
            "custom shape has 6: B,S,d_model,heads,FFN,layers[,causal|noncausal], e.g. "
            "'8,256,128,4,512,2,causal' (case ids are 1-14 and smoke-1..5)"
        )


def select_cases(spec: str) -> list[Case]:
    """Cases from a spec: ``all``, ``official``, ``smoke``, ``1-13``, ``2,5,smoke-1`` or
    custom shapes separated by ``;`` (``8,256,128,4,512,2,causal;4,64,64,2,128,1``). A comma
    list of case ids only is cases (``1,5,6,9,10,11``); a shape whose six numbers are all
    case ids is written with its kind (``1,8,8,2,8,2,causal``)."""
    spec = spec.strip()
    groups = {"all": OFFICIAL_CASES, "official": OFFICIAL_CASES, "smoke": SMOKE_CASES}
    tokens = [t.strip() for t in spec.split(",")]
    only_ids = all(t in _REGISTRY or t in groups for t in tokens)  # "1,5,6,9": cases
    if ";" in spec:  # custom shapes, and any case ids or groups among them
        parts = [part.strip() for part in spec.split(";") if part.strip()]
        return list(
            dict.fromkeys(
                case
                for part in parts
                for case in (
                    [parse_custom(part)]  # a shape, as ';' lists always read them
                    if _CUSTOM.match(part)
                    else select_cases(part)
                )
            )
        )
    if _CUSTOM.match(spec) and not only_ids:
        return [parse_custom(spec)]
    _refuse_malformed_shape(spec)
    out: list[Case] = []
    for token in (t.strip() for t in spec.split(",")):
        if not token:
            continue
        ids: Iterable[str] = [token]
        if token in groups:  # "smoke-1,smoke", "all,smoke"
            ids = [c.id for c in groups[token]]
        elif re.fullmatch(r"\d+-\d+", token):
            ids = _expand_range(token)
        for case_id in ids:
            case = get_case(case_id)
            if case not in out:
                out.append(case)
    if not out:
        raise ValueError(f"case spec {spec!r} selects no case; try 'smoke', '1-13' or 'all'")
    return out


def _axis_values(token: str, name: str) -> list[int]:
    """``1,8,32`` or ``LO-HI`` (powers of 4 from LO, then HI) or ``LO-HI/F`` (factor F)."""
    values: set[int] = set()
    for part in (p.strip() for p in token.split(",")):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?:/(\d+))?)?", part)
        if not m or int(m.group(1)) < 1:
            raise ValueError(
                f"cannot read {name} {part!r} in --shapes: write numbers >= 1, ranges LO-HI "
                "(powers of 4 from LO, and HI) or LO-HI/F (factor F), e.g. '1-128/4 x 32-1024'"
            )
        lo = int(m.group(1))
        if m.group(2) is None:
            values.add(lo)
            continue
        hi, factor = int(m.group(2)), int(m.group(3) or 4)
        if hi < lo or factor < 2:
            raise ValueError(
                f"bad {name} range {part!r} in --shapes: LO-HI needs LO <= HI and a factor "
                ">= 2, e.g. '1-128/4'"
            )
        v = lo
        while v < hi:
            values.add(v)
            v *= factor
        values.add(hi)
    return sorted(values)


def shape_grid(spec: str, bases: list[Case]) -> list[Case]:
    """Cases on a grid of batch sizes x sequence lengths around each base case's other
    dims (``autotune study --shapes '1-128/4 x 32-1024/4' --cases 2``). A grid shape that
    is a registered case is that case (its study is shared)."""
    parts = re.split(r"\s*[xX]\s*", spec.strip())
    if len(parts) != 2 or not all(parts):
        raise ValueError(
            f"cannot read --shapes {spec!r}: write BATCHES x SEQS, e.g. '1-128/4 x 32-1024/4' "
            "or '1,8,64 x 32,256'"
        )
    batches = _axis_values(parts[0], "batch size")
    seqs = _axis_values(parts[1], "sequence length")
    by_key = {c.key: c for c in _REGISTRY.values()}
    out: list[Case] = []
    for base in bases:
        c = base.config
        for b in batches:
            for s in seqs:
                config = dataclasses.replace(c, batch_size=b, seq_len=s)
                key = CaseKey.from_config(config, base.dtype)
                case = by_key.get(key) or parse_custom(
                    f"{b},{s},{c.d_model},{c.num_heads},{c.ffn_dim},{c.num_layers},"
                    + ("causal" if c.causal else "noncausal")
                )
                if case not in out:
                    out.append(case)
    return out
