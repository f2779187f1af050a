"""A reduced GPU space for search-efficiency runs (issue 10): small enough to exhaust on
the H200 in a few minutes per case, rich enough that the tiles and the fusion choices
interact. Every plan is graph-captured with the layout choices the studies settled on
(packed QKV, strided heads, mask elision); what varies is the attention backend and its
precision, the Triton tiles, and the fused LayerNorm / GELU epilogue."""

SPACE = {
    "name": "gpu-reduced",
    "profiles": ["rtx5080", "rtx4090", "a100", "h100", "h200"],
    "regimes": ["*"],
    "params": [
        {
            "name": "attention",
            "variants": [
                {"attention": "sdpa_cudnn", "attn_precision": "fp16"},
                {"attention": "sdpa_flash", "attn_precision": "fp16"},
                {"attention": "sdpa_efficient", "attn_precision": "fp32"},
                {"attention": "triton", "attn_precision": "fp16"},
            ],
        },
        {"name": "attn_block_m", "values": [32, 64], "when": {"attention": ["triton"]}},
        {"name": "attn_block_n", "values": [32, 64], "when": {"attention": ["triton"]}},
        {"name": "attn_warps", "values": [4, 8], "when": {"attention": ["triton"]}},
        {"name": "attn_stages", "values": [2, 3], "when": {"attention": ["triton"]}},
        {"name": "layernorm", "values": ["torch", "triton"]},
        {"name": "ffn_act", "values": ["torch", "triton_epilogue"]},
        {"name": "gemm_precision", "values": ["fp32", "fp16"]},
    ],
    "fixed": {"heads": "strided", "qkv": "packed", "mask": "elide", "cuda_graph": True},
}
