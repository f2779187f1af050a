"""Whole-batch verification against the oracle (``autotune long``), side-by-side plan
comparison (``autotune compare``), host I/O and polynomial plans, budget weights."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from autotune.core.cases import get_case, parse_custom
from autotune.core.reference import check_outputs
from autotune.judge.fullbatch import Route, compare_sliced, merge_reports, verify_full_batch
from autotune.plan import REFERENCE_PLAN, Plan
from tests.conftest import cli

ROOT = Path(__file__).resolve().parents[2]
SMALL = "2,48,32,2,48,2,causal"


def test_every_route_is_checked_on_the_whole_batch_of_every_seed(cpu_device) -> None:
    case = parse_custom(SMALL)
    routes = [
        Route("library", Plan(attention="sdpa_math", qkv="packed"), cpu_device),
        Route("dense", REFERENCE_PLAN, cpu_device, dense_reference=True),
    ]
    logs: list[str] = []
    records = verify_full_batch(
        case, routes, seeds=(1234, 1235), oracle_chunks=(16, 8), log=logs.append
    )
    per_seed = case.config.batch_size * case.config.seq_len * case.config.d_model
    for rec in records:
        s = rec.summary()
        assert rec.passed and s["failed"] == 0 and s["elements"] == 2 * per_seed
        assert s["seeds"] == [1234, 1235] and s["max_abs_err"] < 1e-5
    assert sum("oracle" in line for line in logs) == 2  # one oracle output per seed


def test_each_seed_times_the_second_whole_batch_forward(cpu_device, monkeypatch) -> None:
    """The official protocol excludes first runs: per seed and route, one untimed forward
    of the whole batch (library plans for the chunk's batch, the allocator's blocks), then
    the timed one. The clock is the test's own: a first forward "takes" 100 s, the others
    1 s, so the record shows which one was timed whatever the machine's load."""
    import types

    import autotune.judge.fullbatch as longrun

    batches: list[int] = []
    clock = [0.0]
    monkeypatch.setattr(longrun, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    real = longrun.build_candidate

    def build(*args, **kwargs):  # type: ignore[no-untyped-def]
        model = real(*args, **kwargs)
        forward = model.forward

        def counted(x, mask):  # type: ignore[no-untyped-def]
            batches.append(x.shape[0])
            first = batches.count(x.shape[0]) == 1 and x.shape[0] > 1
            clock[0] += 100.0 if first else 1.0  # the first whole-batch forward: slow
            return forward(x, mask)

        object.__setattr__(model, "forward", counted)
        return model

    monkeypatch.setattr(longrun, "build_candidate", build)
    case = parse_custom(SMALL)
    (rec,) = verify_full_batch(
        case,
        [Route("library", Plan(attention="sdpa_math"), cpu_device)],
        seeds=(1234, 1235),
        oracle_chunks=(16, 8),
        log=lambda _: None,
    )
    b = case.config.batch_size
    assert batches == [1, b, b, b, b]  # the one-sequence warm-up, then two per seed
    assert rec.passed and [s["wall_s"] for s in rec.seeds] == [1.0, 1.0]


def test_scaled_inputs_reach_the_generator_and_the_record(cpu_device, monkeypatch) -> None:
    import autotune.judge.fullbatch as longrun

    scales: list[float] = []
    real = longrun.generate_random_case

    def generate(config, device, dtype, seed, padding_ratio=0.0, input_scale=1.0):  # type: ignore[no-untyped-def]
        scales.append(input_scale)
        return real(config, device, dtype, seed, padding_ratio, input_scale)

    monkeypatch.setattr(longrun, "generate_random_case", generate)
    case = parse_custom(SMALL)
    (rec,) = verify_full_batch(
        case,
        [Route("library", Plan(attention="sdpa_math"), cpu_device)],
        seeds=(1234,),
        oracle_chunks=(16, 8),
        log=lambda _: None,
        input_scale=4.0,
    )
    assert scales[-1] == 4.0 and rec.passed and rec.summary()["input_scale"] == 4.0


def test_scaled_scores_scale_the_q_projection_of_routes_and_oracle(cpu_device) -> None:
    """--score-scale multiplies every layer's q projection (weight and bias) and nothing
    else, in the weights the routes and the oracle share: an exact route still passes
    against the oracle, the record says so, and the scores really changed (the output
    differs from the official weights' output)."""
    from autotune.core.reference import build_reference
    from autotune.judge.fullbatch import scaled_scores

    case = parse_custom(SMALL)
    state = build_reference(case.config, "cpu").state_dict()
    scaled = scaled_scores(state, 3.0)
    assert scaled_scores(state, 1.0) is state
    for name, value in state.items():
        factor = 3.0 if ".attention.q_proj." in name else 1.0
        assert torch.equal(scaled[name], value * factor), name
    (rec,) = verify_full_batch(
        case,
        [Route("library", Plan(attention="sdpa_math"), cpu_device)],
        seeds=(1234,),
        oracle_chunks=(16, 8),
        log=lambda _: None,
        score_scale=3.0,
    )
    assert rec.passed and rec.summary()["score_scale"] == 3.0
    assert rec.summary()["input_scale"] == 1.0


@pytest.mark.parametrize("flag", ["--input-scale", "--score-scale"])
@pytest.mark.parametrize(
    ("value", "shown"),
    [("0", "0.0"), ("inf", "inf"), ("nan", "nan"), ("1e300", "1e+300"), ("1e20", "1e+20")],
)
def test_long_refuses_a_scale_that_is_not_a_positive_float32(flag, value, shown, capsys) -> None:
    """inf, 1e300 and 1e20 overflowed the reference's own float32 arithmetic: it then
    'failed' on every element, a verdict about nothing."""
    assert cli(f"long --case {SMALL} --force --route cpu=reference {flag} {value}") == 2
    err = capsys.readouterr().err
    assert f"{flag} takes a positive number up to 1e+06" in err and f"got {shown}" in err
    assert len(err.strip().splitlines()) == 1


def test_a_wrong_route_fails_with_its_count_and_the_others_still_run(
    cpu_device, monkeypatch
) -> None:
    import autotune.judge.fullbatch as longrun

    real = longrun.build_candidate

    def build(plan, config, device, state):  # type: ignore[no-untyped-def]
        model = real(plan, config, device, state)
        if plan.qkv == "packed":
            forward = model.forward
            model.forward = lambda x, m=None: forward(x, m) + 0.01  # type: ignore[method-assign]
        return model

    monkeypatch.setattr(longrun, "build_candidate", build)
    case = parse_custom(SMALL)
    wrong, right = verify_full_batch(
        case,
        [
            Route("wrong", Plan(qkv="packed"), cpu_device),
            Route("right", Plan(heads="strided"), cpu_device),
        ],
        seeds=(1234,),
        oracle_chunks=(16, 8),
        log=lambda _: None,
    )
    assert not wrong.passed and wrong.summary()["failed"] > 0
    assert right.passed


def test_sliced_comparison_is_the_rule_over_the_whole_tensor() -> None:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(5, 7, 3, generator=g)
    out = ref.clone()
    out[3, 2, 1] += 0.5
    out[1, 0, 0] += 0.3
    whole = check_outputs(out, ref)
    sliced = compare_sliced(out, ref, torch.device("cpu"), rows=2)
    assert sliced.n_failed == whole.n_failed == 2
    assert sliced.worst_index == whole.worst_index
    assert sliced.budget_share == pytest.approx(whole.budget_share)
    assert merge_reports([(0, check_outputs(ref, ref))]).passed


def test_long_cli_refuses_what_it_cannot_do(tmp_path, capsys) -> None:
    assert cli("long --case 14 --device cpu") == 2
    assert "at least one --route" in capsys.readouterr().err
    assert cli("long --case 14 --device cpu --route rtx5080=reference") == 2
    assert "needs a CUDA GPU to emulate" in capsys.readouterr().err
    assert cli(f"long --case {SMALL} --device cpu --route cpu=reference") == 2
    assert "--force" in capsys.readouterr().err
    assert cli("long --case 14 --device cpu --route cpu=reference --oracle-chunks 5") == 2
    assert "--oracle-chunks" in capsys.readouterr().err
    assert cli("long --case 14 --device cpu --route nosuchgpu=reference") == 2
    assert "unknown GPU profile" in capsys.readouterr().err


def test_long_cli_writes_the_record(tmp_path, capsys) -> None:
    out = tmp_path / "long.json"
    code = cli(
        f"long --case {SMALL} --device cpu --dense --seeds 1 --oracle-chunks 16,8 "
        f"--route cpu={json.dumps(json.dumps({'attention': 'sdpa_math'}))} --out {out}"
    )
    assert code == 0, capsys.readouterr()
    record = json.loads(out.read_text())
    assert record["oracle"] == {"query_chunk": 16, "key_chunk": 8, "batch_chunk": 1}
    assert [r["passed"] for r in record["routes"]] == [True, True]
    assert record["command"].startswith("autotune long --case")


def test_compare_prints_every_plan_against_the_reference(capsys) -> None:
    code = cli(
        "compare --cases smoke-1 --plan reference "
        + "--plan "
        + json.dumps(json.dumps({"attention": "sdpa_math", "qkv": "packed"}))
    )
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line for line in out.splitlines() if line.startswith("| smoke-1 |")]
    assert len(rows) == 3 and all(line.endswith("| pass |") for line in rows)


