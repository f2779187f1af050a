"""CUDA GPUs, every regime that the dense reference can run: library attention backends
(each also under torch.compile), QKV packing, head layout, operand precision, CUDA graphs,
and the project's Triton kernels with their tiles.

No ``mask=elide``: dropping a no-op mask means reading its values on the host every call,
a synchronisation the tuned forward must not have (export would not ship it). Every plan
here applies the mask on the device; the Triton kernels take it as it is.
"""

_GRAPH_PLAN = {"heads": "strided", "qkv": "packed", "cuda_graph": True}
# The per-layer Triton attention with the fused LayerNorm and GELU epilogue under a graph.
_TRITON_EPILOGUE = dict(
    _GRAPH_PLAN,
    attention="triton",
    attn_precision="fp16",
    attn_block_m=32,
    attn_block_n=32,
    attn_warps=8,
    attn_stages=3,
    layernorm="triton",
    ffn_act="triton_epilogue",
)
_SDPA = ["sdpa_auto", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn"]
_LAYERS = ["heads", "rows"]  # the variants with row kernels (row_block, row_warps)
_PER_LAYER = {"fused_block": [False], "fused_layer": ["none"]}  # the unfused path's knobs


def _layer(
    variant: str,
    block_m: int,
    block_n: int,
    warps: int,
    stages: int,
    row_block: int,
    row_warps: int,
) -> dict:
    """A fused-layer plan with fp16 operands under a CUDA graph."""
    return {
        "attention": "triton",
        "fused_layer": variant,
        "attn_precision": "fp16",
        "gemm_precision": "fp16",
        "attn_block_m": block_m,
        "attn_block_n": block_n,
        "attn_warps": warps,
        "attn_stages": stages,
        "row_block": row_block,
        "row_warps": row_warps,
        "cuda_graph": True,
    }


def _one_tile(block_m: int, warps: int) -> dict:
    """Case 8's per-layer plan (fp16 GEMMs, the Triton LayerNorm and GELU epilogue, a
    graph) with the one-tile attention at 64-wide head chunks in 2 stages."""
    plan = dict(_TRITON_EPILOGUE, gemm_precision="fp16", attn_block_m=block_m)
    del plan["attn_block_n"]  # unused by the one-tile form (not asked)
    return dict(plan, attn_warps=warps, attn_stages=2, attn_head_chunk=64)


# The rows plans of tables/h200.py v40: the staged residual with 32 FFN columns a step
# (case 6), and that with key-mask bounds and 3 attention stages (cases 1, 11, 13).
_ROWS_STAGED = dict(_layer("rows", 64, 64, 4, 2, 64, 4), row_stage=True, row_ffn_block=32)
_ROWS_BOUNDED = dict(
    _layer("rows", 64, 64, 4, 3, 64, 4), row_stage=True, row_ffn_block=32, mask_bounds=True
)


SPACE = {
    "name": "gpu",
    "profiles": ["rtx5080", "rtx4090", "a100", "h100", "h200"],
    "regimes": ["*"],
    "params": [
        {
            "name": "attention",
            "variants": [
                {"attention": "reference", "attn_precision": "fp32"},
                {"attention": "sdpa_auto", "attn_precision": "fp32"},
                {"attention": "sdpa_efficient", "attn_precision": "fp32"},
                {"attention": "sdpa_efficient", "attn_precision": "fp16"},
                {"attention": "sdpa_flash", "attn_precision": "fp16"},
                {"attention": "sdpa_cudnn", "attn_precision": "fp16"},
                {"attention": "triton", "attn_precision": "fp32"},
                {"attention": "triton", "attn_precision": "fp16"},
                # Fused layers for any batch (kernels/layer.py): two launches a layer
                # (S <= 256), or three with the flash attention (any S). The variants are
                # told apart by fused_layer and fused_block before gemm_precision (knobs
                # are asked in order of first appearance), which is a parameter of its own
                # for the per-layer path.
                {
                    "attention": "triton",
                    "fused_layer": "heads",
                    "fused_block": False,
                    "attn_precision": "fp16",
                    "gemm_precision": "fp16",
                },
                {
                    "attention": "triton",
                    "fused_layer": "rows",
                    "fused_block": False,
                    "attn_precision": "fp16",
                    "gemm_precision": "fp16",
                },
                # One launch a layer (S, d_model <= 128): a query block of one sequence,
                # every head, the output projection and the FFN in one program.
                {
                    "attention": "triton",
                    "fused_layer": "seq",
                    "fused_block": False,
                    "attn_precision": "fp16",
                    "gemm_precision": "fp16",
                },
                # The whole layer in two Triton launches (S, d_model, FFN <= 256). fp16
                # operands only: its TF32 variant failed the rule on 9 of 10 cases on the
                # H200 (docs/fused_block.md).
                {
                    "attention": "triton",
                    "fused_block": True,
                    "attn_precision": "fp16",
                    "gemm_precision": "fp16",
                },
            ],
        },
        # 16-row query tiles for the fused heads layer only (session 36: case 2 ran 39.9 us
        # a forward at 16 against 46.5 at 32 in one process; 32 heads programs, not 16).
        {"name": "attn_block_m", "values": [16, 32, 64, 128], "when": {"attention": ["triton"]}},
        # The flash attention kernel with every key in one tile and the head dim in chunks
        # (S <= 256), per layer or in rows: case 8's flash attention at head dim 256 held
        # 134-255 registers a thread (1 block an SM); this form 80-140, 2-4 blocks an SM
        # (offline, Triton 3.6, docs/kernels_h200.md session 24).
        {
            "name": "attn_head_chunk",
            "values": [0, 16, 32, 64, 128],
            "when": {
                "attention": ["triton"],
                "fused_block": [False],
                "fused_layer": ["none", "rows"],
            },
        },
        {
            "name": "attn_block_n",
            "values": [32, 64, 128],
            # heads and rows use it; seq and the one-tile form hold every key in one tile
            "when": {
                "attention": ["triton"],
                "fused_block": [False],
                "fused_layer": ["none", *_LAYERS],
                "attn_head_chunk": [0],
            },
        },
        {"name": "attn_warps", "values": [4, 8], "when": {"attention": ["triton"]}},
        {"name": "attn_stages", "values": [1, 2, 3], "when": {"attention": ["triton"]}},
        # The flash attention in Gluon (session 34, kernels/gluon_flash.py): each key block's
        # softmax beside the previous block's p @ v. Measured on an H100 (session 34,
        # docs/logs/s34/s35_flash.log): case 13's attention 481.7 us against the Triton
        # kernel's 473.1 at 64 keys a step, slower at 128 keys or 8 warps; no prior.
        {
            "name": "attn_gluon_flash",
            "values": [False, True],
            "when": {
                "attention": ["triton"],
                "fused_block": [False],
                "fused_layer": ["none", "rows"],
                "attn_head_chunk": [0],
            },
        },
        {"name": "row_block", "values": [16, 32, 64, 128], "when": {"fused_layer": _LAYERS}},
        {"name": "row_warps", "values": [2, 4, 8], "when": {"fused_layer": _LAYERS}},
        # Post rows keeps x + attention in its output rows during the FFN instead of in
        # registers (bit-identical): case 6's post rows 5.52 -> 4.93 ms, spills 112 -> 22
        # a thread; case 13 0.940 -> 0.902 ms; case 2 25.5 -> 26.8 us (docs/logs/h200_s12_first.log)
        {"name": "row_stage", "values": [False, True], "when": {"fused_layer": _LAYERS}},
        # FFN columns a step of the kernel that runs the FFN (0: 64, or 32 where d_model >
        # 128): post rows still spills 14-22 registers a thread at case 6 with row_stage.
        {
            "name": "row_ffn_block",
            "values": [0, 32, 16],
            "when": {"fused_layer": [*_LAYERS, "seq"]},
        },
        # The FFN's GELU in the fused layers: erf (libdevice) or v * sigmoid(p(v)) (within
        # 2.6e-5 of it; session 22's PC sampling: 13-21% of the post rows kernel's samples
        # on the erf GELU).
        {"name": "ffn_gelu", "values": ["erf", "poly"], "when": {"fused_layer": [*_LAYERS, "seq"]}},
        # Post rows whose output projection accumulates onto x + bo: the residual's load
        # before the projection's loop (session 22's PC sampling: 13.4% of case 6's post
        # rows samples on that load after it).
        {"name": "row_fold_residual", "values": [False, True], "when": {"fused_layer": _LAYERS}},
        # The QKV rows kernel's pipeline stages (0: 3): case 6's at 3 stages holds 73.7 KB of
        # shared memory, 3 blocks an SM; 2 stages 57.3 KB, 4 blocks (offline, Triton 3.6).
        {"name": "row_qkv_stages", "values": [0, 2, 1], "when": {"fused_layer": ["rows"]}},
        # The flash attention's registers capped (session 22's probe, docs/logs/s22/
        # s22_probe.log: capped at 80 its time on case 6 -4.3%, at 96 on case 13 -3.7%).
        {
            "name": "attn_maxnreg",
            "values": [0, 80, 96, 128],
            "when": {
                "attention": ["triton"],
                "fused_block": [False],
                "fused_layer": ["none", "rows"],
            },
        },
        # Not searched: row_maxnreg (a cap on the row kernels' registers). Measured in
        # session 22 (docs/logs/s22/s22_maxnreg.log, s22_cap4.log): with 8 row warps capped
        # at 128 (16 warps an SM) 0.91x the entry on case 6, 0.95x on 13 and 1; with 4 warps
        # capped at 168 / 128 (spilled) 0.86x / 0.59x on case 6.
        # The flash attention of `rows` skips the mask inside each sequence's all-valid
        # key prefix and every block past its last valid key (one launch per forward).
        {"name": "mask_bounds", "values": [False, True], "when": {"fused_layer": ["rows"]}},
        # rows in two launches a layer: the flash attention and the post rows in one kernel
        # (every head of a query block, the output projection accumulated, then the FFN).
        {"name": "row_attn_post", "values": [False, True], "when": {"fused_layer": ["rows"]}},
        # rows in 2L + 1 launches: the post rows of each layer but the last also write the
        # next layer's LayerNorm1 + QKV (session 19: case 13 3.4% faster, case 6 neutral).
        {"name": "row_next_qkv", "values": [False, True], "when": {"fused_layer": ["rows"]}},
        # heads in 2L launches with the next layer's LayerNorm1 written by the post rows
        # (session 27): the heads attention loads normalised rows instead of normalising
        # up to S key rows in every program (session 21: its samples on the LayerNorm and
        # softmax reductions' FADD / SHFL / MUFU).
        {"name": "row_next_norm", "values": [False, True], "when": {"fused_layer": ["heads"]}},
        # The whole heads stack in one launch (session 35, kernels/stack.py): persistent
        # programs with a grid-wide barrier between phases. On an H100 it lost to the two
        # launches a layer on cases 2, 3, 12, 7 (0.43-0.90x; docs/logs/s35/s35_stack.log:
        # about 1 us a barrier against 0.4 us a graph's kernel boundary); searched, no prior.
        {
            "name": "one_launch",
            "values": [False, True],
            "when": {"fused_layer": ["heads"], "row_next_norm": [True]},
        },
        # The heads kernels' weight tiles loaded before anything else, with pdl before the
        # wait for the previous kernel (session 36): the loads overlap its tail, and the
        # output projection and FFN run in one step each. No device measurement yet.
        {"name": "weights_first", "values": [False, True], "when": {"fused_layer": ["heads"]}},
        # The post rows kernel in Gluon (session 28, kernels/gluon_rows.py): persistent, its
        # weights resident in shared memory, one wgmma a GEMM. Built without a device;
        # compiled offline (Triton 3.6: 253 registers, 112 KiB at 4 warps on case 6's
        # shape; 194 registers, 212 KiB with the next QKV at 8 warps on case 1's).
        {"name": "row_gluon", "values": [False, True], "when": {"fused_layer": _LAYERS}},
        # The heads attention in Gluon (session 29, kernels/gluon_heads.py): persistent, a
        # group of heads' q, k, v weights resident, every key in one tile. Built without a
        # device; offline (Triton 3.6, case 6's shape, 4 heads a program, 8 warps): 190-201
        # registers, 160 KiB, no spills. pdl: its weights copied before it waits.
        {"name": "attn_gluon", "values": [0, 1, 2, 4], "when": {"fused_layer": ["heads"]}},
        # Every kernel of heads / rows launched with programmatic dependent launch (sm_90+):
        # the next launch overlaps the tail of the one before (session 20: lost on 3 of 5).
        {"name": "pdl", "values": [False, True], "when": {"fused_layer": _LAYERS}},
        # With pdl, each kernel lets the next launch right after its own wait (start) or
        # after its last store (end: session 20's pdl lost 11-18% on multi-wave cases with
        # start, plausibly the next kernel's programs resident and waiting).
        {"name": "pdl_trigger", "values": ["start", "end"], "when": {"pdl": [True]}},
        # torch.compile of the forward with a library attention (the one line a user
        # writes, as a plan the search can pick): compile time is the trial's first call.
        # max-autotune is left out: minutes of compile per shape, and its TF32 Triton GEMMs
        # failed the rule on cases 1, 2 and 6 on the H200 (../shared/REFERENCE.md).
        {
            "name": "compile",
            "values": ["none", "default", "reduce-overhead"],
            "when": {"attention": _SDPA},
        },
        {"name": "qkv", "values": ["separate", "packed"], "when": _PER_LAYER},
        {"name": "heads", "values": ["contiguous", "strided"], "when": _PER_LAYER},
        {"name": "gemm_precision", "values": ["fp32", "fp16"], "when": _PER_LAYER},
        # The Triton LayerNorm and GELU epilogue do not go under torch.compile.
        {
            "name": "layernorm",
            "values": ["torch", "triton"],
            "when": dict(_PER_LAYER, compile=["none"]),
        },
        # blas_tanh (session 25): the bias + GELU in the FFN GEMM's cuBLASLt epilogue, the
        # tanh GELU; one kernel a layer fewer than triton_epilogue (case 8: 4 x 14 us).
        {
            "name": "ffn_act",
            "values": ["torch", "triton_epilogue", "blas_tanh"],
            "when": dict(_PER_LAYER, compile=["none"]),
        },
        # reduce-overhead captures graphs itself.
        {"name": "cuda_graph", "values": [False, True], "when": {"compile": ["none", "default"]}},
    ],
    "restrictions": [
        # The reference arithmetic materialises scores: only worth trying without graphs.
        {"forbid": {"attention": ["reference"], "cuda_graph": [True]}},
        # 128-row tiles of the fused heads layer and the fused block miscompile on CUDA
        # (session 7 memcheck sweep, docs/results/h200/memcheck_s7.csv); the support rules
        # refuse them too, and here they cost no trial.
        {"forbid": {"fused_layer": ["heads"], "attn_block_m": [128]}},
        {"forbid": {"fused_layer": ["none", "rows", "seq"], "attn_block_m": [16]}},
        {"forbid": {"fused_block": [True], "attn_block_m": [16]}},
        {"forbid": {"fused_block": [True], "attn_block_m": [128]}},
        # The one-launch layer faulted at 64- and 128-row tiles (session 10, H200).
        {"forbid": {"fused_layer": ["seq"], "attn_block_m": [64, 128]}},
        # The fused attention + post rows holds a [128, d_model] fp32 accumulator beside the
        # attention's state at 128-row tiles: the family of tiles that faulted above.
        {"forbid": {"row_attn_post": [True], "attn_block_m": [128]}},
        # The chain follows the post rows kernel, which row_attn_post folds into attention.
        {"forbid": {"row_attn_post": [True], "row_next_qkv": [True]}},
        {"forbid": {"row_attn_post": [True], "pdl": [True]}},
        # attn_post accumulates the projection head by head: no fold there.
        {"forbid": {"row_fold_residual": [True], "row_attn_post": [True]}},
        # The Gluon post rows has none of the Triton post rows' knobs (it folds both
        # residuals into its accumulators).
        {"forbid": {"row_gluon": [True], "row_attn_post": [True]}},
        {"forbid": {"row_gluon": [True], "row_stage": [True]}},
        {"forbid": {"row_gluon": [True], "row_fold_residual": [True]}},
        {"forbid": {"row_gluon": [True], "row_ffn_block": [32, 16]}},
        # and no QKV rows stages or row tile of the Triton kernels (its tiles are 64 rows)
        {"forbid": {"row_gluon": [True], "row_qkv_stages": [2, 1]}},
        {"forbid": {"row_gluon": [True], "row_block": [16, 32, 128]}},
        # The Gluon heads attention has none of the Triton kernel's tiles and stages: one
        # setting of those stands for all.
        {"forbid": {"attn_gluon": [1, 2, 4], "attn_block_m": [16, 32, 128]}},
        {"forbid": {"attn_gluon": [1, 2, 4], "attn_block_n": [32, 128]}},
        {"forbid": {"attn_gluon": [1, 2, 4], "attn_stages": [1, 3]}},
        {"forbid": {"attn_maxnreg": [80, 96], "row_attn_post": [True]}},
        # The Gluon flash attention's query tile is 64 rows a warpgroup (one attn_block_m
        # stands for all), its key blocks 64 or 128 through 3 buffers; capped at 128
        # registers (4 programs an SM at 4 warps; 80 and 96 would spill), or not.
        {"forbid": {"attn_gluon_flash": [True], "attn_block_m": [16, 32, 128]}},
        {"forbid": {"attn_gluon_flash": [True], "attn_block_n": [32]}},
        {"forbid": {"attn_gluon_flash": [True], "attn_stages": [1, 2]}},
        {"forbid": {"attn_gluon_flash": [True], "attn_maxnreg": [80, 96]}},
        {"forbid": {"attn_gluon_flash": [True], "row_attn_post": [True]}},
        {"forbid": {"attn_head_chunk": [16, 32, 64, 128], "row_attn_post": [True]}},
    ],
    "enqueue": [
        {},
        # Session 27 (docs/logs/s27/s27_norm.log): row_next_norm took case 2's GPU time 57.0
        # -> 49.6 us a forward and won the export on cases 2, 3, 7 and 12 by 9-18%. First
        # for the heads cases; and a 64-row heads plan with it for the 64-128-row cases, where
        # rows won (session 6) while every heads program still normalised its key rows.
        dict(
            _layer("heads", 32, 128, 4, 1, 16, 8),
            row_next_norm=True,
            row_fold_residual=True,
            ffn_gelu="poly",
        ),
        dict(
            _layer("heads", 64, 64, 4, 2, 64, 4),
            row_next_norm=True,
            row_fold_residual=True,
            ffn_gelu="poly",
        ),
        # Session 21 (docs/logs/s21/s21_warps.log, one compare a case): 8 warps in the row
        # kernels 3.4-4.3% faster than the entries on cases 2, 3 and 12; the chained rows form
        # with 16-row tiles and 8 row warps 7% faster on case 4. First for the heads cases.
        _layer("heads", 32, 128, 4, 1, 16, 8),
        _layer("heads", 32, 32, 4, 2, 16, 8),
        dict(_layer("rows", 32, 64, 4, 2, 16, 8), row_next_qkv=True),
        # Session 22 (docs/logs/s22/s22_gelu.log, one compare a case): the rows entries with
        # ffn_gelu=poly, 2.7-4.2% faster on cases 6, 13, 1, 11 and 5, within the rule.
        dict(_ROWS_STAGED, cuda_graph=False, ffn_gelu="poly"),
        dict(_ROWS_BOUNDED, row_next_qkv=True, pdl=True, ffn_gelu="poly"),
        dict(_ROWS_BOUNDED, row_next_qkv=True, ffn_gelu="poly"),
        # Session 22 (docs/logs/s22/s22_probe.log): case 6's plan without the CUDA graph,
        # 10.04 ms against 10.33 with it (its 655 MB output is over the graph's ring, so a
        # graphed call clones it); 12 launches of host time hide under its GPU time.
        dict(_ROWS_STAGED, cuda_graph=False),
        # v40's two rows plans with the next layer's QKV chained into the post rows (session
        # 19, docs/kernels_h200.md: case 13 843.6 us against 873.0, case 6 neutral): early,
        # so that a short study of a rows case reaches them.
        dict(_ROWS_BOUNDED, row_next_qkv=True),
        dict(_ROWS_STAGED, row_next_qkv=True),
        # Programmatic dependent launch measured in session 20 (docs/kernels_h200.md,
        # docs/logs/s20_pdl.log): slower on cases 12, 7 and 1 (0.82-0.89x), neutral on 2,
        # 1% faster on 13; only the case-13 rows plan with the chain stays a prior.
        dict(_ROWS_BOUNDED, row_next_qkv=True, pdl=True),
        # Fused layers (session 6, autotune compare on the H200, commit 5df76d4): small
        # tiles on the launch-bound cases, 64-row tiles on the mid ones, rows for S=1024.
        _layer("heads", 32, 32, 4, 2, 16, 4),
        _layer("heads", 64, 64, 4, 2, 64, 4),
        _layer("rows", 64, 64, 4, 2, 64, 4),
        # The winners of later rounds (tables/h200.py v39): case 2's key tiles of 128 in
        # one stage; rows with the staged residual and 32 FFN columns a step (case 6), and
        # with key bounds and 3 stages (case 13). row_attn_post is not a prior: it lost on
        # both (session 17, docs/kernels_h200.md).
        _layer("heads", 32, 128, 4, 1, 16, 4),
        _ROWS_STAGED,
        _ROWS_BOUNDED,
        dict(_GRAPH_PLAN, attention="sdpa_efficient"),
        dict(_GRAPH_PLAN, attention="sdpa_cudnn", attn_precision="fp16"),
        dict(_GRAPH_PLAN, attention="sdpa_flash", attn_precision="fp16"),
        dict(_GRAPH_PLAN, attention="triton", attn_precision="fp16"),
        dict(_GRAPH_PLAN, attention="sdpa_cudnn", attn_precision="fp16", gemm_precision="fp16"),
        # Priors from the first H200 round: the Triton attention with the fused LayerNorm
        # and GELU epilogue under a graph, and the fused block (fewest kernels).
        _TRITON_EPILOGUE,
        # The same with fp16 GEMM operands: case 8's winner.
        dict(_TRITON_EPILOGUE, gemm_precision="fp16"),
        # ... with the one-tile attention (head dim in chunks of 64): for case 8's head dim
        # 256, 64- and 32-row tiles (512 / 1,024 programs; 80 / 140 registers, 3 blocks an
        # SM offline).
        _one_tile(64, 8),
        _one_tile(32, 4),
        # ... and with the FFN's bias + GELU in the GEMM's epilogue (session 25, no device
        # yet): case 8's four bias + GELU kernels (56 us of its 1.18 ms in session 16) gone.
        dict(_one_tile(64, 8), ffn_act="blas_tanh"),
        dict(_TRITON_EPILOGUE, gemm_precision="fp16", ffn_act="blas_tanh"),
        {
            "attention": "triton",
            "fused_block": True,
            "attn_precision": "fp16",
            "gemm_precision": "fp16",
            "attn_block_m": 32,
            "cuda_graph": True,
        },
        # The anchors a user writes, and the best library plan under reduce-overhead.
        {"attention": "sdpa_auto", "compile": "reduce-overhead"},
        {
            "attention": "sdpa_cudnn",
            "attn_precision": "fp16",
            "gemm_precision": "fp16",
            "heads": "strided",
            "qkv": "packed",
            "compile": "reduce-overhead",
        },
    ],
}
