"""Load, validate, select and sample declarative search spaces (``search_spaces/``)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import itertools
import json
import os
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from autotune.core.cases import Case
from autotune.plan import KNOBS_BY_NAME, REFERENCE_PLAN, Plan

SPACES_ENV = "AUTOTUNE_SPACES"
# 2: variant parameters are asked knob by knob, with knob values (1: one label per variant).
PARAM_ENCODING = 2


class Suggester(Protocol):
    """What sampling needs from an Optuna trial (so this module needs no optuna)."""

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    choices: tuple[Any, ...]  # plain values, or labels of variants
    variants: tuple[Mapping[str, Any], ...] | None = None
    when: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)

    def applies(self, chosen: Mapping[str, Any]) -> bool:
        return all(chosen.get(k, _default(k)) in v for k, v in self.when.items())

    def knob_values(self, choice: Any) -> dict[str, Any]:
        if self.variants is None:
            return {self.name: choice}
        return dict(self.variants[self.choices.index(choice)])

    # A variant parameter is asked as knob values, one knob at a time (define-by-run):
    # the knob that tells the remaining variants apart, named after the choices made so far
    # ("attention", then "attn_precision (attention=triton)", ...), so every Optuna
    # parameter has one fixed set of values and each value is a knob value.
    def suggest_variant(self, trial: Suggester) -> dict[str, Any]:
        return self._walk(lambda name, knob, values: trial.suggest_categorical(name, values))

    def variant_params(self, plan: Plan) -> dict[str, Any]:
        """The parameter values that make ``suggest_variant`` pick the plan's variant."""
        asked: dict[str, Any] = {}

        def answer(name: str, knob: str, values: list[Any]) -> Any:
            value = getattr(plan, knob)
            if value not in values:
                raise ValueError(
                    f"plan {plan.describe()!r}: {knob}={value!r} matches no variant of "
                    f"{self.name!r} (values {values})"
                )
            asked[name] = value
            return value

        leaf = self._walk(answer)
        if any(getattr(plan, k) != v for k, v in leaf.items()):
            raise ValueError(
                f"plan {plan.describe()!r} matches no variant of {self.name!r} in its space"
            )
        return asked

    def _walk(self, ask: Callable[[str, str, list[Any]], Any]) -> dict[str, Any]:
        assert self.variants is not None
        remaining = list(self.variants)
        path: list[str] = []
        while len(remaining) > 1:
            knob = next(k for k in self._variant_knobs() if len(_values(remaining, k)) > 1)
            name = knob if not path else f"{knob} ({', '.join(path)})"
            value = ask(name, knob, _values(remaining, knob))
            path.append(f"{knob}={value}")
            remaining = [v for v in remaining if v.get(knob, _default(knob)) == value]
        return dict(remaining[0])

    def _variant_knobs(self) -> list[str]:
        assert self.variants is not None
        knobs = [self.name] if any(self.name in v for v in self.variants) else []
        for v in self.variants:
            knobs += [k for k in v if k not in knobs]
        return knobs


def _values(variants: list[Mapping[str, Any]], knob: str) -> list[Any]:
    return list(dict.fromkeys(v.get(knob, _default(knob)) for v in variants))