def test_host_io_needs_cuda_and_no_graph(cpu_device) -> None:
    from autotune.build import not_supported_reasons
    from autotune.measure import predict_peak_bytes

    case = parse_custom(SMALL)
    reasons = not_supported_reasons(Plan(host_io=True), case.config, cpu_device)
    assert any("host_io=true needs CUDA" in r for r in reasons)
    big = parse_custom("32,100000,1024,16,1024,2,causal")
    device_io = predict_peak_bytes(Plan(batch_chunk=1, attention="sdpa_efficient"), big.config)
    host_io = predict_peak_bytes(
        Plan(batch_chunk=1, attention="sdpa_efficient", host_io=True), big.config
    )
    # The whole batch's input and output (2 x 12.2 GiB) leave the device.
    assert device_io - host_io > 24 * 2**30 - 3 * 2**30


def test_a_capped_route_streams_from_host_only_when_its_batch_does_not_fit(cpu_device) -> None:
    from autotune.judge.fullbatch import _from_host

    cap = 16 * 2**30  # the rtx5080 profile's memory
    # Case 6's whole batch (10000 x 128 x 128 fp32, 0.6 GiB) fits a 16 GiB card: a capped
    # route runs it from the device, host_io or not (session 14 refused it for want of host_io).
    for case_id, fits in (("6", True), ("14", False)):
        c = get_case(case_id).config
        io_bytes = c.batch_size * c.seq_len * c.d_model * 4
        capped = Route("rtx5080", Plan(), cpu_device, cap)
        assert _from_host(capped, io_bytes) is not fits, case_id
        assert _from_host(Route("x", Plan(host_io=True), cpu_device, cap), io_bytes)
        assert not _from_host(Route("h200", Plan(), cpu_device), io_bytes)


