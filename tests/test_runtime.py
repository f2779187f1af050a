"""The runtime's serving contract: serving(), the once-per-model warning when a tuned entry
is skipped for the contract, and what a table made under other torch/triton says."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from autotune.core.cases import get_case
from autotune.core.device import detect_device, software_versions
from autotune.core.reference import build_reference, check_outputs, official_settings
from autotune.runtime import DispatchedTransformer, compatibility_problems, load_table, serving
from autotune.ship.export import render_table
from tests.conftest import ROOT

CASE = get_case("smoke-1")
KEY = (2, 16, 32, 2, 64, 2, True, "float32")  # smoke-1's case key
PLAN = {"attention": "sdpa_math", "qkv": "packed"}


def _write_table(tmp_path: Path, plan: dict = PLAN, **versions: str) -> Path:
    """A minimal CPU table whose one entry (smoke-1) is a tuned plan."""
    provenance = {
        "command": "autotune export --gpu cpu",
        "commit": "test",
        "device": {"capability": None, "name": "cpu", "type": "cpu"},
        "emulated": False,
        "storage": "sqlite:///studies.db",
        "versions": dict(software_versions(), **versions),
    }
    entries = {
        KEY: {
            "admitted": True,
            "case": "smoke-1",
            "evidence": {"reason": "test"},
            "plan": plan,
            "plan_hash": "test",
        }
    }
    path = tmp_path / "cpu.py"
    path.write_text(render_table("cpu", 1, provenance, entries))
    return path


@pytest.fixture()
def table(tmp_path: Path) -> Path:
    return _write_table(tmp_path)


@pytest.fixture()
def default_flags():
    """torch's default flags (precision "highest", CUDA matmul TF32 off), restored after."""
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cuda.matmul.allow_tf32 = saved[1]
    torch.backends.cudnn.allow_tf32 = saved[2]


def _model(table) -> tuple[DispatchedTransformer, torch.nn.Module]:
    ref = build_reference(CASE.config).eval()
    model = DispatchedTransformer(CASE.config, table=table)
    model.load_state_dict(ref.state_dict())
    return model.eval(), ref


