"""The ground floor: the reference and its rule, cases, GPU profiles, device facts,
outcome types and atomic file writes. Imports nothing else of autotune."""