def test_polynomial_plan_runs_and_reports_its_guard(cpu_device) -> None:
    from autotune.evaluate import evaluate_plan
    from autotune.judge.gate import CaseBench

    case = parse_custom("2,40,32,2,48,2,causal")
    bench = CaseBench(case, cpu_device)
    plan = Plan(
        attention="polynomial",
        attn_precision="ieee",
        mask="elide",
        poly_chunk=64,
        poly_guard=0.125,
        attn_block_m=16,
        attn_block_n=16,
    )
    outcome = evaluate_plan(bench, plan, timing=None)
    # Default nn.Linear weights give scaled scores far above 0.125: the guard refuses
    # the polynomial and the exact path passes the rule.
    assert outcome.passed, outcome.summary_line()
    assert "0/2 attention calls polynomial" in outcome.message
    noncausal = parse_custom("2,40,32,2,48,2,noncausal")
    from autotune.build import not_supported_reasons

    assert any("causal" in r for r in not_supported_reasons(plan, noncausal.config, cpu_device))


def test_poly_norm_reaches_the_kernel(cpu_device, monkeypatch) -> None:
    import kernels.polynomial as kp
    from autotune.evaluate import evaluate_plan
    from autotune.judge.gate import CaseBench

    seen: list[bool] = []
    real = kp.polynomial_attention

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs["row_norm"])
        return real(*args, **kwargs)

    monkeypatch.setattr(kp, "polynomial_attention", spy)
    bench = CaseBench(parse_custom("1,40,32,2,48,1,causal"), cpu_device)
    for norm in ("taylor", "row"):
        plan = Plan(
            attention="polynomial",
            attn_precision="ieee",
            mask="elide",
            poly_chunk=64,
            poly_guard=8.0,  # wide enough that the polynomial runs
            poly_norm=norm,
            attn_block_m=16,
            attn_block_n=16,
        )
        evaluate_plan(bench, plan, timing=None)  # judged; wide toy scores may fail the rule
    assert True in seen and False in seen
    assert Plan(poly_norm="row").hash != Plan().hash and "poly_norm" not in Plan().to_dict(
        full=False
    )


