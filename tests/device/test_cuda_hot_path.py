"""The steady-state call path on a CUDA device (skipped without one; on the GPU machine:
``TRITON_INTERPRET=0 python3 -m pytest tests/device``).

- A captured forward bound to the caller's input addresses reads their current contents.
- Outputs the caller holds are never overwritten by later calls.
- A fused layer's graph stores its output into the ring buffer itself (no copy).
- A candidate with captured graphs (or a compiled core) pickles; its copy captures its own.
- Every entry of every table made for this device runs its steady-state calls with no
  host synchronisation (``torch.cuda.set_sync_debug_mode("error")``), on the same input
  again (the bound graph) and on a fresh one (copied in); except a plan that reads the mask
  on the host where the oracle judges (case 14), which the export allows there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.build import build_candidate
from autotune.core.cases import OFFICIAL_CASES
from autotune.core.device import detect_device
from autotune.core.reference import (
    TransformerConfig,
    build_reference,
    check_outputs,
    generate_random_case,
)
from autotune.judge.gate import dense_reference_fits
from autotune.plan import Plan
from autotune.runtime import DispatchedTransformer, compatibility_problems, load_table, serving

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROOT = Path(__file__).resolve().parents[2]
CFG = TransformerConfig(
    batch_size=4, seq_len=64, d_model=64, num_heads=4, ffn_dim=128, num_layers=2, causal=True
)
GRAPHED = Plan(attention="sdpa_efficient", heads="strided", qkv="packed", cuda_graph=True)
FUSED_ROWS = Plan(
    attention="triton",
    fused_layer="rows",
    attn_precision="fp16",
    gemm_precision="fp16",
    attn_block_m=16,
    attn_block_n=16,
    row_block=16,
    cuda_graph=True,
)


def _pair(plan: Plan = GRAPHED, config: TransformerConfig = CFG):
    ref = build_reference(config, "cuda")
    cand = build_candidate(plan, config, detect_device("cuda"), ref.state_dict())
    return ref, cand


def _inputs(seed: int, padding: float = 0.3):
    return generate_random_case(CFG, "cuda", seed=seed, padding_ratio=padding)


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    report = check_outputs(got, want)
    assert report.passed, report.summary()


def test_bound_graph_reads_the_current_contents_of_the_callers_buffers():
    ref, cand = _pair()
    x, mask = _inputs(1)
    with serving():
        first = cand(x, mask)  # copied into the graph's buffers
        second = cand(x, mask)  # the same addresses again: graphs bound to them
        (captured,) = cand._graphs.values()
        assert captured.direct == (x.data_ptr(), mask.data_ptr())
        x2, mask2 = _inputs(2)
        x.copy_(x2)  # the serving loop refills its buffers in place
        mask.copy_(mask2)
        third = cand(x, mask)
        _assert_close(third, ref(x2, mask2))
        x1, mask1 = _inputs(1)
        _assert_close(first, ref(x1, mask1))
        _assert_close(second, ref(x1, mask1))


def test_held_outputs_are_never_overwritten():
    ref, cand = _pair()
    seeds = range(10, 16)
    with serving():
        held = [cand(*_inputs(s)) for s in seeds]  # more outputs held than ring buffers
        x, mask = _inputs(99)
        for _ in range(4):  # and more calls after, bound and not
            cand(x, mask)
        views = [h[0] for h in held]  # a view alone also holds a buffer
        del held
        later = [cand(*_inputs(s + 100)) for s in seeds]
        for s, v in zip(seeds, views, strict=True):
            _assert_close(v, ref(*_inputs(s))[0])
        for s, y in zip(seeds, later, strict=True):
            _assert_close(y, ref(*_inputs(s + 100)))


def test_a_loop_that_drops_its_outputs_reuses_one_buffer():
    _, cand = _pair()
    x, mask = _inputs(3)
    with serving():
        for _ in range(6):
            cand(x, mask)
        (captured,) = cand._graphs.values()
        assert captured.slots[0] is not None and captured.slots[1] is None


def test_a_fused_layer_graph_stores_into_the_ring_buffer_without_a_copy():
    """The ring buffer is handed to the fused layers inside the capture: a steady replay
    runs the layer kernels and no device copy of the output."""
    from torch.profiler import ProfilerActivity, profile

    ref, cand = _pair(FUSED_ROWS)
    x, mask = _inputs(5)
    with serving():
        for _ in range(3):
            cand(x, mask)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            y = cand(x, mask)
            torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    names = [e.name for e in prof.events() if e.device_type == cuda]
    assert any("rows_kernel" in n for n in names), names
    assert not any(n.lower().startswith("memcpy") for n in names), names
    _assert_close(y, ref(x, mask))


@pytest.mark.parametrize(
    "plan",
    [
        GRAPHED,  # packed QKV: a copy of three weights
        FUSED_ROWS,  # fp16 copies of every matrix
    ],
    ids=["packed", "fused-rows-fp16"],
)
def test_an_in_place_edit_after_capture_is_served_without_refresh(plan: Plan) -> None:
    """A captured graph reads the plan's derived weights: with ``watch_edits`` on, after an
    edit of a parameter in place, the next call remakes them and captures again."""
    ref, cand = _pair(plan)
    cand.watch_edits = True
    x, mask = _inputs(7)
    with serving():
        for _ in range(3):
            cand(x, mask)
        before = cand._graphs.copy()
        with torch.no_grad():
            for module in (cand.layers[0].attention.k_proj, cand.layers[1].ffn_in):
                module.weight.mul_(1.25)
        ref.load_state_dict(cand.state_dict())
        y = cand(x, mask)
        assert cand._graphs and all(
            g is not before.get(k) for k, g in cand._graphs.items()
        )  # captured again
        _assert_close(y, ref(x, mask))
        _assert_close(cand(x, mask), ref(x, mask))


@pytest.mark.parametrize(
    "plan",
    [GRAPHED, FUSED_ROWS, Plan(attention="sdpa_efficient", compile="reduce-overhead")],
    ids=["graphed", "fused-rows", "compiled"],
)
def test_a_candidate_with_captured_graphs_pickles_and_its_copy_captures_its_own(
    plan: Plan,
) -> None:
    import pickle

    ref, cand = _pair(plan)
    x, mask = _inputs(11)
    with serving():
        for _ in range(3):
            want = cand(x, mask)
        copy = pickle.loads(pickle.dumps(cand))
        assert not copy._graphs
        for _ in range(3):
            _assert_close(copy(x, mask), ref(x, mask))
        _assert_close(cand(x, mask), want)


def _shipped_entries():
    if not torch.cuda.is_available():
        return
    device = detect_device("cuda")
    by_key = {c.key.as_tuple(): c for c in OFFICIAL_CASES}
    for path in sorted((ROOT / "tables").glob("*.py")):
        table = load_table(path)
        if table.problems or compatibility_problems(table, device):
            continue
        for key, entry in table.entries.items():
            if entry.get("admitted") and tuple(key) in by_key:
                yield pytest.param(
                    path,
                    by_key[tuple(key)],
                    Plan.from_dict(entry["plan"]),
                    id=f"{path.stem}-case{entry['case']}",
                )


@pytest.mark.parametrize(
    ("path", "case", "plan"), list(_shipped_entries()) or [pytest.param(None, None, None)]
)
def test_shipped_entries_are_free_of_host_synchronisation(path, case, plan):
    if path is None:
        pytest.skip("no table in tables/ is made for this device")
    if plan.reads_mask_on_host and not dense_reference_fits(case, detect_device("cuda")):
        # The export's rule (autotune/ship/select.py): where the oracle judges (case 14, a
        # forward of seconds, streamed, never graphed) a mask read per call is allowed.
        pytest.skip("an oracle-judged shape's plan that reads the mask on the host: allowed")
    model = DispatchedTransformer(case.config, table=path)
    model.load_state_dict(build_reference(case.config, "cpu").state_dict())
    model = model.cuda().eval()
    x, mask = generate_random_case(case.config, "cuda", seed=7)
    fresh = [generate_random_case(case.config, "cuda", seed=8 + i) for i in range(3)]
    with serving():
        route = model.explain(x, mask)
        assert route.plan is not None, str(route)
        for _ in range(3):  # first calls: capture, compile, bind
            model(x, mask)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                model(x, mask)
            for fx, fm in fresh:
                model(fx, fm)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()


def _shipped_buckets():
    if not torch.cuda.is_available():
        return
    device = detect_device("cuda")
    for path in sorted((ROOT / "tables").glob("*.py")):
        table = load_table(path)
        if table.problems or compatibility_problems(table, device):
            continue
        for i, bucket in enumerate(table.buckets):
            yield pytest.param(path, dict(bucket), id=f"{path.stem}-bucket{i}")


@pytest.mark.parametrize(("path", "bucket"), list(_shipped_buckets()) or [pytest.param(None, None)])
def test_bucket_plans_serve_an_unseen_shape_correctly_and_sync_free(path, bucket):
    """A shape strictly inside each bucket (not a tuned key): served by the bucket's plan,
    within the rule on a padded input, and its steady calls free of host synchronisation."""
    if path is None:
        pytest.skip("no table in tables/ with buckets is made for this device")
    (blo, bhi), (slo, shi) = bucket["batch"], bucket["seq"]
    d_model, heads, ffn, layers, causal = bucket["dims"][:5]
    batch, seq = max(blo, min(bhi, (blo + bhi) // 3 + 1)), max(slo, min(shi, slo + 7))
    config = TransformerConfig(batch, seq, d_model, heads, ffn, layers, causal=bool(causal))
    model = DispatchedTransformer(config, table=path)
    ref = build_reference(config, "cuda")
    model.load_state_dict(ref.state_dict())
    model = model.cuda().eval()
    x, mask = generate_random_case(config, "cuda", seed=11, padding_ratio=0.3)
    with serving():
        route = model.explain(x, mask)
        assert route.plan is not None and "bucket" in route.source, str(route)
        _assert_close(model(x, mask), ref(x, mask))
        for _ in range(2):  # capture, bind to these addresses
            model(x, mask)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                model(x, mask)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()


def test_evaluation_records_each_passing_candidates_host_time_per_call():
    """On CUDA every timed candidate's outcome carries its host milliseconds a call (what
    export ranks finalists by, with the host slower); the value itself is not asserted."""
    import math

    from autotune.core.cases import get_case
    from autotune.evaluate import evaluate_many
    from autotune.judge.gate import CaseBench
    from autotune.measure import TimingSettings

    bench = CaseBench(get_case("smoke-1"), detect_device("cuda"))
    timing = TimingSettings(warmup=2, rounds=2, reps=5)
    eager = Plan(attention="sdpa_efficient", heads="strided", qkv="packed")
    outcomes = evaluate_many(bench, [GRAPHED, eager], timing=timing, prune=False)
    for outcome in outcomes:
        assert outcome.passed, outcome.message
        host = outcome.host_ms_per_call
        assert host is not None and math.isfinite(host) and host > 0
    bench.release()


def test_eager_launch_probe_measures_host_time_per_launch() -> None:
    """``eager_launch_us``: host microseconds per eager launch, a positive figure well
    under a millisecond on any working machine, and the device idle afterwards."""
    from autotune.measure import eager_launch_us

    value = eager_launch_us(launches=50, rounds=3)
    assert 0.0 < value < 1000.0
    assert torch.cuda.current_stream().query()


def test_threads_sharing_a_graphed_module_each_get_their_own_inputs_forward():
    """Two threads call one captured forward with inputs at fresh addresses (copied into
    the graph's buffers each call): a call's staging and replay are one step, so neither
    thread's replay reads the other's inputs, and held outputs stay theirs."""
    import threading

    ref, cand = _pair()
    inputs = {t: [_inputs(100 * t + i) for i in range(12)] for t in (1, 2)}
    outs: dict[int, list[torch.Tensor]] = {1: [], 2: []}
    start = threading.Barrier(2)

    def serve(t: int) -> None:
        start.wait(30)
        with serving():
            for _ in range(5):
                for x, mask in inputs[t]:
                    outs[t].append(cand(x.clone(), mask.clone()))  # never the same address
            torch.cuda.current_stream().synchronize()

    with serving():
        cand(*_inputs(0))  # captured before the threads start
    threads = [threading.Thread(target=serve, args=(t,)) for t in (1, 2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    with serving():
        for t in (1, 2):
            assert len(outs[t]) == 60
            for i, got in enumerate(outs[t]):
                _assert_close(got, ref(*inputs[t][i % 12]))
