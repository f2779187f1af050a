"""autotune: per-shape tuning of a fixed Transformer layer under a hard correctness rule."""

__version__ = "0.1.0"