def test_poly_output_kernel_knobs_reach_the_kernel(cpu_device, monkeypatch) -> None:
    import kernels.polynomial as kp
    from autotune.build import not_supported_reasons
    from autotune.evaluate import evaluate_plan
    from autotune.judge.gate import CaseBench

    seen: list[dict] = []
    real = kp.polynomial_attention

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(kp, "polynomial_attention", spy)
    case = parse_custom("1,40,32,2,48,1,causal")
    bench = CaseBench(case, cpu_device)
    base = {
        "attention": "polynomial",
        "attn_precision": "ieee",
        "mask": "elide",
        "poly_chunk": 64,
        "poly_guard": 8.0,
        "attn_block_m": 16,
        "attn_block_n": 16,
    }
    plan = Plan(
        **base,
        poly_norm="row",
        poly_stats_first=True,
        poly_out_block_n=16,
        poly_out_stages=3,
        poly_prefix_flat=True,
        poly_prefix_stages=4,
    )
    assert not_supported_reasons(plan, case.config, cpu_device) == []
    evaluate_plan(bench, plan, timing=None)
    assert seen and all(
        k["stats_first"]
        and k["output_block_n"] == 16
        and k["output_stages"] == 3
        and k["prefix_flat"] is True
        and k["num_stages"] == 4
        for k in seen
    )
    # At their defaults the prefix scan's knobs leave the kernel's own defaults alone.
    seen.clear()
    evaluate_plan(bench, Plan(**base), timing=None)
    assert seen and all(
        not k.get("prefix_flat", False) and k.get("num_stages", 2) == 2 for k in seen
    )
    # stats_first orders the row weights' statistics: refused with the Taylor weights, and
    # the output kernel's knobs are refused under any other attention.
    taylor = Plan(**base, poly_stats_first=True)
    assert any("poly_norm=row" in r for r in not_supported_reasons(taylor, case.config, cpu_device))
    triton = Plan(attention="triton", attn_precision="ieee", poly_out_block_n=32)
    assert any(
        "poly_out_block_n=32 applies to attention=polynomial" in r
        for r in not_supported_reasons(triton, case.config, cpu_device)
    )
    flat = Plan(attention="triton", attn_precision="ieee", poly_prefix_flat=True)
    assert any(
        "poly_prefix_flat=True applies to attention=polynomial" in r
        for r in not_supported_reasons(flat, case.config, cpu_device)
    )
    # The new knobs at their defaults leave existing plans' identities alone: the table's
    # case-14 plan hashed 76c5ea25d7e2 before they existed (commit e4e7083).
    plan_file = ROOT / "docs/plans/c14_poly_row_g225_b4.json"
    shipped = Plan.from_dict(json.loads(plan_file.read_text()))
    assert shipped.hash == "76c5ea25d7e2"


def test_oracle_judged_timing_quotes_the_cached_oracle_time(cpu_device) -> None:
    from autotune.evaluate import evaluate_plan
    from autotune.judge.gate import CaseBench
    from autotune.measure import TimingSettings

    case = parse_custom("3,40,32,2,48,2,causal")
    bench = CaseBench(case, cpu_device, reference="oracle", oracle_batch=1)
    fast = TimingSettings(warmup=1, rounds=2, reps=2)
    a = evaluate_plan(bench, Plan(attention="sdpa_math"), timing=fast)
    b = evaluate_plan(bench, Plan(attention="sdpa_math", qkv="packed"), timing=fast)
    assert a.passed and b.passed
    assert a.timing.ref_median_ms == b.timing.ref_median_ms == bench.reference_ms()