def _contract_warnings(model, calls: int, batch: int = 2) -> list[str]:
    """Messages of the contract warnings over ``calls`` forwards in the current context."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(calls):
            model(torch.randn(batch, 16, 32, generator=torch.Generator().manual_seed(seed)))
    ours = [w for w in caught if "serving()" in str(w.message)]
    assert all(w.filename == __file__ for w in ours), [w.filename for w in ours]  # our line
    return [str(w.message) for w in ours]


def test_no_grad_under_default_flags_warns_once_naming_the_flags_and_the_fix(
    table, default_flags
) -> None:
    model, _ = _model(table)
    with torch.no_grad():
        (message,) = _contract_warnings(model, calls=4)
        assert model.last_route is not None and model.last_route.plan is None
    assert "allow_tf32=False" in message
    assert "float32_matmul_precision='highest'" in message
    assert "wrap calls in autotune.runtime.serving()" in message
    assert str(KEY) in message
    # explain() still gives the full reasons, and a second model warns once too.
    with torch.no_grad():
        assert "differ from the official settings" in str(model.explain(torch.randn(2, 16, 32)))
        assert len(_contract_warnings(_model(table)[0], calls=2)) == 1


def test_default_tf32_flags_in_inference_mode_warn_once(table, default_flags) -> None:
    model, _ = _model(table)
    with torch.inference_mode():
        (message,) = _contract_warnings(model, calls=3)
    assert "TF32/matmul precision flags differ" in message and "gradients" not in message


def test_gradients_enabled_under_official_flags_warn_once(table) -> None:
    model, _ = _model(table)
    with official_settings():
        (message,) = _contract_warnings(model, calls=3)
    assert "gradients are enabled" in message and "flags differ" not in message
    assert "autotune.runtime.serving()" in message


def test_serving_gives_the_tuned_plan_and_no_warning(table, default_flags) -> None:
    model, ref = _model(table)
    x = torch.randn(2, 16, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with serving():
            for _ in range(3):
                out = model(x)
                assert model.last_route is not None and model.last_route.plan is not None
            rep = check_outputs(out, ref(x))
    assert rep.passed, rep.summary()


def test_no_contract_warning_without_a_tuned_entry(table, default_flags) -> None:
    model, _ = _model(table)
    with torch.no_grad():
        assert _contract_warnings(model, calls=2, batch=3) == []  # no entry for B=3
        assert "no entry for case key" in str(model.explain(torch.randn(3, 16, 32)))


def test_a_call_runs_with_its_inputs_gpu_current(table, monkeypatch) -> None:
    """Triton launches and CUDA graphs go to the current device: a model on cuda:1 called
    while cuda:0 is current must make cuda:1 current for the call (checked here with
    stand-ins for torch.cuda: CI has no GPU), and the CPU and the current GPU enter nothing."""
    from types import SimpleNamespace

    from autotune.runtime import dispatch

    entered: list[object] = []

    class Device:  # torch.cuda.device's stand-in
        def __init__(self, device: int) -> None:
            self.device = device

        def __enter__(self) -> None:
            entered.append(self.device)

        def __exit__(self, *exc: object) -> None:
            entered.append("exit")

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", Device)
    with dispatch.input_device(SimpleNamespace(is_cuda=True, get_device=lambda: 1)):
        assert entered == [1]
    assert entered[-1] == "exit"
    for same in (SimpleNamespace(is_cuda=True, get_device=lambda: 0), torch.zeros(1)):
        with dispatch.input_device(same):
            pass
    assert len(entered) == 2
    # and every forward runs inside it, entered with the call's input
    inside: list[torch.Size] = []
    during: list[bool] = []

    @contextlib.contextmanager
    def recorded(x: torch.Tensor) -> Iterator[None]:
        inside.append(x.shape)
        yield
        inside.append(torch.Size())  # exited

    real_forward = DispatchedTransformer._forward

    def checked(self: DispatchedTransformer, x: torch.Tensor, mask: object) -> torch.Tensor:
        during.append(len(inside) % 2 == 1)  # entered, not yet exited
        return real_forward(self, x, mask)

    monkeypatch.setattr(dispatch, "input_device", recorded)
    monkeypatch.setattr(DispatchedTransformer, "_forward", checked)
    model, _ = _model(table)
    with serving():
        model(torch.randn(2, 16, 32))
    assert inside == [torch.Size([2, 16, 32]), torch.Size()] and during == [True]


def test_inputs_the_reference_cannot_run_are_refused_saying_what_it_takes(table) -> None:
    """Wrong inputs give one line naming the shape or dtype it takes (the reference's own
    errors name a LayerNorm or an unpacking); masks the reference broadcasts ([1, S],
    [B, 1], [1, 1]) still run as there."""
    model, ref = _model(table)
    x = torch.randn(2, 16, 32)
    with serving():
        for bad, says in (
            (
                torch.randn(16, 32),
                r"x has shape \(16, 32\); this model takes \[batch, seq_len, 32\]",
            ),
            (torch.randn(2, 16, 64), r"x has shape \(2, 16, 64\).*d_model 32"),
        ):
            with pytest.raises(ValueError, match=says):
                model(bad)
        for mask, says in (
            (torch.ones(2, 16), "dtype torch.float32; it must be torch.bool"),
            (torch.ones(2, 15, dtype=torch.bool), r"shape \(2, 15\); it must be \[2, 16\]"),
            (torch.ones(3, 16, dtype=torch.bool), r"shape \(3, 16\)"),
        ):
            with pytest.raises(ValueError, match=says):
                model(x, mask)
        one = torch.ones(1, 16, dtype=torch.bool)
        one[0, 12:] = False
        for broadcast in (
            one,
            torch.ones(2, 1, dtype=torch.bool),
            torch.ones(1, 1, dtype=torch.bool),
        ):
            assert check_outputs(model(x, broadcast), ref(x, broadcast)).passed
        assert check_outputs(model(x), ref(x)).passed  # the model still serves
        assert model.last_route is not None
        with pytest.raises(ValueError):
            model(torch.randn(16, 32))
        assert model.last_route is None  # a refused call went nowhere (was: the last route)


def test_an_input_dtype_the_weights_do_not_take_is_refused_in_one_line(table) -> None:
    """x in float16 against float32 weights (or a model.half() given float32 x) raised the
    matmul's 'mat1 and mat2 must have the same dtype', and explain() named a plan for the
    second; under autocast the reference casts and serves."""
    model, ref = _model(table)
    x = torch.randn(2, 16, 32)
    with serving():
        assert check_outputs(model(x), ref(x)).passed
        with pytest.raises(ValueError, match=r"x has dtype torch.float16, the model's weights "
                           r"torch.float32; pass x.to\(torch.float32\)"):  # fmt: skip
            model(x.half())
        assert model.last_route is None
        model.double()
        route = model.explain(x)
        assert route.plan is None and "the call is refused: x has dtype torch.float32" in str(route)
        with pytest.raises(ValueError, match=r"model's weights torch\.float64"):
            model(x)
        assert model(x.double()).dtype == torch.float64  # its own dtype still serves
    model.float()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x.bfloat16()).shape == x.shape  # autocast casts: the reference serves


def test_a_table_this_autotune_cannot_read_is_refused_and_the_reference_serves(
    tmp_path,
) -> None:
    """A plan with a knob this autotune lacks (a newer one's table, hash intact) or a value
    it lacks (a hand edit, hash broken) made every call raise, any shape; so did a
    PROVENANCE record edited to a non-dict."""
    newer = tmp_path / "newer.py"  # _write_table writes cpu.py each time
    newer.write_text(
        _write_table(tmp_path, plan=dict(PLAN, knob_of_a_newer_autotune=1)).read_text()
    )
    edited = tmp_path / "edited.py"
    edited.write_text(_write_table(tmp_path).read_text().replace("'packed'", "'fused'", 1))
    bad_device = tmp_path / "device.py"
    bad_device.write_text(
        _write_table(tmp_path).read_text().replace("'device': {", "'device': 'cpu', 'x': {", 1)
    )
    for path, says in (
        (newer, "cannot be read by this autotune (unknown knob(s) ['knob_of_a_newer"),
        (edited, "content hash mismatch"),
        (bad_device, "PROVENANCE['device'] is str, not a dict"),
    ):
        loaded = load_table(path)
        assert any(says in p for p in loaded.problems), (path, loaded.problems)
        model, ref = _model(path)
        with serving(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for shape in ((2, 16, 32), (3, 16, 32)):  # in the table, and not
                x = torch.randn(*shape)
                assert check_outputs(model(x), ref(x)).passed
                route = model.explain(x)
                assert route.plan is None and "table refused" in str(route)
        assert len([w for w in caught if "refused" in str(w.message)]) == 1


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("ENTRIES", None, "ENTRIES is NoneType 'None', not a dict"),
        ("TABLE_VERSION", "x", "TABLE_VERSION is str 'x', not an int"),
        ("TABLE_VERSION", True, "TABLE_VERSION is bool 'True', not an int"),
        ("PROVENANCE", [1], "PROVENANCE is list '[1]', not a dict"),
        ("BUCKETS", [3], "BUCKETS holds a int, not a bucket dict"),
        ("ENTRIES", {KEY: "plan"}, "ENTRIES holds \"(2, 16, 32, 2, 64, 2, True, 'float32')\": str"),
    ],
)
def test_a_table_field_of_the_wrong_type_is_named_in_one_error(table, field, value, says) -> None:
    """ENTRIES = None raised an AttributeError, TABLE_VERSION = 'x' a bare int() error."""
    from autotune.runtime.table import read_table_file

    values = dict(read_table_file(table), **{field: value})
    with pytest.raises(ValueError, match=re.escape(f"<mapping>: {says}")):
        load_table(values)


def test_a_newer_schema_whose_fields_have_other_shapes_is_refused_not_raised(table) -> None:
    """The field checks ran before the schema check: a schema-3 table with BUCKETS of
    another shape raised at construction, where it loaded refused before."""
    from autotune.runtime.table import read_table_file

    values = dict(read_table_file(table), SCHEMA_VERSION=3, BUCKETS={"new": "form"})
    values["ENTRIES"] = {"a string key": ["a", "list"]}
    loaded = load_table(values)
    (problem,) = loaded.problems
    assert problem.startswith("schema version 3 is not one this autotune reads (1, 2)")
    model, ref = _model(loaded)
    x = torch.randn(2, 16, 32)
    with serving(), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert check_outputs(model(x), ref(x)).passed
        assert "table refused: schema version 3" in str(model.explain(x))


def test_a_model_of_mixed_weight_dtypes_is_left_to_the_reference(table) -> None:
    """The dtype refusal compared x with the first weight only: half Linears with float
    LayerNorms (which the reference runs on half x) were refused, with wrong advice."""
    model, ref = _model(table)
    for module in [*model.modules(), *ref.modules()]:
        if isinstance(module, torch.nn.Linear):
            module.half()
    x = torch.randn(2, 16, 32).half()
    with serving():
        assert "the call is refused" not in str(model.explain(x))
        out = model(x)
        assert out.dtype == torch.float16 and torch.equal(out, ref(x))  # the reference's


def test_a_schema_version_of_the_wrong_type_is_shown_as_written(table, tmp_path) -> None:
    broken = tmp_path / "schema.py"
    broken.write_text(table.read_text().replace("SCHEMA_VERSION = 2", "SCHEMA_VERSION = '2'"))
    (problem, *_) = load_table(broken).problems
    assert problem.startswith("schema version '2' is not one this autotune reads (1, 2)")


def test_the_model_pickles_and_saves_like_the_reference(table, tmp_path) -> None:
    """``pickle`` and ``torch.save(model)`` work as they do for the reference, after calls
    too: what the calls built (plans, routes, graphs) is remade by the copy on its first
    call, on its own weights."""
    import pickle

    model, ref = _model(table)
    x = torch.randn(2, 16, 32)
    with serving():
        want = model(x)
        assert model.last_route.plan is not None
        for copy in (
            pickle.loads(pickle.dumps(model)),
            _saved_and_loaded(model, tmp_path / "model.pt"),
        ):
            assert not copy._devices and not copy._candidates  # this machine's, made anew
            assert torch.equal(copy(x), want)
            assert copy.last_route.plan == model.last_route.plan  # the tuned plan again
            with torch.no_grad():
                copy.layers[0].ffn_in.weight.mul_(2.0)  # its own weights, not the model's
            copy.refresh()
            assert torch.equal(model(x), want) and not torch.equal(copy(x), want)
        assert check_outputs(want, ref(x)).passed


def _saved_and_loaded(model: torch.nn.Module, path: Path) -> torch.nn.Module:
    torch.save(model, path)
    return torch.load(path, weights_only=False)


def test_edits_after_the_first_call_are_served_watched_replaced_or_swapped(table) -> None:
    """watch_edits turned on after the first call covers the plans already made; a
    replaced parameter and a replaced final norm are served without refresh()."""
    model, ref = _model(table)
    x = torch.randn(2, 16, 32)
    with serving():
        model(x)
        assert model.last_route.plan is not None
        model.watch_edits = True
        with torch.no_grad():
            model.layers[0].attention.k_proj.weight.mul_(1.5)  # in the packed copy
        ref.load_state_dict(model.state_dict())
        assert check_outputs(model(x), ref(x)).passed
        model.watch_edits = False
        layer = model.layers[1]
        layer.norm2.weight = torch.nn.Parameter(layer.norm2.weight.detach() * 3.0)
        model.final_norm = torch.nn.LayerNorm(32)
        with torch.no_grad():
            model.final_norm.bias.fill_(0.25)
        ref.load_state_dict(model.state_dict())
        assert check_outputs(model(x), ref(x)).passed
        assert model.last_route.plan is not None  # still the tuned plan
        swapped = torch.nn.LayerNorm(32)
        with torch.no_grad():
            swapped.weight.fill_(0.5)
        model.add_module("final_norm", swapped)  # not through setattr
        ref.load_state_dict(model.state_dict())
        assert check_outputs(model(x), ref(x)).passed


def test_a_module_replaced_while_a_first_call_resolves_is_not_served_stale(table) -> None:
    """Another thread replaces a module while a call key's first call works out its route:
    that call resolves again, and what it leaves behind reads the new module."""
    model, ref = _model(table)
    x = torch.randn(2, 16, 32)
    resolve = model._resolve
    calls = []

    def meanwhile(*args):
        calls.append(1)
        served = resolve(*args)
        if len(calls) == 1:  # the other thread, between the route and its storing
            model.final_norm = torch.nn.LayerNorm(32, elementwise_affine=True)
            with torch.no_grad():
                model.final_norm.bias.fill_(-0.5)
        return served

    object.__setattr__(model, "_resolve", meanwhile)
    with serving():
        y = model(x)
        ref.load_state_dict(model.state_dict())
        assert len(calls) == 2 and check_outputs(y, ref(x)).passed
        ((_route, cand),) = model._served.values()
        assert cand.final_norm is model.final_norm


def test_explain_names_the_dtype_and_a_broadcast_mask(table) -> None:
    model, _ = _model(table)
    x = torch.randn(2, 16, 32)
    with serving():
        route = model.double().explain(x.double())
        assert route.plan is None
        assert route.reasons[0].startswith(
            "x is float64: the table's plans are tuned for float32 inputs"
        )
        model.float()
        assert model.explain(x).plan is not None
        one = torch.ones(1, 16, dtype=torch.bool)
        assert "a mask of shape (1, 16) is broadcast: plans take one of shape (2, 16)" in (
            model.explain(x, one).reasons
        )
        assert (
            "mask dtype torch.float32 is not torch.bool"
            in model.explain(x, torch.ones(2, 16)).reasons
        )


def test_autocast_inside_serving_is_served_by_the_reference_with_one_warning(table) -> None:
    """Tuned plans were verified in float32 without autocast: under autocast the reference
    serves, as autocast asks, and the model says so once, at the caller's line."""
    model, ref = _model(table)
    x = torch.randn(2, 16, 32)
    with serving():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with pytest.warns(UserWarning, match="autocast is on") as caught:
                y = model(x)
            assert "Fix: call the model outside torch.autocast" in str(caught[0].message)
            assert caught[0].filename == __file__
            assert model.last_route.plan is None
            assert torch.equal(y, ref(x))  # the reference, under the autocast asked for
            assert any(r.startswith("autocast is on") for r in model.explain(x).reasons)
        model(x)
        assert model.last_route.plan is not None  # without autocast: the tuned plan


def test_serving_restores_flags_and_grad_mode() -> None:
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    try:
        torch.set_float32_matmul_precision("highest")  # torch 2.13: allow_tf32 follows
        torch.backends.cudnn.allow_tf32 = False
        assert torch.is_grad_enabled()
        with pytest.raises(RuntimeError, match="inside"), serving():
            assert torch.is_inference_mode_enabled() and not torch.is_grad_enabled()
            assert torch.get_float32_matmul_precision() == "high"
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
            raise RuntimeError("inside")
        assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        assert torch.get_float32_matmul_precision() == "highest"
        assert not torch.backends.cuda.matmul.allow_tf32
        assert not torch.backends.cudnn.allow_tf32
        with torch.no_grad(), serving():
            pass
        assert torch.is_grad_enabled()
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        torch.backends.cudnn.allow_tf32 = saved[2]


def test_mixed_flags_warn_instead_of_raising(table, default_flags) -> None:
    # torch 2.13: the precision becomes unreadable once allow_tf32 is set against it.
    torch.set_float32_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = False
    model, ref = _model(table)
    x = torch.randn(2, 16, 32)
    with torch.inference_mode():
        with pytest.warns(UserWarning, match="unreadable") as caught:
            out = model(x)
        assert torch.equal(out, ref(x))  # the reference served
    (message,) = [str(w.message) for w in caught if "serving()" in str(w.message)]
    assert "unreadable" in message


def test_version_mismatch_names_both_versions_and_the_way_forward(tmp_path) -> None:
    path = _write_table(tmp_path, torch="2.11.0+cu130")
    table = load_table(path)
    (problem,) = compatibility_problems(table, detect_device("cpu"))
    assert "torch 2.11.0+cu130" in problem and f"torch {torch.__version__}" in problem
    assert f"autotune validate --table {path} --allow-reference --out" in problem
    assert "never edit a table in place" in problem
    model, _ = _model(table)
    with serving(), pytest.warns(UserWarning, match="refused") as caught:
        model(torch.randn(2, 16, 32))
    assert len(caught) == 1 and "torch 2.11.0+cu130" in str(caught[0].message)


def test_triton_mismatch_names_both_triton_versions(tmp_path) -> None:
    here = software_versions()["triton"]
    table = load_table(_write_table(tmp_path, plan={"attention": "triton"}, triton="0.1.0"))
    (problem,) = compatibility_problems(table, detect_device("cpu"))
    assert "triton 0.1.0" in problem and (f"triton {here}" if here else "no triton") in problem
    assert f"torch {torch.__version__}" not in problem  # torch matches: not named
    assert "autotune validate --table" in problem and "--out" in problem


def test_serving_imports_without_the_tuning_stack() -> None:
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("optuna", "sqlalchemy", "pandas", "matplotlib"):
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        from autotune.runtime import serving
        with serving():
            pass
        print("OK")
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout


def test_the_steady_state_resolves_each_call_key_once(table, monkeypatch) -> None:
    """Route, contract and candidate are worked out on a call key's first call and then
    looked up; a new shape or other flags are a new key."""
    import autotune.runtime.dispatch as dispatch

    resolved = []
    original = dispatch.DispatchedTransformer._resolve

    def counting(self, x, mask):
        resolved.append(tuple(x.shape))
        return original(self, x, mask)

    monkeypatch.setattr(dispatch.DispatchedTransformer, "_resolve", counting)
    model, ref = _model(table)
    x = torch.randn(2, 16, 32)
    mask = torch.ones(2, 16, dtype=torch.bool)
    with serving():
        outs = [model(x, mask) for _ in range(4)]
        assert model.last_route.plan is not None  # the tuned entry served
        model(torch.randn(3, 16, 32), torch.ones(3, 16, dtype=torch.bool))
    assert resolved == [(2, 16, 32), (3, 16, 32)]
    with serving():
        assert all(check_outputs(o, ref(x, mask)).passed for o in outs)
    from autotune.core.reference import ReferenceTransformer

    torch.manual_seed(9)
    other = ReferenceTransformer(CASE.config).eval()
    model.load_state_dict(other.state_dict())  # new weights: the plan remakes what it derived
    with serving():
        assert check_outputs(model(x, mask), other(x, mask)).passed
        assert not check_outputs(model(x, mask), ref(x, mask)).passed


@pytest.mark.parametrize(("threshold", "path"), [(0.125, "exact"), (8.0, "polynomial")])
def test_explain_and_the_log_say_what_the_guard_decided_per_call(
    tmp_path, caplog, threshold, path
) -> None:
    """A polynomial plan's route states its guard's rule; after a call, what the guard
    decided for each batch chunk and layer (in explain(), last_route and the log)."""
    import logging

    plan = {
        "attention": "polynomial",
        "attn_precision": "ieee",
        "mask": "elide",
        "poly_chunk": 64,
        "poly_guard": threshold,
        "attn_block_m": 16,
        "attn_block_n": 16,
        "batch_chunk": 1,
    }
    model, ref = _model(_write_table(tmp_path, plan=plan))
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 16, dtype=torch.bool)
    with serving():
        before = model.explain(x, mask)
        assert before.plan is not None and len(before.guard) == 1
        assert f"<= {threshold:g}" in before.guard[0] and "guard:" in str(before)
        with caplog.at_level(logging.DEBUG, logger="autotune.runtime"):
            out = model(x, mask)
        # A hand-written table: with a guard this loose the polynomial errs beyond the rule
        # at these weights (what the study's constraint and the export's gate refuse).
        assert check_outputs(out, ref(x, mask)).passed == (path == "exact")
        after = model.explain(x, mask)
    rule, summary, *calls = after.guard
    assert rule == before.guard[0] and model.last_route.guard == after.guard
    # smoke-1: 2 sequences one at a time, 2 layers: 4 attention calls, each decided alone
    assert [c.split(":")[0] for c in calls] == [
        "sequence 0, layer 0",
        "sequence 0, layer 1",
        "sequence 1, layer 0",
        "sequence 1, layer 1",
    ]
    assert all(f": {path} (sampled score spread" in c for c in calls)
    poly = 4 if path == "polynomial" else 0
    assert summary.startswith(f"last call: {poly} of 4 attention calls polynomial")
    logged = [r.getMessage() for r in caplog.records if r.name == "autotune.runtime"]
    assert any(summary in m for m in logged) and sum(m.strip() in calls for m in logged) == 4


