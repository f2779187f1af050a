"""Session 36: the heads kernel at case 2's shape with attn_block_m=64, attn_block_n=128
(an illegal memory access on the H200): which settings fault. One configuration a process:
python3 scripts/s36_bm64_probe.py BLOCK_M BLOCK_N STAGES WARPS WEIGHTS_FIRST."""

import sys

import torch

import kernels.layer as _layer
from autotune.core.reference import ReferenceTransformer, TransformerConfig
from kernels._tolerance import PROJECT_RULE, compare
from kernels.block import weights_from_model
from kernels.layer import Tiling, layer_stack, prepare_layer_weights

# Session 37: the support rules refuse this configuration since d46a0fb; the probe runs it
# anyway (under compute-sanitizer) by dropping that one refusal.
_errors = _layer._config_errors
_layer._config_errors = lambda *a, **k: [e for e in _errors(*a, **k) if "faults compiled" not in e]

bm, bn, st, nw, wf = (int(a) for a in sys.argv[1:6])
cfg = TransformerConfig(1, 128, 128, 4, 128, 4, True)
torch.manual_seed(0)
model = ReferenceTransformer(cfg).eval()
x = torch.randn(1, 128, 128)
with torch.inference_mode():
    ref = model(x, None)
    layers, final = weights_from_model(model.cuda())
    t = Tiling(
        block_m=bm,
        block_n=bn,
        num_stages=st,
        num_warps=nw,
        row_block=16,
        row_warps=8,
        next_norm=True,
        fold_residual=True,
        gelu_poly=True,
        weights_first=bool(wf),
    )
    out = layer_stack(
        x.cuda(),
        [prepare_layer_weights(w, "fp16") for w in layers],
        final,
        num_heads=4,
        causal=True,
        key_mask=None,
        variant="heads",
        tiling=t,
        gemm_precision="fp16",
        attn_precision="fp16",
    )
    torch.cuda.synchronize()
    r = compare(out.cpu(), ref, PROJECT_RULE)
print(sys.argv[1:6], "pass" if r.passed else "FAIL", r)