def test_study_budget_is_weighted_by_regime() -> None:
    from autotune.core.cases import get_case
    from autotune.search.schedule import budget_weight as _budget_weight

    assert _budget_weight(get_case("2")) < _budget_weight(get_case("1"))
    assert _budget_weight(get_case("6")) > _budget_weight(get_case("1"))
    assert _budget_weight(get_case("14")) == max(
        _budget_weight(get_case(str(i))) for i in range(1, 15)
    )


def _oracle_only(monkeypatch) -> None:
    """Pretend the dense reference cannot run anything: CaseBench judges with the oracle."""
    import autotune.judge.gate as correctness

    monkeypatch.setattr(correctness, "dense_reference_fits", lambda case, device: False)


def test_export_verifies_an_oracle_judged_winner_on_the_whole_batch(
    monkeypatch, tmp_path, capsys
) -> None:
    from autotune.core.reference import ACCURACY_SEEDS
    from autotune.runtime import load_table

    _oracle_only(monkeypatch)
    # What is tested is the whole-batch evidence, not the timing gate: on a loaded 2-core
    # machine a tiny case's rounds disagree by 30% or more and the export would keep the
    # reference. Every passing finalist counts as a gain here (no noise, no minimum).
    import autotune.evaluate as evaluate
    import autotune.measure as measure
    import autotune.ship.select as select

    def quiet(*args, **kwargs):  # type: ignore[no-untyped-def]
        # No noise, and never slower than the reference: on a contended 2-core CI machine
        # a finalist measured 2.2% slower once and the reference kept the case (this test
        # is about the whole-batch evidence, not about timing).
        stats = measure.paired_stats(*args, **kwargs)
        return dataclasses.replace(stats, noise=0.0, speedup=max(stats.speedup, 1.5))

    monkeypatch.setattr(evaluate, "paired_stats", quiet)
    monkeypatch.setattr(select, "MIN_GAIN", -1.0)
    spec = "3,24,16,2,24,1,causal"
    db = f"sqlite:///{tmp_path / 's.db'}"
    assert (
        cli(
            f"study --gpu cpu --cases {spec} --n-trials 4 --storage {db} --quiet "
            "--no-isolation --oracle-batch 1"
        )
        == 0
    )
    table = tmp_path / "t.py"
    export = f"export --gpu cpu --storage {db} --out {table} --in-process --anchors none"
    assert cli(export) == 0  # in this process: the oracle-only patch holds there
    out = capsys.readouterr().out
    entry = next(iter(load_table(table).entries.values()))
    assert entry["admitted"], out
    full = entry["evidence"]["full_batch"]
    assert full["failed"] == 0 and full["seeds"] == list(ACCURACY_SEEDS)
    assert full["elements"] == 5 * 3 * 24 * 16  # every sequence, not the oracle subset
    assert full["source"] == "verified by this export"
    assert "whole batch verified" in entry["evidence"]["reason"]

    # A record from 'autotune long' for the same plan is used instead of running again;
    # one that failed keeps the reference.
    import optuna

    hashes = {
        t.user_attrs.get("plan_hash")
        for s in optuna.get_all_study_summaries(db)
        for t in optuna.load_study(study_name=s.study_name, storage=db).trials
    }
    assert entry["plan_hash"] in hashes  # re-selection may pick any of them: all failed
    record = {
        "command": "autotune long ...",
        "commit": "abc",
        "oracle": {"query_chunk": 8, "key_chunk": 8, "batch_chunk": 1},
        "routes": [
            {
                "case": entry["case"],
                "plan_hash": h,
                "capacity_bytes": None,
                "seeds": list(ACCURACY_SEEDS),
                "passed": False,
                "error": "",
                "failed": 7,
                "elements": 5760,
            }
            for h in sorted(hashes)
        ],
    }
    # A record of scaled inputs or scores (stress tests) is no evidence: the export
    # verifies itself.
    for stress in ("input_scale", "score_scale"):
        scaled = tmp_path / f"{stress}.json"
        scaled.write_text(
            json.dumps(record | {"routes": [r | {stress: 2.0} for r in record["routes"]]})
        )
        assert cli(f"{export} --fresh --verified {scaled}") == 0
        entry = next(iter(load_table(table).entries.values()))
        assert entry["admitted"] and entry["evidence"]["full_batch"]["source"] == (
            "verified by this export"
        ), stress
    rec = tmp_path / "long.json"
    rec.write_text(json.dumps(record))
    assert cli(f"{export} --fresh --verified {rec}") == 0
    entry = next(iter(load_table(table).entries.values()))
    assert not entry["admitted"]
    assert "failed whole-batch verification" in entry["evidence"]["reason"]
    assert str(rec) in entry["evidence"]["full_batch"]["source"]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mask_kind", ["none", "right", "general"])
