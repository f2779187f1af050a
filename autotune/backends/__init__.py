"""Backends: each implementation choice of a plan knob is one registered object with its
needs, its support rules, its memory model and its forward (``base`` holds the registry).
The only package that imports ``kernels/``. Adding a backend = one new module here that
registers a class, and its name in the import list below.
"""

from autotune.backends import (  # noqa: F401
    block,
    ffn,
    layer,
    norm,
    polynomial,
    sdpa,
    triton_attention,
)
from autotune.backends.base import (
    MASK_GENERAL,
    MASK_NONE,
    MASK_RIGHT_PADDED,
    AttentionBackend,
    AttentionCall,
    Backend,
    BlockBackend,
    FfnBackend,
    NormBackend,
    attention,
    chosen,
    get,
    knobs,
    layer_backend,
    needs,
    not_supported_reasons,
    reads_mask_on_host,
    register,
    uses_triton,
    values,
)
from autotune.backends.checks import kernel_checks

__all__ = [
    "MASK_GENERAL",
    "MASK_NONE",
    "MASK_RIGHT_PADDED",
    "AttentionBackend",
    "AttentionCall",
    "Backend",
    "BlockBackend",
    "FfnBackend",
    "NormBackend",
    "attention",
    "chosen",
    "get",
    "kernel_checks",
    "knobs",
    "layer_backend",
    "needs",
    "not_supported_reasons",
    "reads_mask_on_host",
    "register",
    "uses_triton",
    "values",
]
