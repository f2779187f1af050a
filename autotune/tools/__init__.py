"""What people run on results: bench, validate, compare and report."""