def test_query_prefix_chunks_keep_the_reference_arithmetic(cpu_device, causal, mask_kind) -> None:
    from autotune.build import build_candidate, not_supported_reasons
    from autotune.core.reference import (
        ReferenceTransformer,
        generate_random_case,
        official_settings,
    )
    from autotune.measure import predict_peak_bytes

    spec = "3,37,24,3,40,2," + ("causal" if causal else "noncausal")
    config = parse_custom(spec).config
    torch.manual_seed(3)
    ref = ReferenceTransformer(config).eval()
    plan = Plan(query_chunk=8)
    model = build_candidate(plan, config, cpu_device, ref.state_dict())
    x, mask = generate_random_case(
        config, "cpu", torch.float32, 4, 0.3 if mask_kind != "none" else 0
    )
    if mask_kind == "general":
        mask = mask.flip(1)  # left padding: a general mask
        x = x.masked_fill(~mask[..., None], 0.0)
    with official_settings(), torch.inference_mode():
        report = check_outputs(model(x, mask), ref(x, mask))
    assert report.passed and report.max_abs_err < 1e-5, report.summary()
    big = parse_custom("1,100000,1024,16,1024,2,causal").config
    assert predict_peak_bytes(Plan(query_chunk=1024), big) < predict_peak_bytes(Plan(), big) / 50
    reasons = not_supported_reasons(Plan(attention="sdpa_math", query_chunk=8), config, cpu_device)
    assert any("query_chunk=8 applies to attention=reference" in r for r in reasons)


@dataclasses.dataclass
class _Winner:
    plan: Plan
    admitted: bool = True
    reason: str = "fastest on the subset"
    trial: int | None = 3


