"""Benchmarks (`tlt bench`): side-by-side variants in one run, ratios of medians."""
