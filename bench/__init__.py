"""Benchmarks (not part of the product): scripts, and the scale harness in bench/scale."""