@pytest.fixture()
def newer_precision_api():
    """Precisions set through torch.backends.fp32_precision (the newer API) that the
    legacy cuDNN flag cannot express: reading it raises. Every precision setting is put
    back after."""
    from autotune.core.reference import _FP32_PRECISION_HOLDERS, flags_state, restore_flags

    legacy = flags_state()
    assert legacy[0] is not None  # the legacy flags readable
    newer = [holder().fp32_precision for holder in _FP32_PRECISION_HOLDERS]
    # cuDNN's convolutions and RNNs at different precisions: no single legacy flag.
    torch.backends.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    torch.backends.cudnn.rnn.fp32_precision = "tf32"
    with pytest.raises(RuntimeError):
        torch.backends.cudnn.allow_tf32  # noqa: B018 (what a plain read does now)
    yield
    for holder, value in zip(_FP32_PRECISION_HOLDERS, newer, strict=True):
        holder().fp32_precision = value
    restore_flags(legacy)


def test_the_newer_precision_api_serves_and_is_restored(table, newer_precision_api) -> None:
    """A process on ``torch.backends.fp32_precision``: forwards run (outside serving(): the
    reference, with the contract warning), serving() serves the tuned entry and puts the
    newer API's settings back."""
    from autotune.core.reference import flags_state

    model, ref = _model(table)
    x = torch.randn(2, 16, 32)
    before = flags_state()
    assert before[0] is None  # a legacy flag unreadable
    with torch.inference_mode():
        with pytest.warns(UserWarning, match="fp32_precision, the newer API"):
            out = model(x)
        assert torch.equal(out, ref(x))  # the reference served
    precision = torch.get_float32_matmul_precision()
    with serving():
        out = model(x)
        assert model.last_route.plan is not None
        assert check_outputs(out, ref(x)).passed
    assert flags_state() == before
    assert torch.get_float32_matmul_precision() == precision
    with pytest.raises(RuntimeError):  # as the process left it: the legacy read refused
        torch.backends.cudnn.allow_tf32  # noqa: B018
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(model(x), ref(x))  # later calls still run


