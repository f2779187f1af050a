"""Correctness: the gate over official seeds, the streamed oracle, golden vectors and
whole-batch verification for shapes the dense reference cannot run."""
