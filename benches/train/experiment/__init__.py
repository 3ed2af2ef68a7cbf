"""Benchmarks of train/experiment/."""