def test_a_tf32_root_precision_serves_outside_and_inside_serving(table) -> None:
    """torch's recommended newer setting, ``torch.backends.fp32_precision = "tf32"``:
    the CUDA matmul flag cannot be read the legacy way either; calls and explain() run."""
    from autotune.core.reference import _FP32_PRECISION_HOLDERS, flags_state, restore_flags

    legacy = flags_state()
    newer = [holder().fp32_precision for holder in _FP32_PRECISION_HOLDERS]
    try:
        torch.backends.fp32_precision = "tf32"
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        with pytest.raises(RuntimeError):
            torch.backends.cuda.matmul.allow_tf32  # noqa: B018 (unreadable the legacy way)
        model, ref = _model(table)
        x = torch.randn(2, 16, 32)
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert torch.equal(model(x), ref(x))
            assert model.explain(x).plan is None
        with serving():
            assert model(x) is not None and model.last_route.plan is not None
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert torch.equal(model(x), ref(x))
    finally:
        for holder, value in zip(_FP32_PRECISION_HOLDERS, newer, strict=True):
            holder().fp32_precision = value
        restore_flags(legacy)


def test_serving_from_two_threads_restores_the_flags_once_both_leave(table, default_flags) -> None:
    """The flags are the process's: a thread leaving serving() while another is still
    inside leaves them official; the last to leave puts back what the first found."""
    import threading

    model, ref = _model(table)
    x = torch.randn(2, 16, 32)
    a_inside, a_left, b_done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def thread_a() -> None:
        with serving():
            a_inside.set()
            assert b_done.wait(0) is False
            seen["a"] = model(x).clone()
        a_left.set()

    def thread_b() -> None:
        a_inside.wait(10)
        with serving():
            a_left.wait(10)  # A has left; B is still inside
            seen["b"] = model(x).clone()
            seen["b_route"] = model.last_route
        b_done.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a call sent to the reference for the flags warns
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert seen["b_route"].plan is not None, seen["b_route"]  # the tuned plan, not the reference
    with serving():
        assert check_outputs(seen["b"], ref(x)).passed
    assert torch.get_float32_matmul_precision() == "highest"
    assert not torch.backends.cuda.matmul.allow_tf32


