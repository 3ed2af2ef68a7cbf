"""Benchmarks of train/."""
