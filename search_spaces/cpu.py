"""CPU: the variants that run on a CPU, kept small so a smoke study takes minutes."""

SPACE = {
    "name": "cpu",
    "profiles": ["cpu"],
    "regimes": ["*"],
    "params": [
        {
            "name": "attention",
            # fp16 matmuls on a CPU are emulated and slow: only SDPA's fused kernels take
            # them, so only flash is asked its precision (no trial is spent on the others).
            "variants": [
                {"attention": "reference"},
                {"attention": "sdpa_math"},
                {"attention": "sdpa_flash", "attn_precision": "fp32"},
                {"attention": "sdpa_flash", "attn_precision": "fp16"},
            ],
        },
        {"name": "qkv", "values": ["separate", "packed"]},
        {"name": "heads", "values": ["contiguous", "strided"]},
        {"name": "mask", "values": ["apply", "elide"]},
    ],
    "enqueue": [
        {},
        {"attention": "sdpa_flash", "qkv": "packed", "heads": "strided", "mask": "elide"},
    ],
}
