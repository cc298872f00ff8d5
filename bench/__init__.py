"""Micro-benchmarks and load benchmarks (see BENCHMARKS.md)."""
