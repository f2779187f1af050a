"""CUDA GPUs, shapes the dense reference cannot run (case 14: B=32, S=100,000): only
attention that never materialises scores, batch streaming to bound memory, no graphs
(one forward is seconds long). Judged against the streamed exact oracle."""

SPACE = {
    "name": "gpu-long",
    "profiles": ["rtx5080", "rtx4090", "a100", "h100", "h200"],
    "regimes": ["infeasible-dense"],
    "priority": 20,
    "params": [
        {
            "name": "attention",
            "variants": [
                {"attention": "triton", "attn_precision": "fp16"},
                {"attention": "triton", "attn_precision": "fp32"},
                {"attention": "sdpa_cudnn", "attn_precision": "fp16"},
                {"attention": "sdpa_flash", "attn_precision": "fp16"},
                {"attention": "sdpa_efficient", "attn_precision": "fp32"},
            ],
        },
        {"name": "attn_block_m", "values": [64, 128], "when": {"attention": ["triton"]}},
        {"name": "attn_block_n", "values": [32, 64, 128], "when": {"attention": ["triton"]}},
        {"name": "attn_warps", "values": [4, 8], "when": {"attention": ["triton"]}},
        {"name": "attn_stages", "values": [2, 3], "when": {"attention": ["triton"]}},
        {"name": "gemm_precision", "values": ["fp32", "fp16"]},
        {"name": "qkv", "values": ["separate", "packed"]},
        {"name": "batch_chunk", "values": [1, 2, 4, 8]},
    ],
    "fixed": {"heads": "strided", "mask": "elide"},
    "enqueue": [
        {
            "attention": "triton",
            "attn_precision": "fp16",
            "gemm_precision": "fp16",
            "qkv": "packed",
            "batch_chunk": 1,
            "attn_block_m": 128,
            "attn_block_n": 64,
            "attn_warps": 8,
            "attn_stages": 3,
        },
        {
            "attention": "sdpa_cudnn",
            "attn_precision": "fp16",
            "gemm_precision": "fp16",
            "qkv": "packed",
            "batch_chunk": 1,
        },
    ],
}