def _route(plan: Plan, walls: list[float], passed: bool = True) -> dict:
    from autotune.core.reference import ACCURACY_SEEDS

    return {
        "case": "14",
        "plan": plan.to_dict(),
        "plan_hash": plan.hash,
        "capacity_bytes": None,
        "seeds": list(ACCURACY_SEEDS),
        "passed": passed,
        "error": "",
        "median_wall_s": sorted(walls)[len(walls) // 2],
        "wall_s": walls,
    }


def test_the_whole_batch_record_picks_the_knobs_a_subset_cannot_rank(tmp_path) -> None:
    from types import SimpleNamespace

    from autotune.judge.fullbatch import whole_batch_choice

    base = Plan(attention="polynomial", poly_guard=2.25, batch_chunk=1)
    b2, b4 = base.replace(batch_chunk=2), base.replace(batch_chunk=4)
    other = base.replace(poly_guard=2.0, batch_chunk=4)  # another knob differs: not chosen
    wrong = base.replace(batch_chunk=8)  # fastest, but failed
    routes = [
        _route(base, [1.52, 1.523, 1.53]),
        _route(b2, [1.42, 1.421, 1.43]),
        _route(b4, [1.40, 1.401, 1.405]),
        _route(other, [1.0, 1.0, 1.0]),
        _route(wrong, [0.9, 0.9, 0.9], passed=False),
    ]
    rec = tmp_path / "long.json"
    rec.write_text(json.dumps({"command": "autotune long", "commit": "abc", "routes": routes}))
    sel = SimpleNamespace(emulated=False, capacity_bytes=None)
    case = get_case("14")
    chosen = whole_batch_choice(_Winner(base), case, sel, str(rec), log=lambda _: None)
    assert chosen.plan == b4 and chosen.trial is None
    assert "batch_chunk=4 from the whole-batch record: 1.401 s against 1.523 s" in chosen.reason
    # batch_streams is the other such knob: taken with the chunk it was timed at
    streamed = b4.replace(batch_streams=2)
    rec.write_text(json.dumps({"routes": [*routes, _route(streamed, [1.36, 1.362, 1.365])]}))
    chosen = whole_batch_choice(_Winner(base), case, sel, str(rec), log=lambda _: None)
    assert chosen.plan == streamed
    assert "batch_chunk=4, batch_streams=2 from the whole-batch record: 1.362 s" in chosen.reason
    rec.write_text(json.dumps({"command": "autotune long", "commit": "abc", "routes": routes}))
    # Not in the record (nothing timed beside it), no record, not admitted: as it is.
    alone = base.replace(poly_exact_prefix=1024)
    for winner, path in ((_Winner(alone), str(rec)), (_Winner(base), None)):
        assert whole_batch_choice(winner, case, sel, path, log=print) == winner
    assert whole_batch_choice(_Winner(base, admitted=False), case, sel, str(rec)).plan == base
    # Over the memory cap: the next fastest within it; the winner listed twice, or a route
    # of a knob this code does not know, changes nothing.
    routes[2]["peak_memory_bytes"] = 40 << 30
    rec.write_text(json.dumps({"routes": routes}))
    capped = whole_batch_choice(_Winner(base), case, sel, str(rec), max_memory=30 << 30)
    assert capped.plan == b2
    twice = [*routes, _route(base, [1.30, 1.30, 1.30]), dict(routes[1], plan={"nope": 1})]
    rec.write_text(json.dumps({"routes": twice}))
    assert whole_batch_choice(_Winner(base), case, sel, str(rec)) == _Winner(base)
    # A gain within the seeds' spread, or under 2%, is noise: the winner stays.
    near = [_route(base, [1.40, 1.40, 1.401]), _route(b4, [1.39, 1.39, 1.39])]
    rec.write_text(json.dumps({"routes": near}))
    assert whole_batch_choice(_Winner(base), case, sel, str(rec)).plan == base
    routes[0]["wall_s"] = [1.2, 1.523, 1.9]
    rec.write_text(json.dumps({"routes": routes}))
    assert whole_batch_choice(_Winner(base), case, sel, str(rec)).plan == base


def test_long_refuses_a_batch_host_memory_cannot_hold(monkeypatch, capsys) -> None:
    """Case 14 on the CPU wants its input, the oracle's output and a route's output in host
    memory (12.2 GiB each): refused before anything is allocated, in one line, exit 2 (it
    ran until the kernel's out-of-memory killer ended it)."""
    import autotune.core.device as device_mod

    monkeypatch.setattr(device_mod, "host_memory", lambda: 24 * 2**30)
    assert cli("long --case 14 --route cpu=reference --seeds 1 --device cpu") == 2
    err = capsys.readouterr().err
    assert "case 14's whole batch needs 36.6 GiB of host memory at least" in err
    assert "this machine has 24.0 GiB" in err


def test_long_cli_prints_a_route_that_could_not_build_with_its_reason(tmp_path, capsys) -> None:
    """A route the device cannot build (cuDNN on the CPU) gets its FAIL line with the
    reason, beside the route that ran: no traceback from its missing numbers."""
    out = tmp_path / "long.json"
    code = cli(
        f"long --case {SMALL} --force --device cpu --seeds 1 --oracle-chunks 16,8 "
        f"--route cpu={json.dumps(json.dumps({'attention': 'sdpa_math'}))} "
        f"--route cpu={json.dumps(json.dumps({'attention': 'sdpa_cudnn'}))} --out {out}"
    )
    printed = capsys.readouterr().out
    assert code == 1, printed  # a route failed
    fail = [line for line in printed.splitlines() if line.startswith("FAIL")]
    assert len(fail) == 1 and "attention=sdpa_cudnn needs CUDA" in fail[0], printed
    assert "max abs err -, worst - of the allowance" in fail[0]
    assert [r["passed"] for r in json.loads(out.read_text())["routes"]] == [True, False]
