"""Benchmarks of train/harness/."""
