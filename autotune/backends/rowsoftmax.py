"""The streamed oracle's row softmax (``kernels.rowsoftmax``): fused masks, row statistics
and probabilities over one score chunk; Triton on CUDA, torch on the CPU."""

from __future__ import annotations

from kernels.rowsoftmax import probs_, row_stats

__all__ = ["probs_", "row_stats"]
