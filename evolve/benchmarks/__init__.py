"""Benchmarks (`evoharness bench <name>`); each prints a machine-readable last line."""
