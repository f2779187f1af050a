"""Triton kernels for the pre-norm Transformer layer, one module per op family.

Each module holds its PyTorch reference, the ``@triton.jit`` kernels, a launcher that
validates its inputs, and ``not_supported_reasons(...)`` for planning. Importing this
package does not import triton; import the submodules you need:

- :mod:`kernels.attention`: fused causal / padded attention forward (online softmax).
- :mod:`kernels.layernorm`: fused residual add + LayerNorm + padded-row zeroing.
- :mod:`kernels.ffn`: bias + exact GELU epilogue, and a GEMM with that epilogue.
- :mod:`kernels.registry`: small correctness checks over every kernel.
"""

from kernels._triton import interpreter_enabled, triton_available

__all__ = ["interpreter_enabled", "triton_available"]
