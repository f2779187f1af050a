"""``batch_streams``: batch chunks spread over CUDA streams give the one-stream output bit
for bit, pass the rule against the reference, and leave earlier outputs alone (skipped
without a CUDA device; on the GPU machine: ``python3 -m pytest tests/device``)."""

from __future__ import annotations

import pytest
import torch

from autotune.build import build_candidate
from autotune.core.device import detect_device
from autotune.core.reference import (
    TransformerConfig,
    build_reference,
    check_outputs,
    generate_random_case,
)
from autotune.plan import Plan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# 7 sequences in chunks of 2: four chunks, the last one short, over 3 streams
CFG = TransformerConfig(
    batch_size=7, seq_len=96, d_model=64, num_heads=4, ffn_dim=128, num_layers=2, causal=True
)
PLAN = Plan(attention="sdpa_efficient", heads="strided", qkv="packed", batch_chunk=2)


@pytest.mark.parametrize("padding", [0.0, 0.4])
def test_streams_match_one_stream_bit_for_bit(padding: float) -> None:
    ref = build_reference(CFG, "cuda")
    device = detect_device("cuda")
    one = build_candidate(PLAN, CFG, device, ref.state_dict())
    three = build_candidate(PLAN.replace(batch_streams=3), CFG, device, ref.state_dict())
    x, mask = generate_random_case(CFG, "cuda", seed=5, padding_ratio=padding)
    with torch.inference_mode():
        want = one(x, mask)
        got = three(x, mask)
        kept = got.clone()
        x2, mask2 = generate_random_case(CFG, "cuda", seed=6, padding_ratio=padding)
        again = three(x2, mask2)  # a later call writes a new output, not the earlier one
        torch.cuda.synchronize()
        assert len(three._streams) == 3
        assert torch.equal(got, want)
        assert torch.equal(got, kept)
        report = check_outputs(got, ref(x, mask))
        assert report.passed, report.summary()
        assert torch.equal(again, one(x2, mask2))