class _Answers:
    """A Suggester that answers from recorded parameter values (replaying a plan)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = values

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self.values[name]


def _default(knob: str) -> Any:
    return getattr(REFERENCE_PLAN, knob)


def _variant_label(variant: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={variant[k]}" for k in sorted(variant))


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    name: str
    profiles: tuple[str, ...]
    regimes: tuple[str, ...]
    params: tuple[Param, ...]
    fixed: Mapping[str, Any]
    restrictions: tuple[Mapping[str, tuple[Any, ...]], ...]
    enqueue: tuple[Plan, ...]
    priority: int
    source: str
    content_hash: str

    def matches(self, profile: str, case: Case) -> bool:
        return (profile in self.profiles or "*" in self.profiles) and (
            case.regime in self.regimes or "*" in self.regimes
        )

    def violated(self, plan: Plan) -> str | None:
        """The restriction this plan breaks, as text, or None."""
        for rule in self.restrictions:
            if all(getattr(plan, k) in v for k, v in rule.items()):
                return "forbidden by the space: " + ", ".join(
                    f"{k} in {list(v)}" for k, v in rule.items()
                )
        return None

    def sample(self, trial: Suggester) -> Plan:
        """Define-by-run sampling: conditional parameters are asked only when they apply."""
        chosen: dict[str, Any] = dict(self.fixed)
        for param in self.params:
            if not param.applies(chosen):
                continue
            if param.variants is not None:
                chosen.update(param.suggest_variant(trial))
                continue
            choice = trial.suggest_categorical(param.name, list(param.choices))
            chosen.update(param.knob_values(choice))
        return Plan.from_dict(chosen)

    def plan_of(self, params: Mapping[str, Any]) -> Plan:
        """The plan that ``sample`` returns for these parameter values (as a trial holds
        them): the inverse of ``params_for``."""
        return self.sample(_Answers(params))

    def params_for(self, plan: Plan) -> dict[str, Any]:
        """The parameter values that make ``sample`` return this plan (for enqueueing)."""
        values: dict[str, Any] = {}
        chosen: dict[str, Any] = dict(self.fixed)
        for param in self.params:
            if not param.applies(chosen):
                continue
            if param.variants is not None:
                values.update(param.variant_params(plan))
                chosen.update(param.suggest_variant(_Answers(values)))
                continue
            choice = getattr(plan, param.name)
            if choice not in param.choices:
                raise ValueError(
                    f"plan {plan.describe()!r}: {param.name}={choice!r} is outside space "
                    f"{self.name!r} (choices {list(param.choices)})"
                )
            values[param.name] = choice
            chosen.update(param.knob_values(choice))
        return values

    def enumerate(self) -> Iterator[Plan]:
        """Every plan of the space (conditions and restrictions applied), in a fixed order."""
        seen: set[Plan] = set()

        def walk(i: int, chosen: dict[str, Any]) -> Iterator[Plan]:
            if i == len(self.params):
                plan = Plan.from_dict(chosen)
                if plan not in seen and self.violated(plan) is None:
                    seen.add(plan)
                    yield plan
                return
            param = self.params[i]
            if not param.applies(chosen):
                yield from walk(i + 1, chosen)
                return
            for choice in param.choices:
                yield from walk(i + 1, {**chosen, **param.knob_values(choice)})

        yield from walk(0, dict(self.fixed))

    def size(self) -> int:
        return sum(1 for _ in self.enumerate())

    def larger_than(self, n: int) -> bool:
        """Whether the space holds more than ``n`` plans: enumerates at most ``n + 1`` of
        them (the long space holds millions; counting them all takes minutes)."""
        return any(True for _ in itertools.islice(self.enumerate(), n, n + 1))


def _as_tuple(value: Any, where: str) -> tuple[Any, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(value)
    raise ValueError(f"{where} must be a list, got {value!r}")


def parse_space(data: Mapping[str, Any], source: str) -> SearchSpace:
    """Validate a space's data; errors name the space, the field and the valid values."""
    if not isinstance(data, Mapping):
        raise ValueError(
            f"search space ({source}) must be a dict with 'name' and 'params', got "
            f"{type(data).__name__}"
        )
    where = f"search space {data.get('name', '?')!r} ({source})"
    known = {
        "name",
        "profiles",
        "regimes",
        "params",
        "fixed",
        "restrictions",
        "enqueue",
        "priority",
        "description",
    }
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown fields {unknown}; valid: {sorted(known)}")
    if not isinstance(data.get("name"), str):
        raise ValueError(f"{where}: 'name' must be a string")
    if not isinstance(data.get("params", []), (list, tuple)) or not all(
        isinstance(p, Mapping) for p in data.get("params", [])
    ):
        raise ValueError(f"{where}: 'params' must be a list of dicts, one a knob")
    params = []
    for i, p in enumerate(data.get("params", [])):
        pw = f"{where} param #{i}"
        if "variants" in p:
            variants = tuple(dict(v) for v in p["variants"])
            for v in variants:
                Plan.from_dict(v)  # validates knob names and values
            params.append(
                Param(p["name"], tuple(_variant_label(v) for v in variants), variants, _when(p, pw))
            )
        else:
            name = p.get("name")
            if name not in KNOBS_BY_NAME:
                raise ValueError(f"{pw}: unknown knob {name!r}; valid: {list(KNOBS_BY_NAME)}")
            values = _as_tuple(p.get("values"), f"{pw} values")
            for v in values:
                KNOBS_BY_NAME[name].validate(v)
            params.append(Param(name, values, None, _when(p, pw)))
    fixed = dict(data.get("fixed", {}))
    Plan.from_dict(fixed)
    restrictions = []
    for rule in data.get("restrictions", []):
        forbid = rule.get("forbid") if isinstance(rule, Mapping) else None
        if not isinstance(forbid, Mapping):
            raise ValueError(f"{where}: a restriction is {{'forbid': {{knob: [values]}}}}")
        for k in forbid:
            if k not in KNOBS_BY_NAME:
                raise ValueError(f"{where}: restriction names unknown knob {k!r}")
        restrictions.append(
            {k: _as_tuple(v, f"{where} restriction {k}") for k, v in forbid.items()}
        )
    # The hash names the study: it covers the space's data and how its parameters are
    # asked (PARAM_ENCODING), since a study cannot change its parameters' values.
    canonical = json.dumps({"space": data, "encoding": PARAM_ENCODING}, sort_keys=True, default=str)
    space = SearchSpace(
        name=data["name"],
        profiles=_as_tuple(data.get("profiles", ["*"]), f"{where} profiles"),
        regimes=_as_tuple(data.get("regimes", ["*"]), f"{where} regimes"),
        params=tuple(params),
        fixed=fixed,
        restrictions=tuple(restrictions),
        enqueue=tuple(Plan.from_dict({**fixed, **e}) for e in data.get("enqueue", [])),
        priority=int(data.get("priority", 0)),
        source=source,
        content_hash=hashlib.sha256(canonical.encode()).hexdigest()[:16],
    )
    for plan in space.enqueue:
        space.params_for(plan)  # every enqueued plan must lie inside the space
    return space


