"""Benchmarks of zoo/."""
