"""End to end on the CPU: study -> export -> import without the tuning stack -> plot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
import torch

from autotune.cli import main
from autotune.plan import Plan
from autotune.runtime import DispatchedTransformer, load_table
from autotune.runtime.table import read_table_file
from autotune.search.trials import counts, study_name
from autotune.ship.export import render_table
from tests.conftest import ROOT, cli

BLOCKED = ("optuna", "sqlalchemy", "pandas", "matplotlib")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> dict:
    """One real smoke study of two cases, exported and plotted (shared by the tests)."""
    tmp = tmp_path_factory.mktemp("pipeline")
    db = f"sqlite:///{tmp / 'studies.db'}"
    table = tmp / "tables" / "cpu.py"
    png = tmp / "pareto.png"
    assert cli(f"study --gpu cpu --cases smoke-1,smoke-3 --n-trials 6 --storage {db} --quiet") == 0
    assert cli(f"export --gpu cpu --storage {db} --out {table!s}") == 0
    assert cli(f"plot --gpu cpu --storage {db} --table {table!s} --out {png!s}") == 0
    return {"db": db, "table": table, "png": png, "tmp": tmp}


def test_study_records_plans_outcomes_environment_and_resumes(pipeline) -> None:
    url = str(pipeline["db"])
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(url))
    assert len(names) == 2 and all(n.startswith("cpu|") for n in names)
    study = optuna.load_study(study_name=names[0], storage=url)
    trials = study.get_trials()
    assert sum(counts(t) for t in trials) == 6  # repeats of a measured plan are free
    assert trials[0].user_attrs["plan_hash"] == "44136fa355b3"  # the reference, enqueued first
    for t in trials:
        assert {"plan", "plan_hash", "outcome_kind", "outcome"} <= set(t.user_attrs)
        assert {"correctness", "memory"} <= set(t.constraints)
    env = study.user_attrs["environment"]
    assert env["profile"] == "cpu" and env["versions"]["torch"] and "commit" in env
    assert study.user_attrs["space"]["hash"]
    # The same command again resumes: nothing new; a higher target adds the difference.
    assert cli(f"study --gpu cpu --cases smoke-1 --n-trials 6 --storage {url} --quiet") == 0
    assert cli(f"study --gpu cpu --cases smoke-1 --n-trials 8 --storage {url} --quiet") == 0
    from autotune.core.cases import get_case
    from autotune.search.space import builtin_spaces, select_space

    case = get_case("smoke-1")
    name = study_name("cpu", case, select_space("cpu", case, builtin_spaces()))
    resumed = optuna.load_study(study_name=name, storage=url).get_trials()
    assert sum(t.state == optuna.trial.TrialState.COMPLETE and counts(t) for t in resumed) == 8


def test_exported_table_serves_in_a_process_without_the_tuning_stack(pipeline, tmp_path) -> None:
    # smoke-1's entry forced admitted, so a tuned plan (not the fallback) is what runs.
    table_path = _table_with_entry(pipeline, tmp_path, {"attention": "sdpa_math", "qkv": "packed"})
    code = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {BLOCKED!r}:
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        import torch
        from autotune.core.cases import get_case
        from autotune.core.reference import build_reference, generate_random_case, check_outputs
        from autotune.core.reference import official_settings
        from autotune.runtime import DispatchedTransformer, load_table
        table = load_table({str(table_path)!r})
        assert table.usable, table.problems
        ok = 0
        for cid in ("smoke-1", "smoke-3"):
            case = get_case(cid)
            ref = build_reference(case.config)
            model = DispatchedTransformer(case.config, table=table)
            model.load_state_dict(ref.state_dict())
            model.eval()
            for seed in range(1234, 1239):
                x, m = generate_random_case(case.config, "cpu", torch.float32, seed)
                with official_settings(), torch.inference_mode():
                    route = model.explain(x, m)
                    rep = check_outputs(model(x, m), ref(x, m))
                assert rep.passed, rep.summary()
            print(cid, route)
            assert cid != "smoke-1" or route.plan is not None, route
            ok += 1
        assert not any(m.split(".")[0] in {BLOCKED!r} for m in sys.modules)
        print("OK", ok)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=pipeline["tmp"],
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK 2" in out.stdout


def test_generated_module_imports_without_the_tuning_stack(pipeline) -> None:
    code = textwrap.dedent(f"""
        import sys, importlib.util
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {BLOCKED!r}:
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        spec = importlib.util.spec_from_file_location("cpu_table", {str(pipeline["table"])!r})
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        from autotune.runtime import load_table
        assert load_table(mod).usable
        print("ENTRIES", len(mod.ENTRIES))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ENTRIES 2" in out.stdout


def test_plot_file_is_a_png(pipeline) -> None:
    data = pipeline["png"].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_edited_table_is_refused_and_the_reference_serves(pipeline, tmp_path) -> None:
    text = pipeline["table"].read_text()
    edited = tmp_path / "edited.py"
    edited.write_text(text.replace("'case': 'smoke-1'", "'case': 'smoke-9'"))
    table = load_table(edited)
    assert not table.usable and "content hash mismatch" in table.problems[0]
    from autotune.core.cases import get_case

    case = get_case("smoke-1")
    model = DispatchedTransformer(case.config, table=table).eval()
    x = torch.randn(2, 16, 32)
    with torch.inference_mode(), pytest.warns(UserWarning, match="refused"):
        model(x)
    route = model.explain(x)
    assert route.plan is None and any("content hash mismatch" in r for r in route.reasons)


def test_table_for_another_gpu_is_refused(pipeline, tmp_path) -> None:
    values = {}
    exec(compile(pipeline["table"].read_text(), "t", "exec"), values)
    prov = dict(values["PROVENANCE"])
    prov["device"] = dict(prov["device"], type="cuda", name="NVIDIA H200", capability=[9, 0])
    other = tmp_path / "h200.py"
    other.write_text(render_table("h200", 1, prov, values["ENTRIES"]))
    table = load_table(other)
    assert table.usable  # intact, but made for a GPU
    from autotune.core.cases import get_case

    model = DispatchedTransformer(get_case("smoke-1").config, table=table)
    route = model.explain(torch.randn(2, 16, 32))
    assert route.plan is None
    assert any("made on a cuda device" in r for r in route.reasons)


def _table_with_entry(pipeline, tmp_path, plan: dict) -> Path:
    """The pipeline's table with smoke-1's entry admitted with ``plan`` (hash re-made),
    so tests of the dispatcher do not depend on what a noisy CPU timing admitted."""
    values: dict = {}
    exec(compile(pipeline["table"].read_text(), "t", "exec"), values)
    entries = dict(values["ENTRIES"])
    key = (2, 16, 32, 2, 64, 2, True, "float32")
    entries[key] = dict(
        entries[key],
        admitted=True,
        plan=plan,
        evidence=dict(entries[key]["evidence"], study=None, trial=None),
    )
    path = tmp_path / "cpu.py"
    path.write_text(render_table("cpu", values["TABLE_VERSION"], values["PROVENANCE"], entries))
    return path


def test_explain_names_every_reason_an_entry_was_not_used(pipeline, tmp_path) -> None:
    from autotune.core.cases import get_case

    table = _table_with_entry(pipeline, tmp_path, {"attention": "sdpa_math", "qkv": "packed"})
    model = DispatchedTransformer(get_case("smoke-1").config, table=table)
    x = torch.randn(2, 16, 32)
    with torch.inference_mode():
        from autotune.core.reference import official_settings

        with official_settings():
            assert model.explain(x).plan is not None
            assert "no entry for case key" in str(model.explain(torch.randn(3, 16, 32)))
        assert "official settings" in str(model.explain(x))
    with official_settings():
        assert "gradients are enabled" in str(model.explain(x))


def test_export_is_byte_identical_for_the_same_inputs_and_versions_increase(pipeline) -> None:
    values: dict = {}
    exec(compile(pipeline["table"].read_text(), "t", "exec"), values)
    args = ("cpu", values["TABLE_VERSION"], values["PROVENANCE"], values["ENTRIES"])
    assert render_table(*args) == render_table(*args) == pipeline["table"].read_text()
    from autotune.ship.export import next_version

    assert (
        next_version(pipeline["table"], "cpu", values["PROVENANCE"], values["ENTRIES"])
        == values["TABLE_VERSION"]
    )
    changed = dict(values["PROVENANCE"], commit="another")
    assert (
        next_version(pipeline["table"], "cpu", changed, values["ENTRIES"])
        == values["TABLE_VERSION"] + 1
    )


def test_conformance_with_the_table_passes_golden_vectors(pipeline, golden_paths, capsys) -> None:
    """Each vector's line says where the dispatcher sent it; where no vector met a plan of
    the table, the run says so (a pass that tested nothing of the table)."""
    assert main(["conformance", "--table", str(pipeline["table"]), *golden_paths]) == 0
    out = capsys.readouterr().out
    assert f"{len(golden_paths)} passed, 0 failed" in out
    assert out.count("(route: reference)") == len(golden_paths)
    assert "none of the table's plans was tested" in out