def _when(p: Mapping[str, Any], where: str) -> dict[str, tuple[Any, ...]]:
    when = p.get("when", {})
    for k in when:
        if k not in KNOBS_BY_NAME:
            raise ValueError(f"{where}: 'when' names unknown knob {k!r}")
    return {k: _as_tuple(v, f"{where} when {k}") for k, v in when.items()}


def load_space_file(path: str | Path) -> SearchSpace:
    """A user's space (.py with ``SPACE`` or .json); any fault of the file is a
    ValueError naming it."""
    try:
        return _load_space_file(Path(path))
    except (TypeError, AttributeError, KeyError) as exc:  # a shape parse_space missed
        raise ValueError(
            f"search space {str(path)!r} is malformed ({type(exc).__name__}: {exc}); "
            "see search_spaces/cpu.py for the form"
        ) from exc


def _load_space_file(path: Path) -> SearchSpace:
    if path.is_dir():
        raise ValueError(
            f"search space {str(path)!r} is a folder; give a file such as search_spaces/cpu.py"
        )
    if not path.is_file():
        raise ValueError(f"search space file {str(path)!r} does not exist")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except (ValueError, OSError) as exc:  # UnicodeDecodeError is a ValueError
            raise ValueError(f"search space {str(path)!r} is not readable JSON: {exc}") from exc
        return parse_space(data, str(path))
    spec = importlib.util.spec_from_file_location(f"_user_space_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import search space {str(path)!r}; use a .py or .json file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's module: its error, named with the file
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) else ""
        raise ValueError(
            f"search space {str(path)!r} failed to import{where}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    if not hasattr(module, "SPACE"):
        raise ValueError(f"{str(path)!r} defines no SPACE dict")
    return parse_space(module.SPACE, str(path))


def builtin_spaces() -> list[SearchSpace]:
    import search_spaces

    spaces = []
    for info in sorted(pkgutil.iter_modules(search_spaces.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"search_spaces.{info.name}")
        if hasattr(module, "SPACE"):
            spaces.append(parse_space(module.SPACE, f"search_spaces/{info.name}.py"))
    return spaces


def available_spaces(extra: list[str] | None = None) -> list[SearchSpace]:
    """Built-in spaces, then those in ``$AUTOTUNE_SPACES``, then ``--space`` files."""
    spaces = builtin_spaces()
    folder = os.environ.get(SPACES_ENV)
    if folder:
        for path in sorted(itertools.chain(Path(folder).glob("*.py"), Path(folder).glob("*.json"))):
            spaces.append(load_space_file(path))
    for path in extra or []:
        spaces.append(dataclasses.replace(load_space_file(path), priority=1000))
    return spaces


def select_space(profile: str, case: Case, spaces: list[SearchSpace]) -> SearchSpace:
    """The matching space of highest priority; a user's space with the same name wins."""
    matching = [s for s in spaces if s.matches(profile, case)]
    if not matching:
        raise ValueError(
            f"no search space serves profile {profile!r} and regime {case.regime!r}; "
            f"spaces: {[s.name for s in spaces]}"
        )
    return max(enumerate(matching), key=lambda t: (t[1].priority, t[0]))[1]