def test_last_route_is_each_threads_own(table) -> None:
    """Two threads on one model, one at the tuned shape and one at an untuned one: each
    reads its own call's route, and each call key is resolved once."""
    import threading

    model, _ = _model(table)
    tuned, untuned = torch.randn(2, 16, 32), torch.randn(1, 16, 32)
    wrong: list[str] = []
    start = threading.Barrier(2)

    def serve(x: torch.Tensor, want_plan: bool) -> None:
        start.wait(10)
        with serving():
            for _ in range(30):
                model(x)
                if (model.last_route.plan is not None) != want_plan:
                    wrong.append(str(model.last_route))

    threads = [
        threading.Thread(target=serve, args=(tuned, True)),
        threading.Thread(target=serve, args=(untuned, False)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not wrong, wrong[:3]
    assert model.last_route is None  # this thread made no call
    assert len(model._served) == 2


def test_an_empty_batch_or_sequence_goes_to_the_reference(table) -> None:
    model, ref = _model(table)
    with serving():
        for shape in ((0, 16, 32), (2, 0, 32)):
            x = torch.randn(*shape)
            mask = torch.ones(shape[:2], dtype=torch.bool)
            route = model.explain(x, mask)
            assert route.plan is None and "is empty" in str(route)
            out = model(x, mask)
            assert out.shape == ref(x, mask).shape == shape


def test_a_model_with_a_table_copies_after_serving(table) -> None:
    """Locks and per-thread state are made afresh in a copy, never copied."""
    import copy

    model, ref = _model(table)
    x = torch.randn(2, 16, 32)
    with serving():
        model(x)
        twin = copy.deepcopy(model)
        assert twin.last_route is None  # a fresh thread-local store
        assert check_outputs(twin(x), ref(x)).passed
        assert twin.last_route.plan is not None
    assert twin._resolve_locks is not model._resolve_locks


def test_an_emulated_table_is_refused_on_another_gpu_of_its_capability(tmp_path) -> None:
    """A table emulated on one GPU was verified there: another card of the same
    capability (an H100 for a table emulated on the H200) must validate it first."""
    from autotune.core.device import DeviceInfo

    path = _write_table(tmp_path)
    text = path.read_text()
    table = load_table(path)
    prov = dict(table.provenance, emulated=True)
    prov["device"] = {"capability": [9, 0], "name": "NVIDIA H200", "type": "cuda"}
    emulated = dataclasses.replace(table, provenance=prov)
    h100 = DeviceInfo(type="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0))
    (problem,) = compatibility_problems(emulated, h100)
    assert "emulating profile 'cpu' on NVIDIA H200" in problem and "H100" in problem
    h200 = DeviceInfo(type="cuda", name="NVIDIA H200", capability=(9, 0))
    assert compatibility_problems(emulated, h200) == []
    assert path.read_text() == text


def test_overlapping_ieee_sections_on_two_threads_restore_tf32(default_flags) -> None:
    """An ieee plan turns TF32 off around its matmuls, a process-wide switch: two threads'
    sections that overlap leave the flags as they found them, not off for good."""
    import threading

    from autotune.backends.precision import matmul_precision

    torch.backends.cuda.matmul.allow_tf32 = True
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def a() -> None:
        with matmul_precision("ieee"):
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b() -> None:
        a_in.wait(10)
        with matmul_precision("ieee"):
            b_in.set()
            a_out.wait(10)  # A left while B is inside: TF32 stays off for B
            assert not torch.backends.cuda.matmul.allow_tf32

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32


@pytest.mark.parametrize(
    "setup",
    [
        'torch.set_float32_matmul_precision("medium")',
        'torch.backends.mkldnn.matmul.fp32_precision = "bf16"',
        "pass",
    ],
)
def test_serving_puts_every_precision_setting_back(setup) -> None:
    """In a fresh process: every newer-API setting (a CPU bf16 matmul, a child left to
    inherit) is as it was, and the legacy getters read as before where the process had not
    mixed the two APIs (where it had, torch's getters depend on what it cannot report)."""
    code = textwrap.dedent(
        f"""
        import torch
        {setup}
        from autotune.core.reference import _FP32_PRECISION_HOLDERS
        from autotune.runtime import serving

        def snap():
            out = []
            getters = (
                torch.get_float32_matmul_precision,
                torch._C._get_cublas_allow_tf32,
                torch._C._get_cudnn_allow_tf32,
            )
            for get in getters:
                try:
                    out.append(get())
                except RuntimeError:
                    out.append("unreadable")
            return out, [h().fp32_precision for h in _FP32_PRECISION_HOLDERS]

        before = snap()
        with serving():
            pass
        after = snap()
        assert after[1] == before[1], (before, after)  # every newer setting
        if "unreadable" not in before[0]:  # the legacy getters, where the APIs were not mixed
            assert after[0] == before[0], (before, after)
        torch.backends.fp32_precision = "tf32"  # a later root change still reaches children
        assert torch.backends.cuda.matmul.fp32_precision in ("tf32", before[1][1])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