def test_conformance_names_the_entry_a_vector_ran_on(pipeline, golden_paths, tmp_path, capsys):
    from autotune.core.cases import CaseKey
    from autotune.judge.golden import load_vector

    values: dict = {}
    exec(compile(pipeline["table"].read_text(), "t", "exec"), values)
    vector = load_vector(golden_paths[0])
    entry = next(iter(values["ENTRIES"].values()))
    plan = {"qkv": "packed"}
    entries = {
        CaseKey.from_config(vector.config).as_tuple(): dict(
            entry, admitted=True, plan=plan, evidence=dict(entry["evidence"], trial=None)
        )
    }
    path = tmp_path / "one.py"
    path.write_text(render_table("cpu", 1, values["PROVENANCE"], entries))
    assert main(["conformance", "--table", str(path), golden_paths[0]]) == 0
    out = capsys.readouterr().out
    assert f"(route: plan {Plan.from_dict(plan).hash} [entry])" in out
    assert "none of the table's plans was tested" not in out


def test_bench_prints_the_official_protocol_table(pipeline, tmp_path, capsys) -> None:
    import autotune.tools.bench as bench_mod
    from autotune.measure import TimingSettings

    fast = TimingSettings(warmup=2, rounds=3, reps=5)
    original = bench_mod.bench_case.__defaults__
    bench_mod.bench_case.__defaults__ = (fast, *original[1:])
    try:
        assert (
            cli(f"bench --table {pipeline['table']!s} --gpu cpu --csv {tmp_path / 'b.csv'!s}") == 0
        )
    finally:
        bench_mod.bench_case.__defaults__ = original
    out = capsys.readouterr().out
    assert "geometric mean" in out and "0 failed" in out
    assert (tmp_path / "b.csv").read_text().startswith("case,route,verdict")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["study", "--gpu", "tpu"], "unknown GPU profile 'tpu'"),
        (["study", "--gpu", "cpu", "--sampler", "magic"], "unknown sampler 'magic'"),
        (["study", "--gpu", "cpu", "--cases", "99"], "unknown case '99'"),
        (["study", "--gpu", "cpu", "--cases", " "], "--cases ' ' selects no case"),
        (["study", "--gpu", "cpu", "--timeout", "-1"], "--timeout takes seconds above 0, got -1"),
        (["study", "--gpu", "cpu", "--trial-timeout", "0"], "--trial-timeout takes seconds"),
        (["study", "--gpu", "h200"], "needs a CUDA GPU"),
        (["evaluate", "--case", "smoke-1", "--plan", '{"tile": 1}'], "unknown knob"),
        (
            ["study", "--gpu", "cpu", "--storage", "postgresql://nobody@127.0.0.1:1/x"],
            "cannot open storage",
        ),
        (["bench", "--table", "/nonexistent.py"], "does not exist"),
        (["report", "--gpu", "h200", "--target", "25"], "--target 25 needs --bench"),
        (["report", "--gpu", "h200", "--bench-before", "a.csv"], "needs --bench (this run's"),
        (
            ["report", "--gpu", "h200", "--bench", "b.csv", "--bench-before", "/no/a.csv"],
            "'/no/a.csv' does not exist",
        ),
        (["report", "--gpu", "h200", "--bench-history", "a.csv"], "needs --bench (this run's"),
        (
            ["report", "--gpu", "h200", "--bench", "pyproject.toml"],
            "pyproject.toml is not an 'autotune bench --csv' file",
        ),
        (
            ["report", "--gpu", "h200", "--bench", "b.csv", "--bench-history", "/no/a.csv"],
            "'/no/a.csv' does not exist",
        ),
        (
            ["report", "--gpu", "h200", "--bench", "b.csv", "--target", "0.5"],
            "not a speedup above 1",
        ),
        (["report", "--gpu", "h200", "--unseen", "pyproject.toml"], "--unseen 'pyproject.toml'"),
        (
            ["report", "--gpu", "h200", "--efficiency", "pyproject.toml"],
            "--efficiency 'pyproject.toml' is not readable JSON",
        ),
        (["report", "--gpu", "h200", "--out", "pyproject.toml"], "is a file; give a folder"),
        (["evaluate", "--case", "smoke-1", "--plan", "reference", "--json", "tests"], "a folder"),
        (["study", "--gpu", "cpu", "--heartbeat", "0"], "--heartbeat takes whole seconds"),
        (
            ["study", "--gpu", "cpu", "--cases", "2,16,32,2,64,2,sideways"],
            "'sideways' is not one of its fields",
        ),
        (["study", "--gpu", "cpu", "--storage", "sqlite:///"], "names no file"),
        (["conformance", "/no/vector.pt"], "golden vector '/no/vector.pt' is not a file"),
        (["conformance", "pyproject.toml"], "cannot read golden vector 'pyproject.toml'"),
        (["export", "--gpu", "cpu", "--finalists", "0"], "--finalists 0: give 1 or more"),
        (["floors", "--fp16-tflops", "0"], "--fp16-tflops 0: give the hardware's rate"),
        (["floors", "--tb-per-s", "nan"], "--tb-per-s nan: give the hardware's rate"),
        (["floors", "--bench", "/no/bench.csv"], "--bench '/no/bench.csv' is not a file"),
        (["floors", "--bench", "pyproject.toml"], "is not a CSV that 'autotune bench --csv'"),
        (["cases", "--cases", ""], "--cases '' selects no case"),
        (["study", "--gpu", "cpu", "--shapes", ""], "--shapes '' names no shape"),
        (
            ["study", "--gpu", "cpu", "--storage", "sqlite:///pyproject.toml/s.db"],
            "pyproject.toml is not a writable folder, so s.db cannot be made there",
        ),
        (["plot", "--gpu", "nope"], "unknown GPU profile 'nope'; valid profiles: cpu"),
        (["report", "--gpu", "nope"], "unknown GPU profile 'nope'; valid profiles: cpu"),
        (["plot", "--gpu", "auto", "--storage", "sqlite:///no.db"], "'sqlite:///no.db' does not"),
        (["study", "--gpu", "cpu", "--seed", "-1"], "--seed -1: give a seed from 0 to 4294967295"),
        (["study", "--gpu", "cpu", "--seed", str(2**32)], "--seed 4294967296: give a seed"),
        (["unseen", "--table", "tables/h200.py", "--seed", "-3"], "--seed -3: give a seed"),
        (["buckets", "--table", "tables/h200.py", "--journal", "tests"], "--journal tests is a"),
        (["validate", "--table", "tables/h200.py", "--cases", " "], "--cases ' ' selects no"),
        (["validate", "--table", "tables", "--gpu", "cpu"], "'tables' is a folder"),
        (
            ["validate", "--table", "tables/h200.py", "--gpu", "cpu", "--cases", "smoke-2"],
            "--cases 'smoke-2' names no entry of tables/h200.py (its entries: cases 1, 2, 3",
        ),
        (
            [
                "unseen",
                "--table",
                "tables/h200.py",
                "--gpu",
                "cpu",
                "--tuned",
                "--storage",
                "sqlite:////no/such.db",
            ],
            "storage 'sqlite:////no/such.db' does not exist",
        ),
        (
            ["plot", "--gpu", "cpu", "--storage", "sqlite:///x.db", "--table", "/no/t.py"],
            "table file '/no/t.py' does not exist",
        ),
    ],
)
def test_bad_input_gets_a_clear_error_and_exit_2(argv, message, capsys) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_kernel_checks_without_a_gpu_or_the_interpreter_are_refused(monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["kernels", "check", "--match", "mantissa"]) == 2
    assert "TRITON_INTERPRET=1 autotune kernels check" in capsys.readouterr().err


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(monkeypatch, capsys) -> None:
    from autotune.cli import info

    def closed(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(info, "cmd_cases", closed)
    monkeypatch.setattr(os, "dup2", lambda fd, fd2: None)  # pytest's captured stdout stays
    assert main(["cases"]) == 141
    assert capsys.readouterr().err == ""


def test_a_case_group_joins_a_list_of_ids() -> None:
    from autotune.core.cases import select_cases

    assert [c.id for c in select_cases("smoke-1,smoke")][:2] == ["smoke-1", "smoke-2"]
    assert len(select_cases("smoke-1,smoke")) == len(select_cases("smoke"))
    assert len(select_cases("all,smoke")) == 19


def test_a_usage_error_is_one_line_naming_the_value_and_where_help_is(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["study", "--n-trials", "abc"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "autotune study: error: argument --n-trials: invalid int value: 'abc'; "
        "see 'autotune study --help'\n"
    )


def test_re_export_measures_the_shipped_entries_as_incumbents(pipeline, tmp_path) -> None:
    shipped = {"attention": "sdpa_math", "heads": "strided", "mask": "elide"}
    out = _table_with_entry(pipeline, tmp_path, shipped)
    assert cli(f"export --gpu cpu --storage {pipeline['db']} --out {out!s}") == 0
    entry = load_table(out).entries[(2, 16, 32, 2, 64, 2, True, "float32")]
    notes = entry["evidence"]["finalists"]
    incumbent = [n for n in notes if n.get("incumbent")]
    assert len(incumbent) == 1 and "speedup" in incumbent[0]  # re-measured in the same run
    reason = entry["evidence"]["reason"]
    # On the CPU's timing an anchor measured beside them may beat every plan: it ships.
    if entry["admitted"] and not reason.startswith("anchor "):
        assert "incumbent" in reason, reason
        if "incumbent kept" in reason or "re-measured fastest" in reason:
            assert entry["plan"] == shipped


def test_validate_reports_each_entry_and_fails_on_a_wrong_one(
    pipeline, tmp_path, capsys, monkeypatch
) -> None:
    table = _table_with_entry(pipeline, tmp_path, {"attention": "sdpa_math", "qkv": "packed"})
    assert cli(f"validate --table {table} --gpu cpu --quick") == 0
    out = capsys.readouterr().out
    assert "case smoke-1" in out and "0 WRONG" in out
    monkeypatch.setenv("AUTOTUNE_INJECT_FAULT", "wrong")
    assert cli(f"validate --table {table} --gpu cpu --quick") == 1
    assert "WRONG" in capsys.readouterr().out


def test_validate_on_another_device_notes_it_and_says_what_cannot_run(capsys) -> None:
    table = Path(__file__).resolve().parent.parent / "tables" / "h200.py"
    # Cases whose plans capture CUDA graphs (the rest would crawl in the Triton interpreter).
    assert cli(f"validate --table {table} --gpu cpu --quick --cases 1-5") == 1
    out = capsys.readouterr().out
    assert out.count("made on a cuda device") == 1  # said once, not per entry
    assert "5 cannot run here" in out and "cuda_graph=true needs CUDA" in out
    flags = "--allow-reference --allow-missing"
    assert cli(f"validate --table {table} --gpu cpu --quick --cases 1-2 {flags}") == 0


def test_bench_anchors_are_timed_in_the_same_run_as_the_table(pipeline, capsys) -> None:
    assert (
        cli(
            f"bench --table {pipeline['table']} --gpu cpu --cases smoke-1 "
            "--anchors sdpa,max-autotune"
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "table/best anchor" in out and "table over the fastest passing anchor" in out
    line = next(
        ln
        for ln in out.splitlines()
        if ln.startswith("smoke-1") and "x" in ln and "unsupported" in ln
    )  # max-autotune needs CUDA: shown, never timed
    assert line.count("x") >= 3
    assert cli(f"bench --table {pipeline['table']} --gpu cpu --anchors nope") == 2


def test_bench_does_not_time_the_reference_against_itself(pipeline, tmp_path, capsys) -> None:
    # The table holds smoke-1 and smoke-3, no buckets: smoke-2 has nothing serving it.
    assert cli(f"bench --table {pipeline['table']} --gpu cpu --cases smoke-2") == 2
    assert "--cases 'smoke-2' names no case" in capsys.readouterr().err
    assert cli(f"bench --table {pipeline['table']} --gpu cpu --cases smoke-1,smoke-2") == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("smoke-2")]
    assert line.split()[1] == "SKIP" and "no entry or bucket of the table serves" in line
    assert "over 1 cases" in out and "1 skipped" in out
    # A baseline that serves smoke-2: the row times the reference (the table has nothing
    # there) against the baseline's plan, the coverage the table lost.
    values: dict = {}
    exec(compile(pipeline["table"].read_text(), "t", "exec"), values)
    entries = dict(values["ENTRIES"])
    smoke1 = entries[(2, 16, 32, 2, 64, 2, True, "float32")]
    entries[(1, 256, 32, 2, 32, 1, True, "float32")] = dict(smoke1, case="smoke-2")
    base = tmp_path / "base.py"
    base.write_text(render_table("cpu", values["TABLE_VERSION"], values["PROVENANCE"], entries))
    table = pipeline["table"]
    assert cli(f"bench --table {table} --baseline {base} --gpu cpu --cases smoke-2") == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("smoke-2"))
    assert "SKIP" not in line and line.split()[1] == "PASS", out
    # A bucket for smoke-2 whose plan the CPU cannot run: a timed row (the reference
    # serves), as an entry's unsupported plan is, not a SKIP.
    bucket = {
        "dims": [32, 2, 32, 1, True, "float32"],
        "batch": [1, 1],
        "seq": [256, 256],
        "plan": {"attention": "sdpa_cudnn", "qkv": "packed"},
        "plan_hash": Plan.from_dict({"attention": "sdpa_cudnn", "qkv": "packed"}).hash,
        "from": "case smoke-1",
        "evidence": {"points": [{"batch": 1, "seq": 256}], "failed_elements": 0},
    }
    values = {}
    exec(compile(pipeline["table"].read_text(), "t", "exec"), values)
    bucketed = tmp_path / "bucketed.py"
    bucketed.write_text(
        render_table(
            "cpu", values["TABLE_VERSION"], values["PROVENANCE"], values["ENTRIES"], [bucket]
        )
    )
    assert cli(f"bench --table {bucketed} --gpu cpu --cases smoke-2") == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("smoke-2"))
    assert line.split()[1] == "PASS" and "its plan is unsupported here" in line
    # Neither serves it: refused, naming both.
    assert cli(f"bench --table {table} --baseline {table} --gpu cpu --cases smoke-2") == 2
    assert f"of {table} or {table} is for" in capsys.readouterr().err


def test_bench_serves_reads_entries_and_buckets() -> None:
    from autotune.core.cases import get_case
    from autotune.runtime.table import DispatchTable
    from autotune.tools.bench import serves

    case = get_case("smoke-2")  # batch 1, seq 256, dims (32, 2, 32, 1, causal)
    bucket = {"dims": [32, 2, 32, 1, True, "float32"], "batch": [1, 4], "seq": [128, 512]}
    table = DispatchTable("cpu", 1, {}, {}, "h", "t.py", buckets=(bucket,))
    assert serves(table, case)
    assert not serves(DispatchTable("cpu", 1, {}, {}, "h", "t.py"), case)
    other = dict(bucket, seq=[1024, 2048])
    assert not serves(DispatchTable("cpu", 1, {}, {}, "h", "t.py", buckets=(other,)), case)


def test_warm_start_seeds_a_new_study_with_other_studies_plans(pipeline, tmp_path) -> None:
    import shutil

    db = tmp_path / "warm.db"
    shutil.copy(pipeline["db"].removeprefix("sqlite:///"), db)
    url = f"sqlite:///{db}"
    assert (
        cli(
            f"study --gpu cpu --cases smoke-2 --n-trials 3 --storage {url} --quiet --warm-start cpu"
        )
        == 0
    )
    (name,) = [
        s.study_name
        for s in optuna.get_all_study_summaries(url)
        if s.study_name.startswith("cpu|1,256")
    ]
    trials = optuna.load_study(study_name=name, storage=url).get_trials()
    sources = [t.user_attrs.get("warm_start") for t in trials if t.user_attrs.get("warm_start")]
    assert sources and all(s.startswith("study cpu|") for s in sources)
    assert cli(f"study --gpu cpu --cases smoke-2 --storage {url} --warm-start nowhere") == 2


def test_report_has_bench_anchors_evidence_cost_figures_and_notes(
    pipeline, tmp_path, capsys
) -> None:
    csv = tmp_path / "bench.csv"
    assert (
        cli(
            f"bench --table {pipeline['table']} --gpu cpu --cases smoke-1 --anchors sdpa "
            f"--csv {csv}"
        )
        == 0
    )
    notes = tmp_path / "notes.md"
    notes.write_text("## Targets\n\nmissed by 3.7x, measured\n")
    out = tmp_path / "report"
    assert (
        cli(
            f"report --gpu cpu --storage {pipeline['db']} --table {pipeline['table']} "
            f"--bench {csv} --bench-before {csv} --bench-history {csv} {csv} --notes {notes} "
            f"--out {out}"
        )
        == 0
    )
    page = (out / "report.md").read_text()
    for section in (
        "## Provenance",
        "## Bench (official protocol)",
        "Anchors (sdpa)",
        "Table over the fastest passing anchor",
        "## Correctness evidence per entry",
        "## Knob importances",
        "## Tuning cost",
        "missed by 3.7x, measured",
        "## Against an earlier bench",
        "the table's medians x1.000 of the earlier run's",
        "## At the references of earlier benches",
    ):
        assert section in page, section
    for png in ("speedups.png", "pareto.png", "history.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The tuning cost counts trials as the study's own line does: measured, and free ones
    url = str(pipeline["db"])
    studies = [
        optuna.load_study(study_name=x.study_name, storage=url)
        for x in optuna.get_all_study_summaries(url)
    ]
    done = [t for st in studies for t in st.get_trials() if t.state.is_finished()]
    measured = sum(1 for t in done if t.state == optuna.trial.TrialState.COMPLETE and counts(t))
    cost = page.split("## Tuning cost")[1]
    assert re.search(r"\|\s*case\s*\|\s*measured\s*\|\s*free\s*\|\s*feasible", cost)
    assert f"over {measured} measured trials and {len(done) - measured} free ones" in cost
    from autotune.search.trials import is_feasible
    from autotune.tools.report import tuning_cost

    frame = tuning_cost(studies)
    feasible = sum(1 for t in done if is_feasible(t) and counts(t))  # as the study line
    assert frame["feasible"].sum() == feasible and (frame["feasible"] <= frame["measured"]).all()
    # Not measured on the CPU (peak memory): "-", never "nan" or "None" in a cell
    bench = page.split("## Bench (official protocol)")[1].split("\n\n")
    assert bench[2].startswith("The bench measured this table (content hash ")
    bench_rows = bench[3]
    assert bench_rows.count("|") > 20 and "| -" in bench_rows
    assert not re.search(r"\|\s*(nan|None)\s*(?=\|)", page), page
    assert cli(f"report --gpu cpu --storage {pipeline['db']} --notes /no/such.md --out {out}") == 2
    assert cli(f"report --gpu cpu --storage {pipeline['db']} --bench /no/b.csv --out {out}") == 2
    assert "--bench '/no/b.csv' does not exist" in capsys.readouterr().err


def _fast_bench(monkeypatch) -> None:
    import autotune.tools.bench as bench_mod
    from autotune.measure import TimingSettings

    fast = TimingSettings(warmup=2, rounds=3, reps=5)
    rest = bench_mod.bench_case.__defaults__[1:]
    monkeypatch.setattr(bench_mod.bench_case, "__defaults__", (fast, *rest))


def _edited(pipeline, tmp_path) -> Path:
    edited = tmp_path / "edited.py"
    text = pipeline["table"].read_text()
    edited.write_text(text.replace("'case': 'smoke-1'", "'case': 'smoke-9'"))
    return edited


def test_bench_of_an_edited_table_exits_1_saying_why_once(
    pipeline, tmp_path, capsys, monkeypatch
) -> None:
    _fast_bench(monkeypatch)
    edited = _edited(pipeline, tmp_path)
    assert cli(f"bench --table {edited} --gpu cpu --cases smoke-1") == 1
    captured = capsys.readouterr()
    assert (captured.out + captured.err).count("content hash mismatch") == 1
    assert cli(f"bench --table {edited} --gpu cpu --cases smoke-1,smoke-3 --allow-reference") == 0
    captured = capsys.readouterr()
    assert (captured.out + captured.err).count("content hash mismatch") == 1
    assert captured.out.count("reference (table refused)") == 2


def test_validate_of_an_edited_table_exits_1_and_never_says_holds(
    pipeline, tmp_path, capsys
) -> None:
    edited = _edited(pipeline, tmp_path)
    assert cli(f"validate --table {edited} --gpu cpu --quick") == 1
    out = capsys.readouterr().out
    assert out.count("content hash mismatch") == 1 and "nothing validated" in out
    assert cli(f"validate --table {edited} --gpu cpu --quick --allow-reference") == 0
    out = capsys.readouterr().out
    assert out.count("content hash mismatch") == 1
    assert not any(" holds " in line for line in out.splitlines() if line.startswith("case"))


def test_validate_writes_the_entries_verified_here_as_a_new_table(
    pipeline, tmp_path, capsys
) -> None:
    table = _table_with_entry(pipeline, tmp_path, {"attention": "sdpa_math", "qkv": "packed"})
    old = load_table(table)
    out = tmp_path / "here.py"
    code = cli(f"validate --table {table} --gpu cpu --quick --out {out}")
    printed = capsys.readouterr().out
    assert code == 0, printed
    new = load_table(out)
    assert new.usable and new.profile == "cpu"
    assert new.provenance["validated_from"]["content_hash"] == old.content_hash
    assert new.provenance["command"].startswith("autotune validate")
    key = (2, 16, 32, 2, 64, 2, True, "float32")
    entry = new.entries[key]
    holds = any(ln.startswith("case smoke-1") and " holds " in ln for ln in printed.splitlines())
    assert entry["admitted"] == holds  # admitted exactly when it held here
    if holds:
        assert entry["plan"] == {"attention": "sdpa_math", "qkv": "packed"}
    assert table.read_text() == (tmp_path / "cpu.py").read_text()  # the input untouched
    assert cli(f"validate --table {table} --gpu cpu --quick --out {table}") == 2


def test_validate_writes_another_profiles_table_as_this_profiles(
    pipeline, tmp_path, capsys
) -> None:
    """Session 49 on an H100: tables/h200.py validated there was written as profile 'h200',
    which buckets, unseen, report and plot on that H100 (profile h100) then refused. The
    new table is the profile's it was validated under."""
    from autotune.cli.common import check_table_profile

    values: dict = {}
    exec(compile(pipeline["table"].read_text(), "t", "exec"), values)
    foreign = tmp_path / "h100.py"
    foreign.write_text(
        render_table("h100", values["TABLE_VERSION"], values["PROVENANCE"], values["ENTRIES"])
    )
    assert load_table(foreign).profile == "h100"
    out = tmp_path / "here.py"
    code = cli(f"validate --table {foreign} --gpu cpu --quick --allow-reference --out {out}")
    printed = capsys.readouterr().out
    assert code == 0, printed
    new = load_table(out)
    assert new.usable and new.profile == "cpu", new.profile
    assert new.provenance["validated_from"]["table"] == str(foreign)
    check_table_profile(new, "cpu")  # what buckets, unseen, report and plot check


def test_validate_says_which_entries_it_wrote_as_the_reference_and_which_it_left_out(
    tmp_path, capsys
) -> None:
    """Session 49 printed '13 of 14 entries verified here; the others keep the reference'
    for a table with no case-14 entry at all (skipped with --no-oracle: left out)."""
    out = tmp_path / "here.py"
    code = cli(
        f"validate --table {ROOT / 'tables/h200.py'} --gpu cpu --cases 2,14 --no-oracle "
        f"--allow-missing --allow-reference --out {out}"
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert (
        "0 of 2 entries verified here; 1 written as the reference (not verified here); 1 "
        "left out (skipped or never run here: the new table has no entry for them)"
    ) in printed, printed
    new = load_table(out)
    assert [e["case"] for e in new.entries.values()] == ["2"]  # case 14: no entry
    assert not new.entries[next(iter(new.entries))]["admitted"]


def test_validate_refuses_an_out_it_would_replace_or_cannot_write_before_verifying(
    pipeline, tmp_path, capsys
) -> None:
    """The README's command on an H100 names tables/h100.py, which a study's export may
    already hold: validate never replaces a file, and says so before minutes of work."""
    table = pipeline["table"]
    existing = tmp_path / "h100.py"
    existing.write_text("# a study's export\n")
    assert cli(f"validate --table {table} --gpu cpu --quick --out {existing}") == 2
    captured = capsys.readouterr()
    err = captured.err
    assert f"--out '{existing}' exists" in err and "never replaces" in err, err
    assert "case smoke" not in captured.out  # refused before any entry was verified
    assert existing.read_text() == "# a study's export\n"
    assert cli(f"validate --table {table} --gpu cpu --quick --out {tmp_path}") == 2
    assert "is a folder" in capsys.readouterr().err


def test_validate_update_replaces_the_validated_cases_and_keeps_the_rest(
    pipeline, tmp_path, capsys
) -> None:
    """A long validation in parts (session 50: on an H100 the whole table with case 14 is
    past one device call): --update replaces only the validated cases' entries of this
    device's table at --out, keeps its other entries and its buckets, and numbers it on."""
    from autotune.ship.export import write_entries

    source = _table_with_entry(pipeline, tmp_path, {"attention": "sdpa_math", "qkv": "packed"})
    values: dict = {}
    exec(compile(pipeline["table"].read_text(), "t", "exec"), values)
    smoke1 = (2, 16, 32, 2, 64, 2, True, "float32")
    other = (8, 8, 16, 2, 16, 1, True, "float32")
    rows = {"attention": "sdpa_math", "qkv": "separate"}
    entries = dict(values["ENTRIES"])
    del entries[smoke1]  # added, as verified here or as the reference, however it times
    entries[other] = {
        "admitted": True,
        "case": "kept",
        "plan": rows,
        "plan_hash": Plan.from_dict(rows).hash,
        "evidence": {"speedup": 9.0},
    }
    bucket = {
        "dims": list(other[2:]),
        "batch": [1, 8],
        "seq": [8, 32],
        "plan": rows,
        "plan_hash": Plan.from_dict(rows).hash,
        "from": "case kept",
        "evidence": {"points": [{"batch": 1, "seq": 8}], "failed_elements": 0},
    }
    target = tmp_path / "target" / "cpu.py"
    target.parent.mkdir()
    _, version = write_entries(target, "cpu", values["PROVENANCE"], entries, [bucket])
    before = load_table(target)
    assert before.usable and len(before.buckets) == 1
    command = f"validate --table {source} --gpu cpu --quick --cases smoke-1 --out {target}"
    code = cli(command + " --update")
    printed = capsys.readouterr().out
    assert code == 0, printed
    after = load_table(target)
    assert after.usable and after.profile == "cpu" and after.version == version + 1, printed
    assert after.entries[smoke1]["evidence"]["reason"].startswith("validated here")  # added
    assert {k: after.entries[k] for k in entries} == dict(before.entries)  # the others
    assert list(after.buckets) == list(before.buckets)
    assert after.provenance["updated_from"]["version"] == version
    assert after.provenance["updated_from"]["provenance"] == dict(before.provenance)
    assert after.provenance["validated_from"]["table"] == str(source)
    last = printed.strip().splitlines()[-1]
    assert last.startswith(f"updated {target} (table version {version + 1}): 1 added"), last
    assert last.endswith(f"; {len(entries)} other entries kept as they are"), last
    # Refused before anything is verified, the target untouched: no --out, no file, another
    # profile's table, a table made on another stack, an existing --out without --update,
    # an edited table to re-issue.
    text = target.read_text()
    h200 = tmp_path / "h200.py"
    write_entries(h200, "h200", values["PROVENANCE"], entries)
    elsewhere = tmp_path / "elsewhere" / "cpu.py"
    elsewhere.parent.mkdir()
    stack = dict(values["PROVENANCE"], versions={"torch": "1.0.0", "triton": "1.0.0"})
    write_entries(elsewhere, "cpu", stack, entries)
    refusals = {
        f"validate --table {source} --gpu cpu --quick --update": "--update needs --out",
        command.replace(str(target), str(tmp_path / "none.py")) + " --update": "is not a file",
        command.replace(str(target), str(h200)) + " --update": "is profile 'h200''s table",
        command.replace(str(target), str(elsewhere)) + " --update": "the runtime refuses",
        command: "exists; validate writes a new table",
        f"validate --table {_edited(pipeline, tmp_path)} --gpu cpu --quick --allow-reference "
        f"--out {tmp_path / 'new.py'}": "fails its integrity check",
    }
    for line, why in refusals.items():
        assert cli(line) == 2, line
        captured = capsys.readouterr()
        assert why in captured.err and len(captured.err.strip().splitlines()) == 1, captured
        assert "case smoke" not in captured.out
    assert target.read_text() == text


def test_a_validate_cut_short_resumes_from_its_journal(
    pipeline, tmp_path, capsys, monkeypatch
) -> None:
    """On an H100 the whole table with case 14 validates in about 10 minutes, past one
    device call: a cut run keeps each finished check in OUT.validate.jsonl, and the same
    command again runs only the rest, then writes the table and removes the journal."""
    from autotune.tools import validate as v

    real = v.validate_entry
    calls: list[str] = []

    def cut_after_one(key, entry, *args, **kwargs):  # type: ignore[no-untyped-def]
        if calls:
            raise KeyboardInterrupt  # Ctrl-C, or the call's time limit, mid-validation
        calls.append(entry["case"])
        return real(key, entry, *args, **kwargs)

    monkeypatch.setattr(v, "validate_entry", cut_after_one)
    out = tmp_path / "here.py"
    command = f"validate --table {pipeline['table']} --gpu cpu --quick --out {out}"
    assert cli(command) == 130
    journal = tmp_path / "here.validate.jsonl"
    assert not out.exists() and len(journal.read_text().splitlines()) == 1
    (first,) = calls
    capsys.readouterr()

    def counted(key, entry, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(entry["case"])
        return real(key, entry, *args, **kwargs)

    monkeypatch.setattr(v, "validate_entry", counted)
    assert cli(command) == 0
    printed = capsys.readouterr().out
    assert f"1 checks recorded in {journal}: those of this run are not" in printed, printed
    (line,) = [ln for ln in printed.splitlines() if ln.startswith(f"case {first} ")]
    assert line.endswith(f"(as recorded in {journal})"), line
    assert len(calls) == 2 and calls[1] != first  # only the other entry ran
    assert load_table(out).usable and not journal.exists()
    # A record made under another stamp (other code, device, table) is verified again.
    out.unlink()
    journal.write_text('{"key": {"entry": []}, "result": {}, "stamp": {"code": "old"}}\n')
    assert cli(command) == 0
    assert "1 line(s) of" in capsys.readouterr().out and len(calls) == 4
    assert not journal.exists()
    # Another table's run under this code, cut short into the same OUT (an --update run),
    # keeps its records when this one ends; one under other code cannot resume: it goes.
    from autotune.ship.buckets import code_digest

    out.unlink()
    line = '{{"key": {{"entry": []}}, "result": {{}}, "stamp": {{"code": "{}", "table": "b"}}}}\n'
    other = line.format(code_digest())
    journal.write_text(other + line.format("old"))
    assert cli(command) == 0 and len(calls) == 6
    assert journal.read_text() == other


def test_a_validate_cut_after_writing_its_table_is_finished_by_the_same_command(
    pipeline, tmp_path, capsys, monkeypatch
) -> None:
    """A cut between writing the table and removing the journal (the call's time limit at
    that moment) left the journal beside the table, and the same command again was refused
    (--out exists). Now it reports from the journal, writes nothing and removes the journal;
    a journal with records newer than the table (a run cut mid-validation) is refused."""
    import os

    from autotune.core.files import Journal
    from autotune.tools import validate as v

    real_finish = Journal.finish

    def cut(self, keep=None):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(Journal, "finish", cut)
    out = tmp_path / "here.py"
    journal = tmp_path / "here.validate.jsonl"
    command = f"validate --table {pipeline['table']} --gpu cpu --quick --out {out}"
    assert cli(command) == 130
    text, records = out.read_text(), journal.read_text()
    assert load_table(out).usable and len(records.splitlines()) == 2
    monkeypatch.setattr(Journal, "finish", real_finish)
    capsys.readouterr()
    calls: list[str] = []
    monkeypatch.setattr(v, "validate_entry", lambda *a, **k: calls.append("ran"))
    # the same table, but records newer than it: not this run's table; refused as before
    os.utime(out, (1, 1))
    assert cli(command) == 2 and "exists; validate writes a new table" in capsys.readouterr().err
    assert journal.read_text() == records and not calls
    os.utime(out)  # now again
    assert cli(command) == 0
    printed = capsys.readouterr().out
    assert f"{out} already holds this run's table (version 1, written before" in printed
    assert not calls and out.read_text() == text and not journal.exists()
    # finished: the same command again is refused, as any existing --out is
    assert cli(command) == 2 and "exists; validate writes" in capsys.readouterr().err


def test_trials_store_constraints_where_the_dashboard_reads_them_and_knob_values(
    pipeline,
) -> None:
    from autotune.plan import KNOBS_BY_NAME

    url = str(pipeline["db"])
    for summary in optuna.get_all_study_summaries(url):
        study = optuna.load_study(study_name=summary.study_name, storage=url)
        for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
            listed = t.system_attrs["constraints"]  # what optuna-dashboard 0.21 reads
            assert listed == [t.constraints["correctness"], t.constraints["memory"]]
            for name, value in t.params.items():
                knob = name.split(" (", 1)[0]
                assert KNOBS_BY_NAME[knob].validate(value) == value, name
        best = study.best_trials
        assert best and all(all(v <= 0 for v in t.constraints.values()) for t in best)


def test_a_storage_that_does_not_exist_is_refused_not_created(tmp_path, capsys) -> None:
    typo = tmp_path / "typo.db"
    for command in ("export --gpu cpu", "plot --gpu cpu", "report --gpu cpu"):
        assert cli(f"{command} --storage sqlite:///{typo} --out {tmp_path / 'x'}") == 2
        assert "does not exist" in capsys.readouterr().err
        assert not typo.exists()


def test_a_new_storage_that_cannot_be_made_leaves_no_empty_file(tmp_path, monkeypatch) -> None:
    """study on a full disk left a 0-byte database behind."""
    import errno

    import autotune.search.trials as trials_mod

    new = tmp_path / "new.db"

    def full(url, *args, **kwargs):  # type: ignore[no-untyped-def]
        new.touch()  # SQLite makes the file, then cannot write its schema
        raise OSError(errno.ENOSPC, "database or disk is full")

    monkeypatch.setattr(trials_mod, "open_storage", full)
    assert cli(f"study --gpu cpu --cases smoke-1 --storage sqlite:///{new}") == 2
    assert not new.exists()


def test_a_warm_start_name_a_new_storage_cannot_hold_is_refused_before_the_file_is_made(
    tmp_path, capsys
) -> None:
    new = tmp_path / "fresh" / "new.db"
    assert cli(f"study --gpu cpu --cases smoke-1 --storage sqlite:///{new} --warm-start h200") == 2
    err = capsys.readouterr().err
    assert f"--warm-start 'h200': no table file, and {new} holds no studies yet" in err
    assert not new.exists()


def test_plot_writes_under_docs_results_and_labels_a_predicted_memory_axis(
    pipeline, tmp_path, monkeypatch
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autotune.tools.report import plot_pareto

    monkeypatch.chdir(tmp_path)
    assert cli(f"plot --gpu cpu --storage {pipeline['db']} --table {pipeline['table']}") == 0
    assert (tmp_path / "docs" / "results" / "cpu" / "pareto.png").is_file()
    (summary, *_) = optuna.get_all_study_summaries(str(pipeline["db"]))
    study = optuna.load_study(study_name=summary.study_name, storage=str(pipeline["db"]))
    fig, ax = plt.subplots()
    plot_pareto(ax, study)
    assert ax.get_xlabel().startswith("predicted peak memory")
    plt.close(fig)


def test_the_figure_marks_what_the_table_ships_for_each_study(pipeline) -> None:
    """A study's shape finds its table entry by case key; the trial it names is marked, and
    a shipped plan that was never a trial of the study (an anchor) is said in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autotune.search.trials import case_key_of
    from autotune.tools.report import Winner, plot_pareto, table_winners

    winners = table_winners(load_table(pipeline["table"]))
    url = str(pipeline["db"])
    studies = [
        optuna.load_study(study_name=s.study_name, storage=url)
        for s in optuna.get_all_study_summaries(url)
    ]
    assert {case_key_of(s) for s in studies} <= set(winners)
    study = studies[0]

    def legend(winner: Winner) -> list[str]:
        fig, ax = plt.subplots()
        plot_pareto(ax, study, winner)
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        plt.close(fig)
        assert labels and all("10^" not in t and "times" not in t for t in labels), labels
        return texts

    assert "exported winner" in legend(Winner(study.study_name, 0, "", "trial 0"))
    shipped_elsewhere = Winner("anchor sdpa", None, "000000000000", "anchor sdpa")
    assert "exported: anchor sdpa (not a trial here)" in legend(shipped_elsewhere)
    # A trial number of another study (an older space) is not this study's trial.
    assert "exported winner" not in legend(Winner("other", 0, "000000000000", "x"))


def test_compare_names_a_table_it_has_no_row_for(pipeline, capsys) -> None:
    """A table without a plan of its own for the case is said, not silently left out."""
    command = ["compare", "--gpu", "cpu", "--cases", "smoke-2", "--plan", '{"qkv": "packed"}']
    assert main([*command, "--table", str(pipeline["table"])]) == 0
    captured = capsys.readouterr()
    assert "ships no plan of its own for case smoke-2 (no entry): not a row" in captured.err
    assert [ln.split(" | ")[1] for ln in captured.out.splitlines()[2:]] == [
        "reference",
        "qkv=packed",
    ]


def test_bench_prints_each_case_once_in_aligned_columns(pipeline, capsys, monkeypatch) -> None:
    from autotune.tools.bench import ROW_HEADER, BenchRow, row_line

    _fast_bench(monkeypatch)
    assert cli(f"bench --table {pipeline['table']} --gpu cpu --cases smoke-1,smoke-3") == 0
    out = capsys.readouterr().out.splitlines()
    assert sum(ln.startswith("smoke-1 ") for ln in out) == 1
    assert sum(ln.startswith("smoke-3 ") for ln in out) == 1
    empty = row_line(BenchRow("smoke-1", "ROUTE", "PASS", 1.0, 0.5, 2.0, 0.01))
    assert empty.index("ROUTE") == ROW_HEADER.index("route")  # '-' MiB cells keep the width


def test_a_custom_shape_with_the_wrong_number_of_fields_says_so(capsys) -> None:
    assert cli("cases --cases 8,256,128,4,512") == 2
    err = capsys.readouterr().err
    assert "5 number(s)" in err and "has 6" in err


def test_sourcing_the_postgres_script_leaves_the_callers_shell_options_alone() -> None:
    script = ROOT / "scripts" / "postgres.sh"
    shell = f"set +eu; source {script} status >/dev/null 2>&1; case $- in *u*) exit 7;; esac"
    assert subprocess.run(["bash", "-c", shell], timeout=60).returncode == 0


def test_the_readme_main_job_keeps_the_committed_studies_db_clean() -> None:
    text = (ROOT / "README.md").read_text()
    job = text.split("Set up and run the main job", 1)[1].split("```", 2)[1]
    parts = [c.strip() for line in job.splitlines() for c in line.split("&&")]
    commands = [c for c in parts if c.startswith("autotune")]
    assert len(commands) == 4
    for command in commands:
        if command.split()[1] in ("study", "export", "plot"):
            assert "--storage sqlite:///out/" in command, command
        assert "tables/" not in command and "docs/" not in command, command


def test_workers_show_a_progress_bar(tmp_path, capsys) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    study = (
        f"study --gpu cpu --cases smoke-1 --n-trials 2 --workers 2 --no-isolation --storage {url}"
    )
    assert cli(study) == 0
    out = capsys.readouterr().out
    assert "case smoke-1" in out and "trial" in out and "2/2" in out
    assert "best=0.00x" not in out.split("2/2")[-1]  # the workers' trials are read back


def test_the_progress_bar_counts_only_the_trials_that_count_toward_n_trials() -> None:
    """A repeat of a measured plan, a forbidden or refused plan and a trial the harness
    failed cost no trial: the bar stops at its total and the feasible share stays <= 100%."""
    from optuna.trial import TrialState, create_trial

    from autotune.core.outcome import OutcomeKind
    from autotune.search import trials
    from autotune.search.study import StudyProgress

    def trial(kind: OutcomeKind, state=TrialState.COMPLETE, **extra: object):
        attrs = {trials.OUTCOME_KIND: kind.value, **extra}
        values = [0.5, 1.0] if state == TrialState.COMPLETE else None
        sys_attrs = {"constraints": [-1.0 if kind == OutcomeKind.PASSED else 1.0, -1.0]}
        return create_trial(state=state, values=values, user_attrs=attrs, system_attrs=sys_attrs)

    state = StudyProgress(total=3)
    for t in (
        trial(OutcomeKind.PASSED),
        trial(OutcomeKind.PASSED, **{trials.DUPLICATE_OF: 0}),
        trial(OutcomeKind.UNSUPPORTED, **{trials.FORBIDDEN: "qkv"}),
        trial(OutcomeKind.WRONG_RESULT),
        trial(OutcomeKind.CRASHED, state=TrialState.FAIL),
        trial(OutcomeKind.UNSUPPORTED, **{trials.UNSUPPORTED_HERE: "cuda"}),
    ):
        state.update(t)
    assert (state.finished, state.feasible, state.best_speedup) == (2, 1, 2.0)
    assert state.postfix() == {"best": "2.00x", "feasible": "50%"}


def test_a_study_short_of_its_trials_says_why_and_counts_its_free_trials() -> None:
    import optuna
    from optuna.trial import create_trial

    from autotune.core.cases import get_case
    from autotune.core.outcome import OutcomeKind
    from autotune.search import trials
    from autotune.search.study import StudyProgress, summarise_study

    study = optuna.create_study(directions=["minimize", "minimize"])
    passed = {trials.OUTCOME_KIND: OutcomeKind.PASSED.value}
    for attrs in (passed, passed, {**passed, trials.DUPLICATE_OF: 0}):
        study.add_trial(
            create_trial(values=[0.5, 1.0], user_attrs=attrs,
                         system_attrs={"constraints": [-1.0, -1.0]})
        )  # fmt: skip
    case = get_case("smoke-1")
    short = summarise_study(study, case, 2, 0.0, 5, "every plan of the search space is measured")
    assert (short.trials, short.measured, short.feasible) == (3, 2, 2)
    assert short.stopped == "every plan of the search space is measured"
    assert summarise_study(study, case, 2, 0.0, 2, "x").stopped == ""  # it has its trials
    assert (StudyProgress.of(study, 5).finished, StudyProgress.of(study, 5).feasible) == (2, 2)


def test_bench_csv_is_appended_per_case_and_a_rerun_skips_the_cases_it_holds(
    pipeline, tmp_path, capsys, monkeypatch
) -> None:
    from autotune.tools.bench import read_csv

    _fast_bench(monkeypatch)
    out = tmp_path / "bench.csv"
    table = pipeline["table"]
    assert cli(f"bench --table {table} --gpu cpu --cases smoke-1 --csv {out}") == 0
    (first,) = read_csv(out)
    assert first.case == "smoke-1" and first.table_hash == load_table(table).content_hash
    capsys.readouterr()
    assert cli(f"bench --table {table} --gpu cpu --cases smoke-1,smoke-3 --csv {out}") == 0
    printed = capsys.readouterr().out
    assert "(from the CSV)" in printed  # smoke-1 is not timed again
    rows = read_csv(out)
    assert [r.case for r in rows] == ["smoke-1", "smoke-3"] and rows[0] == first
    assert "geometric mean" in printed and "over 2 cases" in printed
    other = _table_with_entry(pipeline, tmp_path, {"attention": "sdpa_math"})
    assert cli(f"bench --table {other} --gpu cpu --cases smoke-1 --csv {out}") == 2
    assert "rows of another table" in capsys.readouterr().err


def test_a_bench_csv_resumes_only_under_the_options_its_rows_were_benched_with(
    pipeline, tmp_path, capsys, monkeypatch
) -> None:
    """Rows benched without anchors or a baseline were reused by a run that asked for them:
    its summaries over the anchors and the baseline then covered some cases only, unsaid."""
    import dataclasses

    from autotune.tools.bench import read_csv, write_csv

    _fast_bench(monkeypatch)
    out = tmp_path / "bench.csv"
    table = pipeline["table"]
    assert cli(f"bench --table {table} --gpu cpu --cases smoke-1 --csv {out}") == 0
    capsys.readouterr()
    for more in ("--anchors sdpa", f"--baseline {table}"):
        assert (
            cli(f"bench --table {table} --gpu cpu --cases smoke-1,smoke-3 --csv {out} {more}") == 2
        )
        err = capsys.readouterr().err
        assert "holds case smoke-1 benched with other options" in err and "--anchors" in err
    assert [r.case for r in read_csv(out)] == ["smoke-1"]  # nothing appended
    # a row written before the options column: judged by what it holds
    (row,) = read_csv(out)
    write_csv([dataclasses.replace(row, options="")], out)
    assert cli(f"bench --table {table} --gpu cpu --cases smoke-1 --csv {out} --anchors sdpa") == 2
    assert "anchors [], no baseline" in capsys.readouterr().err
    assert cli(f"bench --table {table} --gpu cpu --cases smoke-1 --csv {out}") == 0
    assert "(from the CSV)" in capsys.readouterr().out


def test_a_bench_csv_another_table_wrote_to_meanwhile_takes_no_row(tmp_path) -> None:
    """Two benches of two tables on one new CSV at once each checked the CSV only as it
    started, and both appended: rows of two tables, each case twice."""
    from autotune.tools.bench import BenchRow, append_csv, read_csv

    out = tmp_path / "bench.csv"
    append_csv(BenchRow("smoke-1", "r", "PASS", table_hash="a" * 64), out)
    with pytest.raises(ValueError, match="another bench wrote rows of table aaaaaaaaaaaaaaaa"):
        append_csv(BenchRow("smoke-2", "r", "PASS", table_hash="b" * 64), out)
    append_csv(BenchRow("smoke-2", "r", "PASS", table_hash="a" * 64), out)
    assert [r.case for r in read_csv(out)] == ["smoke-1", "smoke-2"]


def test_export_writes_nothing_over_an_out_that_changed_while_it_measured(
    pipeline, tmp_path, capsys, monkeypatch
) -> None:
    """--out was checked only as export started: a file written there meanwhile (a user's,
    or another export's table) was replaced, and two exports of some cases lost one."""
    import autotune.ship.export as export_mod

    out = _table_with_entry(pipeline, tmp_path, {"attention": "sdpa_math", "qkv": "packed"})
    real = export_mod.kept_buckets

    def meanwhile(*args, **kwargs):  # type: ignore[no-untyped-def]
        out.write_text("my own notes\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(export_mod, "kept_buckets", meanwhile)
    command = f"export --gpu cpu --storage {pipeline['db']} --out {out!s} --cases smoke-3"
    assert cli(command + " --in-process") == 2
    assert f"--out {out} changed while export ran" in capsys.readouterr().err
    assert out.read_text() == "my own notes\n"


def test_export_measures_the_anchors_and_never_ships_below_them(pipeline) -> None:
    entries = load_table(pipeline["table"]).entries.values()
    for entry in entries:
        notes = entry["evidence"]["finalists"]
        anchors = {n["anchor"]: n for n in notes if "anchor" in n}
        assert set(anchors) == {"sdpa", "sdpa+reduce-overhead"}, notes
        assert "speedup" in anchors["sdpa"]  # measured in the same run as the finalists
        assert "needs CUDA" in anchors["sdpa+reduce-overhead"]["dropped"]
        if entry["admitted"]:
            best_anchor = max(n.get("speedup", 0.0) for n in anchors.values())
            assert entry["evidence"]["speedup"] >= best_anchor, entry["evidence"]


def test_export_of_some_cases_keeps_the_other_entries_as_they_are(pipeline, tmp_path, capsys):
    out = _table_with_entry(pipeline, tmp_path, {"attention": "sdpa_math", "qkv": "packed"})
    smoke1 = (2, 16, 32, 2, 64, 2, True, "float32")
    before = load_table(out).entries
    assert cli(f"export --gpu cpu --storage {pipeline['db']} --out {out!s} --cases smoke-3") == 0
    assert "kept 1 entries" in capsys.readouterr().out
    after = load_table(out)
    assert after.usable and set(after.entries) == set(before)
    assert after.entries[smoke1] == before[smoke1]  # not selected again
    assert "--cases smoke-3" in after.provenance["command"]
    # where the kept entry was made stays on record, one step deep however many exports
    was = load_table(out)
    assert after.provenance["updated_from"]["content_hash"] != after.content_hash
    assert cli(f"export --gpu cpu --storage {pipeline['db']} --out {out!s} --cases smoke-3") == 0
    again = load_table(out).provenance["updated_from"]
    assert again["version"] == was.version and again["content_hash"] == was.content_hash
    older = again["provenance"]["updated_from"]
    assert set(older) == {"table", "version", "content_hash", "command"}, older
    assert older["version"] == was.version - 1 and "provenance" not in older
    assert cli(f"export --gpu cpu --storage {pipeline['db']} --out {out!s} --cases smoke-2") == 2
    assert "no studies of profile 'cpu' for case(s) smoke-2" in capsys.readouterr().err


def test_a_case_whose_selection_crashes_keeps_its_entry_and_the_others_ship(
    pipeline, tmp_path, capsys, monkeypatch
) -> None:
    out = _table_with_entry(pipeline, tmp_path, {"attention": "sdpa_math", "qkv": "packed"})
    before = load_table(out).entries
    monkeypatch.setenv("AUTOTUNE_INJECT_FAULT", "crash")  # every evaluation aborts its process
    assert cli(f"export --gpu cpu --storage {pipeline['db']} --out {out!s}") == 1
    captured = capsys.readouterr()
    assert captured.out.count("not selected again (its process ended with exit code") == 2
    assert "the table keeps its entry" in captured.out
    assert "rerun with --cases smoke-1,smoke-3" in captured.err
    after = load_table(out)
    assert after.usable and after.entries == before  # nothing lost, nothing half-written


def test_export_in_process_selects_the_same_cases(pipeline, tmp_path, capsys) -> None:
    out = tmp_path / "cpu.py"
    db = pipeline["db"]
    assert cli(f"export --gpu cpu --storage {db} --out {out!s} --in-process --cases smoke-3") == 0
    assert "case smoke-3:" in capsys.readouterr().out
    assert [e["case"] for e in load_table(out).entries.values()] == ["smoke-3"]


def test_busy_us_counts_overlapping_kernels_once() -> None:
    """The hot path's device time is the union of the kernels' spans: kernels that overlap
    (pdl: the next kernel's programs wait while the one before runs) count once, disjoint
    ones add, gaps between them count nothing."""
    from types import SimpleNamespace

    from autotune.tools.bench import busy_us

    def ev(start: float, end: float) -> SimpleNamespace:
        return SimpleNamespace(time_range=SimpleNamespace(start=start, end=end))

    assert busy_us([]) == 0.0
    assert busy_us([ev(0, 5), ev(10, 12)]) == 7.0  # apart: 5 + 2, the gap not counted
    assert busy_us([ev(4, 9), ev(0, 6)]) == 9.0  # overlapping, in any order: 0..9
    assert busy_us([ev(0, 10), ev(2, 3), ev(10, 11)]) == 11.0  # inside one; touching


def test_export_refuses_an_out_it_must_not_replace_before_measuring(
    pipeline, tmp_path, capsys
) -> None:
    """Another profile's table, an edited table (its values, or only a comment) and a file
    of your own are refused at once (exit 2, the file unchanged); --fresh replaces them. A
    directory or an unwritable place is refused before anything is measured."""
    db = pipeline["db"]
    values = read_table_file(pipeline["table"])
    h200 = tmp_path / "h200.py"
    h200.write_text(render_table("h200", 3, values["PROVENANCE"], values["ENTRIES"]))
    mine = tmp_path / "mine.py"
    mine.write_text("def important():\n    return 42\n")
    edited = tmp_path / "edited.py"
    edited.write_text(pipeline["table"].read_text().replace("'admitted': True", "'admitted': 1"))
    commented = tmp_path / "commented.py"  # values intact: a comment would be lost
    commented.write_text(pipeline["table"].read_text() + "# serves the canary fleet\n")
    cases = {
        h200: "is profile 'h200''s table (version 3)",
        mine: "is not an autotune table",
        edited: "fails its own checks",
        commented: "was edited by hand (its values are intact, but comments",
    }
    for path, why in cases.items():
        text = path.read_text()
        assert cli(f"export --gpu cpu --storage {db} --out {path!s} --cases smoke-3") == 2
        err = capsys.readouterr().err.strip()
        assert why in err and "--fresh" in err and len(err.splitlines()) == 1, err
        assert path.read_text() == text
    assert cli(f"export --gpu cpu --storage {db} --out {tmp_path!s}") == 2
    assert "is a folder; give a file path" in capsys.readouterr().err
    assert cli(f"export --gpu cpu --storage {db} --out ''") == 2
    assert "--out '': give a file path" in capsys.readouterr().err
    for bad in ("--finalists 0", "--max-memory -5", f"--verified {tmp_path / 'none.json'}"):
        assert cli(f"export --gpu cpu --storage {db} --out {mine!s} {bad}") == 2
        assert bad.split()[0] in capsys.readouterr().err
    assert cli(f"export --gpu cpu --storage {db} --out {mine!s} --cases smoke-3 --fresh") == 0
    assert [e["case"] for e in load_table(mine).entries.values()] == ["smoke-3"]


def test_a_full_disk_under_another_libraries_error_is_one_line(monkeypatch, capsys) -> None:
    """Optuna turns a storage failure inside a trial into ``AssertionError('Should not
    reach.')``; a full disk under any error is one line and exit 2; a plain bug keeps its
    traceback."""
    import errno

    import autotune.cli.info as info

    def storage_full(args) -> int:
        try:
            raise optuna.exceptions.StorageInternalError(
                "(sqlite3.OperationalError) database or disk is full"
            )
        except Exception:
            raise AssertionError("Should not reach.")  # noqa: B904 (as Optuna raises it)

    def disk_full(args) -> int:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/tmp/x/report.md")
        except OSError as exc:
            raise TypeError("a writer's own error") from exc

    def bug(args) -> int:
        try:
            raise OSError(errno.ENOENT, "No such file")
        except OSError:
            raise KeyError("a bug while handling it")  # noqa: B904

    monkeypatch.setattr(info, "cmd_cases", storage_full)
    assert main(["cases"]) == 2
    err = capsys.readouterr().err.strip()
    assert "storage error" in err and "database or disk is full" in err
    assert len(err.splitlines()) == 1
    monkeypatch.setattr(info, "cmd_cases", disk_full)
    assert main(["cases"]) == 2
    err = capsys.readouterr().err.strip()
    assert "No space left on device: '/tmp/x/report.md'" in err and len(err.splitlines()) == 1
    monkeypatch.setattr(info, "cmd_cases", bug)
    with pytest.raises(KeyError):
        main(["cases"])


def test_a_search_space_that_fails_to_import_is_named_in_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "space.py"
    bad.write_text("SPACE = {\n")
    json_bad = tmp_path / "space.json"
    json_bad.write_text("not json")
    for path, why in ((bad, "failed to import (line 1): SyntaxError"), (json_bad, "JSON")):
        assert main(["study", "--gpu", "cpu", "--cases", "smoke-1", "--space", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert str(path) in err and why in err and len(err.splitlines()) == 1, err


def test_a_signal_an_import_swallowed_still_ends_the_command(monkeypatch, capsys) -> None:
    """Ctrl-C (or SIGTERM) while a command imports torch: an import that swallows the
    KeyboardInterrupt does not make the run go on; the first guard ends it (exit 130)."""
    import contextlib
    import signal

    import autotune.cli.info as info
    from autotune.search.interrupt import InterruptGuard

    ran = []

    def command(args) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(KeyboardInterrupt):  # an import that swallows it
                signal.raise_signal(sig)
        with InterruptGuard():
            ran.append("trials")
        return 0

    monkeypatch.setattr(info, "cmd_cases", command)
    assert main(["cases"]) == 130
    assert ran == [] and "autotune cases: interrupted" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # put back after the command


def test_a_signal_while_the_process_tears_down_keeps_the_commands_status(tmp_path) -> None:
    """SIGTERM after the ``autotune`` program's command ended (storages closing, libraries
    unloading: up to a second) is ignored: the process exits with the command's own status,
    not killed by the signal (143, no line said). Sent from an exit handler, and later, from
    a finaliser during module cleanup (after the interpreter has reset Python handlers). A
    caller of ``main()`` keeps its own signal handling."""
    import signal
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import atexit, os, signal, sys, time

        def term():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)

        class Late:  # cleared with this module's globals, late in the teardown
            def __del__(self):
                term()

        late = Late()
        if sys.argv[2] == "atexit":
            atexit.register(term)
        from autotune.cli import entry
        sys.argv = ["autotune", "cases", "--cases", sys.argv[1]]
        entry()
        """
    )
    for cases, status in (("smoke-1", 0), ("nope", 2)):
        for when in ("atexit", "module cleanup"):
            done = subprocess.run(
                [sys.executable, "-c", script, cases, when],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == status, (cases, when, done.returncode, done.stderr[-500:])
    assert main(["cases", "--cases", "smoke-1"]) == 0
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # in-process calls put it back
    assert signal.getsignal(signal.SIGINT) == signal.default_int_handler


def test_the_study_line_names_the_file_a_relative_sqlite_url_resolves_to(
    tmp_path, monkeypatch, capsys
) -> None:
    """sqlite:///tmp/x.db (three slashes, a common slip for /tmp/x.db) is a path relative
    to the working folder: the first line says which file that is."""
    from autotune.cli.common import storage_text

    monkeypatch.chdir(tmp_path)
    assert storage_text("sqlite:////abs/x.db") == "sqlite:////abs/x.db"
    assert storage_text("postgresql://u@h/db") == "postgresql://u@h/db"
    assert cli("study --gpu cpu --cases smoke-1 --n-trials 1 --storage sqlite:///tmp/x.db") == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert f"storage sqlite:///tmp/x.db (the file {tmp_path / 'tmp' / 'x.db'})" in first
    assert (tmp_path / "tmp" / "x.db").is_file()


def test_an_immutable_output_file_is_refused_before_anything_is_measured(
    pipeline, tmp_path, capsys, monkeypatch
) -> None:
    """``chattr +i`` on the output: export measured for minutes, then failed on the
    replace with [Errno 1], also at its default path. Now one line up front, exit 2,
    nothing made (the storage not created). Append-only (+a) is refused too: a CSV is
    truncated at a torn row and a journal removed when done."""
    import subprocess

    from autotune.core import files

    out = tmp_path / "tables" / "cpu.py"
    out.parent.mkdir()
    out.write_text("# a user's file\n")
    db = tmp_path / "none.db"
    made = subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode == 0
    if not made:  # no chattr, or a file system without inode flags: as the ioctl reads it
        monkeypatch.setattr(files, "_inode_flags", lambda path: 0x10)
    try:
        assert cli(f"export --gpu cpu --storage sqlite:///{db} --out {out}") == 2
        monkeypatch.chdir(tmp_path)  # export's default --out: tables/cpu.py
        assert cli(f"export --gpu cpu --storage {pipeline['db']}") == 2
    finally:
        if made:
            subprocess.run(["chattr", "-i", str(out)], check=True)
    err = capsys.readouterr().err
    assert err.count("the file is immutable or append-only") == 2
    assert not db.exists() and out.read_text() == "# a user's file\n"
    monkeypatch.setattr(files, "_inode_flags", lambda path: 0x20)
    assert files.unchangeable_file(out, appended=True) is not None  # --csv, --journal
    assert files.unchangeable_file(out) is not None
    monkeypatch.setattr(files, "_inode_flags", lambda path: 0)
    assert files.unchangeable_file(out, appended=True) is None
    assert files.unchangeable_file(tmp_path / "absent.csv", appended=True) is None


def test_autotunes_own_warnings_are_one_line_others_keep_their_form(capsys, recwarn) -> None:
    """A torn bench CSV row's warning printed the file, line and source of the warn() call
    under it; the command's own warnings are now one line, like its errors."""
    import importlib
    import warnings

    main_mod = importlib.import_module("autotune.cli.main")
    with main_mod._own_warnings_in_one_line("bench"):
        from autotune.tools import bench

        warnings.warn_explicit("b.csv: 1 row(s) cut short", UserWarning, bench.__file__, 1)
        warnings.warn_explicit("elsewhere", UserWarning, "/somewhere/else.py", 7)
        warnings.filterwarnings("ignore", message="installed by a module the command imported")
    # the hook is set back, the filters stay (catch_warnings dropped Optuna's filter)
    assert warnings.showwarning is not None
    assert any(f[1] and f[1].pattern.startswith("installed by") for f in warnings.filters)
    err = capsys.readouterr().err
    assert "autotune bench: warning: b.csv: 1 row(s) cut short\n" in err
    assert "elsewhere" not in err  # passed on as it came (here: to pytest's recorder)
    assert [str(w.message) for w in recwarn] == ["elsewhere"]
    assert "bench.py" not in err
