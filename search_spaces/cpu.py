"""CPU: the variants that run on a CPU, kept small so a smoke study takes minutes."""

SPACE = {
    "name": "cpu",
    "profiles": ["cpu"],
    "regimes": ["*"],
    "params": [
        {
            "name": "attention",
            "variants": [
                {"attention": "reference"},
                {"attention": "sdpa_math"},
                {"attention": "sdpa_flash"},
            ],
        },
        {"name": "qkv", "values": ["separate", "packed"]},
        {"name": "heads", "values": ["contiguous", "strided"]},
        {"name": "mask", "values": ["apply", "elide"]},
        {"name": "attn_precision", "values": ["fp32", "fp16"]},
    ],
    "restrictions": [
        # fp16 matmuls on a CPU are emulated and slow: only SDPA's fused kernels take them.
        {"forbid": {"attention": ["reference", "sdpa_math"], "attn_precision": ["fp16"]}},
    ],
    "enqueue": [
        {},
        {"attention": "sdpa_flash", "qkv": "packed", "heads": "strided", "mask": "elide"},
    ],
}
